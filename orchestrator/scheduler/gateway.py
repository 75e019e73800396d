"""The team gateway (`corral admission`): team submissions and cancels, checked against the queues each team owns.

NATS permissions match subjects, and a job's subject names no queue, so the
server cannot keep team vision out of queue nlp. This service can: each team
is its own NATS account that may not publish to `corral.>` at all; it sends
requests instead, on subjects the CORRAL account exports:

    corral-submit.<job_id>   {"spec": {...JobSpec...}}
    corral-cancel.<job_id>   {"reason": "..."}

Crossing the import, the server stamps each request with `Nats-Request-Info`
(`{"acc": "TEAM_VISION", "user": "client-vision", ...}`), replacing whatever
header the caller wrote (tests/deploy/test_queue_scoping.py). No user of the
CORRAL account may publish to these subjects, so every request this service
sees was stamped by the server. The service checks the caller's account
against the spec's queue (a submit) or the job's queue (a cancel) and then
appends JobSubmitted or CancelRequested, or refuses:

    {"ok": true,  "job_id": "j-1", "seq": 42}
    {"ok": false, "job_id": "j-1", "error": "forbidden", "message": "..."}

A refusal appends nothing: the log holds facts about jobs, and a request
that never became a job is not one (a JobRejected for it would also take the
job id, so a team could squat another team's ids by submitting them to the
wrong queue). Refusals are logged by this service (`admission_refused`).

Who owns which queue is deployment configuration, given with the accounts
(`corral admission --team vision=vision,vision-batch`), not a log event: the
same person who creates a team's account decides its queues, and no event
type had to change. A queue whose parent (QueueDefined.parent, read from the
log) a team owns is the team's too, so an admin can give a team a new
sub-queue without restarting anything.

The service keeps no state: each request reads what it needs with a direct
get of the stream's last message on one subject (the job's JobSubmitted, a
queue's QueueDefined), answered by the stream leader, so a submit is seen by
the next cancel at once. Run two or more: they share the requests through the
queue group `corral-admission`.

Names. In the code this is the team gateway (`TeamGateway`, `GatewayRefusal`):
"admission" is the scheduler's word for a queue head getting its GPUs
(orchestrator/core/admit.py). What operators and clients already hold keeps
its older name: the command `corral admission`, the NATS user and role
`admission`, the queue group, the log lines `admission_*`, the clients'
`--via-admission` and the SDK's `AdmissionRefused` (renaming those would
break deployed credentials, manifests and scripts).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from events.bus import Bus
from events.sdk import ADMISSION_CANCEL, ADMISSION_SUBMIT
from events.security import team_account
from events.subjects import valid_id
from events.swallowed_cancel import stop_if_cancelled
from schemas import CancelRequested, InvalidJobSpec, JobSubmitted, QueueDefined, parse_jobspec

log = structlog.get_logger("corral.admission")

SUBMIT = ADMISSION_SUBMIT
CANCEL = ADMISSION_CANCEL
QUEUE_GROUP = "corral-admission"
REQUEST_INFO = "Nats-Request-Info"
#: How far up QueueDefined.parent links ownership is inherited (and a guard against a cycle).
MAX_QUEUE_DEPTH = 16

_TEAM_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class GatewayRefusal(Exception):
    """A refusal: `code` is one of forbidden, invalid, exists, not_found, bad_request, internal."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Caller:
    account: str
    user: str

    def __str__(self) -> str:
        return f"{self.user}@{self.account}"


@dataclass(frozen=True)
class Owners:
    """NATS account -> the queues its team may submit to and cancel in."""

    queues: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Owners:
        """`vision=vision,vision-batch` or just `vision` (the queue named after the team)."""
        out: dict[str, set[str]] = {}
        for entry in entries:
            team, sep, rest = entry.strip().partition("=")
            team = team.strip()
            if not _TEAM_RE.fullmatch(team):
                raise ValueError(f"bad team {team!r} in {entry!r}: lowercase letters, digits, '-' or '_'")
            queues = [q.strip() for q in rest.split(",") if q.strip()] if sep else [team]
            bad = [q for q in queues if not valid_id(q)]
            if bad or not queues:
                raise ValueError(f"bad queue list in {entry!r}: expected TEAM=QUEUE[,QUEUE...]")
            out.setdefault(team_account(team), set()).update(queues)
        return cls({acc: frozenset(qs) for acc, qs in out.items()})

    def owns(self, account: str, chain: Iterable[str]) -> bool:
        """Whether `account` owns a queue of `chain` (a queue, then its parent, its parent's parent, ...)."""
        mine = self.queues.get(account, frozenset())
        return any(q in mine for q in chain)


def caller_of(headers: Mapping[str, str] | None) -> Caller:
    """Who sent a request, as the server stamped it crossing the import."""
    raw = (headers or {}).get(REQUEST_INFO)
    if not raw:
        raise GatewayRefusal("forbidden", "no Nats-Request-Info: only a team account's import reaches admission")
    try:
        info = json.loads(raw)
    except ValueError:
        raise GatewayRefusal("forbidden", "unreadable Nats-Request-Info") from None
    acc, user = (info.get("acc"), info.get("user")) if isinstance(info, dict) else (None, None)
    if not isinstance(acc, str) or not acc:
        raise GatewayRefusal("forbidden", "Nats-Request-Info names no account")
    return Caller(account=acc, user=user if isinstance(user, str) else "")


def _body(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        raise GatewayRefusal("bad_request", "the request is not JSON") from None
    if not isinstance(body, dict):
        raise GatewayRefusal("bad_request", "the request must be a JSON object")
    return body


def _job_id(subject: str, prefix: str) -> str:
    job_id = subject.removeprefix(prefix + ".")
    if not valid_id(job_id):
        raise GatewayRefusal("bad_request", f"job id {job_id!r} is not a valid corral id")
    return job_id


class TeamGateway:
    """Answers corral-submit.* and corral-cancel.* until cancelled. Create, then `await run()`."""

    def __init__(self, bus: Bus, owners: Owners, *, queue_group: str = QUEUE_GROUP) -> None:
        self.bus = bus
        self.owners = owners
        self.queue_group = queue_group
        self.answered = 0
        self.refused = 0
        self.ready = asyncio.Event()

    async def run(self) -> None:
        nc = self.bus.nc
        subs: list[Subscription] = []
        try:
            for prefix in (SUBMIT, CANCEL):
                subs.append(await nc.subscribe(f"{prefix}.*", queue=self.queue_group, cb=self._on_request))
            # Shielded: a flush cancelled mid-way leaves its PING's future cancelled in nats-py's list, and the
            # PONG's set_result on it kills the connection's read loop (orchestrator/index/service.py: `_serve`).
            await asyncio.shield(nc.flush())
            log.info("admission_ready", teams={a: sorted(q) for a, q in self.owners.queues.items()})
            self.ready.set()
            stop_if_cancelled()  # a SIGTERM the flush's wait swallowed
            await asyncio.Event().wait()
        finally:
            for sub in subs:
                if not nc.is_closed:
                    await sub.unsubscribe()

    async def _on_request(self, msg: Msg) -> None:
        reply = await self.answer(msg.subject, msg.headers, msg.data)
        if msg.reply:
            await msg.respond(json.dumps(reply).encode())

    async def answer(self, subject: str, headers: Mapping[str, str] | None, data: bytes) -> dict[str, Any]:
        """The reply to one request (and the event appended, if any)."""
        prefix = subject.split(".", 1)[0]
        job_id = subject.partition(".")[2]
        caller: Caller | None = None
        try:
            caller = caller_of(headers)
            if prefix == SUBMIT:
                seq = await self.submit(caller, _job_id(subject, SUBMIT), _body(data))
            elif prefix == CANCEL:
                seq = await self.cancel(caller, _job_id(subject, CANCEL), _body(data))
            else:
                raise GatewayRefusal("bad_request", f"unknown request subject {subject!r}")
        except GatewayRefusal as e:
            self.refused += 1
            log.warning("admission_refused", request=prefix, job_id=job_id, caller=str(caller or "?"), code=e.code,
                        reason=str(e))
            return {"ok": False, "job_id": job_id, "error": e.code, "message": str(e)}
        except Exception as e:  # the caller gets an answer, not a timeout; the log gets the details
            log.exception("admission_failed", request=prefix, job_id=job_id, caller=str(caller or "?"))
            return {"ok": False, "job_id": job_id, "error": "internal", "message": f"{type(e).__name__}: {e}"}
        self.answered += 1
        log.info("admission_accepted", request=prefix, job_id=job_id, caller=str(caller), seq=seq)
        return {"ok": True, "job_id": job_id, "seq": seq}

    async def submit(self, caller: Caller, job_id: str, body: dict[str, Any]) -> int:
        try:
            spec = parse_jobspec(body.get("spec"))
        except InvalidJobSpec as e:
            raise GatewayRefusal("invalid", str(e)) from None
        except (TypeError, ValueError) as e:
            raise GatewayRefusal("invalid", f"not a job spec: {e}") from None
        await self._check_owner(caller, spec.queue, f"submit to queue {spec.queue!r}")
        existing = await self._submitted(job_id)
        if existing is not None:
            seq, event = existing
            if event.submitted_by.rpartition("@")[2] == caller.account and event.spec == spec:
                return seq  # a retry of this very submit (by the same team): the same answer
            raise GatewayRefusal("exists", f"job {job_id} already exists: choose another id")
        return await self.bus.append(JobSubmitted(event_id=f"submit:{job_id}", occurred_at=time.time(),
                                                  job_id=job_id, spec=spec, submitted_by=str(caller)))

    async def cancel(self, caller: Caller, job_id: str, body: dict[str, Any]) -> int:
        reason = body.get("reason", "")
        if not isinstance(reason, str):
            raise GatewayRefusal("bad_request", "reason must be a string")
        existing = await self._submitted(job_id)
        if existing is None:
            raise GatewayRefusal("not_found", f"unknown job {job_id!r}")
        queue = existing[1].spec.queue
        await self._check_owner(caller, queue, f"cancel job {job_id} of queue {queue!r}")
        return await self.bus.append(CancelRequested(event_id=f"cancel:{job_id}", occurred_at=time.time(),
                                                     job_id=job_id, reason=reason[:1000],
                                                     requested_by=str(caller)))

    async def _check_owner(self, caller: Caller, queue: str, what: str) -> None:
        if caller.account not in self.owners.queues:
            raise GatewayRefusal("forbidden", f"account {caller.account} owns no queue: it may not {what}")
        if not self.owners.owns(caller.account, await self.queue_chain(queue)):
            mine = ", ".join(sorted(self.owners.queues[caller.account]))
            raise GatewayRefusal("forbidden", f"{caller} may not {what}: the team's queues are {mine} "
                                              "(and their sub-queues)")

    async def queue_chain(self, queue: str) -> list[str]:
        """`queue`, its parent, its parent's parent, ... as the newest QueueDefined of each says."""
        chain = [queue]
        while len(chain) < MAX_QUEUE_DEPTH:
            event = await self._last(f"corral.queue.{chain[-1]}.QueueDefined")
            parent = event[1].parent if event is not None and isinstance(event[1], QueueDefined) else None
            if parent is None or parent in chain:
                break
            chain.append(parent)
        return chain

    async def _submitted(self, job_id: str) -> tuple[int, JobSubmitted] | None:
        found = await self._last(f"corral.job.{job_id}.JobSubmitted")
        if found is None or not isinstance(found[1], JobSubmitted):
            return None
        return found[0], found[1]

    async def _last(self, subject: str) -> tuple[int, Any] | None:
        """The stream's last message on `subject`, decoded, from the stream leader (not a replica)."""
        try:
            newest = await self.bus.last_on(subject)
        except (nats.errors.TimeoutError, nats.js.errors.APIError) as e:
            raise GatewayRefusal("internal", f"cannot read the log: {e}") from None
        return None if newest is None else (newest.seq, newest.event)
