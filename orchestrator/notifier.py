"""The notifier (`corral notifier`, started by `corral up`): a note when a job ends (issue #41).

It follows only the terminal job events (JobCompleted, JobFailed,
JobCancelled, JobRejected). For each, it reads that job's own events (its
subject, `corral.job.<id>.>`, up to the end) and builds the note (`note_of`):
id, name, user, queue, state, exit code, reason, times. Then:

- a job submitted with `--notify-url URL` (JobSpec.notify_url) gets the note
  POSTed there as JSON;
- with `--cmd CMD` (the operator's, never a job's: a command from a job spec
  would run as the notifier's user), CMD runs for every ended job with the
  note on its stdin and CORRAL_JOB_ID / CORRAL_JOB_STATE / CORRAL_JOB_EXIT_CODE
  in its environment.

Each delivery has a timeout and a bounded number of tries (backoff 1 s, 2 s,
4 s, ...); a 4xx answer other than 408/429 is not retried. A failed delivery
is logged with its reason (`notify_failed`) and fails only that note:
deliveries run concurrently (at most `concurrency`), so a slow or dead
endpoint never holds up the others, and nothing else in corral waits for the
notifier.

Position: after every delivery, the newest stream position below which every
note is done is written to `state_path` (atomically: a temporary file, then a
rename). A restart goes on from there, so no note is lost; one that was sent
but not yet recorded is sent again: delivery is at least once. Every note
carries `dedupe_key` (also the `Idempotency-Key` header): the job id and the
terminal event's id, the same on every retry and redelivery, so a receiver
drops repeats by it. A notifier with no position yet starts at the end of the
log: it does not notify the whole history.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import urllib.error
import urllib.request
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from events.bus import Bus, Envelope
from events.subjects import job_filter, type_filters
from schemas import JobSubmitted, Unknown
from schemas.events import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobRunning,
    WorkerExited,
)

log = structlog.get_logger("corral.notifier")

TERMINAL_TAGS = ("JobCompleted", "JobFailed", "JobCancelled", "JobRejected")
_STATE = {JobCompleted: "completed", JobFailed: "failed", JobCancelled: "cancelled", JobRejected: "rejected"}
#: Most bytes of an endpoint's answer read (its body is not used; reading some lets keep-alive servers finish).
_ANSWER_BYTES = 4096


@dataclass(frozen=True)
class NotifierConfig:
    #: Where the position is kept (a small JSON file).
    state_path: Path
    #: The operator's command run for every ended job (shlex-split, no shell); None: none.
    cmd: str | None = None
    #: Seconds one try may take (a POST, or the command).
    timeout_s: float = 5.0
    #: Tries per note (1: no retry).
    tries: int = 3
    #: Seconds before the first retry; doubled each time.
    backoff_s: float = 1.0
    #: Deliveries at once.
    concurrency: int = 8


def note_of(events: list[Envelope], end: Envelope) -> dict[str, Any] | None:
    """The note about the job that `end` (a terminal event) ended, from the job's events up to it; None when the
    log does not hold its submission."""
    ev = end.event
    if not isinstance(ev, (JobCompleted, JobFailed, JobCancelled, JobRejected)):
        return None
    sub = next((e for e in events if isinstance(e.event, JobSubmitted)), None)
    if sub is None or not isinstance(sub.event, JobSubmitted):
        return None
    attempt = getattr(ev, "attempt", None)
    started = [e.stream_time for e in events if isinstance(e.event, JobRunning) and e.seq < end.seq]
    exits = [e.event for e in events if isinstance(e.event, WorkerExited) and e.seq < end.seq
             and (attempt is None or e.event.attempt == attempt)]
    if attempt is None and exits:  # (a cancel has no attempt: its newest one's exits)
        newest = max(x.attempt for x in exits)
        exits = [x for x in exits if x.attempt == newest]
    bad = [x.exit_code for x in exits if x.exit_code not in (0, None)]
    rank0 = [x.exit_code for x in exits if x.rank == 0]
    exit_code = bad[0] if bad else rank0[-1] if rank0 else None
    reason = "; ".join(ev.reasons) if isinstance(ev, JobRejected) else getattr(ev, "reason", "")
    spec = sub.event.spec
    return {
        "job_id": ev.job_id, "name": spec.name, "user": sub.event.submitted_by, "queue": spec.queue,
        "state": _STATE[type(ev)], "exit_code": exit_code, "reason": reason, "attempt": attempt,
        "submitted_at": sub.stream_time, "started_at": started[-1] if started else None, "ended_at": end.stream_time,
        "seq": end.seq, "dedupe_key": f"{ev.job_id}:{ev.event_id}",
    }


def read_position(path: Path) -> int | None:
    """The position kept at `path`; None when there is none (or it is unreadable: the notifier says so)."""
    try:
        found = json.loads(path.read_text())["seq"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("notifier_position_unreadable", path=str(path), error=str(e))
        return None
    return found if isinstance(found, int) and found >= 0 else None


def write_position(path: Path, seq: int) -> None:
    """Keep `seq` at `path` atomically: a crash leaves the old position or the new one, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps({"seq": seq}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def post_json(url: str, body: bytes, key: str, timeout_s: float) -> None:
    """POST `body`; raises on anything but a 2xx answer (urllib.error.HTTPError carries the status)."""
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "corral-notifier", "Idempotency-Key": key})
    with urllib.request.urlopen(req, timeout=timeout_s) as answer:
        answer.read(_ANSWER_BYTES)


class _Permanent(Exception):
    """A failure another try would meet again (a 4xx answer, a URL no client can use)."""


class Notifier:
    def __init__(self, bus: Bus, config: NotifierConfig) -> None:
        self.bus = bus
        self.config = config
        self._slots = asyncio.Semaphore(config.concurrency)
        #: Positions read, in order, and those whose note is done: the kept position is the newest done prefix.
        self._open: list[int] = []
        self._done: set[int] = set()
        self.position = 0
        self.sent = 0
        self.failed = 0

    async def run(self) -> None:
        """Follow the terminal job events from the kept position until cancelled."""
        kept = read_position(self.config.state_path)
        if kept is None:
            kept = await self.bus.last_seq()
            write_position(self.config.state_path, kept)
        self.position = kept
        log.info("notifier_started", position=kept, cmd=bool(self.config.cmd))
        async with asyncio.TaskGroup() as tg, aclosing(
                self.bus.tail(subjects=type_filters(*TERMINAL_TAGS), from_seq=kept + 1)) as ends:
            async for env in ends:
                self._open.append(env.seq)
                if isinstance(env.event, Unknown):
                    self._finish(env.seq)
                    continue
                await self._slots.acquire()  # (bounded: a flood of ends waits here, not in memory)
                tg.create_task(self._deliver(env))

    async def _deliver(self, end: Envelope) -> None:
        try:
            job_id = getattr(end.event, "job_id", "")
            events: list[Envelope] = []
            async with aclosing(self.bus.replay(subjects=[job_filter(job_id)], to_seq=end.seq)) as batches:
                async for batch in batches:
                    events.extend(batch)
            note = note_of(events, end)
            if note is None:  # (its submission left the stream, or was never readable: nothing to say who to tell)
                log.info("notify_skipped", job_id=job_id, seq=end.seq, reason="the log holds no submission of it")
                return
            spec = next(e.event.spec for e in events if isinstance(e.event, JobSubmitted))
            url = spec.notify_to
            if url is not None:
                await self._try(note, f"POST {url}", lambda body: self._post(url, body, note["dedupe_key"]))
            if self.config.cmd:
                await self._try(note, "command", self._run_cmd_for(note))
        except Exception as e:  # (one note's failure is logged and ends only that note)
            log.warning("notify_failed", seq=end.seq, reason=f"{type(e).__name__}: {e}")
            self.failed += 1
        finally:
            self._slots.release()
            self._finish(end.seq)

    async def _try(self, note: dict[str, Any], what: str, once: Any) -> None:
        body = json.dumps(note).encode()
        delay = self.config.backoff_s
        for attempt in range(1, self.config.tries + 1):
            try:
                await asyncio.wait_for(once(body), self.config.timeout_s + 1.0)
            except _Permanent as e:
                log.warning("notify_failed", job_id=note["job_id"], to=what, tries=attempt, reason=str(e))
                self.failed += 1
                return
            except Exception as e:
                reason = "timed out" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
                if attempt == self.config.tries:
                    log.warning("notify_failed", job_id=note["job_id"], to=what, tries=attempt, reason=reason)
                    self.failed += 1
                    return
                log.info("notify_retry", job_id=note["job_id"], to=what, tries=attempt, reason=reason)
                await asyncio.sleep(delay)
                delay *= 2
            else:
                log.info("notified", job_id=note["job_id"], to=what, state=note["state"])
                self.sent += 1
                return

    async def _post(self, url: str, body: bytes, key: str) -> None:
        if not url.startswith(("http://", "https://")):
            raise _Permanent(f"not an http(s) URL: {url[:200]!r}")
        try:
            await asyncio.to_thread(post_json, url, body, key, self.config.timeout_s)
        except urllib.error.HTTPError as e:
            if 400 <= e.code < 500 and e.code not in (408, 429):
                raise _Permanent(f"HTTP {e.code} {e.reason}") from None
            raise
        except ValueError as e:  # a URL urllib cannot use
            raise _Permanent(str(e)) from None

    def _run_cmd_for(self, note: dict[str, Any]) -> Any:
        assert self.config.cmd is not None
        argv = shlex.split(self.config.cmd)
        env = {**os.environ, "CORRAL_JOB_ID": note["job_id"], "CORRAL_JOB_STATE": note["state"],
               "CORRAL_JOB_EXIT_CODE": "" if note["exit_code"] is None else str(note["exit_code"]),
               "CORRAL_NOTIFY_DEDUPE_KEY": note["dedupe_key"]}

        async def once(body: bytes) -> None:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, env=env,
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL)
            try:
                await asyncio.wait_for(proc.communicate(body), self.config.timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise
            if proc.returncode != 0:
                raise RuntimeError(f"{argv[0]} exited {proc.returncode}")

        return once

    def _finish(self, seq: int) -> None:
        """`seq`'s note is done: keep the newest position below which every note is."""
        self._done.add(seq)
        moved = False
        while self._open and self._open[0] in self._done:
            self._done.discard(self._open[0])
            self.position = self._open.pop(0)
            moved = True
        if moved:
            try:
                write_position(self.config.state_path, self.position)
            except OSError as e:
                log.warning("notifier_position_not_kept", path=str(self.config.state_path), error=str(e))
