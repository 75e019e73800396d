"""The read commands' way to the index service (`corral index`), and back to the log when none answers.

`usage`, `jobs --all`, `job OLD` and `explain OLD` ask the index first: it
answers from SQLite what they would otherwise fold the whole log for. Only a
caught-up index answers (orchestrator/index/api.py: `not_ready`). When none
does (none running, too slow, or still catching up after ASKS asks), they say
so in one line on stderr and fold the whole log themselves -- from the
archive and the stream with `--archive` -- or, where the stream no longer
starts at 1 and no archive was given, exit non-zero naming the positions
missing: complete and correct, or no answer (orchestrator/cli/whole_log.py).
`--no-index`, `--log FILE` and `--at` read the log without asking.
"""

from __future__ import annotations

import argparse
import sys
from functools import cache
from typing import TYPE_CHECKING

import msgspec

from orchestrator.index.api import JobInfo, Reply

# The NATS client and the fold's records are imported when a question is asked (a command's
# parser imports this module for `add_index_arg`).
if TYPE_CHECKING:
    from events.bus import Bus
    from events.history import History
    from orchestrator.core.model.state import Job
    from orchestrator.index.client import R


def add_index_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-index", action="store_true", help="read the log itself, not the index service "
                   "(`corral index`), which is asked first and answers without reading the whole log")


def wants_index(args: argparse.Namespace) -> bool:
    """Whether to ask the index: reading NATS at the log's end, and not told otherwise."""
    return (getattr(args, "log", None) is None and getattr(args, "at", None) is None
            and not getattr(args, "no_index", False))


#: Times a `not_ready` (or behind) answer is asked again before the log is read instead: the queue group
#: hands each request to one replica, so another caught-up index may answer the next.
ASKS = 3


async def asked(bus: Bus | History, subject: str, request: msgspec.Struct, reply_type: type[R], *,
                fresh: bool = True) -> R | None:
    """The index's answer, or None (after one stderr line) when no caught-up index answers: read the log then.

    `fresh`: the answer must include every event the log holds now (read your writes: a job just
    finished is in it); an index that has not folded that far (`not_ready`, or an older index's answer
    as of an earlier position) is asked again, ASKS times in all, then not used. A refusal
    (IndexRefused) other than `not_ready` goes to the caller: only it knows what "not found" means for
    its command.
    """
    from orchestrator.index.api import NOT_READY
    from orchestrator.index.client import IndexRefused, NoIndex, ask

    last = await bus.last_seq() if fresh else 0
    if fresh:
        request = msgspec.structs.replace(request, at_least=last)
    behind = ""
    for _ in range(ASKS):
        try:
            reply = await ask(bus.nc, subject, request, reply_type)
        except NoIndex as e:
            print(f"corral: {e}; reading the whole log instead (`corral index` answers this fast)", file=sys.stderr)
            return None
        except IndexRefused as e:
            if e.error != NOT_READY:
                raise
            behind = str(e)
            continue
        if reply.as_of_seq >= last:
            return reply
        behind = f"the index is at #{reply.as_of_seq}, {last - reply.as_of_seq:,} event(s) behind the log"
    print(f"corral: no index answered caught up ({behind}); reading the whole log instead", file=sys.stderr)
    return None


def freshness(reply: Reply, last_seq: int | None = None) -> str:
    """`index as of #N` (and how far behind the log's end it is, when known)."""
    behind = f", {last_seq - reply.as_of_seq:,} event(s) behind the log" if last_seq and last_seq > reply.as_of_seq \
        else ""
    return f"index as of #{reply.as_of_seq}{behind}"


@cache
def _record() -> msgspec.msgpack.Decoder[Job]:
    from orchestrator.core.model.state import Job

    return msgspec.msgpack.Decoder(Job)


def job_of(info: JobInfo) -> Job:
    """The fold's record of a job as the index keeps it, with the queue it counts against filled in (the
    index resolved it as the fold would; the views print `job.queue` when set)."""
    job = _record().decode(info.record)
    return job if job.queue else msgspec.structs.replace(job, queue=info.queue)
