"""Every job the log holds, folded by the CLI itself: what `jobs --all` and `job OLD` answer without an index.

The cluster state a snapshot holds keeps only the newest FINISHED_KEPT
finished jobs (orchestrator/core/evolve_jobs.py: `retire`), so a listing of
history from it would silently miss the older ones. When no caught-up index
answers (orchestrator/cli/indexed.py), these commands fold the whole log from
position 1 with the shared `evolve` and keep each job's newest record as the
index does (after every event naming the job), plus the fold's own records at
the end. The whole log means from position 1: with `--archive` the archive
and the stream as one log; from the stream alone, a head that retention or a
purge removed is refused naming the positions and the flag (`require_from`),
and a hole met while reading stops it (`check_contiguous`): complete and
correct, or a non-zero exit that says what is missing.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.cli.state_view import LogSource
    from orchestrator.core.model.state import ClusterState


async def every_job(source: LogSource, what: str, *, to_seq: int | None = None) -> ClusterState:
    """The state folded from position 1 to `to_seq` (default: the log's end now), whose `jobs` holds every job
    the log submitted (in submit order), not only the newest FINISHED_KEPT finished ones.

    `what` says in an error which command needs the whole log.
    """
    from orchestrator.cli.archive import check_contiguous, require_from
    from orchestrator.core.evolve import evolve
    from orchestrator.core.model.state import ClusterState, Job

    nothing = "; no caught-up index answered (`corral index` answers this without the whole log)"
    await require_from(source, 1, what + nothing)
    state = ClusterState()
    seen: dict[str, Job] = {}
    async with aclosing(source.replay(to_seq=to_seq)) as batches:
        async for batch in batches:
            for env in batch:
                if env.seq <= state.seq:
                    continue
                if env.seq != state.seq + 1:
                    await check_contiguous(source, state.seq + 1, env.seq)
                event = env.event
                state = evolve(state, event, env.seq)
                job_id = getattr(event, "job_id", None)
                if isinstance(job_id, str) and (job := state.jobs.get(job_id)) is not None:
                    seen[job_id] = job
    seen.update(state.jobs)
    state.jobs = dict(sorted(seen.items(), key=lambda kv: kv[1].submit_seq))
    return state
