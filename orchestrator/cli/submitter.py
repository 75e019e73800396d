"""What a submit takes from the submitter's side, like sbatch: the working directory and exported variables.

A job runs where it was submitted: its spec gets the submitter's directory as
`workdir` (`--chdir DIR` instead; a spec file's own `workdir` is kept unless
`--chdir` is given). Its environment is the node's baseline (the README's
"What a worker gets", nodeagent/rank_env.py: `node_env`), then the variables
the submitter exports, then the spec's `env:`, then corral's own keys.

`--export` reads as Slurm's (`sbatch --export`), ALL by default:

- `ALL` (the default, and `--export-all`): the whole environment, less what
  belongs to the submitter's shell or to corral (EXPORT_ALL_SKIPS, CORRAL_*,
  the rank keys, shell functions), less who the submitter is (ACCOUNT_SKIPS:
  the job runs as the node agent's account) and less what looks like a credential
  (`looks_secret`), said on stderr; a job with an `image` exports NONE unless
  asked, since the host's PATH would replace the image's;
- `NONE`: nothing;
- `A,B` (a list without ALL narrows it): only those variables; `VAR=VALUE`
  sets one; `ALL,A,B=c` is everything and those. A name in the list is
  exported even if it looks like a credential; one that is not set is an
  error, not a silent empty value.

Exported values are written into the log with the job (`corral job --json`
shows them), hence the credential rule, and at most MAX_EXPORT_BYTES of them.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping

import msgspec

from orchestrator.cli.errors import USAGE, CliError
from schemas import InvalidJobSpec, JobSpec, parse_jobspec

#: Variables of the submitter's shell that mean nothing on a node: ALL leaves them out.
EXPORT_ALL_SKIPS = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PROMPT_COMMAND", "TERM", "COLUMNS",
                              "LINES", "DISPLAY", "SSH_AUTH_SOCK", "SSH_AGENT_PID", "SSH_CONNECTION", "SSH_CLIENT",
                              "SSH_TTY", "XDG_SESSION_ID", "XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS", "HOSTNAME"})
#: Who the job runs as: the node agent's account (nodeagent/rank_env.py: ACCOUNT_KEYS), not the submitter's, so ALL
#: leaves these to the node (Slurm runs a job as its submitter and exports them; corral cannot).
ACCOUNT_SKIPS = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "MAIL"})
#: Keys corral sets for every rank (nodeagent/rank_env.py: RANK_KEYS): exporting one would be dropped.
CORRAL_SET = frozenset({"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
                        "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES"})
#: Most bytes (`NAME=VALUE`, one byte between) a job may export: they are stored in the log with it, and every
#: reader's fold keeps its spec. A typical shell's environment is a few KiB.
MAX_EXPORT_BYTES = 64 * 1024
#: A name holding one of these (upper-cased) looks like a credential.
SECRET_PARTS = ("SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "PRIVATE")
#: ... and so does one with one of these as a `_`-separated word (HF_TOKEN, AWS_ACCESS_KEY_ID, WANDB_API_KEY,
#: MYSQL_PWD; not TOKENIZERS_PARALLELISM).
SECRET_WORDS = frozenset({"TOKEN", "TOKENS", "KEY", "KEYS", "APIKEY", "PASS", "PWD", "AUTH", "CREDS", "COOKIE"})
#: A value holding a URL with a password (`postgres://user:password@host/db`).
_URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@", re.I)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODES = ("ALL", "NONE")


def looks_secret(name: str, value: str) -> bool:
    """Whether ALL leaves `name` out as a credential (the README's "What a worker gets" states the rule)."""
    upper = name.upper()
    return (any(part in upper for part in SECRET_PARTS) or not SECRET_WORDS.isdisjoint(upper.split("_"))
            or _URL_PASSWORD.search(value) is not None)


def add_submitter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chdir", "-D", metavar="DIR", help="where the ranks start (default: this directory); a "
                   "path on the nodes, relative ones from here")
    p.add_argument("--export", action="append", default=[], metavar="ALL|NONE|VAR[,VAR=VALUE...]",
                   help="what of your environment every rank gets, as Slurm's --export: ALL (the default; less "
                        "your shell's own variables, corral's and names that look like credentials), NONE, or only "
                        "the VARs listed (ALL,VAR,... adds them to ALL); VAR=VALUE sets one; repeatable. A job "
                        "with --image exports NONE unless asked")
    p.add_argument("--export-all", action="store_true", help="the same as --export ALL")


def _export_items(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """(ALL, NONE or None when neither was given, the VAR[=VALUE] items) of `--export` and `--export-all`."""
    modes: set[str] = {"ALL"} if args.export_all else set()
    items: list[str] = []
    for part in (p.strip() for item in args.export for p in item.split(",")):
        if part in _MODES:
            modes.add(part)
        elif part:
            items.append(part)
    if len(modes) > 1:
        raise CliError("--export: ALL and NONE together; give one (ALL,VAR adds VAR to everything)", USAGE)
    return (next(iter(modes)) if modes else None), items


def exported(args: argparse.Namespace, environ: Mapping[str, str], *, image: bool = False,
             dropped: list[str] | None = None) -> dict[str, str]:
    """The variables `--export` (and `--export-all`) put into the job's env; the names ALL left out as
    credentials are appended to `dropped`. Exit 2 past MAX_EXPORT_BYTES."""
    mode, items = _export_items(args)
    if mode is None:
        mode = "NONE" if items or image else "ALL"
    out: dict[str, str] = {}
    if mode == "ALL":
        for k, v in environ.items():
            if k in EXPORT_ALL_SKIPS or k in ACCOUNT_SKIPS or k in CORRAL_SET or k.startswith(("CORRAL_", "BASH_FUNC_")):
                continue
            if looks_secret(k, v):
                if dropped is not None:
                    dropped.append(k)
                continue
            out[k] = v
    named = named_variables(items, environ, "--export")
    if dropped is not None:
        dropped[:] = [k for k in dropped if k not in named]
    out.update(named)
    _check_size(out, mode == "ALL" and not items)
    return out


def _check_size(env: Mapping[str, str], whole: bool) -> None:
    size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())
    if size <= MAX_EXPORT_BYTES:
        return
    largest = sorted(env, key=lambda k: len(env[k].encode()), reverse=True)[:3]
    sizes = ", ".join(f"{k} ({_kib(len(env[k].encode()))})" for k in largest)
    what = "your environment" if whole else "the exported variables"
    are = "is" if whole else "are"
    raise CliError(f"{what} {are} {_kib(size)}, more than the {_kib(MAX_EXPORT_BYTES)} a job may export (stored in "
                   f"the log with it); largest: {sizes}: unset those, or pass only what the job needs with "
                   "--export VAR,... (or NONE)", USAGE)


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


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
                   cwd: str | None = None, notice: Callable[[str], None] | None = None) -> JobSpec:
    """`spec` with the submitter's directory (or `--chdir`) and exported variables (under the spec's `env:`).

    Validated again: what the submitter adds must make a valid spec too (exit 2 otherwise). The variables
    ALL left out as credentials are told to `notice` (default: a line on stderr; `run` and `submit` say it
    once the job is in the log, so a refused submit prints its one error line only).
    """
    environ = os.environ if environ is None else environ
    here = os.getcwd() if cwd is None else cwd
    raw = msgspec.to_builtins(spec)
    if args.chdir is not None:
        raw["workdir"] = os.path.normpath(os.path.join(here, os.path.expanduser(args.chdir)))
    elif spec.working_dir is None:
        raw["workdir"] = here
    dropped: list[str] = []
    shell = exported(args, environ, image=spec.image is not None, dropped=dropped)
    explicit = {k: v for k, v in shell.items() if k in _set_on_command_line(args)}
    raw["env"] = {**shell, **spec.env, **explicit}
    try:
        placed = parse_jobspec(raw)
    except InvalidJobSpec as e:
        lines = "\n".join(f"  {p.path}: {p.message}" for p in e.problems)
        raise CliError(f"the job with your directory and exports has {len(e.problems)} problem(s):\n{lines}",
                       USAGE) from None
    if dropped:
        (notice or _stderr)(f"not exported, as they look like credentials (the job is stored in the log): "
                            f"{', '.join(sorted(dropped))}; --export ALL,NAME passes one")
    return placed


def _stderr(text: str) -> None:
    print(f"corral: {text}", file=sys.stderr, flush=True)


def _set_on_command_line(args: argparse.Namespace) -> set[str]:
    """Names given a value by `--export VAR=VALUE`: they win over the spec file's `env:`."""
    return {part.split("=", 1)[0].strip() for item in args.export for part in item.split(",") if "=" in part}
