"""`corral archive` (the archiver service) and the global `--archive PATH` every reader honours.

With retention on, the stream keeps the newer positions and the archive the
older ones (orchestrator/archiver.py). A read command given `--archive PATH`
(or CORRAL_ARCHIVE) reads both as one log (events/history.py), so `replay
--at`, `explain`, `usage`, `jobs` and `tail --from-seq` reach any position;
without it, a position the stream dropped is a LogGap naming it.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from events.archive import Archive
from events.bus import Bus, LogGap
from events.history import History
from events.logfile import LogFile
from orchestrator.cli.errors import FAILURE, USAGE, CliError
from orchestrator.cli.timespec import parse_span, seconds_arg

if TYPE_CHECKING:
    from events.telemetry import MetricsServer
    from orchestrator.archiver import ArchiverConfig

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in `20GB`, `500MB`, `1.5GiB`, `4096`; raises CliError (exit 2) otherwise."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise CliError(f"bad size {text!r}: use a number with a unit, like 500MB, 20GB or 1.5GiB", USAGE)
    unit = (m.group(2) or "b").lower()
    return int(float(m.group(1)) * (1024 if "i" in unit else 1000) ** "bkmgt".index(unit[0]))


def with_archive(args: argparse.Namespace, bus: Bus) -> Bus | History:
    """The log a read command reads: the stream, or with `--archive` the archive and the stream as one."""
    path = getattr(args, "archive", None)
    if not path:
        return bus
    if not Path(path).is_dir():
        raise CliError(f"--archive {path}: no such directory", USAGE)
    return History(bus, Archive(path))


#: What a reader refused for positions the stream dropped says to do about it.
ARCHIVE_HINT = "pass --archive PATH (or set CORRAL_ARCHIVE) to read them from the archive"


async def require_from(source: Bus | History | LogFile, seq: int, what: str, *, instead: str = "") -> None:
    """Refuse (CliError, exit 1) a read of the log from `seq` on when the stream no longer holds `seq`.

    A reader whose answer needs the whole history (usage, explain, `tail --no-follow`) never answers
    from what is left after retention or a purge: it names the range the stream lacks and how to read
    it. Only for the stream alone: with --archive a read that neither holds raises LogGap naming the
    range (events/history.py), and a log file holds what it holds.
    """
    if not isinstance(source, Bus):
        return
    why = await source.missing(seq)
    if why is not None:
        raise CliError(f"{what}: {why}; {ARCHIVE_HINT}" + (f", or {instead}" if instead else ""), FAILURE)


async def check_contiguous(source: Bus | History | LogFile, expected: int, env_seq: int) -> None:
    """A whole-log read that delivered `env_seq` where it needed `expected` stops, naming the range (a
    purge that raced the read): never a silent skip. A log file may start anywhere and skip."""
    if env_seq != expected and not isinstance(source, LogFile):
        await _gap(source, expected, env_seq)


async def export_log(args: argparse.Namespace, path: Path) -> Path:
    """The whole log, from position 1 to its last as of now, into `path`: one event a line, line N position N.

    With `--archive` the archive and the stream as one log; without, a stream whose head was purged
    stops it with a LogGap naming the missing range (no partial file is left: written aside, renamed).
    What `corral sim --from-cluster` re-runs; the file is what `--from-log` reads.
    """
    from contextlib import aclosing

    from orchestrator.cli.connect import connected
    from schemas import Event, Unknown, encode

    def line(event: Event | Unknown) -> bytes:
        if isinstance(event, Unknown):  # as stored, on one line: --from-log counts it as unreadable, at its position
            return (event.raw.replace(b"\n", b" ").strip() or b"{}") + b"\n"
        return encode(event) + b"\n"

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot create {path.parent}: {e.strerror or e}", USAGE) from None
    part = path.with_name(path.name + ".part")
    async with connected(args, name="corral-sim") as bus:
        source = with_archive(args, bus)
        end = await source.last_seq()
        nxt = 1
        try:
            with part.open("wb") as out:
                async with aclosing(source.replay(from_seq=1, to_seq=end)) as batches:
                    async for batch in batches:
                        if batch[0].seq != nxt or batch[-1].seq != nxt + len(batch) - 1:
                            await _gap(source, nxt, next(e.seq for i, e in enumerate(batch) if e.seq != nxt + i))
                        out.write(b"".join(line(env.event) for env in batch))
                        nxt += len(batch)
            if nxt <= end:
                await _gap(source, nxt, end + 1)
            part.replace(path)
        finally:
            part.unlink(missing_ok=True)
    return path


async def _gap(source: Bus | History, expected: int, found: int) -> None:
    """A read of the whole log that would skip `expected`..`found - 1` stops, naming them (and the cure)."""
    why = await source.missing(expected) or f"seq {expected}..{found - 1} were not delivered"
    hint = "" if isinstance(source, History) else f"; {ARCHIVE_HINT}"
    raise CliError(f"{LogGap(expected, found, why)}{hint}", FAILURE)


async def run_archiver(args: argparse.Namespace) -> int:
    from orchestrator.archiver import Archiver
    from orchestrator.cli.connect import connected
    from orchestrator.cli.services import until_signalled
    from orchestrator.logging import configure_logging

    configure_logging(args.log_level)
    path = args.path or args.archive
    if not path:
        raise CliError("corral archive needs --path DIR (or the global --archive / CORRAL_ARCHIVE)", USAGE)
    config = archiver_config(args, Path(path))
    async with connected(args, name="corral-archiver", forever=True, wait_for_creator=True) as bus:
        archiver = Archiver(bus, config)
        server = await _serve_metrics(args, bus)
        try:
            return await until_signalled(archiver.run())
        finally:
            if server is not None:
                await server.close()


async def _serve_metrics(args: argparse.Namespace, bus: Bus) -> MetricsServer | None:
    """The archiver's metrics (corral_archive_*, alert CorralArchiveWriteFailing) on --metrics-port (0: off)."""
    if not args.metrics_port:
        return None
    from events.telemetry import ServiceRegistry
    from orchestrator.archiver import watch_archiver
    from orchestrator.cli.services import serve_metrics

    registry = ServiceRegistry([bus])
    watch_archiver(registry)
    return await serve_metrics(args, registry)


def archiver_config(args: argparse.Namespace, path: Path) -> ArchiverConfig:
    from orchestrator.archiver import ArchiverConfig

    if args.segment_events < 1 or args.segment_seconds <= 0:
        raise CliError("--segment-events must be >= 1 and --segment-seconds > 0", USAGE)
    return ArchiverConfig(
        path=path.resolve(), segment_events=args.segment_events, segment_seconds=args.segment_seconds,
        retention_s=_retention_s(args.retention) if args.retention else None,
        max_bytes=parse_size(args.max_bytes) if args.max_bytes else None, purge_every_s=args.purge_every,
    )


def _retention_s(text: str) -> float:
    """--retention in any span form (orchestrator/cli/timespec.py: `parse_span`; a plain number is seconds)."""
    try:
        return parse_span(text, bare_s=1)
    except ValueError as e:
        raise CliError(f"--retention: {e}", USAGE) from None


def add_retention_args(p: argparse.ArgumentParser) -> None:
    """The archiver's options (`corral archive`, and `corral up` when it runs one)."""
    p.add_argument("--retention", metavar="AGE", help="keep this much of the log in the stream (30d, 12h), measured "
                   "back from its newest event; older events leave the stream once archived (default: no age limit)")
    p.add_argument("--max-bytes", metavar="SIZE", help="keep the stream under SIZE (20GB, 500MB) by dropping its "
                   "oldest archived events (default: no size limit)")
    p.add_argument("--segment-events", type=int, default=10_000, metavar="N",
                   help="close an archive segment after N events (default %(default)s)")
    p.add_argument("--segment-seconds", type=seconds_arg, default=60.0, metavar="S",
                   help="or S seconds after its first event (default %(default)s)")
    p.add_argument("--purge-every", type=seconds_arg, default=10.0, metavar="S",
                   help="apply retention this often (default %(default)s)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from orchestrator.cli.connect import add_connection_args, add_log_level_arg

    p = sub.add_parser(
        "archive", help="run the archiver: the log into compressed segment files, and stream retention",
        description="Write the stream's events, in order and exactly once, to compressed segment files with "
                    "manifests under --path, and (with --retention/--max-bytes) purge from the stream what the "
                    "archive holds and no restart needs: nothing at or after the oldest kept scheduler snapshot or the node "
                    "views' base (a damaged newest snapshot falls back to an older one). Readers given --archive "
                    "PATH read both. Connect as the `archiver` user (reads, and purges the stream).")
    add_connection_args(p, service=True)
    add_log_level_arg(p)
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("CORRAL_METRICS_PORT", "0")),
                   metavar="PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics (env "
                   "CORRAL_METRICS_PORT; default 0 = off)")
    p.add_argument("--metrics-host", default="0.0.0.0", metavar="HOST",
                   help="address the metrics endpoint binds (default %(default)s)")
    p.add_argument("--path", metavar="DIR", help="the archive directory, local or shared storage (default: the "
                   "global --archive / CORRAL_ARCHIVE)")
    add_retention_args(p)
    p.set_defaults(handler=run_archiver)
