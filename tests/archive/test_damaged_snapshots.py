"""#39 acceptance 2: a damaged or missing snapshot never stops the cluster, with retention on.

Real processes on a real nats-server: `corral archive` with a stream limit of one byte (retention purges
all it may, as soon as it may), `corral scheduler` snapshotting every few events, one `corral agent`
(simulated GPUs) and `corral index`. The test damages the snapshots through nats-py's own object store
API, not corral's:

* the newest one, three times over (truncated, a flipped byte, deleted), each time with the scheduler,
  the agent and the index stopped: all three start again, the scheduler from the next older snapshot
  (whose tail retention kept in the stream), naming the damaged one and why in its log, and the next job
  completes;
* then every snapshot, and the agent's node view too: without `--archive` the scheduler and the agent
  exit non-zero naming the positions the stream lacks and the flag; with it, all three start (the
  scheduler and the agent read the log's start from the archive) and the next job completes.

Afterwards an independent count (the archive's segments and the stream read with nats-py and json, not
corral's readers) says every job was reserved once and completed once, and the agent's own log says each
worker started once: no damaged snapshot was folded into a state that ran anything twice.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import nats
import pytest

from events.archive import Archive
from events.bus import Bus
from events.follow import Follower
from events.history import History
from events.sdk import Client
from events.server import NatsServer
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import JobSpec
from tests.archive.segcheck import read_archive, read_stream
from tests.cli.conftest import corral
from tests.faults.services import Proc, agent_proc, logged_starts, stop_all, until
from tests.index.test_cli import _until_indexed
from tests.integration.harness import start_corral

#: The names nats-py and the scheduler use (spelled out: this test reads them without corral's code).
SNAPSHOTS = "corral-snapshots"
NODEVIEWS = "corral-nodeviews"
KEEP = 4
NODE = "n0"

Damage = Callable[[bytes], bytes]


def _flip(data: bytes) -> bytes:
    b = bytearray(data)
    b[-1] ^= 0xFF  # the body's last byte (compressed or not): what a bad disk block does to a file's tail
    return bytes(b)


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]  # a write cut short


class Cluster:
    """The services of one test, each a real `corral` process; the archive; an observer on archive + stream."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.archive = tmp / "archive"
        self.archive.mkdir()
        self.node_dir = tmp / "node"
        self.node_dir.mkdir()
        self.starts = 0
        self.procs: dict[str, Proc] = {}

    def _log(self, name: str) -> Path:
        self.starts += 1
        return self.tmp / f"{self.starts:02d}-{name}.log"

    def start_archiver(self) -> None:
        self.procs["archiver"] = start_corral(
            "--nats", self.url, "archive", "--path", str(self.archive), "--max-bytes", "1", "--segment-events", "10",
            "--segment-seconds", "0.2", "--purge-every", "0.2", "--log-level", "info", log=self._log("archiver"))

    def start_scheduler(self, *, archive: bool = False) -> Proc:
        arch = ("--archive", str(self.archive)) if archive else ()
        proc = self.procs["scheduler"] = start_corral(
            "--nats", self.url, *arch, "scheduler", "--id", f"s{self.starts}", "--lease-ttl", "1.5", "--tick", "0.2",
            "--heartbeat-timeout", "60", "--snapshot-every", "10", "--log-level", "info",
            log=self._log("scheduler"))
        return proc

    def start_agent(self, *, archive: bool = False) -> Proc:
        # Every start appends to NODE_DIR/agent-n0.log (agent_proc): this start's lines begin at `own_start`.
        mine = self.node_dir / f"agent-{NODE}.log"
        start = mine.stat().st_size if mine.exists() else 0
        env = {"CORRAL_ARCHIVE": str(self.archive)} if archive else {}
        proc = self.procs["agent"] = agent_proc(self.url, NODE, self.node_dir, env=env)
        proc.own_start = start  # type: ignore[attr-defined]
        return proc

    def start_index(self) -> Proc:
        proc = self.procs["index"] = start_corral(
            "--nats", self.url, "index", "--data-dir", str(self.tmp / "index"), "--archive", str(self.archive),
            "--log-level", "info", log=self._log("index"))
        return proc

    def alive(self) -> list[Proc]:
        return list(self.procs.values())

    def stop(self, *names: str) -> None:
        codes = stop_all([self.procs.pop(n) for n in names])
        assert codes == [0] * len(names), dict(zip(names, codes, strict=True))


def log_of(proc: Proc) -> str:
    """What this start of the process logged (an agent's log file is shared by its starts)."""
    data = Path(proc.corral_log).read_bytes()  # type: ignore[attr-defined]
    return data[getattr(proc, "own_start", 0):].decode(errors="replace")


def records(proc: Proc, event: str) -> list[dict[str, object]]:
    out = []
    for line in log_of(proc).splitlines():
        if f'"{event}"' in line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("event") == event:
                out.append(rec)
    return out


async def logged(proc: Proc, event: str, timeout: float = 60) -> dict[str, object]:
    """The first `event` line this start of `proc` logs (it must stay alive meanwhile)."""
    async with asyncio.timeout(timeout):
        while not (found := records(proc, event)):
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args!r} exited {proc.returncode} before logging {event}:\n"
                                     f"{log_of(proc)[-3000:]}")
            await asyncio.sleep(0.1)
    return found[0]


async def exited(proc: Proc, timeout: float = 60) -> tuple[int, str]:
    try:
        rc = await asyncio.to_thread(proc.wait, timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{proc.args!r} did not stop by itself:\n{log_of(proc)[-3000:]}") from None
    return rc, log_of(proc)


async def snapshot_names(js: nats.js.JetStreamContext) -> list[str]:
    """The scheduler's stored snapshots, newest first (names end in the 15-digit position)."""
    try:
        infos = await (await js.object_store(SNAPSHOTS)).list()
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
        return []  # none written yet
    names = [i.name for i in infos if i.name.startswith("scheduler.") and not i.deleted]
    return sorted(names, key=lambda n: int(n.rsplit(".", 1)[1]), reverse=True)


def seq_of(name: str) -> int:
    return int(name.rsplit(".", 1)[1])


async def damage(js: nats.js.JetStreamContext, name: str, how: Damage | None) -> None:
    """Rewrite object `name` as `how` spoils it (None: delete it), with nats-py alone."""
    obs = await js.object_store(SNAPSHOTS)
    if how is None:
        await obs.delete(name)
        return
    data = (await obs.get(name)).data
    assert data
    await obs.put(name, how(data))


async def submit_and_complete(bus: Bus, observer: Follower[ClusterState], job_id: str, alive: list[Proc]) -> None:
    await Client(bus, user="alice").submit(JobSpec(name=job_id, queue="default", ranks=1, gpus_per_rank=2,
                                                   command=("sleep", "0.05")), job_id=job_id)
    await until(observer, lambda s: s.jobs[job_id].status == "completed", 90, f"job {job_id} completed", alive=alive)


async def stream_first(js: nats.js.JetStreamContext) -> int:
    return int((await js.stream_info("CORRAL")).state.first_seq)


@pytest.mark.timeout(300)
async def test_damaged_snapshots_with_retention_on_do_not_stop_the_cluster(nats_server: NatsServer,
                                                                          tmp_path: Path) -> None:
    c = Cluster(nats_server.url, tmp_path)
    c.start_scheduler()
    bus = await Bus.connect(c.url)
    nc = await nats.connect(c.url)
    js = nc.jetstream()
    observer = Follower(History(bus, Archive(c.archive)), evolve, ClusterState())
    watching = asyncio.create_task(observer.follow())
    jobs: list[str] = []
    try:
        c.start_archiver()
        c.start_agent()
        c.start_index()
        await until(observer, lambda s: NODE in s.nodes and s.nodes[NODE].schedulable, 60, "the node registered",
                    alive=c.alive())
        # Jobs until retention is at work: every snapshot the store keeps is there, and the archive holds the
        # newest one's position (a purge up to the NEWEST snapshot would have cut the older ones' tails: #39's
        # failure), and the stream no longer starts at 1.
        for i in range(40):
            names = await snapshot_names(js)
            archived = read_archive(c.archive)
            first = await stream_first(js)
            if len(names) == KEEP and archived and archived[-1][0] >= seq_of(names[0]) and first > 1:
                break
            jobs.append(f"w{i}")
            await submit_and_complete(bus, observer, jobs[-1], c.alive())
            await asyncio.sleep(0.5)  # (the scheduler looks for a due snapshot every second)
        else:
            raise AssertionError(f"retention never cut: snapshots {names}, archive to "
                                 f"{archived[-1][0] if archived else None}, stream from {first}")

        # The newest snapshot damaged three ways: the scheduler starts from the next older one.
        newest: list[tuple[Damage | None, str | None]] = [(_truncate, "truncated"), (_flip, "checksum mismatch"),
                                                          (None, None)]
        damaged: dict[str, str] = {}  # name -> what its skip line says (a deleted one is gone from the list)
        for how, says in newest:
            c.stop("scheduler", "agent", "index")
            names = await snapshot_names(js)
            await damage(js, names[0], how)
            if says is not None:
                damaged[names[0]] = says
            names = await snapshot_names(js)
            usable = [n for n in names if n not in damaged]
            first = await stream_first(js)
            assert 1 < first <= seq_of(names[-1]) + 1, (first, names)  # retention kept every kept snapshot's tail
            sched, agent, index = c.start_scheduler(), c.start_agent(), c.start_index()
            caught_up = await logged(sched, "caught_up")
            assert caught_up["from_snapshot"] == seq_of(usable[0]), (caught_up, names, damaged)
            # Each damaged snapshot newer than that one is named, with why; none is folded.
            skipped = [(r["name"], str(r["reason"])) for r in records(sched, "snapshot_skipped") if r["name"] in names]
            assert [n for n, _ in skipped] == [n for n in names if n in damaged and seq_of(n) > seq_of(usable[0])]
            assert all(damaged[n] in why for n, why in skipped), skipped
            await logged(agent, "caught_up")
            await logged(index, "index_serving")
            jobs.append(f"after-{says or 'deleted'}".replace(" ", "-"))
            await submit_and_complete(bus, observer, jobs[-1], c.alive())

        # Every snapshot damaged, and the node's view too: the log's start is only in the archive.
        c.stop("scheduler", "agent", "index")
        names = await snapshot_names(js)
        # Those the rounds above left whole: newest first truncated, flipped, ... alternately, the oldest deleted
        # (not flipped twice: that would mend it).
        whole = [n for n in names if n not in damaged]
        assert whole and len(names) >= 3, (names, damaged)
        for i, name in enumerate(whole):
            if i == len(whole) - 1 and i > 0:
                await damage(js, name, None)
                continue
            how, says = ((_truncate, "truncated"), (_flip, "checksum mismatch"))[i % 2]
            await damage(js, name, how)
            damaged[name] = says
        names = await snapshot_names(js)
        assert all(n in damaged for n in names), (names, damaged)
        kv = await js.key_value(NODEVIEWS)
        await kv.put(NODE, _flip((await kv.get(NODE)).value or b""))
        first = await stream_first(js)
        assert first > 1

        # Without the archive: a loud stop naming the positions and the flag (never a state over a hole).
        for proc in (c.start_scheduler(), c.start_agent()):
            rc, text = await exited(proc)
            # (from 1 to where the stream starts now: the archiver may have purged more since `first`)
            named = re.search(r"seq 1\.\.(\d+) are not in the stream", text)
            assert rc != 0 and named is not None and int(named.group(1)) >= first - 1, text[-3000:]
            assert "--archive" in text, text[-3000:]
        del c.procs["scheduler"], c.procs["agent"]
        view = records(proc, "nodeview_skipped")  # (the agent's)
        assert [r["key"] for r in view] == [NODE] and "checksum mismatch" in str(view[0]["why"]), view

        # With it: the agent reads its slice from the archive's start, the scheduler the whole log.
        agent = c.start_agent(archive=True)
        agent_caught_up = await logged(agent, "caught_up")
        assert agent_caught_up["from_view"] == 0, agent_caught_up
        sched, index = c.start_scheduler(archive=True), c.start_index()
        caught_up = await logged(sched, "caught_up")
        assert caught_up["from_snapshot"] == 0, caught_up
        reasons = {str(r["name"]): str(r["reason"]) for r in records(sched, "snapshot_skipped")}
        assert all(damaged[n] in reasons.get(n, "") for n in names), (names, reasons)
        await logged(index, "index_serving")
        jobs.append("after-all")
        await submit_and_complete(bus, observer, jobs[-1], c.alive())
        last = await bus.last_seq()
        await _until_indexed(c.url, last, index)
        listed = await asyncio.to_thread(corral, "jobs", "--all", "--json", url=c.url)
        assert "reading the whole log" not in listed.stderr, listed.stderr
        assert {j["job_id"]: j["status"] for j in json.loads(listed.stdout)["jobs"]} == \
            dict.fromkeys(jobs, "completed")
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        stop_all(list(c.procs.values()))
        await bus.close()
        await nc.close()

    # The independent count: every position once (archive, then what the stream still holds), each job
    # reserved once and completed once; each worker started once by the agent.
    recs = {r[0]: r for r in read_archive(c.archive)}
    recs.update(await read_stream(c.url))
    assert sorted(recs) == list(range(1, max(recs) + 1))
    reserved: Counter[str] = Counter()
    completed: Counter[str] = Counter()
    for _, _, _, data in sorted(recs.values()):
        ev = json.loads(data)
        if ev["type"] == "GangReserved":
            reserved[ev["job_id"]] += 1
        elif ev["type"] == "JobCompleted":
            completed[ev["job_id"]] += 1
    assert reserved == completed == Counter(jobs), (reserved, completed)
    starts = logged_starts([c.node_dir / f"agent-{NODE}.log"])
    assert sorted(starts) == sorted((j, 1, 0) for j in jobs) and set(starts.values()) == {1}, starts


async def test_retention_keeps_the_tail_of_the_oldest_kept_snapshot_and_of_the_views(bus: Bus) -> None:
    """The archiver's bound (orchestrator/archiver.py: RestartPoints): the OLDEST kept snapshot's position, or
    the node views' base where that is older; no snapshot: keep everything."""
    from events.nodeviews import NodeViewStore
    from events.snapshots import SnapshotStore
    from orchestrator.archiver import RestartPoints
    from orchestrator.core.node_view import NodeView

    points = RestartPoints(bus.js)
    assert await points() == 0
    store = SnapshotStore(bus.js, keep=3)
    for seq in (10, 20, 30, 40):
        await store.save(ClusterState(seq=seq))
    assert await store.seqs() == [40, 30, 20]
    assert await points() == 20, "the oldest kept snapshot, not the newest"
    views = NodeViewStore(bus.js)
    await views.save([], 35, NodeView(node_id=""))
    assert await points() == 20
    await views.save([], 15, NodeView(node_id=""))
    assert await points() == 15, "an agent starts from its view: the views' base bounds the cut too"
