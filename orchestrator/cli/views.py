"""Projections of a folded ClusterState into what the read commands print.

Pure functions of (state, now): `jobs`, `job`, `nodes`, `queues`, `replay`
and `top` all build on them, so a job looks the same in every command and the
`--json` of one command can be compared with another's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec

from orchestrator.cli.output import human_duration
from orchestrator.cli.render import placement_summary
from orchestrator.cli.timespec import SIMULATED_BEFORE_S, LogClock
from orchestrator.core.gating import gate_reason
from orchestrator.core.model.estimates import (
    LIMIT,
    MIN_SAME_NAME,
    MIN_SAME_SIZE,
    expected_start,
    line_place,
    told_end,
)
from orchestrator.core.model.plan import QueueLoad
from orchestrator.core.model.state import (
    FINAL_RANKS_KEPT,
    FREE,
    HOLDING,
    TERMINAL,
    ClusterState,
    Job,
    JobStatus,
    Node,
    RankState,
)
from orchestrator.core.model.usage import average_gpus, resolve_queue

if TYPE_CHECKING:
    from orchestrator.policies import Policies

#: Every job status, in lifecycle order (what `corral jobs --state` accepts).
STATUSES: tuple[JobStatus, ...] = (
    "pending", "reserved", "running", "preempting", "completed", "failed", "cancelled", "rejected",
)


def _builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)


# --- jobs ----------------------------------------------------------------------------


def job_queue(state: ClusterState, job: Job) -> str:
    """The queue a job counts against: the one charged while it holds GPUs, else where it would run."""
    return job.queue or resolve_queue(state, job.spec.queue)


def job_shape(job: Job) -> str:
    """`2x8`: ranks x GPUs per rank."""
    return f"{job.spec.ranks}x{job.spec.gpus_per_rank}"


def job_note(job: Job, state: ClusterState | None = None) -> str:
    """The one thing to know about a job now: where it runs, why it waits, or how it ended."""
    gate = gate_reason(state, job) if state is not None else None
    if gate is not None:
        return f"gated: {gate}"
    if job.status in HOLDING:
        where = placement_summary(job.placement)
        if job.status == "preempting":
            return f"{where} (preempted for {job.preemptor})"
        if job.stop is not None:
            return f"{where} (stopping: {job.stop.reason or 'cancel requested'})"
        return where
    if job.status == "pending":
        if job.waiting is None:
            return "waiting for the scheduler"
        return waiting_text(state, job)
    return job.end_reason or job.failure


def waiting_text(state: ClusterState, job: Job) -> str:
    """A pending job's reason, `code: message`; a reservation holder's with its place in its queue's line as the
    state is now (estimates.line_place: exactly one holder per queue is first in line)."""
    w = job.waiting
    if w is None:
        return "not looked at by the scheduler yet"
    return f"{w.code}: {waiting_message(state, job, w.message)}"


def waiting_message(state: ClusterState, job: Job, message: str) -> str:
    """The scheduler's message of a pending job, with its place in line as the state is now when it holds a
    reservation (`waiting_text` without the code: the web UI shows the code apart)."""
    place = line_place(state, job)
    if place is None:
        return message
    if message.startswith("first in line for "):  # (written before #41, its place then)
        return f"{place} {message.removeprefix('first in line ')}"
    return f"{place} with {message}"


def job_age(job: Job, now: float) -> float:
    """How long the job has been in its current phase (seconds).

    The fold keeps 0.0 for a phase not reached, and 0.0 is also a real time (a simulated log starts at 0):
    the phase is told by the status, and its start is the newest of the job's times (a phase not reached
    reads 0.0, never newer than one reached), not by a time being non-zero.
    """
    if job.status in TERMINAL:
        return now - job.finished_at  # (how long it has been over: its run time is `job_elapsed`)
    if job.status == "running":
        return now - job.running_at
    if job.status in HOLDING:
        return now - job.reserved_at
    return now - job.submitted_at


def ran(job: Job) -> bool:
    """Whether the current attempt reached running (its `running_at` is a time, even 0.0)."""
    return job.status == "running" or job.running_at != 0.0 or job.started >= job.spec.ranks


def job_started_at(job: Job) -> float | None:
    """When its last attempt got its GPUs (sacct's Start: GPU-hours are charged from there); None: it holds
    none and finished holding none (waiting, or rejected or cancelled before it was placed)."""
    placed = job.status in HOLDING or (job.status in TERMINAL and bool(job.placement)) or ran(job)
    return job.reserved_at if placed else None


def job_elapsed(job: Job, now: float) -> float | None:
    """How long its last attempt has held its GPUs (sacct's Elapsed): start to end, or to `now` while it
    holds them; None: not placed. Not its age: a job that waited an hour and ran a minute took a minute."""
    start = job_started_at(job)
    if start is None:
        return None
    return max(0.0, (job.finished_at if job.status in TERMINAL else now) - start)


_EXIT_IN_FAILURE = re.compile(r"\(exit (-?\d+)\)")


def job_exit_code(job: Job) -> int | None:
    """A finished job's exit code (sacct's ExitCode): the code of its first rank that exited non-zero,
    else 0 when its ranks exited with codes; None while it is not over or when no rank reported one."""
    if job.status not in TERMINAL:
        return None
    codes = [(rs.exited_at, rank, rs.exit_code) for rank, rs in job.final_ranks
             if rs.status != "started" and rs.exit_code is not None]
    bad = sorted(c for c in codes if c[2] != 0)
    if bad:
        return bad[0][2]
    # The fold keeps the first FINAL_RANKS_KEPT ranks; the first failure is in `failure` whichever rank it was.
    m = _EXIT_IN_FAILURE.search(job.failure)
    if m is not None:
        return int(m.group(1))
    return 0 if codes else None


def select_jobs(state: ClusterState, *, queue: str | None = None, statuses: frozenset[str] = frozenset(),
                user: str | None = None) -> list[Job]:
    """Jobs in log order, of `queue` (named in the spec or charged), in one of `statuses` (empty: all), submitted
    by `user`."""
    out = []
    for job in state.jobs.values():
        if statuses and job.status not in statuses:
            continue
        if queue is not None and queue not in (job.spec.queue, job_queue(state, job)):
            continue
        if user is not None and job.submitted_by != user:
            continue
        out.append(job)
    return out


def job_summary(state: ClusterState, job: Job) -> dict[str, Any]:
    """One job for `corral jobs --json`."""
    return {
        "job_id": job.job_id,
        "name": job.spec.name,
        "queue": job_queue(state, job),
        "status": job.status,
        "attempt": job.attempt,
        "priority": job.spec.priority,
        "ranks": job.spec.ranks,
        "gpus_per_rank": job.spec.gpus_per_rank,
        "gpus": job.spec.total_gpus,
        "preemptible": job.spec.preemptible,
        "submitted_at": job.submitted_at,
        "submitted_by": job.submitted_by or None,
        "running_at": job.running_at if ran(job) else None,
        "finished_at": job.finished_at if job.status in TERMINAL else None,
        "placement": _builtins(job.placement),
        "waiting": _builtins(job.waiting) if job.status == "pending" and job.waiting else None,
        "end_reason": job.end_reason or None,
        # sacct's history fields (`corral jobs --all`): the last attempt's start (placed), the end, the time between.
        "started_at": job_started_at(job),
        "ended_at": job.finished_at if job.status in TERMINAL else None,
        # (a job still holding GPUs has its start: its elapsed would change with the clock, unlike the rest)
        "elapsed_s": job_elapsed(job, job.finished_at) if job.status in TERMINAL else None,
        "exit_code": job_exit_code(job),
    }


def rank_states(state: ClusterState, job: Job) -> dict[int, RankState]:
    """The current attempt's ranks: live in the fold while the job holds GPUs, kept with it once finished."""
    live = state.ranks.get(job.job_id)
    return live if live is not None else dict(job.final_ranks)


#: Where a job's gang is expected to end by its estimate: placed, not being stopped.
_ENDS_BY_ESTIMATE = frozenset({"reserved", "running"})


def running_policies(state: ClusterState) -> Policies:
    """The `Policies` of the policy the newest leader decides with (`corral scheduler --policy`): what it
    estimates and when it lets a gang preempt is what the views tell. A name this version does not know
    (a newer scheduler's) or none (logs from before `--policy`) reads as corral's."""
    from orchestrator.policies.named import POLICY_NAMES, policies_for  # (the policies' code: only views of live jobs)

    name = state.policy if isinstance(state.policy, str) and state.policy in POLICY_NAMES else "corral"
    return policies_for(name)


def job_estimate(state: ClusterState, job: Job, now: float) -> dict[str, Any] | None:
    """The run time corral tells of a job not yet finished, learned from the log, and its source.

    The one the scheduler tells (`Policies.estimate`, core/model/estimates.py `told_estimate`): the median
    of at least MIN_SAME_NAME completed runs of the job's name by its user in its queue, else of at least
    MIN_SAME_SIZE of its user's jobs of its GPU count there. A placed gang's `expected_end` is when it should
    let its GPUs go (None once it has outrun the estimate: `outrun`). None: the job is over, or too few runs
    like it completed (not known).
    """
    if job.status in TERMINAL:
        return None
    est = running_policies(state).estimate(state, job, job_queue(state, job))
    if est is None:
        return None
    end = told_end(est, job, now) if job.status in _ENDS_BY_ESTIMATE else None
    outrun = end is None and job.status in _ENDS_BY_ESTIMATE
    return {"seconds": est.seconds, "source": est.source, "samples": est.samples, "about": est.about,
            "text": est.describe(), "expected_end": end, "outrun": outrun}


def estimate_lines(estimate: dict[str, Any] | None, job: Job, now: float) -> list[tuple[str, str]]:
    """`estimate` and, for a placed gang, `ends` (key, value) for the human views of a job not over."""
    if job.status in TERMINAL:
        return []
    if estimate is None:
        who = f" by {job.submitted_by}" if job.submitted_by else ""
        return [("estimate", f"not known: fewer than {MIN_SAME_NAME} completed runs of {job.spec.name!r}{who} in "
                             f"its queue, and fewer than {MIN_SAME_SIZE} of its user's {job.spec.total_gpus}-GPU "
                             "jobs there")]
    out = [("estimate", estimate["text"])]
    end = estimate["expected_end"]
    if estimate["outrun"]:
        out.append(("ends", "not known: it has run longer than its estimate, which is no guide to it"))
    elif end is not None:
        clock = LogClock(simulated=now < SIMULATED_BEFORE_S)
        out.append(("ends", f"{clock.instant(end)} (in {human_duration(end - now)}, by the estimate)"))
    return out


def job_start(state: ClusterState, job: Job, now: float) -> dict[str, Any] | None:
    """When a pending job holding a reservation is expected to start, as of `now` (estimates.expected_start:
    never a moment already past; `at` None: not known), for `corral job` and `corral explain` alike."""
    pol = running_policies(state)
    start = expected_start(state, job, now, pol.stop_margin_s, pol.estimate)
    return None if start is None else {"at": start.at, "why": start.why}


def start_lines(start: dict[str, Any] | None, now: float) -> list[tuple[str, str]]:
    """`starts` (key, value) for the human views of a reservation holder."""
    if start is None:
        return []
    if start["at"] is None:
        return [("starts", start["why"])]
    clock = LogClock(simulated=now < SIMULATED_BEFORE_S)
    when = "now" if start["at"] <= now else f"in {human_duration(start['at'] - now)}"
    return [("starts", f"{clock.instant(start['at'])} ({when}, {start['why']})")]


_CLAIM_FROM = {LIMIT: "its time limit", "job": "the learned run time of its name's past runs",
               "gpus": "the learned run time of its queue's jobs of its size", "queue": "the learned run time of its queue's jobs"}


def job_line(job: Job, now: float, pol: Policies) -> dict[str, Any] | None:
    """A pending job's place in its queue's line (its claim and where it comes from) and its starvation bound.

    The claim is what the fold ordered its line by when it joined (estimates.claim_of:
    GPUs x time limit, else x the learned run time, less the service already attained);
    `starving_from` is when a gang of BIG_GANG_GPUS or more may stop running gangs to start
    (core/starving.py, `Policies.starvation_bound_s`, or relative to its run time, as `pol` -- the running
    policy's record -- says); None for smaller jobs or a policy without the bound. None: not pending.
    """
    if job.status != "pending":
        return None
    from orchestrator.core.starving import bound_for, starving_from  # (only a pending job's bound needs them)

    bound = bound_for(job, pol.starvation_bound_s, pol.starvation_bound_factor, pol.starvation_bound_floor_s)
    at = starving_from(job, pol.starvation_bound_s, pol.starvation_bound_factor, pol.starvation_bound_floor_s)
    return {"claim_gpu_s": job.claim, "claim_from": job.claim_from or None, "waiting_since": job.waiting_since,
            "starving_from": at, "starvation_bound_s": bound if at is not None else None,
            "starving": at is not None and now >= at}


def line_lines(line: dict[str, Any] | None, job: Job, now: float) -> list[tuple[str, str]]:
    """`claim` and, for a big gang, `starvation` (key, value) for the human views of a pending job."""
    if line is None:
        return []
    clock = LogClock(simulated=now < SIMULATED_BEFORE_S)
    source = line["claim_from"]
    if source is None:
        claim = "none known yet (no time limit, nothing like it completed): in arrival order, ahead of claims"
    else:
        earlier = f", less {job.attained_s / 3600:.1f} GPU-h served before" if job.attained_s > 0 else ""
        claim = (f"{line['claim_gpu_s'] / 3600:.1f} GPU-h ({job.spec.total_gpus} GPUs x "
                 f"{_CLAIM_FROM.get(source, source)}{earlier}): smaller claims go first in its queue")
    out = [("claim", claim)]
    at = line["starving_from"]
    if at is not None:
        bound = human_duration(line["starvation_bound_s"])
        if line["starving"]:
            out.append(("starvation", f"starving since {clock.instant(at)} (pending past the {bound} bound): "
                                      "may preempt the cheapest running gangs to start"))
        else:
            out.append(("starvation", f"not yet: starving from {clock.instant(at)}, will preempt at "
                                      f"{clock.instant(at)} if it still waits ({bound} bound)"))
    return out


def job_detail(state: ClusterState, job: Job, now: float) -> dict[str, Any]:
    """Everything about one job for `corral job --json`: the summary, its spec, ranks, recovery facts and
    the run time expected of it (`job_estimate`)."""
    from nodeagent.runtime.base import WorkerLabels  # (the agent's name for a worker's log file)

    ranks = rank_states(state, job)
    rank_rows = []
    for rp in job.placement:
        rs = ranks.get(rp.rank)
        rank_rows.append({
            "rank": rp.rank,
            "node_id": rp.node_id,
            "gpus": list(rp.gpus),
            "status": rs.status if rs else "not started",
            "exit_code": rs.exit_code if rs else None,
            "reason": rs.reason if rs else "",
            # A time is told apart from "not reported" by the status (a simulated clock starts at 0).
            "started_at": rs.started_at if rs else None,
            "exited_at": rs.exited_at if rs and rs.status != "started" else None,
            # Where its output is: on its node, under the agent's --data-dir (`corral logs` reads it over NATS).
            "log": f"{rp.node_id}/logs/{WorkerLabels(rp.node_id, job.job_id, job.attempt, rp.rank, rs.restarts).name}"
                   ".log" if rs else None,
        })
    return {
        **job_summary(state, job),
        "spec_queue": job.spec.queue,
        "restarts": job.restarts,
        "max_restarts": job.spec.max_restarts,
        "checkpoint": _builtins(job.checkpoint),
        "resume_from": job.resume_from,
        "preemptor": job.preemptor or None,
        "stop": _builtins(job.stop),
        "time_limit_s": job.spec.time_limit_s,
        "reservation": job.spec.reservation_name,
        "last_update": job.last_update or None,
        "update_asked": [_builtins(a) for a in state.update_asks.values() if a.job_id == job.job_id],
        "failure": job.failure or None,
        "staging": _builtins(job.staging),
        "earmark": _builtins(job.earmark),
        "estimate": job_estimate(state, job, now),
        "expected_start": job_start(state, job, now),
        "line": job_line(job, now, running_policies(state)),
        "rank_states": rank_rows,
        "spec": _builtins(job.spec),
    }


def daytwo_lines(state: ClusterState, job: Job) -> list[tuple[str, str]]:
    """`corral job`: its time limit, reservation, and `corral update` applied or asked (README "Day-two controls")."""
    out: list[tuple[str, str]] = []
    limit = job.spec.time_limit_s
    if limit is not None:
        out.append(("time limit", human_duration(limit)))
    if job.spec.reservation_name is not None:
        out.append(("reservation", job.spec.reservation_name))
    if job.last_update:
        out.append(("updated", job.last_update))
    if any(a.job_id == job.job_id for a in state.update_asks.values()):
        out.append(("update", "asked, not answered by the scheduler yet"))
    return out


def staging_lines(job: Job) -> list[tuple[str, str]]:
    """`corral job`: the datasets and the newest attempt's staging, per node (#33)."""
    datasets = job.spec.dataset_list
    if not datasets:
        return []
    out = [("datasets", ", ".join(f"{d.name} ({d.source} at {d.mount})" for d in datasets)
            + ("; locality require" if job.spec.locality_mode == "require" else ""))]
    s = job.staging
    if s is None:
        return out
    if s.ready:
        phase = f"attempt {s.attempt}: all ready after {s.ready_at - s.started_at:.1f}s"
    elif s.failed:
        phase = f"attempt {s.attempt}: failed: {s.failed}"
    else:
        phase = f"attempt {s.attempt}: staging"
    out.append(("staging", phase))
    for i in s.items:
        if i.ready:
            how = "cache hit, 0 bytes staged" if i.cached else f"staged {i.staged_bytes} bytes"
            what = f"ready, {i.size_bytes} bytes ({how}) in {i.ready_at - i.since:.1f}s"
        else:
            what = f"{i.bytes_done}" + (f" of {i.bytes_total}" if i.bytes_total else "") + " bytes"
        out.append(("", f"  {i.dataset} on {i.node_id}: {what}"))
    return out


def readable(text: str, now: float) -> str:
    """`text` with the scheduler's `t=SECONDS` (a reservation's expected start) on the clock `now` is on:
    a simulation's, which starts at 0 (`d9 07:48:15.000`), else Unix time. For people; --json keeps it raw."""
    return LogClock(simulated=now < SIMULATED_BEFORE_S).moments(text)


def job_lines(state: ClusterState, job: Job, now: float) -> list[str]:
    """`corral job JOB` for humans: aligned key/value lines, then one line per rank."""
    d = job_detail(state, job, now)
    spec = job.spec
    kv: list[tuple[str, str]] = [
        ("job", f"{job.job_id} ({spec.name})"),
        ("status", f"{job.status} for {human_duration(job_age(job, now))}"),
        ("user", job.submitted_by or "-"),
        ("queue", d["queue"] + (f" (spec asked for {spec.queue})" if spec.queue != d["queue"] else "")),
        ("shape", f"{spec.ranks} rank(s) x {spec.gpus_per_rank} GPU(s)"
                  + (f" {spec.gpu_model}" if spec.gpu_model else "")
                  + (f", {spec.topology.mode} one {spec.topology.level}" if spec.topology else "")),
        ("priority", f"{spec.priority}{'' if spec.preemptible else ' (not preemptible)'}"),
        ("attempt", f"{job.attempt} (gang restarts {job.restarts}/{spec.max_restarts})"),
    ]
    kv.extend(daytwo_lines(state, job))
    if spec.working_dir is not None:
        kv.append(("workdir", spec.working_dir))
    if job.placement:
        kv.append(("placement", placement_summary(job.placement)))
    kv.extend(staging_lines(job))
    gate = gate_reason(state, job)
    if gate is not None:
        kv.append(("pending", f"gated: {gate}"))
    elif job.status == "pending":
        kv.append(("pending", readable(waiting_text(state, job), now)))
    kv.extend(start_lines(d["expected_start"], now))
    kv.extend(estimate_lines(d["estimate"], job, now))
    kv.extend(line_lines(d["line"], job, now))
    if job.status == "preempting":
        kv.append(("preempted for", job.preemptor))
    if job.stop is not None:
        kv.append(("stop", f"{job.stop.reason or 'cancel requested'} by {job.stop.requested_by or '?'}"))
    if job.checkpoint is not None:
        c = job.checkpoint
        kv.append(("checkpoint", f"step {c.step} (attempt {c.attempt}, rank {c.rank}) {c.path}"))
    if job.resume_from:
        kv.append(("resumes from", job.resume_from))
    if job.placement and job.status != "pending":
        kv.append(("logs", f"`corral logs {job.job_id} --rank R [-f]`; on each rank's node under its agent's "
                           f"--data-dir: <node>/logs/corral-<node>-{job.job_id}-a{job.attempt}-r<rank>-x<restart>.log"))
    if job.failure:
        kv.append(("failure", job.failure))
    if job.end_reason:
        kv.append(("ended", job.end_reason))
    width = max(len(k) for k, _ in kv)
    out = [f"{k:<{width}}  {v}" for k, v in kv]
    if d["rank_states"]:
        out.append("ranks:")
        clock = LogClock(simulated=now < SIMULATED_BEFORE_S)
        for r in d["rank_states"]:
            code = "" if r["exit_code"] is None else f" exit={r['exit_code']}"
            why = f" {r['reason']}" if r["reason"] else ""
            times = "" if r["started_at"] is None else f" started {clock.instant(r['started_at'])}"
            if r["exited_at"] is not None:
                times += f" exited {clock.instant(r['exited_at'])}"
            out.append(f"  rank {r['rank']:<3} {r['node_id']} gpus={','.join(map(str, r['gpus']))} "
                       f"{r['status']}{why}{code}{times}")
        if job.status in TERMINAL and len(job.placement) > len(job.final_ranks) >= FINAL_RANKS_KEPT:
            out.append(f"  (the fold keeps the first {FINAL_RANKS_KEPT} ranks of a finished job: "
                       f"`corral explain {job.job_id}` has them all)")
    return out


# --- nodes ---------------------------------------------------------------------------


def _natural(text: str) -> tuple[Any, ...]:
    """`node-2` before `node-10`."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def sorted_nodes(state: ClusterState) -> list[Node]:
    """Nodes by name, numbers in names compared as numbers."""
    return sorted(state.nodes.values(), key=lambda n: _natural(n.node_id))


def node_state(node: Node) -> str:
    if node.failed:
        return "failed"
    return "cordoned" if node.cordoned else "drained" if node.drained else "ready"


def gpu_health(node: Node) -> list[dict[str, Any]]:
    """Every GPU of the node with its health: healthy, or the fault that took it out of service."""
    faults = {f.index: f for f in node.gpu_faults}
    out = []
    for g in node.inventory.gpus:
        f = faults.get(g.index)
        out.append({"index": g.index, "uuid": g.uuid, "healthy": f is None,
                    "reason": f.reason if f else None, "xid": f.xid if f else None,
                    "source": f.source if f else None, "since": f.since if f else None})
    return out


def health_text(node: Node) -> str:
    """`8 ok`, or `7 ok, 3=Xid 79`: the node's GPUs out of service and why (the reason's first words)."""
    ok = node.inventory.gpu_count - len(node.gpu_faults)
    bad = [f"{f.index}={(f'Xid {f.xid}' if f.xid is not None else f.reason)[:24]}" for f in node.gpu_faults]
    return ", ".join([f"{ok} ok", *bad])


def gpu_runs(owners: tuple[str, ...]) -> list[tuple[int, int, str]]:
    """Contiguous GPU index runs with one owner: (first, last, owner)."""
    runs: list[tuple[int, int, str]] = []
    for i, o in enumerate(owners):
        if runs and runs[-1][2] == o and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i, o)
        else:
            runs.append((i, i, o))
    return runs


def gpu_map(owners: tuple[str, ...]) -> str:
    """`0-7=job-a 8=free`: who holds which GPU of a node."""
    return " ".join(
        f"{a if a == b else f'{a}-{b}'}={o or 'free'}" for a, b, o in gpu_runs(owners)
    )


def node_summary(state: ClusterState, node: Node) -> dict[str, Any]:
    owners = state.owners.get(node.node_id, ())
    inv = node.inventory
    used = sum(1 for o in owners if o != FREE)
    marks = state.earmarks.get(node.node_id, ())
    return {
        "node_id": node.node_id,
        "state": node_state(node),
        "cordoned": node.cordoned,
        "failed": node.failed,
        "drained": node.drained or None,
        "gpu_health": gpu_health(node),
        "gpus": len(owners),
        "used": used,
        "free": sum(1 for i, o in enumerate(owners) if o == FREE and i not in node.unhealthy_gpus),
        "model": inv.gpus[0].model if inv.gpus else None,
        "labels": dict(sorted(inv.labels.items())),
        "address": node.address,
        "owners": [o or None for o in owners],
        "earmarks": [m or None for m in marks] if marks else [],
        "jobs": list(dict.fromkeys(o for o in owners if o != FREE)),
        "datasets": list(node.datasets),
    }


NODES_HEADERS = ("NODE", "STATE", "USED", "FREE", "GPU HEALTH", "MODEL", "LABELS", "JOBS")


def nodes_rows(state: ClusterState) -> list[list[Any]]:
    rows = []
    for node in sorted_nodes(state):
        n = node_summary(state, node)
        labels = ",".join(f"{k}={v}" for k, v in n["labels"].items()) or "-"
        rows.append([n["node_id"], n["state"], f"{n['used']}/{n['gpus']}", n["free"], health_text(node),
                     n["model"] or "-", labels, " ".join(n["jobs"]) or "-"])
    return rows


# --- queues --------------------------------------------------------------------------


def queue_loads(state: ClusterState, now: float) -> list[QueueLoad]:
    """Every queue (defined or charged) with its GPUs, guarantee, limit and fair-share usage."""
    names = [*state.queues, *(q for q in state.usage if q not in state.queues)]
    half_life = state.config.fairshare_half_life_s
    out = []
    for name in names:
        q = state.queues.get(name)
        u = state.usage.get(name)
        out.append(
            QueueLoad(
                name=name,
                weight=q.weight if q else 1.0,
                guaranteed=q.guaranteed_gpus if q else 0,
                limit=q.limit_gpus if q else None,
                gpus=u.gpus if u else 0,
                usage=average_gpus(u, now, half_life) if u else 0.0,
            )
        )
    return out


def queue_summaries(state: ClusterState, now: float) -> list[dict[str, Any]]:
    """Every queue (defined, or charged without a definition) with usage, quotas and job counts."""
    pending: dict[str, int] = {}
    running: dict[str, int] = {}
    for jid in state.pending:
        qn = job_queue(state, state.jobs[jid])
        pending[qn] = pending.get(qn, 0) + 1
    for jid in state.active:
        qn = job_queue(state, state.jobs[jid])
        running[qn] = running.get(qn, 0) + 1
    loads = {load.name: load for load in queue_loads(state, now)}
    names = [*loads, *(qn for qn in dict.fromkeys([*pending, *running]) if qn not in loads)]
    out = []
    for name in names:
        q = state.queues.get(name)
        u = state.usage.get(name)
        load = loads.get(name)
        out.append({
            "queue": name,
            "defined": q is not None,
            "weight": q.weight if q else 1.0,
            "guaranteed_gpus": q.guaranteed_gpus if q else 0,
            "limit_gpus": q.limit_gpus if q else None,
            "parent": q.parent if q else None,
            "gpus": u.gpus if u else 0,
            "tree_gpus": u.tree_gpus if u else 0,
            "fair_share_usage": load.usage if load else 0.0,
            "pending": pending.get(name, 0),
            "active": running.get(name, 0),
        })
    return out


QUEUES_HEADERS = ("QUEUE", "USED", "GUARANTEE", "LIMIT", "WEIGHT", "PENDING", "ACTIVE", "PARENT")


def queues_rows(summaries: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [q["queue"] + ("" if q["defined"] else " (undefined)"),
         q["gpus"] if q["tree_gpus"] == q["gpus"] else f"{q['gpus']} (tree {q['tree_gpus']})",
         q["guaranteed_gpus"], "-" if q["limit_gpus"] is None else q["limit_gpus"], f"{q['weight']:g}",
         q["pending"], q["active"], q["parent"] or "-"]
        for q in summaries
    ]


# --- the whole cluster (replay --at, top) --------------------------------------------------


def pending_summaries(state: ClusterState) -> list[dict[str, Any]]:
    """Pending jobs in line order with the scheduler's reason."""
    out = []
    for jid in state.pending:
        job = state.jobs[jid]
        w = job.waiting
        gate = gate_reason(state, job)
        out.append({
            "job_id": jid,
            "name": job.spec.name,
            "queue": job_queue(state, job),
            "priority": job.spec.priority,
            "gpus": job.spec.total_gpus,
            "attempt": job.attempt,
            "code": "gated" if gate is not None else w.code if w else None,
            "message": gate if gate is not None else w.message if w else None,
            "place": line_place(state, job),
        })
    return out


def status_counts(state: ClusterState) -> dict[str, int]:
    counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for job in state.jobs.values():
        counts[job.status] = counts.get(job.status, 0) + 1
    return counts


def cluster_summary(state: ClusterState, now: float) -> dict[str, Any]:
    """The cluster at the state's log position: GPUs, queues, pending jobs (what `replay --at` prints)."""
    return {
        "seq": state.seq,
        "epoch": state.epoch,
        "scheduler_id": state.scheduler_id or None,
        "nodes": [node_summary(state, n) for n in sorted_nodes(state)],
        "queues": queue_summaries(state, now),
        "pending": pending_summaries(state),
        "active": [job_summary(state, state.jobs[j]) for j in state.active],
        "jobs": status_counts(state),
        "voids": state.voids,
    }
