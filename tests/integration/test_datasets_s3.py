"""s3:// datasets staged onto every node of a gang before its ranks start (#33, the extra corral[s3]): a real
scheduler, agents with the process runtime (in-process, and one `corral agent` process), a real nats-server and a
real S3 server on loopback (moto's, its own process). The agents find their credentials and endpoint the standard
AWS way (environment variables), or the endpoint in `corral agent --s3-endpoint-url`.

Cache entries are judged by the test's own checksums of their files (tests/dataset_source.py); event order by
stream sequence, never by clocks.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from events.bus import Bus
from events.follow import Follower
from events.sdk import Client
from orchestrator.core.evolve import evolve
from orchestrator.core.model.state import ClusterState
from schemas import DatasetFailed, DatasetReady, DatasetStaging, JobSpec, WorkerStarted
from schemas.datasets import Dataset
from tests.dataset_source import S3_ENV, make_tar, make_tree, put_tree, s3_client, s3_server, tree_sum
from tests.integration.harness import CORRAL, agents, processes, scheduler, start_corral, stop, wait_until

MB = 1 << 20
SIZE = 8 * MB
#: A rank that fails unless both datasets are there, whole (the files make_tree writes).
CHECK = ('test -d "$CORRAL_DATASET_PILE/b/c" && test "$(ls "$CORRAL_DATASET_PILE/a" | wc -l)" = 4 && '
         'test -d "$CORRAL_DATASET_TREE/b/c" && test "$(ls "$CORRAL_DATASET_TREE/a" | wc -l)" = 4')


def manifest_sha(tree: Path) -> str:
    """The directory digest as the README defines it, computed here (not by nodeagent/datasets/verify.py)."""
    lines = sorted((f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_size} "
                    f"{p.relative_to(tree).as_posix()}\n" for p in tree.rglob("*") if p.is_file()),
                   key=lambda ln: ln.split(" ", 2)[2])
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Dataset], dict[str, str]]]:
    """An S3 server with bucket "sets": pile.tar (a tar of one tree) and tree/ (another tree's files):
    (endpoint, {name: its Dataset with its digest}, {name: tree_sum of its tree})."""
    root = tmp_path_factory.mktemp("s3")
    want = {"pile": make_tree(root / "pile", SIZE, seed=1), "tree": make_tree(root / "tree", SIZE, seed=2)}
    sha = make_tar(root / "pile", root / "pile.tar")
    with s3_server() as endpoint:
        c = s3_client(endpoint)
        c.create_bucket(Bucket="sets")
        c.upload_file(str(root / "pile.tar"), "sets", "pile.tar")
        put_tree(c, "sets", "tree/", root / "tree")
        sets = {"pile": Dataset(name="pile", source="s3://sets/pile.tar", digest=f"sha256:{sha}", mount="/data/p"),
                "tree": Dataset(name="tree", source="s3://sets/tree/", digest=f"sha256:{manifest_sha(root / 'tree')}",
                                mount="/data/t")}
        yield endpoint, sets, want


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agents' AWS chain: keys in the environment, no profile, no instance metadata, no endpoint (yet)."""
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)


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


async def test_a_gang_stages_an_s3_archive_and_prefix_on_every_node_and_a_second_job_hits_the_cache(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path, aws_env: None,
        s3: tuple[str, dict[str, Dataset], dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, sets, want = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # the endpoint as boto3 reads it: the agents have no flag
    spec = JobSpec(name="train", ranks=2, gpus_per_rank=8, datasets=(sets["pile"], sets["tree"]),
                   command=("sh", "-c", CHECK))
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
    ready = {(e.job_id, e.node_id, e.dataset): (seq, e) for seq, e in log if isinstance(e, DatasetReady)}
    starts: dict[str, list[int]] = {"first": [], "second": []}
    for seq, e in log:
        if isinstance(e, WorkerStarted):
            starts[e.job_id].append(seq)
    pile_bytes = s3_client(endpoint).head_object(Bucket="sets", Key="pile.tar")["ContentLength"]
    for node in nodes:
        _, p = ready[("first", node, "pile")]
        _, t = ready[("first", node, "tree")]
        assert not p.cached and p.staged_bytes == pile_bytes and p.size_bytes == SIZE
        assert not t.cached and t.staged_bytes == SIZE and t.size_bytes == SIZE
        # Staging was told (its progress at the bounded rate: tests/agent/test_datasets_s3.py sees every step).
        assert {e.dataset for _, e in log if isinstance(e, DatasetStaging) and e.node_id == node
                and e.job_id == "first"} == {"pile", "tree"}
    for job in ("first", "second"):
        assert min(starts[job]) > max(ready[(job, n, d)][0] for n in nodes for d in ("pile", "tree")), \
            f"a rank of {job} started before every node held every dataset"
    # The second job: cache hits everywhere, nothing staged, no progress, no second download.
    assert all(ready[("second", n, d)][1].cached and ready[("second", n, d)][1].staged_bytes == 0
               for n in nodes for d in ("pile", "tree"))
    assert not [e for _, e in log if isinstance(e, DatasetStaging) and e.job_id == "second"]
    assert sum(1 for _, e in log if isinstance(e, DatasetReady) and not e.cached) == 4
    for node in nodes:
        for name, ds in sets.items():
            assert tree_sum(tmp_path / node / "datasets" / ds.key / "data") == want[name]
        assert set(state.nodes[node].datasets) == {sets["pile"].key, sets["tree"].key}


async def test_a_digest_mismatch_and_a_missing_key_end_the_attempt_with_the_reason(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path, aws_env: None, nats_server: object,
        s3: tuple[str, dict[str, Dataset], dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, sets, _ = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    wrong = Dataset(name="tree", source="s3://sets/tree/", digest="sha256:" + "0" * 64, mount="/d")
    gone = Dataset(name="pile", source="s3://sets/gone.tar", mount="/d")
    async with scheduler(bus), agents(bus, 1, tmp_path, runtime=processes):
        await Client(bus).submit(JobSpec(name="m", gpus_per_rank=8, datasets=(wrong,), max_restarts=0,
                                         command=("true",)), job_id="mismatch")
        await wait_until(follower, ended("mismatch"), 90, "the mismatched job to end")
        await Client(bus).submit(JobSpec(name="g", gpus_per_rank=8, datasets=(gone,), max_restarts=0,
                                         command=("true",)), job_id="gone")
        await wait_until(follower, ended("gone"), 90, "the job of a missing key to end")
    m, g = follower.state.jobs["mismatch"], follower.state.jobs["gone"]
    assert m.status == "failed" and g.status == "failed"
    assert m.end_reason.startswith("dataset tree on n0: digest mismatch: the manifest of s3://sets/tree/ hashes to "
                                   f"sha256:{sets['tree'].sha256}"), m.end_reason
    assert g.end_reason.startswith(f"dataset pile on n0: no such key: s3://sets/gone.tar does not exist at "
                                   f"{endpoint}"), g.end_reason
    log = await log_of(bus)
    assert sorted(e.job_id for _, e in log if isinstance(e, DatasetFailed)) == ["gone", "mismatch"]
    assert not [e for _, e in log if isinstance(e, WorkerStarted)], "no rank ever started"
    assert not [p for p in (tmp_path / "n0" / "datasets").iterdir() if p.name != ".tmp"], "nothing cached"
    assert not list((tmp_path / "n0" / "datasets" / ".tmp").iterdir())
    shown = subprocess.run([CORRAL, "--nats", nats_server.url, "job", "gone"],  # type: ignore[attr-defined]
                           capture_output=True, text=True, timeout=120)
    assert "no such key: s3://sets/gone.tar" in shown.stdout, shown


async def test_a_corral_agent_process_takes_the_endpoint_from_its_flag(
        bus: Bus, follower: Follower[ClusterState], tmp_path: Path, aws_env: None, nats_server: object,
        s3: tuple[str, dict[str, Dataset], dict[str, str]]) -> None:
    """`corral agent --s3-endpoint-url` (an on-prem S3), credentials from its environment."""
    endpoint, sets, want = s3
    data = tmp_path / "agent"
    ag = start_corral("--nats", nats_server.url, "agent", "--node-id", "n0",  # type: ignore[attr-defined]
                      "--runtime", "process", "--fake-gpus", "8", "--labels", "block=b0,leaf=l0", "--data-dir",
                      str(data), "--address", "127.0.0.1", "--heartbeat", "0.5", "--dataset-cache",
                      str(data / "cache"), "--s3-endpoint-url", endpoint, log=tmp_path / "agent.log")
    try:
        async with scheduler(bus):
            await Client(bus).submit(JobSpec(name="t", gpus_per_rank=8, datasets=(sets["tree"],), max_restarts=0,
                                             command=("sh", "-c", 'test "$(ls "$CORRAL_DATASET_TREE/a" | wc -l)" = 4')),
                                     job_id="t")
            await wait_until(follower, ended("t"), 120, "the job to end")
    finally:
        stop(ag)
    assert follower.state.jobs["t"].status == "completed", follower.state.jobs["t"].end_reason
    assert tree_sum(data / "cache" / sets["tree"].key / "data") == want["tree"]
