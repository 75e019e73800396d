"""Hostile datasets against a real node (#39): every one ends its job once with a reason, nothing lands outside
the dataset's directory, the agent stays up and its other jobs run on.

Real processes: nats-server, `corral scheduler`, one `corral agent` (process runtime, 8 fake GPUs) with small
limits set by its flags, a misbehaving HTTP server of the test's own (tests/hostile_http.py) and, with the dev
extra, moto's S3 server. The archives are built here with Python's tarfile/zipfile (the attacker's tools) and
aim at a sentinel directory beside the agent's; what happened on the disk is judged with os/pathlib only, and a
download's end by the server's own record of its client going away.

While the hostile jobs come and go, a "steady" job (one GPU, a good dataset) runs on the same node; once they
are all over, a later job with the same good dataset completes, a staging child killed from outside (as the
kernel's OOM killer would) fails its job once, and the steady job completes.
"""

from __future__ import annotations

import gzip
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from events.bus import Bus
from events.sdk import Client
from orchestrator.core.model.state import ClusterState
from schemas import DatasetFailed, GangRestarted, JobFailed, JobSpec, NodeRegistered, WorkerStarted
from schemas.datasets import Dataset
from tests.dataset_source import S3_ENV, free_port, s3_client, start_s3_server, stop_http_server
from tests.faults.services import observer, scheduler_proc, stop_all, until
from tests.integration.harness import log_tail, start_corral

MiB = 1 << 20
CACHE = 16 * MiB
MAX_BYTES = 12 * MiB
MAX_MEMBERS = 1000
STALL_S = 3
TIMEOUT_S = 12
#: What the agent may grow to while children unpack bombs (its own peak RSS, VmHWM); it peaks near 40 MiB here.
AGENT_PEAK = 200 * MiB
PAYLOAD = b"pwned\n"
VICTIM = b"the victim's own bytes\n"


@dataclass(frozen=True)
class Case:
    name: str
    path: str  # on the hostile server (or s3://...)
    reason: str  # a part of the DatasetFailed's reason
    permanent: bool = True


# --- the archives (built with the attacker's tools) ------------------------------------------------------


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _m(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes | None = None) -> \
        tuple[tarfile.TarInfo, bytes | None]:
    t = tarfile.TarInfo(name)
    t.type, t.linkname, t.mode = kind, link, 0o755 if kind == tarfile.DIRTYPE else 0o644
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        t.devmajor, t.devminor = 1, 3
    return t, data if data is not None or kind != tarfile.REGTYPE else PAYLOAD


def symlink_chain(outside: Path) -> bytes:
    """The `tarfile` realpath bypass of 2025 (CVE-2025-4517's shape): directories of 247-character names, each
    with a one-letter link to it, so the letters' path resolves past PATH_MAX; a link down that chain climbing
    back out, one through it to `outside`, then files written through that and over the victim."""
    comp, steps = "d" * 247, "abcdefghijklmnop"
    members, path = [], ""
    for s in steps:
        members.append(_m(f"{path}{comp}", tarfile.DIRTYPE))
        members.append(_m(f"{path}{s}", tarfile.SYMTYPE, comp))
        path += comp + "/"
    chain = "/".join(steps)
    members.append(_m(chain, tarfile.SYMTYPE, "../" * len(steps)))
    members.append(_m("escape", tarfile.SYMTYPE, chain + "/" + "../" * 64 + str(outside).lstrip("/")))
    members.append(_m("escape/escaped-chain"))
    members.append(_m("escape/victim"))
    members.append(_m("victim-link", tarfile.LNKTYPE, "escape/victim"))
    return _tar(members)


def hostile_archives(outside: Path) -> dict[str, bytes]:
    up = "../" * 32 + str(outside).lstrip("/")
    zeros = io.BytesIO()
    with tarfile.open(fileobj=zeros, mode="w", format=tarfile.GNU_FORMAT) as tar:  # 256 MiB of zeros, 1 MiB a file
        for i in range(256):
            info = tarfile.TarInfo(f"z/{i}")
            info.size = MiB
            tar.addfile(info, io.BytesIO(bytes(MiB)))
    huge = tarfile.TarInfo("huge")  # declares 100 GiB (base-256 size), holds none of it
    huge.size = 100 << 30
    pax = tarfile.TarInfo("././@PaxHeader")  # a pax extension declaring 100 GiB (tarfile's stream mode buffered it)
    pax.type, pax.size = tarfile.XHDTYPE, 100 << 30
    zbomb = io.BytesIO()
    with zipfile.ZipFile(zbomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros", bytes(64 * MiB))
    return {
        "chain.tar": symlink_chain(outside),
        # a member written through a link the archive made (here to a directory of its own)
        "through-link.tar": _tar([_m("d", tarfile.DIRTYPE), _m("a", tarfile.SYMTYPE, "d"), _m("a/escaped-through")]),
        "absolute.tar": _tar([_m(str(outside / "escaped-abs"))]),
        "dotdot.tar": _tar([_m("ok/f"), _m(f"{up}/escaped-dotdot")]),
        "symlink-out.tar": _tar([_m("s", tarfile.SYMTYPE, str(outside)), _m("s/escaped-sym")]),
        "hardlink-out.tar": _tar([_m("h", tarfile.LNKTYPE, str(outside / "victim")), _m("h")]),
        "hardlink-up.tar": _tar([_m("h", tarfile.LNKTYPE, f"{up}/victim"), _m("h")]),
        "fifo.tar": _tar([_m("p", tarfile.FIFOTYPE, data=None)]),
        "chardev.tar": _tar([_m("null", tarfile.CHRTYPE, data=None)]),
        "members.tar.gz": gzip.compress(_tar([_m(f"m/{i}", data=b"") for i in range(MAX_MEMBERS + 500)])),
        "declared.tar.gz": gzip.compress(huge.tobuf(format=tarfile.GNU_FORMAT) + bytes(64 << 10), 9),
        "pax.tar.gz": gzip.compress(pax.tobuf(format=tarfile.GNU_FORMAT) + bytes(64 << 10), 9),
        "bomb.tar.gz": gzip.compress(zeros.getvalue(), 9),
        "bomb.zip": zbomb.getvalue(),
        "good.tar": _tar([_m("good/a", data=b"a" * 1000), _m("good/b", data=b"b" * 2000)]),
    }


CASES = [
    Case("chain", "/files/chain.tar", "which may lead outside the dataset's directory"),
    Case("through-link", "/files/through-link.tar", "is a link or a file, not a directory"),
    Case("absolute", "/files/absolute.tar", "is an absolute path"),
    Case("dotdot", "/files/dotdot.tar", "climbs out of the dataset's directory"),
    Case("symlink-out", "/files/symlink-out.tar", "may lead outside the dataset's directory"),
    Case("hardlink-out", "/files/hardlink-out.tar", "outside the dataset's directory"),
    Case("hardlink-up", "/files/hardlink-up.tar", "outside the dataset's directory"),
    Case("fifo", "/files/fifo.tar", "is a fifo"),
    Case("chardev", "/files/chardev.tar", "is a character device"),
    Case("members", "/files/members.tar.gz", f"more than {MAX_MEMBERS} members (--dataset-max-members)"),
    Case("declared", "/files/declared.tar.gz", f"more than {MAX_BYTES} bytes"),
    Case("pax", "/files/pax.tar.gz", "a tar header extension of"),
    Case("bomb", "/files/bomb.tar.gz", f"more than {MAX_BYTES} bytes"),
    Case("zip-bomb", "/files/bomb.zip", f"more than the {MAX_BYTES}"),
    Case("endless", "/endless", f"the source sent more than {CACHE} bytes"),
    Case("lying", "/lying", f"more than the {CACHE} a staging may fetch here"),
    Case("trickle", "/trickle/stall", f"fewer than 1024 bytes in {STALL_S}s (--dataset-stall-timeout)"),
    Case("slow", "/slow/timeout", f"took longer than {TIMEOUT_S}s (--dataset-timeout)"),
    Case("garbage", "/garbage", "did not answer in HTTP", permanent=False),
]
#: A staging child killed by the kernel (its OOM killer, say: the test plays it with SIGKILL) mid-fetch.
KILLED = Case("killed", "/slow/killed", "ended without a result (signal 9)")
S3_CASES = [
    Case("s3-chain", "s3://hostile/chain.tar", "which may lead outside the dataset's directory"),
    Case("s3-bomb", "s3://hostile/bomb.tar.gz", f"more than {MAX_BYTES} bytes"),
]


@pytest.fixture
def hostile_server(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """(base URL, the archives' directory, the server's events file); the archives aim at tmp_path/outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(VICTIM)
    www = tmp_path / "www"
    www.mkdir()
    for name, data in hostile_archives(outside).items():
        (www / name).write_bytes(data)
    events = tmp_path / "server-events"
    events.touch()
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "hostile_http.py"), str(port), str(www),
                             str(events)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # answering before any job is submitted
            try:
                with urllib.request.urlopen(f"{base}/files/good.tar", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "tests/hostile_http.py did not come up"
                time.sleep(0.05)
        yield base, www, events
    finally:
        stop_http_server(proc)


def s3_endpoint(www: Path) -> tuple[subprocess.Popen[bytes] | None, str | None]:
    """moto's S3 server holding two of the archives in bucket "hostile" (none without the dev extra)."""
    try:
        import moto.server  # noqa: F401
    except ModuleNotFoundError:
        if os.environ.get("CI") == "true":
            raise
        return None, None
    proc, endpoint = start_s3_server()
    c = s3_client(endpoint)
    c.create_bucket(Bucket="hostile")
    for name in ("chain.tar", "bomb.tar.gz"):
        c.upload_file(str(www / name), "hostile", name)
    return proc, endpoint


def agent(url: str, data: Path, s3: str | None) -> subprocess.Popen[bytes]:
    s3_args = ("--s3-endpoint-url", s3) if s3 else ()
    return start_corral(
        "--nats", url, "agent", "--node-id", "n0", "--runtime", "process", "--fake-gpus", "8",
        "--labels", "block=b0,leaf=l0", "--data-dir", str(data), "--address", "127.0.0.1", "--heartbeat", "0.5",
        "--dataset-cache", str(data / "cache"), "--dataset-cache-bytes", str(CACHE),
        "--dataset-max-bytes", str(MAX_BYTES), "--dataset-max-members", str(MAX_MEMBERS),
        "--dataset-stall-timeout", str(STALL_S), "--dataset-timeout", str(TIMEOUT_S),
        "--dataset-memory-bytes", str(1 << 30), *s3_args, "--log-level", "info",
        log=data / "agent.log", env=S3_ENV if s3 else None)


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def staging_children(agent: int) -> list[int]:
    """The pids of the staging children (`python -m nodeagent.datasets.child`) of process `agent` now."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == agent and b"nodeagent.datasets.child" in cmd:
            found.append(int(p.name))
    return found


def escaped(root: Path) -> list[str]:
    """Every path under `root` an archive named (escaped-*), wherever it is, links not followed."""
    found = []
    for d, dirs, files in os.walk(root):
        found += [os.path.join(d, n) for n in dirs + files if n.startswith("escaped")]
    return found


def job(ds_url: str, name: str, command: tuple[str, ...] = ("true",), max_restarts: int = 3) -> JobSpec:
    return JobSpec(name=name, gpus_per_rank=1, max_restarts=max_restarts, command=command,
                   datasets=(Dataset(name="set", source=ds_url, mount="/data/set"),))


def fetched(s: ClusterState, job_id: str) -> int:
    """The bytes the node told it fetched for `job_id`'s current attempt (its DatasetStaging progress)."""
    staging = s.jobs[job_id].staging
    return max((i.bytes_done for i in staging.items), default=0) if staging is not None else 0


def ended(s: ClusterState, job_id: str) -> bool:
    return s.jobs[job_id].status in ("completed", "failed", "cancelled")


async def test_hostile_datasets_fail_their_job_once_and_the_node_runs_on(
        bus: Bus, nats_server: object, tmp_path: Path, hostile_server: tuple[str, Path, Path]) -> None:
    base, www, server_events = hostile_server
    url = nats_server.url  # type: ignore[attr-defined]
    s3_proc, s3 = s3_endpoint(www)
    cases = CASES + (S3_CASES if s3 else [])
    data = tmp_path / "agent"
    data.mkdir()
    cache = data / "cache"
    release = tmp_path / "release"
    sched = scheduler_proc(url, "s1", tmp_path, min_runtime=0.0)
    ag = agent(url, data, s3)
    c = Client(bus)
    try:
        async with observer(bus) as obs:
            # A job that runs on this node throughout, with a good dataset.
            good = f"{base}/files/good.tar"
            await c.submit(job(good, "steady", ("sh", "-c", f'test -s "$CORRAL_DATASET_SET/good/b" && '
                                                 f'while [ ! -e {release} ]; do sleep 0.2; done')), job_id="steady")
            await until(obs, lambda s: s.jobs["steady"].status == "running", 60, "the steady job to run",
                        alive=[sched, ag])
            for case in cases:
                src = case.path if case.path.startswith("s3://") else base + case.path
                await c.submit(job(src, case.name, max_restarts=3 if case.permanent else 0), job_id=case.name)
            # A cancel mid-fetch: once the slow download has brought bytes, cancel its job.
            await c.submit(job(f"{base}/slow/cancel", "cancelled"), job_id="cancelled")
            await until(obs, lambda s: fetched(s, "cancelled") > 0, 60,
                        "the cancelled job's download to bring bytes", alive=[sched, ag])
            await c.cancel("cancelled", reason="the test cancels mid-fetch")
            await until(obs, lambda s: all(ended(s, j.name) for j in cases) and ended(s, "cancelled"), 90,
                        "every hostile job to end", alive=[sched, ag])
            state = obs.state
            assert state.jobs["steady"].status == "running", "the steady job was disturbed"
            # The node stages and runs good data still: a later job (a cache hit) completes.
            await c.submit(job(good, "later", ("sh", "-c", 'test -s "$CORRAL_DATASET_SET/good/a"')), job_id="later")
            await until(obs, lambda s: ended(s, "later"), 60, "the later job to end", alive=[sched, ag])
            assert obs.state.jobs["later"].status == "completed", obs.state.jobs["later"].end_reason
            # A staging child killed from outside (as the kernel's OOM killer would): its job fails once, saying so.
            await c.submit(job(base + KILLED.path, KILLED.name), job_id=KILLED.name)
            await until(obs, lambda s: fetched(s, KILLED.name) > 0, 60, "the killed job's download to bring bytes",
                        alive=[sched, ag])
            (child,) = staging_children(ag.pid)
            os.kill(child, signal.SIGKILL)
            await until(obs, lambda s: ended(s, KILLED.name), 60, "the killed job to end", alive=[sched, ag])
            cases.append(KILLED)
            # The cancelled download stopped (the server saw its client go) and its temporary directory went.
            await until(obs, lambda s: "slow/cancel closed" in server_events.read_text(), 30,
                        "the server to see the cancelled download's client go", alive=[sched, ag])
            await until(obs, lambda s: not list((cache / ".tmp").iterdir()), 30, "the cache's .tmp/ to be empty",
                        alive=[sched, ag])
            release.touch()
            await until(obs, lambda s: ended(s, "steady"), 60, "the steady job to end", alive=[sched, ag])
            assert obs.state.jobs["steady"].status == "completed", obs.state.jobs["steady"].end_reason
            assert ag.poll() is None, f"the agent died:\n{log_tail(ag)}"
            peak = peak_rss(ag.pid)
    finally:
        release.touch()  # the steady worker outlives its agent (by design): a failed run must not leave it behind
        stop_all([ag, sched])
        if s3_proc is not None:
            stop_http_server(s3_proc)
    log = [env.event async for batch in bus.replay() for env in batch]
    failed: dict[str, list[DatasetFailed]] = {}
    for e in log:
        if isinstance(e, DatasetFailed):
            failed.setdefault(e.job_id, []).append(e)
    problems = []
    for case in cases:
        j = state.jobs[case.name]
        told = failed.get(case.name, [])
        if j.status != "failed" or len(told) != 1 or case.reason not in told[0].reason \
                or told[0].permanent != case.permanent or case.reason not in j.end_reason:
            problems.append(f"{case.name}: {j.status}, told {[(d.reason, d.permanent) for d in told]}")
    assert not problems, "\n".join(problems)
    for kind in (JobFailed, GangRestarted, WorkerStarted):
        per_job = [e.job_id for e in log if isinstance(e, kind) and e.job_id in {case.name for case in cases}]
        want = sorted(case.name for case in cases) if kind is JobFailed else []
        assert sorted(per_job) == want, f"{kind.__name__}: {per_job}"
    assert state.jobs["cancelled"].status == "cancelled" and "cancelled" not in failed
    # Nothing outside the dataset's directory; the agent never restarted, and its memory stayed its own.
    outside = tmp_path / "outside"
    assert sorted(p.name for p in outside.iterdir()) == ["victim"] and (outside / "victim").read_bytes() == VICTIM
    assert not escaped(tmp_path), escaped(tmp_path)
    assert sum(isinstance(e, NodeRegistered) for e in log) == 1, "the agent registered more than once"
    print(f"the agent's own memory peaked at {peak >> 20} MiB")
    assert peak < AGENT_PEAK, f"the agent's own memory peaked at {peak >> 20} MiB"
    assert sorted(p.name for p in cache.iterdir()) == [".tmp", Dataset(name="set", source=good, mount="/").key]
    assert not list((cache / ".tmp").iterdir())


@pytest.mark.parametrize(("flag", "value"), [("--dataset-stall-timeout", "0"), ("--dataset-max-bytes", "-1"),
                                             ("--dataset-memory-bytes", "-5")])
def test_a_bad_limit_stops_the_agent_before_it_starts(tmp_path: Path, flag: str, value: str) -> None:
    from tests.integration.harness import CORRAL

    out = subprocess.run([CORRAL, "--nats", "nats://127.0.0.1:1", "agent", "--node-id", "n0", "--fake-gpus", "8",
                          "--runtime", "process", "--data-dir", str(tmp_path / "agent"), flag, value],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and flag in out.stderr and value in out.stderr, out.stderr
