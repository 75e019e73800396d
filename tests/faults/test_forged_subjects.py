"""Without auth anyone may publish anywhere: a payload on another type's or entity's subject is refused by every
reader (events/authorship.py, issue #39). A real nats-server; the forgeries go in as raw publishes."""

from __future__ import annotations

from contextlib import aclosing

from events.bus import Bus
from orchestrator.core.evolve import evolve, fold
from schemas import GpuUnhealthy, JobCompleted, NodeFailed, Unknown, WorkerStarted, encode
from schemas.events import REFUSED

FORGED = [
    ("corral.job.j1.JobSubmitted", GpuUnhealthy(event_id="f1", occurred_at=1.0, node_id="n2", gpu_index=0)),
    ("corral.job.j1.JobSubmitted", JobCompleted(event_id="f2", occurred_at=1.0, job_id="j2", attempt=1)),
    ("corral.node.n1.GpuUnhealthy", GpuUnhealthy(event_id="f3", occurred_at=1.0, node_id="n2", gpu_index=1)),
    ("corral.node.n1.NodeRegistered", NodeFailed(event_id="f4", occurred_at=1.0, node_id="n1", incarnation="i")),
    ("corral.job.j2.WorkerStarted.n1", WorkerStarted(event_id="f5", occurred_at=1.0, job_id="j2", attempt=1,
                                                     rank=0, node_id="n2")),
]


async def test_every_reader_refuses_an_event_off_its_subject(bus: Bus) -> None:
    for n, (subject, event) in enumerate(FORGED):
        await bus.js.publish(subject, encode(event), headers={"Nats-Msg-Id": f"forged-{n}"})
    fine = GpuUnhealthy(event_id="ok", occurred_at=1.0, node_id="n2", gpu_index=2)
    await bus.append(fine)  # on its own subject: counts

    got = []
    async with aclosing(bus.replay()) as batches:
        async for batch in batches:
            got += batch
    assert len(got) == len(FORGED) + 1
    for env in got[:-1]:
        assert isinstance(env.event, Unknown) and env.event.reason == REFUSED, env
        assert "refused" in env.event.error
    assert got[-1].event == fine
    state = fold(env.event for env in got)
    assert state.refused_events == len(FORGED)

    for subject, _ in FORGED[:2]:  # a single read (last_on) judges alike
        one = await bus.last_on(subject)
        assert one is not None and isinstance(one.event, Unknown) and one.event.reason == REFUSED
    assert evolve(fold([]), got[0].event).refused_events == 1
