"""A dependency on a 2,000-task array, and a chain, through 10 SIGKILLs of the leading scheduler (#39).

Fault: two `corral scheduler` processes share the log; the leader is SIGKILLed every second or two and a
fresh process started in its place. The dependents name the array once (`after_ok_arrays`): the fold's
counters settle them, whatever the restarts. Check (tests/faults/array_deps_check.py, which reads the stream
with plain nats-py and json and imports nothing of corral): every task ran exactly once, every dependent
started only after its parents completed (or ended, for after-any).
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.model.state import TERMINAL
from schemas import ArrayElement, Gates, JobSpec
from tests.faults import array_deps_check
from tests.faults.services import Proc, kill, observer, scheduler_proc, stop_all, until
from tests.integration.harness import agents

pytestmark = pytest.mark.slow

TASKS = 2000
CHAIN = 10
KILLS = 10
#: Few GPUs (8), so that the 2,000 tasks take long enough for ten kills to land while work is left.
NODES = 1


def test_the_checker_imports_nothing_of_corral() -> None:
    tree = ast.parse(Path(array_deps_check.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= {"__future__", "contextlib", "json", "nats"}, names


async def test_array_dependencies_survive_scheduler_kills(nats_server: NatsServer, bus: Bus, tmp_path: Path) -> None:
    url = nats_server.url
    generation = 0

    def new_scheduler() -> tuple[str, Proc]:
        nonlocal generation
        generation += 1
        sid = f"s{generation}"
        return sid, scheduler_proc(url, sid, tmp_path, snapshot_every=500)

    procs = dict([new_scheduler(), new_scheduler()])
    tasks = [f"A_{i}" for i in range(TASKS)]
    dependents: dict[str, tuple[list[str], bool]] = {"after-any": (tasks, False), "c0": (tasks, True)}
    for i in range(1, CHAIN):
        dependents[f"c{i}"] = ([f"c{i - 1}"], True)
    kills = 0
    async with observer(bus) as follower:
        try:
            async with agents(bus, NODES, tmp_path / "agents"):
                await until(follower, lambda s: s.epoch >= 1 and len(s.nodes) == NODES, 60, "a leader and the nodes")
                client = Client(bus, user="test")
                run = ("sleep", "0.01")
                await client.submit_many(
                    (jid, JobSpec(name="t", command=run, restart_policy="never", gates=Gates(
                        array=ArrayElement(array_id="A", index=i, indexes=f"0-{TASKS - 1}", count=TASKS))))
                    for i, jid in enumerate(tasks))
                await client.submit(JobSpec(name="c", command=run, gates=Gates(after_ok_arrays=("A",))), job_id="c0")
                await client.submit(JobSpec(name="y", command=run, gates=Gates(after_any_arrays=("A",))),
                                    job_id="after-any")
                for i in range(1, CHAIN):
                    await client.submit(JobSpec(name="c", command=run, gates=Gates(after_ok=(f"c{i - 1}",))),
                                        job_id=f"c{i}")
                ids = [*tasks, *dependents]
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 150
                # Every kill lands while work is left (the loop ends when it all ended): the test fails if the
                # work ends before the tenth.
                done_at_kill: list[int] = []
                while not all((j := follower.state.jobs.get(x)) is not None and j.status in TERMINAL for x in ids):
                    assert loop.time() < deadline, f"not done in time ({kills} kills)"
                    await asyncio.sleep(1.0)
                    leader = follower.state.scheduler_id
                    if kills < KILLS and leader in procs and procs[leader].poll() is None:
                        kill(procs.pop(leader))
                        kills += 1
                        done_at_kill.append(sum(follower.state.jobs[x].status in TERMINAL for x in ids))
                        sid, proc = new_scheduler()
                        procs[sid] = proc
                    for sid, p in procs.items():
                        assert p.poll() is None, f"scheduler {sid} died: {(tmp_path / f'{sid}.log').read_text()[-3000:]}"
        finally:
            stop_all(list(procs.values()))
    print(f"{kills} leaders SIGKILLed; jobs ended at each kill: {done_at_kill}")
    events = await array_deps_check.read_events(url)
    assert array_deps_check.check(events, tasks, dependents) == []
    assert kills == KILLS
