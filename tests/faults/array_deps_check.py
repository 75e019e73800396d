"""An independent checker of dependencies through scheduler kills: the stream read with plain nats-py and json.

It imports nothing of corral (tests/faults/test_array_deps_kill.py asserts it): what it knows is the event
catalogue's JSON (type, job_id) and the rule under test -- every task runs exactly once (one WorkerStarted,
one JobCompleted), and a dependent's worker starts only after every parent completed (after-ok) or ended
(after-any), at log positions.
"""

from __future__ import annotations

import contextlib
import json

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

ENDS = ("JobCompleted", "JobFailed", "JobCancelled", "JobRejected")


async def read_events(url: str, stream: str = "CORRAL") -> list[tuple[int, dict[str, object]]]:
    """(stream seq, decoded JSON) of every message the stream holds, in order (undecodable ones skipped)."""
    nc = await nats.connect(url, max_reconnect_attempts=0, connect_timeout=2)
    out: list[tuple[int, dict[str, object]]] = []
    try:
        js = nc.jetstream(timeout=5)
        last = (await js.stream_info(stream)).state.last_seq
        cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, mem_storage=True,
                             inactive_threshold=30.0)
        psub = await js.pull_subscribe("corral.>", durable=None, stream=stream, config=cfg)
        seen = 0
        while seen < last:
            for m in await psub.fetch(1000, timeout=5):
                seen = m.metadata.sequence.stream
                with contextlib.suppress(ValueError, UnicodeDecodeError):
                    e = json.loads(m.data)
                    if isinstance(e, dict):
                        out.append((seen, e))
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return out


def check(events: list[tuple[int, dict[str, object]]], tasks: list[str],
          dependents: dict[str, tuple[list[str], bool]]) -> list[str]:
    """Every problem found: `tasks` must each start once and complete once; each dependent (parents, after-ok?)
    must start once, after every parent completed (after-ok) or ended (after-any), and complete."""
    starts: dict[str, list[int]] = {}
    ends: dict[str, list[tuple[int, str]]] = {}
    for seq, e in events:
        jid = e.get("job_id")
        if not isinstance(jid, str):
            continue
        if e.get("type") == "WorkerStarted":
            starts.setdefault(jid, []).append(seq)
        elif e.get("type") in ENDS:
            ends.setdefault(jid, []).append((seq, str(e["type"])))
    problems: list[str] = []
    for jid in [*tasks, *dependents]:
        if len(starts.get(jid, [])) != 1:
            problems.append(f"{jid} started {len(starts.get(jid, []))} times")
        if [t for _, t in ends.get(jid, [])] != ["JobCompleted"]:
            problems.append(f"{jid} ended {ends.get(jid, [])}, not completed once")
    for jid, (parents, ok) in dependents.items():
        first = min(starts.get(jid, [0]))
        for p in parents:
            done = [s for s, t in ends.get(p, []) if t == "JobCompleted" or not ok]
            if not done or min(done) > first:
                problems.append(f"{jid} started at {first} before {p} {'completed' if ok else 'ended'} ({done})")
    return problems
