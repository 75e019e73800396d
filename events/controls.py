"""The day-two requests a client appends (issue #41): update a job, requeue it, reserve nodes.

Like the SDK's (events/sdk.py): each call appends one event and returns its
stream sequence; the scheduler acts on it (README, "Day-two controls").
An update is answered by the scheduler's JobUpdated, which `update_answer`
waits for.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from contextlib import aclosing

from events.bus import Bus
from events.subjects import ROOT, check_id
from schemas.events import (
    JobUpdateByOperator,
    JobUpdated,
    JobUpdateRequested,
    RequeueRequested,
    ReservationCreated,
    ReservationDeleted,
)


async def request_update(bus: Bus, job_id: str, *, user: str, priority: int | None = None,
                         time_limit_s: float | None = None, queue: str | None = None, operator: bool = False,
                         reason: str = "") -> tuple[int, str]:
    """Append JobUpdateRequested (JobUpdateByOperator with `operator`); its sequence and event id (the
    `request_id` of the answer). `time_limit_s` 0 asks for no limit."""
    check_id(job_id, "job id")
    if queue is not None:
        check_id(queue, "queue")
    kind = JobUpdateByOperator if operator else JobUpdateRequested
    event_id = f"update:{job_id}:{secrets.token_hex(6)}"
    seq = await bus.append(kind(event_id=event_id, occurred_at=time.time(), job_id=job_id, requested_by=user,
                                priority=priority, time_limit_s=time_limit_s, queue=queue, reason=reason))
    return seq, event_id


async def update_answer(bus: Bus, job_id: str, request_id: str, from_seq: int, timeout: float) -> JobUpdated | None:
    """The scheduler's JobUpdated for `request_id` (appended after `from_seq`), or None after `timeout` seconds."""

    async def first() -> JobUpdated | None:
        subject = f"{ROOT}.job.{job_id}.JobUpdated"
        async with aclosing(bus.tail(subjects=[subject], from_seq=from_seq)) as live:
            async for env in live:
                e = env.event
                if isinstance(e, JobUpdated) and e.request_id == request_id:
                    return e
        return None

    try:
        return await asyncio.wait_for(first(), timeout)
    except TimeoutError:
        return None


async def request_requeue(bus: Bus, job_id: str, *, user: str, reason: str = "") -> int:
    """Append RequeueRequested: the job goes back to the queue (events/schemas say when)."""
    check_id(job_id, "job id")
    return await bus.append(RequeueRequested(event_id=f"requeue:{job_id}:{secrets.token_hex(6)}",
                                             occurred_at=time.time(), job_id=job_id, requested_by=user,
                                             reason=reason))


async def create_reservation(bus: Bus, name: str, nodes: tuple[str, ...], start: float, end: float, *, user: str,
                             users: tuple[str, ...] = (), queue: str | None = None, reason: str = "") -> int:
    """Append ReservationCreated (a second one with the same name replaces it)."""
    check_id(name, "reservation name")
    for n in nodes:
        check_id(n, "node id")
    return await bus.append(ReservationCreated(
        event_id=f"reservation:{name}:{secrets.token_hex(6)}", occurred_at=time.time(), name=name, nodes=nodes,
        start=start, end=end, users=users, queue=queue, created_by=user, reason=reason))


async def delete_reservation(bus: Bus, name: str, *, user: str) -> int:
    check_id(name, "reservation name")
    return await bus.append(ReservationDeleted(event_id=f"reservation-deleted:{name}:{secrets.token_hex(6)}",
                                               occurred_at=time.time(), name=name, deleted_by=user))
