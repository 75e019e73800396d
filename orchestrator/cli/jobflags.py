"""The job flags `corral run` and `corral submit` share, as srun and sbatch share theirs.

`run` builds its job from them (with srun's defaults: one rank of one GPU,
restart policy `never`). `submit` reads a spec file and a flag given on the
command line overrides that field of the file, as sbatch's flags override its
`#SBATCH` lines; a flag not given leaves the file's value. Slurm's spellings
are aliases where a user's habit is at stake: `-p/--partition` is the queue,
`-J/--job-name` the name, `--ntasks` the ranks, `-t/--time` the time limit in
Slurm's forms (a plain number is minutes: orchestrator/cli/timespec.py),
`--dependency afterok:J[:J],afterany:J` the gates.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from orchestrator.cli.errors import USAGE, CliError
from orchestrator.cli.timespec import minutes_arg, slurm_forms
from schemas import InvalidJobSpec, JobSpec, parse_jobspec

#: (argparse dest, the spec field it sets).
FIELDS = (("name", "name"), ("queue", "queue"), ("priority", "priority"), ("ranks", "ranks"),
          ("gpus_per_rank", "gpus_per_rank"), ("gpu_model", "gpu_model"), ("time_limit", "time_limit_s"),
          ("restart_policy", "restart_policy"), ("max_restarts", "max_restarts"), ("image", "image"),
          ("checkpoint_dir", "checkpoint_dir"))
#: `--dependency` types corral has, and the gate each sets (Slurm's `afterok`, `afterany`).
DEPENDENCY_TYPES = {"afterok": "after_ok", "afterany": "after_any"}


def add_job_args(p: argparse.ArgumentParser, *, run: bool) -> None:
    """The job flags; `run`: srun's defaults, else none (a spec file's fields stay unless a flag is given)."""
    def default(value: Any) -> Any:
        return value if run else None

    over = "" if run else "; overrides the file's "
    p.add_argument("-n", "--ranks", "--ntasks", type=int, default=default(1), metavar="N",
                   help=f"ranks in the gang{' (default 1)' if run else over + 'ranks'}")
    p.add_argument("-g", "--gpus-per-rank", "--gpus-per-task", type=int, default=default(1), metavar="G",
                   help=f"GPUs of each rank{' (default 1)' if run else over + 'gpus_per_rank'}")
    p.add_argument("-q", "-p", "--queue", "--partition", dest="queue", metavar="QUEUE",
                   help="queue charged (Slurm's partition; default: the cluster's default queue)")
    p.add_argument("-J", "--name", "--job-name", dest="name",
                   help="job name" + (" (default: the command's name)" if run else over + "name"))
    p.add_argument("--priority", type=int, default=default(0), help="priority within the queue"
                   + (" (default 0)" if run else over + "priority"))
    p.add_argument("--gpu-model", metavar="MODEL", help="only GPUs whose model contains this, e.g. H100")
    p.add_argument("-t", "--time", "--time-limit", dest="time_limit", type=minutes_arg, metavar="TIME",
                   help=f"stop it after this long running: {slurm_forms('minutes')}")
    p.add_argument("--restart-policy", choices=("never", "rank", "gang"), default=default("never"),
                   help="on a crash" + (" (default never: the job fails with the rank's exit status)" if run
                                        else over + "restart_policy"))
    p.add_argument("--max-restarts", type=int, default=default(0), metavar="N",
                   help="restarts before it fails" + (" (default 0)" if run else over + "max_restarts"))
    p.add_argument("--image", help="container image (docker runtime agents)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="where ranks checkpoint (CORRAL_CHECKPOINT_DIR)")
    p.add_argument("--allow-future-nodes", action="store_true",
                   help="queue it even if no registered node could ever hold it (GPU count, model, memory, "
                        "topology): it waits for nodes to join instead of being refused (exit 2)")
    p.add_argument("--after-ok", action="append", metavar="JOB[,JOB]", help="start only after these jobs completed "
                   "(an array's id: all its elements, as one dependency); if one fails or is cancelled, this job is "
                   "cancelled (dependency never satisfied); one the log does not know is refused (exit 2)")
    p.add_argument("--after-any", action="append", metavar="JOB[,JOB]",
                   help="start only after these jobs (or every element of these arrays) ended, however they ended")
    p.add_argument("--dependency", action="append", metavar="TYPE:JOB[:JOB][,...]",
                   help="Slurm's form of the two above: afterok:J1:J2,afterany:J3")
    p.add_argument("--hold", action="store_true", help="submit held: it starts only after `corral release`")


def with_job_flags(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """`raw` (a spec's fields) with each field a flag gave."""
    out = dict(raw)
    for dest, field in FIELDS:
        value = getattr(args, dest, None)
        if value is not None:
            out[field] = value
    if args.allow_future_nodes:
        out["allow_future_nodes"] = True
    return out


def spec_with_flags(spec: JobSpec, args: argparse.Namespace, source: str) -> JobSpec:
    """`spec` (read from `source`) with the fields the flags override, validated again (exit 2)."""
    return checked(with_job_flags(msgspec.to_builtins(spec), args), f"{source} with your flags")


def checked(raw: dict[str, Any], what: str) -> JobSpec:
    try:
        return parse_jobspec(raw)
    except InvalidJobSpec as e:
        lines = "\n".join(f"  {p.path}: {p.message}" for p in e.problems)
        raise CliError(f"{what} has {len(e.problems)} problem(s):\n{lines}", USAGE) from None


def dependencies(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The (after-ok, after-any) job ids of `--after-ok`, `--after-any` and `--dependency`, unchecked."""
    ok = [v.strip() for vs in args.after_ok or () for v in vs.split(",") if v.strip()]
    any_ = [v.strip() for vs in args.after_any or () for v in vs.split(",") if v.strip()]
    for item in args.dependency or ():
        for part in filter(None, (p.strip() for p in item.split(","))):
            kind, _, ids = part.partition(":")
            gate = DEPENDENCY_TYPES.get(kind.lower())
            names = [j for j in ids.split(":") if j]
            if gate is None or not names:
                raise CliError(f"--dependency {part!r}: use afterok:JOB[:JOB] or afterany:JOB[:JOB], comma-"
                               "separated (corral has no other dependency types; '?' is not supported)", USAGE)
            (ok if gate == "after_ok" else any_).extend(names)
    return ok, any_
