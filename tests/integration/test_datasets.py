"""Datasets staged onto every node of a gang before its ranks start (#33), with a real scheduler, agents with the
process runtime, a real nats-server and a real HTTP server (`python -m http.server`) on loopback.

Cache entries are judged by the test's own checksums of their files (tests/dataset_source.py). Event order is
judged by stream sequence, never by clocks. `CORRAL_STAGE_BIG=1` stages 1 GB instead of 24 MB (by hand).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from events.bus import Bus
from events.follow import Follower
from events.sdk import Client
from nodeagent.datasets.cache import DatasetCache
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from orchestrator.core.staging import staged
from schemas import (
    DatasetEvicted,
    DatasetFailed,
    DatasetReady,
    DatasetStaging,
    GangRestarted,
    JobSpec,
    NodeDatasets,
    WorkerStarted,
)
from schemas.datasets import Dataset
from tests.dataset_source import (
    http_server,
    make_tar,
    make_tree,
    start_http_server,
    stop_http_server,
    tiny_disk,
    tree_sum,
    unused_url,
)
from tests.integration.harness import CORRAL, agents, processes, scheduler, wait_until

MB = 1 << 20
SIZE = 1024 * MB if os.environ.get("CORRAL_STAGE_BIG") == "1" else 24 * MB
#: A rank that fails unless its dataset is there, whole (the files make_tree writes).
CHECK = 'test -d "$CORRAL_DATASET_PILE/b/c" && test "$(ls "$CORRAL_DATASET_PILE/a" | wc -l)" = 4'


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(URL of a tar of a SIZE-byte random tree, sha256 of the tar, tree_sum of the tree)."""
    root = tmp_path_factory.mktemp("source")
    want = make_tree(root / "tree", SIZE)
    (root / "www").mkdir()
    sha = make_tar(root / "tree", root / "www" / "pile.tar")
    with http_server(root / "www") as url:
        yield f"{url}/pile.tar", sha, want


@pytest.fixture
async def follower(bus: Bus) -> AsyncIterator[Follower[ClusterState]]:
    f = Follower(bus, evolve, ClusterState())
    task = asyncio.create_task(f.follow())
    yield f
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def log_of(bus: Bus) -> list[tuple[int, object]]:
    return [(env.seq, env.event) async for batch in bus.replay() for env in batch]


def ended(job_id: str):  # type: ignore[no-untyped-def]
    return lambda s: job_id in s.jobs and s.jobs[job_id].status in ("completed", "failed", "cancelled")


def cli(url: str, *args: str) -> str:
    out = subprocess.run([CORRAL, "--nats", url, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_a_gang_starts_only_once_every_node_staged_and_a_second_job_hits_the_cache(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path, source: tuple[str, str, str],
        nats_server: object) -> None:
    url, sha, want = source
    pile = Dataset(name="pile", source=url, digest=f"sha256:{sha}", mount="/data/pile")
    spec = JobSpec(name="train", ranks=2, gpus_per_rank=8, datasets=(pile,), command=("sh", "-c", CHECK))
    async with scheduler(bus), agents(bus, 2, tmp_path, runtime=processes):
        await Client(bus).submit(spec, job_id="first")
        await wait_until(follower, ended("first"), 120, "the first job to end")
        await Client(bus).submit(spec, job_id="second")
        await wait_until(follower, ended("second"), 60, "the second job to end")
    state = follower.state
    assert state.jobs["first"].status == "completed", state.jobs["first"].end_reason
    assert state.jobs["second"].status == "completed", state.jobs["second"].end_reason
    log = await log_of(bus)
    nodes = {p.node_id for p in state.jobs["first"].placement}
    assert nodes == {"n0", "n1"}

    ready = {(e.job_id, e.node_id): (seq, e) for seq, e in log if isinstance(e, DatasetReady)}
    starts = {e.job_id: [] for _, e in log if isinstance(e, WorkerStarted)}  # type: ignore[var-annotated]
    for seq, e in log:
        if isinstance(e, WorkerStarted):
            starts[e.job_id].append(seq)
    # Staged once per node, by the first job: the whole archive; both nodes ready before any rank started.
    for node in nodes:
        seq, e = ready[("first", node)]
        assert not e.cached and e.staged_bytes > SIZE  # the archive: the files and their tar headers
        assert e.size_bytes == SIZE
    assert min(starts["first"]) > max(ready[("first", n)][0] for n in nodes), "a rank started before both were ready"
    # The second job: a cache hit on both nodes, 0 bytes staged, no staging progress at all.
    for node in nodes:
        seq, e = ready[("second", node)]
        assert e.cached and e.staged_bytes == 0
    assert min(starts["second"]) > max(ready[("second", n)][0] for n in nodes)
    assert not [e for _, e in log if isinstance(e, DatasetStaging) and e.job_id == "second"]
    assert sum(1 for _, e in log if isinstance(e, DatasetReady) and not e.cached) == 2
    # Each node's cache holds the tree, as the test itself sums it.
    for node in nodes:
        assert tree_sum(tmp_path / node / "datasets" / pile.key / "data") == want
        assert state.nodes[node].datasets == (pile.key,)
    # `corral explain` and `corral job` tell both stories.
    server_url = nats_server.url  # type: ignore[attr-defined]
    story = cli(server_url, "explain", "first")
    assert "staging dataset pile on n0" in story and "all datasets ready on every node after" in story
    assert "dataset pile ready on n1" in story and "(staged" in story
    again = cli(server_url, "explain", "second")
    assert again.count("cache hit, 0 bytes staged") == 2 and "staging dataset" not in again
    shown = cli(server_url, "job", "second")
    assert "staging" in shown and "all ready after" in shown and "pile on n0: ready" in shown
    warm = cli(server_url, "nodes", "--datasets")
    rows = [ln.split() for ln in warm.splitlines() if ln.startswith("n")]
    assert [(r[0], r[-4], r[-1]) for r in rows] == [("n0", "1", "pile"), ("n1", "1", "pile")], warm  # 1 dataset: pile
    nodes_json = json.loads(cli(server_url, "nodes", "--datasets", "--json"))["nodes"]
    assert [[d["key"] for d in n["datasets"]] for n in nodes_json] == [[pile.key], [pile.key]]


async def test_a_digest_mismatch_and_an_unreachable_source_end_the_attempt_with_the_reason(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path, source: tuple[str, str, str],
        nats_server: object) -> None:
    url, _, _ = source
    wrong = Dataset(name="pile", source=url, digest="sha256:" + "0" * 64, mount="/d")
    gone = Dataset(name="pile", source=unused_url(), mount="/d")
    async with scheduler(bus), agents(bus, 1, tmp_path, runtime=processes):
        await Client(bus).submit(JobSpec(name="m", gpus_per_rank=8, datasets=(wrong,), max_restarts=1,
                                         command=("true",)), job_id="mismatch")
        await wait_until(follower, ended("mismatch"), 90, "the mismatched job to end")
        await Client(bus).submit(JobSpec(name="u", gpus_per_rank=8, datasets=(gone,), max_restarts=0,
                                         command=("true",)), job_id="unreachable")
        await wait_until(follower, ended("unreachable"), 90, "the unreachable job to end")
    state = follower.state
    m, u = state.jobs["mismatch"], state.jobs["unreachable"]
    assert m.status == "failed" and u.status == "failed"
    assert m.end_reason.startswith("dataset pile on n0: digest mismatch: ") and "1 used" in m.end_reason
    assert u.end_reason.startswith("dataset pile on n0: cannot fetch http://127.0.0.1:"), u.end_reason
    log = await log_of(bus)
    restarts = [e for _, e in log if isinstance(e, GangRestarted) and e.job_id == "mismatch"]
    assert len(restarts) == 1 and "digest mismatch" in restarts[0].reason, "retried once, with backoff"
    assert [e.attempt for _, e in log if isinstance(e, DatasetFailed) and e.job_id == "mismatch"] == [1, 2]
    assert not [e for _, e in log if isinstance(e, WorkerStarted)], "no rank ever started"
    assert not [p for p in (tmp_path / "n0" / "datasets").iterdir() if p.name != ".tmp"], "nothing cached"
    assert not list((tmp_path / "n0" / "datasets" / ".tmp").iterdir())
    shown = cli(nats_server.url, "job", "unreachable")  # type: ignore[attr-defined]
    assert "cannot fetch http://127.0.0.1:" in shown


async def test_a_full_cache_evicts_the_least_recently_used_dataset_no_job_uses(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path) -> None:
    """Room for three: A stays in use by a running job, B then E complete; C evicts B (least recently used),
    never A (in use, and older than both)."""
    www = tmp_path / "www"
    www.mkdir()
    sets = {}
    for i, name in enumerate("ABEC"):
        make_tree(tmp_path / name, 2 * MB, seed=i + 1)
        sets[name] = Dataset(name="pile", source=f"/{name}", mount="/d",
                             digest="sha256:" + make_tar(tmp_path / name, www / f"{name}.tar"))
    hold = tmp_path / "release-A"
    with http_server(www) as base:
        sets = {n: Dataset(name="pile", source=f"{base}/{n}.tar", mount="/d", digest=d.digest) for n, d in sets.items()}
        limit = 3 * 2 * MB + MB // 2
        async with scheduler(bus), agents(bus, 1, tmp_path, runtime=processes, dataset_cache_bytes=limit):
            c = Client(bus)
            await c.submit(JobSpec(name="a", gpus_per_rank=4, datasets=(sets["A"],),
                                   command=("sh", "-c", f"while [ ! -e {hold} ]; do sleep 0.1; done")), job_id="A")
            await wait_until(follower, lambda s: s.jobs["A"].status == "running", 60, "A running")
            for name in "BE":
                await c.submit(JobSpec(name=name, gpus_per_rank=4, datasets=(sets[name],), command=("true",)),
                               job_id=name)
                await wait_until(follower, ended(name), 60, f"{name} to end")
            await c.submit(JobSpec(name="c", gpus_per_rank=4, datasets=(sets["C"],), command=("true",)), job_id="C")
            await wait_until(follower, ended("C"), 60, "C to end")
            hold.touch()
            await wait_until(follower, ended("A"), 60, "A to end")
    assert all(follower.state.jobs[j].status == "completed" for j in "ABEC")
    log = await log_of(bus)
    evicted = [e.key for _, e in log if isinstance(e, DatasetEvicted)]
    assert evicted == [sets["B"].key]
    cache = tmp_path / "n0" / "datasets"
    assert sorted(p.name for p in cache.iterdir() if p.name != ".tmp") == sorted(sets[n].key for n in "AEC")
    for n in "AEC":
        assert tree_sum(cache / sets[n].key / "data") == tree_sum(tmp_path / n)
    assert follower.state.nodes["n0"].datasets == tuple(sorted(sets[n].key for n in "AEC"))


async def test_a_directory_on_shared_storage_is_copied_to_each_node_and_checked_against_its_manifest(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "set"
    want = make_tree(shared, 4 * MB, seed=7)
    # The manifest digest as the README defines it, computed here (not by nodeagent/datasets/verify.py).
    lines = sorted((f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_size} "
                    f"{p.relative_to(shared).as_posix()}\n" for p in shared.rglob("*") if p.is_file()),
                   key=lambda ln: ln.split(" ", 2)[2])
    digest = hashlib.sha256("".join(lines).encode()).hexdigest()
    pile = Dataset(name="pile", source=f"file://{shared}", digest=f"sha256:{digest}", mount="/data/pile")
    spec = JobSpec(name="dir", ranks=2, gpus_per_rank=8, datasets=(pile,), command=("sh", "-c", CHECK))
    async with scheduler(bus), agents(bus, 2, tmp_path, runtime=processes):
        await Client(bus).submit(spec, job_id="dir")
        await wait_until(follower, ended("dir"), 90, "the job to end")
    assert follower.state.jobs["dir"].status == "completed", follower.state.jobs["dir"].end_reason
    for node in ("n0", "n1"):
        assert tree_sum(tmp_path / node / "datasets" / f"sha256-{digest}" / "data") == want
    log = await log_of(bus)
    ready = [(seq, e) for seq, e in log if isinstance(e, DatasetReady)]
    assert sorted(e.node_id for _, e in ready) == ["n0", "n1"] and all(e.staged_bytes == 4 * MB for _, e in ready)
    assert min(seq for seq, e in log if isinstance(e, WorkerStarted)) > max(seq for seq, _ in ready)


async def test_a_rank_never_starts_on_a_dataset_its_node_does_not_hold_whatever_the_log_says(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path) -> None:
    """The log says n0 is ready (a DatasetReady its cache does not back: wiped, or forged as here) while
    its download is stalled: the rank waits for the entry, and then finds its dataset whole."""
    want = make_tree(tmp_path / "tree", 4 * MB, seed=9)
    (tmp_path / "www").mkdir()
    make_tar(tmp_path / "tree", tmp_path / "www" / "set.tar")
    http, base = start_http_server(tmp_path / "www")
    pile = Dataset(name="pile", source=f"{base}/set.tar", mount="/data/pile")
    try:
        async with scheduler(bus), agents(bus, 1, tmp_path, runtime=processes):
            http.send_signal(signal.SIGSTOP)  # the download cannot finish until SIGCONT
            await Client(bus).submit(JobSpec(name="w", gpus_per_rank=8, datasets=(pile,), max_restarts=0,
                                             command=("sh", "-c", CHECK)), job_id="w")
            await wait_until(follower, lambda s: s.jobs["w"].status == "reserved", 60, "w reserved")
            forged = await bus.append(DatasetReady(event_id="forged-ready", occurred_at=0.0, job_id="w", attempt=1,
                                                   node_id="n0", dataset="pile", key=pile.key, size_bytes=1))
            await wait_until(follower, lambda s: s.seq >= forged and staged(s.jobs["w"]), 30, "the forged ready")
            # Room for a wrong agent to start the rank on the missing dataset (it would fail: max_restarts 0);
            # what is asserted is the outcome, not a time.
            await asyncio.sleep(3.0)
            http.send_signal(signal.SIGCONT)
            await wait_until(follower, ended("w"), 60, "w to end")
    finally:
        http.send_signal(signal.SIGCONT)
        stop_http_server(http)
    assert follower.state.jobs["w"].status == "completed", follower.state.jobs["w"].end_reason
    assert tree_sum(tmp_path / "n0" / "datasets" / pile.key / "data") == want


async def test_a_full_disk_evicts_what_no_job_uses_or_fails_saying_so(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path) -> None:
    """The cache on a 10 MB disk, no size limit: A and B (4 MB each) fill most of it; C is a small tar.gz that
    unpacks to 5 MB, more than the disk has left: staging it runs out of space, evicts A and B (no job uses
    them) and succeeds on its second try. D (12 MB) cannot fit even with C gone: it fails saying so, and C
    stays."""
    www = tmp_path / "www"
    www.mkdir()
    for i, name in enumerate("AB"):
        make_tree(tmp_path / name, 4 * MB, seed=20 + i)
        make_tar(tmp_path / name, www / f"{name}.tar")
    (tmp_path / "C").mkdir()
    (tmp_path / "C" / "zeros.bin").write_bytes(bytes(5 * MB))
    with tarfile.open(www / "C.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "C" / "zeros.bin", arcname="zeros.bin")
    make_tree(tmp_path / "D", 12 * MB, seed=30)
    make_tar(tmp_path / "D", www / "D.tar")
    with tiny_disk(tmp_path / "disk", "10m") as disk, http_server(www) as base:
        sets = {n: Dataset(name="pile", source=f"{base}/{n}.tar" + (".gz" if n == "C" else ""), mount="/d")
                for n in "ABCD"}
        async with scheduler(bus), agents(bus, 1, tmp_path, runtime=processes, dataset_cache=disk / "cache"):
            for n in "ABCD":
                await Client(bus).submit(JobSpec(name=n, gpus_per_rank=8, datasets=(sets[n],), max_restarts=0,
                                                 command=("true",)), job_id=n)
                await wait_until(follower, ended(n), 60, f"{n} to end")
        state = follower.state
        assert [state.jobs[n].status for n in "ABCD"] == ["completed"] * 3 + ["failed"], state.jobs["C"].end_reason
        assert "no room on the disk of the dataset cache" in state.jobs["D"].end_reason
        log = await log_of(bus)
        evicted = [e for _, e in log if isinstance(e, DatasetEvicted)]
        assert [e.key for e in evicted] == [sets["A"].key, sets["B"].key]
        assert all("the disk filled up while staging" in e.reason for e in evicted)
        assert sorted(p.name for p in (disk / "cache").iterdir() if p.name != ".tmp") == [sets["C"].key]
        assert tree_sum(disk / "cache" / sets["C"].key / "data") == tree_sum(tmp_path / "C")
        assert not list((disk / "cache" / ".tmp").iterdir())


async def test_an_agent_tells_the_log_what_its_cache_holds_when_it_starts(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path) -> None:
    """A cache the log does not know (a node that joins with one, a log started afresh): reconciled on start
    (a half-staged entry goes, a whole one stays), then announced (NodeDatasets), so placement sees it warm."""
    cache = DatasetCache(tmp_path / "n0" / "datasets")
    whole = cache.temp_dir("src-" + "a" * 32)
    (whole / "data" / "f").write_bytes(b"x" * 1000)
    cache.commit(whole, "src-" + "a" * 32, 1000, "/somewhere")
    half = cache.temp_dir("src-" + "b" * 32)
    (half / "data" / "f").write_bytes(b"y" * 10)
    async with scheduler(bus), agents(bus, 1, tmp_path, runtime=processes):
        await wait_until(follower, lambda s: "n0" in s.nodes and s.nodes["n0"].datasets == ("src-" + "a" * 32,), 60,
                         "the node's cache in the log")
    told = [e for _, e in await log_of(bus) if isinstance(e, NodeDatasets)]
    assert [[(d.key, d.size_bytes) for d in e.datasets] for e in told] == [[("src-" + "a" * 32, 1000)]]
    assert not half.exists()
