"""The client SDK: what users and the CLI append, and how they follow a job.

Every call is safe to retry. Event ids are derived from what the call means
(`submit:<job_id>`, `cancel:<job_id>`, a queue definition's content), so a
retried call inside the stream's duplicate window is stored once. Past the
window the log may hold a second copy; the scheduler's fold treats a second
JobSubmitted or CancelRequested for the same job as no change.

Two ways to submit and cancel:
- direct (default): append to the log. For users of the CORRAL account
  (`client`, `admin`, tests, `corral up`): NATS checks only the event type.
- `Client(bus, via_admission=True)`: ask the admission service
  (orchestrator/scheduler/gateway.py) instead. Team users (their own NATS accounts,
  no write on `corral.>`) must: it checks the team owns the queue, then
  appends for them. A refusal raises AdmissionRefused.
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import json
import secrets
import time
from collections.abc import AsyncGenerator, Iterable, Mapping
from contextlib import aclosing
from typing import Any

import msgspec
import nats.errors

from events.bus import Bus, Envelope
from events.subjects import check_id, job_filter
from schemas import (
    CancelRequested,
    DatasetEvictRequested,
    GpuHealthy,
    GpuUnhealthy,
    JobHeld,
    JobReleased,
    JobSpec,
    JobSubmitted,
    NodeCordoned,
    NodeUncordoned,
    QueueDefined,
    QueueDeleted,
    encode,
    parse_jobspec,
    tag_of,
)

#: Tags after which a job never changes again.
FINAL: frozenset[str] = frozenset({"JobCompleted", "JobFailed", "JobCancelled", "JobRejected"})


def new_job_id() -> str:
    """Short, readable, and unique enough: 40 random bits."""
    return "j-" + secrets.token_hex(5)


#: Request subjects of the admission service (orchestrator/scheduler/gateway.py): `<prefix>.<job_id>`.
ADMISSION_SUBMIT = "corral-submit"
ADMISSION_CANCEL = "corral-cancel"


class AdmissionRefused(Exception):
    """The admission service said no, or no admission service answered.

    `code`: forbidden (not the team's queue or job), invalid (the spec), exists (the job id is
    taken), not_found (no such job), bad_request, internal, or unavailable (no answer).
    """

    def __init__(self, code: str, message: str, job_id: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.job_id = job_id


def default_user(bus: Bus | None = None, nats_user: object = None) -> str:
    """Who a submit or cancel is recorded as when the caller does not say: the NATS user (given, or the
    connection's password login), else the operating system's user ($USER, ...); "" if neither is known."""
    if nats_user is None:
        options = getattr(getattr(bus, "nc", None), "options", None)
        nats_user = options.get("user") if isinstance(options, dict) else None
    if isinstance(nats_user, str) and nats_user:
        return nats_user
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


class Client:
    """Submit, cancel, define queues, cordon nodes and follow jobs over a connected `Bus`.

    `user` is recorded as the submitter (`JobSubmitted.submitted_by`, what `corral jobs --by-user` and
    `corral usage --by user` group by) and canceller; None: `default_user(bus)`.
    """

    def __init__(self, bus: Bus, *, user: str | None = None, via_admission: bool = False,
                 admission_timeout: float = 10.0) -> None:
        self.bus = bus
        self.user = default_user(bus) if user is None else user
        self.via_admission = via_admission
        self.admission_timeout = admission_timeout

    async def submit(self, spec: JobSpec | Mapping[str, Any], job_id: str | None = None, submitted_by: str = "") -> str:
        """Append JobSubmitted; the job id. Give `job_id` to make a retried submit a no-op.

        A mapping is validated first (InvalidJobSpec lists every problem). Through the
        admission service the log records the NATS user and account as the submitter
        (`submitted_by` is ignored: the server, not the caller, says who that is).
        """
        if not isinstance(spec, JobSpec):
            spec = parse_jobspec(spec)
        job_id = check_id(job_id, "job id") if job_id is not None else new_job_id()
        if self.via_admission:
            await self._ask(ADMISSION_SUBMIT, job_id, {"spec": msgspec.to_builtins(spec)})
            return job_id
        await self.bus.append(
            JobSubmitted(event_id=f"submit:{job_id}", occurred_at=time.time(), job_id=job_id, spec=spec,
                         submitted_by=submitted_by or self.user)
        )
        return job_id

    async def cancel(self, job_id: str, reason: str = "", requested_by: str = "") -> int:
        """Append CancelRequested (once per job: asking twice is asking once); its sequence."""
        check_id(job_id, "job id")
        if self.via_admission:
            return await self._ask(ADMISSION_CANCEL, job_id, {"reason": reason})
        return await self.bus.append(
            CancelRequested(event_id=f"cancel:{job_id}", occurred_at=time.time(), job_id=job_id, reason=reason,
                            requested_by=requested_by or self.user)
        )

    async def submit_many(self, jobs: Iterable[tuple[str, JobSpec]], submitted_by: str = "") -> list[str]:
        """`submit` of several (job id, validated spec), appended in order in one pipeline (a job array's
        elements); their ids. Safe to retry as a whole: each event id is the job's."""
        jobs = [(check_id(jid, "job id"), spec) for jid, spec in jobs]
        if self.via_admission:
            return [await self.submit(spec, job_id=jid) for jid, spec in jobs]
        now = time.time()
        await self.bus.append_many(
            JobSubmitted(event_id=f"submit:{jid}", occurred_at=now, job_id=jid, spec=spec,
                         submitted_by=submitted_by or self.user) for jid, spec in jobs)
        return [jid for jid, _ in jobs]

    async def cancel_many(self, job_ids: Iterable[str], reason: str = "") -> list[int]:
        """`cancel` of several jobs, in one pipeline; their sequences."""
        ids = [check_id(j, "job id") for j in job_ids]
        if self.via_admission:
            return [await self.cancel(j, reason=reason) for j in ids]
        now = time.time()
        return await self.bus.append_many(
            CancelRequested(event_id=f"cancel:{j}", occurred_at=now, job_id=j, reason=reason, requested_by=self.user)
            for j in ids)

    async def hold(self, job_id: str, reason: str = "") -> int:
        """Append JobHeld: the pending job does not start until `release` (no change for one not pending)."""
        check_id(job_id, "job id")
        return await self.bus.append(JobHeld(event_id=f"hold:{job_id}:{secrets.token_hex(6)}", occurred_at=time.time(),
                                             job_id=job_id, requested_by=self.user, reason=reason))

    async def release(self, job_id: str) -> int:
        """Append JobReleased: a held job may start again."""
        check_id(job_id, "job id")
        return await self.bus.append(JobReleased(event_id=f"release:{job_id}:{secrets.token_hex(6)}",
                                                 occurred_at=time.time(), job_id=job_id, requested_by=self.user))

    async def _ask(self, prefix: str, job_id: str, body: dict[str, Any]) -> int:
        """One request to the admission service; the sequence of the event it appended."""
        try:
            msg = await self.bus.nc.request(f"{prefix}.{job_id}", json.dumps(body).encode(),
                                            timeout=self.admission_timeout)
        except nats.errors.NoRespondersError:
            raise AdmissionRefused("unavailable", f"no admission service answers {prefix}.*: is `corral admission` "
                                   "running, and does this account import it?", job_id) from None
        except nats.errors.TimeoutError:
            raise AdmissionRefused("unavailable", f"the admission service did not answer {prefix}.{job_id} in "
                                   f"{self.admission_timeout:g}s", job_id) from None
        try:
            reply = json.loads(msg.data)
            ok, seq = bool(reply["ok"]), reply.get("seq")
        except (ValueError, KeyError, TypeError):
            raise AdmissionRefused("internal", f"unreadable answer from admission: {msg.data[:200]!r}", job_id) from None
        if not ok:
            raise AdmissionRefused(str(reply.get("error", "internal")), str(reply.get("message", "")), job_id)
        return int(seq)

    async def define_queue(
        self,
        queue: str,
        *,
        weight: float = 1.0,
        guaranteed_gpus: int = 0,
        limit_gpus: int | None = None,
        parent: str | None = None,
    ) -> int:
        """Append QueueDefined; repeating the same definition stores it once, a changed one again."""
        check_id(queue, "queue")
        if parent is not None:
            check_id(parent, "parent queue")
        fields = QueueDefined(event_id="", occurred_at=0.0, queue=queue, weight=weight,
                              guaranteed_gpus=guaranteed_gpus, limit_gpus=limit_gpus, parent=parent)
        digest = hashlib.sha256(encode(fields)).hexdigest()[:16]
        return await self.bus.append(
            QueueDefined(event_id=f"queue:{queue}:{digest}", occurred_at=time.time(), queue=queue, weight=weight,
                         guaranteed_gpus=guaranteed_gpus, limit_gpus=limit_gpus, parent=parent)
        )

    async def delete_queue(self, queue: str, reason: str = "") -> int:
        """Append QueueDeleted: the queue is no longer defined (jobs holding its GPUs keep them until they end)."""
        check_id(queue, "queue")
        return await self.bus.append(
            QueueDeleted(event_id=f"queue-deleted:{queue}:{secrets.token_hex(6)}", occurred_at=time.time(),
                         queue=queue, reason=reason)
        )

    async def cordon(self, node_id: str, reason: str = "") -> int:
        check_id(node_id, "node id")
        return await self.bus.append(
            NodeCordoned(event_id=f"cordon:{node_id}:{secrets.token_hex(6)}", occurred_at=time.time(),
                         node_id=node_id, reason=reason)
        )

    async def uncordon(self, node_id: str) -> int:
        check_id(node_id, "node id")
        return await self.bus.append(
            NodeUncordoned(event_id=f"uncordon:{node_id}:{secrets.token_hex(6)}", occurred_at=time.time(),
                           node_id=node_id)
        )

    async def evict_dataset(self, node_id: str, key: str, reason: str = "") -> int:
        """Ask `node_id`'s agent to drop the cache entry `key` (once no job there uses it): DatasetEvictRequested."""
        check_id(node_id, "node id")
        return await self.bus.append(
            DatasetEvictRequested(event_id=f"dataset-evict:{node_id}:{key}:{secrets.token_hex(6)}",
                                  occurred_at=time.time(), node_id=node_id, key=key, requested_by=self.user,
                                  reason=reason)
        )

    async def drain_gpu(self, node_id: str, gpu_index: int, reason: str = "", gpu_uuid: str = "") -> int:
        """Take one GPU out of service (an operator's GpuUnhealthy): its gang, if any, is requeued."""
        check_id(node_id, "node id")
        return await self.bus.append(
            GpuUnhealthy(event_id=f"gpu-drain:{node_id}:{gpu_index}:{secrets.token_hex(6)}", occurred_at=time.time(),
                         node_id=node_id, gpu_index=gpu_index, gpu_uuid=gpu_uuid, reason=reason or "drained by an "
                         "operator", source="operator")
        )

    async def undrain_gpu(self, node_id: str, gpu_index: int, reason: str = "", gpu_uuid: str = "") -> int:
        """Put one GPU back in service (GpuHealthy), whoever took it out."""
        check_id(node_id, "node id")
        return await self.bus.append(
            GpuHealthy(event_id=f"gpu-undrain:{node_id}:{gpu_index}:{secrets.token_hex(6)}", occurred_at=time.time(),
                       node_id=node_id, gpu_index=gpu_index, gpu_uuid=gpu_uuid,
                       reason=reason or "undrained by an operator", source="operator")
        )

    async def watch(self, job_id: str) -> AsyncGenerator[Envelope, None]:
        """The job's events: its whole history, then live ones as they happen. Never ends by itself.

        One consumer from the first sequence, so there is no gap or overlap
        between history and live events.
        """
        async with aclosing(self.bus.tail(subjects=[job_filter(job_id)], from_seq=1)) as events:
            async for env in events:
                yield env

    async def wait(self, job_id: str, until: Iterable[str] = FINAL, timeout: float | None = None) -> Envelope:
        """The Envelope of the job's first event whose tag is in `until` (default: any final one).

        The envelope carries the event (`env.event`, e.g. a JobCompleted), its stream
        sequence (`env.seq`), subject and stream time. Raises TimeoutError after
        `timeout` seconds.
        """
        wanted = frozenset(until)
        async with asyncio.timeout(timeout), aclosing(self.watch(job_id)) as events:
            async for env in events:
                if tag_of(env.event) in wanted:
                    return env
        raise AssertionError("watch() ended")  # pragma: no cover - watch never ends
