"""What a submit takes from the submitter's side, like sbatch: the working directory and exported variables.

A job runs where it was submitted: its spec gets the submitter's directory as
`workdir` (`--chdir DIR` instead; a spec file's own `workdir` is kept unless
`--chdir` is given). Its environment is the node's baseline (the README's
"What a worker gets", nodeagent/rank_env.py: `node_env`), then the variables
the submitter exports, then the spec's `env:`, then corral's own keys:

- `--export VAR[,VAR...]` exports those variables of the submitter's
  environment (`--export VAR=VALUE` sets one); a name that is not set is an
  error, not a silent empty value;
- `--export-all` exports the whole environment, less what belongs to the
  submitter's shell or to corral (EXPORT_ALL_SKIPS, CORRAL_*, the rank keys).

Exported values are written into the log with the job (`corral job --json`
shows them): export what the job needs, not secrets.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping

import msgspec

from orchestrator.cli.errors import USAGE, CliError
from schemas import InvalidJobSpec, JobSpec, parse_jobspec

#: Variables of the submitter's shell that mean nothing on a node: `--export-all` leaves them out.
EXPORT_ALL_SKIPS = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PROMPT_COMMAND", "TERM", "COLUMNS",
                              "LINES", "DISPLAY", "SSH_AUTH_SOCK", "SSH_AGENT_PID", "SSH_CONNECTION", "SSH_CLIENT",
                              "SSH_TTY", "XDG_SESSION_ID", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"})
#: Keys corral sets for every rank (nodeagent/rank_env.py: RANK_KEYS): exporting one would be dropped.
CORRAL_SET = frozenset({"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
                        "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def add_submitter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chdir", "-D", metavar="DIR", help="where the ranks start (default: this directory); a "
                   "path on the nodes, relative ones from here")
    p.add_argument("--export", action="append", default=[], metavar="VAR[,VAR=VALUE...]",
                   help="pass these variables of your environment to every rank (VAR=VALUE sets one); repeatable")
    p.add_argument("--export-all", action="store_true", help="pass your whole environment (less your shell's own "
                   "variables, such as PWD and TERM, and corral's)")


def exported(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables `--export` and `--export-all` put into the job's env."""
    out: dict[str, str] = {}
    if args.export_all:
        out.update({k: v for k, v in environ.items()
                    if k not in EXPORT_ALL_SKIPS and k not in CORRAL_SET and not k.startswith("CORRAL_")
                    and not k.startswith("BASH_FUNC_")})
    out.update(named_variables(args.export, environ, "--export"))
    return out


def named_variables(items: list[str], environ: Mapping[str, str], flag: str) -> dict[str, str]:
    """`VAR[,VAR=VALUE...]` items (`--export`, `--worker-env`): each VAR's value in `environ`, or the VALUE given.

    A name that is not set, not a name, or one corral sets for every rank is an error (exit 2).
    """
    out: dict[str, str] = {}
    for item in items:
        for part in (p.strip() for p in item.split(",")):
            if not part:
                continue
            name, eq, value = part.partition("=")
            if not _NAME.fullmatch(name):
                raise CliError(f"{flag} {part}: {name!r} is not a variable name", USAGE)
            if name.startswith("CORRAL_") or name in CORRAL_SET:
                raise CliError(f"{flag} {name}: corral sets {name} for every rank itself", USAGE)
            if not eq:
                if name not in environ:
                    raise CliError(f"{flag} {name}: not set in your environment (VAR=VALUE sets one)", USAGE)
                value = environ[name]
            out[name] = value
    return out


def with_submitter(spec: JobSpec, args: argparse.Namespace, *, environ: Mapping[str, str] | None = None,
                   cwd: str | None = None) -> JobSpec:
    """`spec` with the submitter's directory (or `--chdir`) and exported variables (under the spec's `env:`).

    Validated again: what the submitter adds must make a valid spec too (exit 2 otherwise).
    """
    environ = os.environ if environ is None else environ
    here = os.getcwd() if cwd is None else cwd
    raw = msgspec.to_builtins(spec)
    if args.chdir is not None:
        raw["workdir"] = os.path.normpath(os.path.join(here, os.path.expanduser(args.chdir)))
    elif spec.working_dir is None:
        raw["workdir"] = here
    explicit = {k: v for k, v in exported(args, environ).items() if k in _set_on_command_line(args)}
    raw["env"] = {**exported(args, environ), **spec.env, **explicit}
    try:
        return parse_jobspec(raw)
    except InvalidJobSpec as e:
        lines = "\n".join(f"  {p.path}: {p.message}" for p in e.problems)
        raise CliError(f"the job with your directory and exports has {len(e.problems)} problem(s):\n{lines}",
                       USAGE) from None


def _set_on_command_line(args: argparse.Namespace) -> set[str]:
    """Names given a value by `--export VAR=VALUE`: they win over the spec file's `env:`."""
    return {part.split("=", 1)[0].strip() for item in args.export for part in item.split(",") if "=" in part}
