"""An independent checker of a chaos run's log: written from the event schemas alone.

It imports nothing of corral (not `schemas`, not `evolve`, not the core): it
reads the stored messages as JSON, so a bug in the code under test cannot hide
in the checker too. What it knows of the rules is what DESIGN.md and the event
catalogue (schemas/events.py) say, re-stated here in a few lines:

- a scheduler's decision carries `epoch`; one older than the newest elected
  epoch at its position is void (it changes nothing), so it is not held
  against the run;
- an epoch is elected by a SchedulerElected whose epoch is the previous one
  plus one; no epoch is elected twice;
- a worker is live from its WorkerStarted to the WorkerExited of the same
  (job, attempt, rank, restarts); its GPUs are the ones WorkerStarted names,
  or, for a report without them, the rank's placement in its attempt's
  reservation;
- NodeFailed is legitimate only for a node whose heartbeats stopped for the
  heartbeat timeout: the node's agent was paused or killed, or the NATS server
  was away, for long enough (the run's driver records when it did what).

Checks at every position: no GPU with live workers of two jobs; no epoch
elected twice or out of order; no effective NodeFailed without an outage to
explain it; no scheduler decision after the first election without an epoch;
sequences contiguous. At the end: every job terminal, none failed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Events a scheduler authors (the rest come from agents, clients and admins).
SCHEDULER_EVENTS = frozenset({
    "GangReserved", "JobWaiting", "JobRunning", "PreemptionRequested", "Preempted", "GangRestarted", "JobRequeued",
    "JobCompleted", "JobFailed", "JobCancelled", "JobRejected", "NodeFailed",
})
TERMINAL = frozenset({"JobCompleted", "JobFailed", "JobCancelled", "JobRejected"})


@dataclass(frozen=True)
class Stored:
    """One message as the stream holds it."""

    seq: int
    time: float  # server time, epoch seconds
    data: bytes
    subject: str = ""


@dataclass(frozen=True)
class Outage:
    """A span in which `node` (None: every node) sent no heartbeat the scheduler could see."""

    node: str | None
    start: float
    #: None: until the node registers again (a killed agent), read from the log.
    end: float | None
    what: str


@dataclass
class Report:
    events: int = 0
    unreadable: int = 0
    jobs: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    epochs: list[int] = field(default_factory=list)
    void_by_epoch: Counter[str] = field(default_factory=Counter)
    node_failed: int = 0
    node_failed_void: int = 0
    violations: list[str] = field(default_factory=list)

    def violate(self, seq: int, what: str) -> None:
        self.violations.append(f"seq {seq}: {what}")

    def summary(self) -> dict[str, object]:
        return {
            "events": self.events, "unreadable": self.unreadable, "jobs": self.jobs,
            "outcomes": dict(self.outcomes), "epochs": len(self.epochs),
            "void_by_epoch": sum(self.void_by_epoch.values()), "node_failed": self.node_failed,
            "node_failed_void": self.node_failed_void, "violations": len(self.violations),
        }


def check(
    log: Iterable[Stored],
    outages: Iterable[Outage],
    *,
    heartbeat_timeout: float,
    heartbeat_interval: float,
    slack: float = 2.0,
    final: bool = True,
) -> Report:
    r = Report()
    outs = list(outages)
    epoch = 0
    seen_epochs: set[int] = set()
    reservations: dict[tuple[str, int], dict[int, tuple[str, tuple[int, ...]]]] = {}
    live: dict[tuple[str, int, int, int], tuple[str, tuple[int, ...], str]] = {}
    holders: dict[tuple[str, int], set[tuple[str, int, int, int]]] = {}
    registered: dict[str, list[float]] = {}
    failed: list[tuple[int, float, str]] = []
    submitted: set[str] = set()
    terminal: dict[str, str] = {}
    starts: Counter[tuple[str, int, int, int]] = Counter()
    last_seq = 0
    for m in log:
        r.events += 1
        if m.seq != last_seq + 1:
            r.violate(m.seq, f"positions not contiguous: {last_seq} then {m.seq}")
        last_seq = m.seq
        try:
            e = json.loads(m.data.decode("utf-8"))
            kind = e["type"]
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            r.unreadable += 1
            continue
        if not isinstance(e, dict) or not isinstance(kind, str):
            r.unreadable += 1
            continue
        if kind == "SchedulerElected":
            n = e.get("epoch")
            if n in seen_epochs:
                r.violate(m.seq, f"epoch {n} elected twice")
            elif n == epoch + 1:
                epoch = n
                seen_epochs.add(n)
                r.epochs.append(n)
            else:
                r.void_by_epoch[kind] += 1  # not previous + 1: a forged or raced election, void
            continue
        if kind in SCHEDULER_EVENTS:
            stamped = e.get("epoch", 0)
            if epoch and not stamped:
                r.violate(m.seq, f"{kind} without an epoch after epoch {epoch} was elected")
            if stamped and stamped < epoch:
                r.void_by_epoch[kind] += 1
                if kind == "NodeFailed":
                    r.node_failed_void += 1
                continue
        job = e.get("job_id")
        if kind == "JobSubmitted":
            if job in submitted:
                r.violate(m.seq, f"{job} submitted twice")
            submitted.add(job)
        elif kind == "GangReserved":
            reservations[(job, e["attempt"])] = {p["rank"]: (p["node_id"], tuple(p["gpus"])) for p in e["ranks"]}
        elif kind == "WorkerStarted":
            key = (job, e["attempt"], e["rank"], e.get("restarts", 0))
            starts[key] += 1
            if starts[key] > 1:
                r.violate(m.seq, f"worker {key} started twice")
            gpus = tuple(e.get("gpus") or ())
            if not gpus:
                node, gpus = reservations.get((job, e["attempt"]), {}).get(e["rank"], (e["node_id"], ()))
            node = e["node_id"]
            for g in gpus:
                others = {live[k][2] for k in holders.get((node, g), ())} - {job}
                if others:
                    r.violate(m.seq, f"GPU {node}/{g}: worker of {job} started while {sorted(others)} still run there")
                holders.setdefault((node, g), set()).add(key)
            live[key] = (node, gpus, job)
        elif kind == "WorkerExited":
            key = (job, e["attempt"], e["rank"], e.get("restarts", 0))
            held = live.pop(key, None)
            if held is not None:
                for g in held[1]:
                    holders.get((held[0], g), set()).discard(key)
        elif kind == "NodeRegistered":
            registered.setdefault(e["node_id"], []).append(m.time)
        elif kind == "NodeFailed":
            r.node_failed += 1
            failed.append((m.seq, m.time, e["node_id"]))
        if kind in TERMINAL and job is not None and job not in terminal:
            terminal[job] = kind
    for seq, t, node in failed:
        if not _explained(node, t, outs, registered, heartbeat_timeout, heartbeat_interval, slack):
            near = [f"{o.what} {o.node or 'all'} {o.start - t:+.1f}..{'?' if o.end is None else f'{o.end - t:+.1f}'}s"
                    for o in outs if o.node in (None, node) and abs(o.start - t) < 60]
            r.violate(seq, f"NodeFailed for {node} whose heartbeats never stopped for {heartbeat_timeout}s "
                           f"(outages of it or NATS within 60 s, relative to the NodeFailed: {near or 'none'})")
    r.jobs = len(submitted)
    r.outcomes = Counter(terminal.get(j, "pending") for j in submitted)
    if final:
        for j in sorted(submitted):
            outcome = terminal.get(j, "pending")
            if outcome != "JobCompleted":
                r.violations.append(f"end: {j} is {outcome}")
    return r


def _explained(
    node: str, t: float, outages: list[Outage], registered: Mapping[str, list[float]], timeout: float,
    interval: float, slack: float,
) -> bool:
    """An outage of this node (or of NATS) in which it could have been silent for `timeout` by `t`."""
    for o in outages:
        if o.node is not None and o.node != node:
            continue
        end = o.end
        if end is None:  # killed: its heartbeats resume once the new process registers
            end = min((r for r in registered.get(node, ()) if r >= o.start), default=float("inf"))
        # After NATS comes back, agents reconnect and the monitor re-creates its watch once it was quiet for a
        # third of the timeout (orchestrator/scheduler/health.py): beats are invisible to the scheduler until then.
        # So too after this node's own outage when NATS went down and came back during it: the node reconnects
        # only once it runs again (seen in CI: paused 6 s, NATS killed in the middle, failed 4 s after resuming).
        nats_within = o.node is not None and any(
            n.node is None and n.start <= end and (n.end if n.end is not None else float("inf")) >= o.start
            for n in outages)
        after = interval + slack + 1.0 + (timeout / 3 if o.node is None or nats_within else 0.0)
        silent_from = o.start - interval - slack
        if silent_from <= t - timeout and t <= end + after:
            return True
    return False


def read_stored(messages: Iterable[tuple[int, float, bytes]]) -> list[Stored]:
    return [Stored(seq, t, data) for seq, t, data in messages]
