"""`corral submit --after-ok/--after-any/--hold`: the gates of the command line, checked before anything is written.

A name is a job, or a job array as a whole (one dependency however many
elements it has: `Gates.after_ok_arrays`, settled from the fold's counters,
orchestrator/core/array_deps.py). A name the log does not know, and a spec
whose gates break a limit, are refused here with what to fix (exit 2), never
accepted to be cancelled or rejected later. The scheduler applies the same
rules to what reaches the log without this client (core/gating.py).
"""

from __future__ import annotations

import msgspec
from msgspec.structs import replace

from orchestrator.cli.errors import USAGE, CliError
from orchestrator.core.model.state import ClusterState
from schemas import JobSpec, jobspec_problems


def with_gates(state: ClusterState | None, spec: JobSpec, ok_ids: list[str], any_ids: list[str], *,
               hold: bool) -> JobSpec:
    """`spec` with the command line's gates added; CliError naming what to fix if a name or a limit is wrong.
    (`state`: the cluster folded to now; None only when neither list names anything.)"""
    g = spec.gating
    ok_jobs, ok_arrays = _split(state, ok_ids, "--after-ok")
    any_jobs, any_arrays = _split(state, any_ids, "--after-any")
    gates = replace(g, after_ok=_joined(g.after_ok, ok_jobs), after_any=_joined(g.after_any, any_jobs),
                    after_ok_arrays=_joined(g.after_ok_arrays, ok_arrays),
                    after_any_arrays=_joined(g.after_any_arrays, any_arrays), hold=g.hold or hold)
    spec = replace(spec, gates=gates)
    problems = [p for p in jobspec_problems(msgspec.to_builtins(spec)) if p.path.startswith("gates")]
    if problems:
        raise CliError(f"job {spec.name!r} refused: {'; '.join(map(str, problems))}", USAGE)
    return spec


def _split(state: ClusterState | None, ids: list[str], option: str) -> tuple[list[str], list[str]]:
    """The job ids and the job array ids among `ids` (a job's id wins over an array's of the same name)."""
    if not ids:
        return [], []
    assert state is not None
    jobs: list[str] = []
    arrays: list[str] = []
    unknown: list[str] = []
    for name in ids:
        if name in state.jobs:
            jobs.append(name)
        elif name in state.arrays:
            arrays.append(name)
        else:
            unknown.append(name)
    if unknown:
        which = ", ".join(unknown)
        raise CliError(f"{option} {which}: no such job or job array in the log (submit it first, check the id "
                       "with `corral jobs --all`; a job finished long ago may have been forgotten)", USAGE)
    return jobs, arrays


def _joined(old: tuple[str, ...], new: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*old, *new)))
