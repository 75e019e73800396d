"""Per-queue scoping on a real nats-server: team accounts submit and cancel through the admission service.

The server runs the rendered accounts (deploy/nats/render.py) with teams vision and nlp: each
team is its own account importing corral-submit.*/corral-cancel.* (and JetStream's read API)
from CORRAL. orchestrator.scheduler.gateway.TeamGateway runs in-process as the `admission` user, owning
vision -> {vision} and nlp -> {nlp}. A refused request leaves nothing in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS

from deploy.nats import permissions
from deploy.nats.render import accounts, server
from events.bus import Bus
from events.sdk import ADMISSION_CANCEL, ADMISSION_SUBMIT, AdmissionRefused, Client
from events.security import connect_options
from orchestrator.cli.errors import DENIED, OK
from orchestrator.scheduler.gateway import Owners, TeamGateway
from tests.deploy.launcher import Server, free_ports, passwords

NODES = ["n1"]
TEAMS = ("vision", "nlp")
PASSWORDS = passwords(NODES, TEAMS)
ROOT = Path(__file__).resolve().parents[2]


def _spec(queue: str, name: str = "train") -> dict[str, object]:
    return {"name": name, "queue": queue, "ranks": 1, "gpus_per_rank": 1, "command": ["true"]}


def _password(user: str) -> str:
    return PASSWORDS[f"CORRAL_{user.upper().replace('-', '_')}_PASSWORD"]


@dataclass
class Cluster:
    url: str
    scheduler: Bus
    vision: Bus
    nlp: Bus
    admission: TeamGateway

    async def events_of(self, job_id: str) -> list[str]:
        """Tags in the log about `job_id` (read as the scheduler)."""
        out: list[str] = []
        async with aclosing(self.scheduler.replay(subjects=[f"corral.job.{job_id}.>"])) as batches:
            async for batch in batches:
                out += [env.subject.rsplit(".", 1)[1] for env in batch]
        return out


async def _bus(url: str, user: str) -> Bus:
    return await Bus.connect(url, name=user, connect_attempts=1, **connect_options(user=user, password=_password(user)))


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    port, http = free_ports(2)
    cfg = server(name="scoping", listen=f"127.0.0.1:{port}", http=f"127.0.0.1:{http}",
                 store_dir=str(tmp_path / "js"), auth=accounts(NODES, TEAMS))
    srv = Server(cfg, tmp_path / "server.conf", PASSWORDS).start().wait_healthy()
    buses: list[Bus] = []
    task: asyncio.Task[None] | None = None
    try:
        scheduler = await _bus(srv.url, "scheduler")  # creates the stream
        buses.append(scheduler)
        admin = Client(await _bus(srv.url, "admin"))
        buses.append(admin.bus)
        for queue, parent in (("vision", None), ("nlp", None), ("vision-batch", "vision")):
            await admin.define_queue(queue, parent=parent)
        admission_bus = await _bus(srv.url, "admission")
        buses.append(admission_bus)
        admission = TeamGateway(admission_bus, Owners.parse(["vision", "nlp=nlp"]))
        task = asyncio.create_task(admission.run())
        await asyncio.wait_for(admission.ready.wait(), 5)
        vision, nlp = await _bus(srv.url, "client-vision"), await _bus(srv.url, "client-nlp")
        buses += [vision, nlp]
        yield Cluster(srv.url, scheduler, vision, nlp, admission)
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for bus in reversed(buses):
            await bus.close()
        srv.stop()


async def test_a_team_submits_to_its_own_queue(cluster: Cluster) -> None:
    """The job is in the log, submitted by the user and account the server vouched for; the team reads it back."""
    client = Client(cluster.vision, via_admission=True)
    job_id = await client.submit(_spec("vision"), job_id="v1")
    assert await cluster.events_of(job_id) == ["JobSubmitted"]
    env = await client.wait(job_id, until={"JobSubmitted"}, timeout=5)  # the team account reads the log
    assert env.event.submitted_by == "client-vision@TEAM_VISION"  # type: ignore[union-attr]
    # A retry is the same submit, not a second job.
    assert await client.submit(_spec("vision"), job_id="v1") == "v1"
    assert await cluster.events_of(job_id) == ["JobSubmitted"]


async def test_a_sub_queue_of_the_teams_queue_is_the_teams(cluster: Cluster) -> None:
    """vision-batch's parent is vision (QueueDefined, by the admin): vision may submit there, nlp may not."""
    await Client(cluster.vision, via_admission=True).submit(_spec("vision-batch"), job_id="vb1")
    assert await cluster.events_of("vb1") == ["JobSubmitted"]
    with pytest.raises(AdmissionRefused) as refused:
        await Client(cluster.nlp, via_admission=True).submit(_spec("vision-batch"), job_id="vb2")
    assert refused.value.code == "forbidden"


async def test_another_teams_queue_is_refused_and_leaves_nothing_in_the_log(cluster: Cluster) -> None:
    with pytest.raises(AdmissionRefused) as refused:
        await Client(cluster.vision, via_admission=True).submit(_spec("nlp"), job_id="v2")
    assert refused.value.code == "forbidden"
    assert "client-vision@TEAM_VISION may not submit to queue 'nlp'" in str(refused.value)
    assert await cluster.events_of("v2") == []
    # An existing job id of another team cannot be taken over either.
    await Client(cluster.nlp, via_admission=True).submit(_spec("nlp"), job_id="shared-id")
    with pytest.raises(AdmissionRefused, match="already exists"):
        await Client(cluster.vision, via_admission=True).submit(_spec("vision"), job_id="shared-id")
    assert await cluster.events_of("shared-id") == ["JobSubmitted"]


async def test_a_forged_request_info_header_is_replaced_by_the_server(cluster: Cluster) -> None:
    """vision claims to be nlp in Nats-Request-Info: the server overwrites the claim, admission refuses."""
    forged = {"Nats-Request-Info": json.dumps({"acc": "TEAM_NLP", "user": "client-nlp"})}
    body = json.dumps({"spec": _spec("nlp")}).encode()
    reply = json.loads((await cluster.vision.nc.request(f"{ADMISSION_SUBMIT}.forged", body, headers=forged,
                                                        timeout=5)).data)
    assert reply["ok"] is False and reply["error"] == "forbidden"
    assert "TEAM_VISION" in reply["message"]
    assert await cluster.events_of("forged") == []


async def test_a_team_cannot_cancel_another_teams_job(cluster: Cluster) -> None:
    await Client(cluster.nlp, via_admission=True).submit(_spec("nlp"), job_id="n1")
    with pytest.raises(AdmissionRefused) as refused:
        await Client(cluster.vision, via_admission=True).cancel("n1")
    assert refused.value.code == "forbidden"
    assert await cluster.events_of("n1") == ["JobSubmitted"]
    with pytest.raises(AdmissionRefused) as unknown:
        await Client(cluster.vision, via_admission=True).cancel("no-such-job")
    assert unknown.value.code == "not_found"
    # The owner can.
    seq = await Client(cluster.nlp, via_admission=True).cancel("n1", reason="done")
    assert seq > 0 and await cluster.events_of("n1") == ["JobSubmitted", "CancelRequested"]


async def _violations(url: str, user: str, attempt: object) -> list[str]:
    seen: list[str] = []

    async def record(e: Exception) -> None:
        seen.append(str(e).lower())

    nc: NATS = await nats.connect(url, error_cb=record, allow_reconnect=False,
                                  **connect_options(user=user, password=_password(user)))
    try:
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error, TimeoutError):
            await attempt(nc)  # type: ignore[operator]
        await nc.flush()
        await asyncio.sleep(0.2)
    finally:
        await nc.close()
    return seen


async def test_team_users_cannot_write_the_log_directly(cluster: Cluster) -> None:
    """Not a JobSubmitted, not a JetStream write: a team may only ask admission (and read)."""
    async def append(nc: NATS) -> None:
        await nc.jetstream(timeout=1).publish("corral.job.direct.JobSubmitted", b"{}")

    async def delete_stream(nc: NATS) -> None:
        await nc.jetstream(timeout=1).delete_stream("CORRAL")

    for attempt, subject in ((append, "corral.job.direct.jobsubmitted"), (delete_stream, "$js.api.stream.delete")):
        seen = await _violations(cluster.url, "client-vision", attempt)
        assert any("permissions violation for publish" in s and subject in s for s in seen), seen
    assert await cluster.events_of("direct") == []
    assert (await cluster.scheduler.js.stream_info("CORRAL")).config.name == "CORRAL"


async def test_no_corral_user_can_call_admission_with_its_own_header(cluster: Cluster) -> None:
    """Inside CORRAL no import stamps the header, so no CORRAL user may send admission requests at all."""
    async def submit(nc: NATS) -> None:
        await nc.request(f"{ADMISSION_SUBMIT}.inside", b"{}", timeout=1,
                         headers={"Nats-Request-Info": json.dumps({"acc": "TEAM_VISION", "user": "x"})})

    for user in ("client", "admin", "ops", "scheduler"):
        seen = await _violations(cluster.url, user, submit)
        assert any("permissions violation for publish" in s for s in seen), (user, seen)


def test_admission_subjects_agree_with_the_nats_config() -> None:
    wanted = (f"{ADMISSION_SUBMIT}.*", f"{ADMISSION_CANCEL}.*")
    assert wanted == permissions.ADMISSION_REQUESTS


async def test_without_an_admission_service_the_request_says_so(cluster: Cluster) -> None:
    """A stopped (or never started) admission service is 'unavailable', not a hang."""
    bus = await _bus(cluster.url, "client-vision")
    try:
        client = Client(bus, via_admission=True, admission_timeout=2)
        await cluster.admission.bus.nc.drain()  # no responder left
        with pytest.raises(AdmissionRefused) as refused:
            await client.submit(_spec("vision"), job_id="v-late")
        assert refused.value.code == "unavailable"
    finally:
        await bus.close()


# -- the CLI -------------------------------------------------------------------


def _corral(url: str, user: str, secrets: Path, *args: str) -> subprocess.CompletedProcess[str]:
    pw = secrets / f"{user}.password"
    pw.write_text(_password(user) + "\n")
    env = {**os.environ, "CORRAL_LOG_LEVEL": "warning"}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "--nats", url, "--user", user,
                           "--password-file", str(pw), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=60)


async def test_cli_submit_via_admission(cluster: Cluster, tmp_path: Path) -> None:
    """`corral submit --via-admission` as a team user: own queue exits 0, another team's exits DENIED."""
    own, other = tmp_path / "own.json", tmp_path / "other.json"
    own.write_text(json.dumps(_spec("vision")))
    other.write_text(json.dumps(_spec("nlp")))
    ok, refused = await asyncio.gather(
        asyncio.to_thread(_corral, cluster.url, "client-vision", tmp_path, "submit", "--via-admission",
                          "--id", "cli-1", str(own)),
        asyncio.to_thread(_corral, cluster.url, "client-vision", tmp_path, "submit", "--via-admission",
                          "--id", "cli-2", str(other)),
    )
    assert ok.returncode == OK and ok.stdout.strip() == "cli-1", ok.stderr
    assert refused.returncode == DENIED, refused.stderr
    assert "may not submit to queue 'nlp'" in refused.stderr and "Traceback" not in refused.stderr
    assert await cluster.events_of("cli-1") == ["JobSubmitted"] and await cluster.events_of("cli-2") == []
