"""The history page: utilisation, wait-time percentiles and GPU-hours per queue over a window, from the index.

The index service (`corral index`; `corral up` runs one) answers from its
tables, so a month's report costs a few requests, never a read of the log.
Without an index this page says so (503) rather than read the whole log per
request: the live pages keep working.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from events.bus import Bus
from orchestrator.index import api
from orchestrator.index.client import IndexRefused, NoIndex, ask

#: Pages of the index's job listing read for the wait-time percentiles (MAX_LIMIT jobs each).
JOB_PAGES = 20


class NoHistory(Exception):
    """No index answers (or it refused): the page says why, in one line."""


async def index_answer(bus: Bus, subject: str, request: msgspec.Struct, reply_type: type[Any]) -> Any:
    try:
        return await ask(bus.nc, subject, request, reply_type)
    except NoIndex:
        raise NoHistory("no index service answers: history comes from `corral index` (`corral up` runs one)") \
            from None
    except IndexRefused as e:
        raise NoHistory(f"the index refused: {e}") from None


def percentile(values: list[float], p: float) -> float | None:
    """The nearest-rank percentile `p` (0-100) of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


async def history(bus: Bus, *, since: float, until: float, buckets: int, capacity: int) -> dict[str, Any]:
    """GPU-hours per queue over [since, until], per bucket (utilisation against `capacity` GPUs, the cluster's
    GPUs now), and the wait from submit to first start per queue (p50/p90/p99)."""
    total = await index_answer(bus, api.USAGE, api.UsageRequest(by="queue", since=since, until=until, end=until),
                         api.UsageReply)
    width = (until - since) / buckets
    series = []
    for i in range(buckets):
        a, b = since + i * width, since + (i + 1) * width
        reply = await index_answer(bus, api.USAGE, api.UsageRequest(by="queue", since=a, until=b, end=until),
                             api.UsageReply)
        gpu_s = {row.key: row.gpu_seconds for row in reply.rows}
        series.append({"from": a, "to": b, "gpu_hours": {k: v / 3600 for k, v in gpu_s.items()},
                       "utilisation": sum(gpu_s.values()) / (capacity * width) if capacity and width else None})
    waits: dict[str, list[float]] = {}
    pending = 0
    request = api.JobsRequest(since=since, until=until, limit=api.MAX_LIMIT)
    truncated = False
    for page in range(JOB_PAGES):
        jobs = await index_answer(bus, api.JOBS, request, api.JobsReply)
        for info in jobs.jobs:
            if info.started_at is None:
                pending += 1 if info.state == "pending" else 0
                continue
            wait = max(0.0, info.started_at - info.submitted_at)
            waits.setdefault(info.queue, []).append(wait)
            waits.setdefault("(all)", []).append(wait)
        if jobs.next_after is None:
            break
        truncated = page == JOB_PAGES - 1
        request = msgspec.structs.replace(request, after=jobs.next_after)
    return {
        "since": since, "until": until, "as_of_seq": total.as_of_seq, "capacity": capacity,
        "gpu_hours": {row.key: row.gpu_seconds / 3600 for row in total.rows},
        "finished": {row.key: row.finished for row in total.rows},
        "buckets": series,
        "waits": {q: {"jobs": len(v), "p50": percentile(v, 50), "p90": percentile(v, 90), "p99": percentile(v, 99)}
                  for q, v in sorted(waits.items())},
        "still_pending": pending,
        "waits_truncated": truncated,
    }
