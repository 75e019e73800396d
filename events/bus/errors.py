"""What the bus raises: one BusError family, each naming what failed and what the server said."""

from __future__ import annotations

import nats.js.errors


class BusError(RuntimeError):
    pass


class PermissionDenied(BusError):
    """The server refused to let this connection's user send a request: its permissions, so no retry helps.

    `subject` is what was refused (e.g. $JS.API.STREAM.CREATE.CORRAL), `operation` what the bus
    was doing ("create stream CORRAL"), `user` the NATS user when the bus knows it.
    """

    def __init__(self, operation: str, subject: str, user: str | None) -> None:
        who = f"user {user!r}" if user else "this connection's user"
        super().__init__(f"NATS refused {who} permission to {operation}: permissions violation for publish to "
                         f"{subject}")
        self.operation = operation
        self.subject = subject
        self.user = user


class NotReady(BusError):
    """JetStream could not look up or create the stream (or a bucket) before the deadline; says what it waited for."""


class ReadStalled(BusError):
    """A read made no progress (no message, no heartbeat) and could not recover in time."""


class LogGap(BusError):
    """A fold needs the event at `expected` next, and the log gave `found` (> expected) instead.

    Readers of the whole stream see contiguous positions, so a gap means a
    read lost events: the reader reads again from `expected`. Raised out of a
    reader only when that cannot help (`why`: the log no longer holds the
    position, or reads keep missing it), so the service stops, naming it,
    rather than fold a state that skipped events (DESIGN.md, "never skips").
    """

    def __init__(self, expected: int, found: int, why: str = "") -> None:
        # (found == expected: a read that cannot start at all, e.g. a slice whose start the stream lost)
        super().__init__(f"log gap: the fold needs seq {expected} next"
                         + (f", the log gave seq {found}" if found > expected else "") + (f": {why}" if why else ""))
        self.expected = expected
        self.found = found
        self.why = why


def missing_range(lo: int, hi: int) -> str:
    """`seq 1..41 are` / `seq 7 is`: the positions a reader lacks, named exactly."""
    return f"seq {lo} is" if lo >= hi else f"seq {lo}..{hi} are"


class AppendRefused(BusError):
    """The server refused an append with an error that retrying at once will not fix.

    `description` is the server's own text, `err_code` its JetStream error code.
    """

    def __init__(self, message: str, *, code: int | None, err_code: int | None, description: str) -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code
        self.description = description


class LogFull(AppendRefused):
    """The stream (or the server's or the account's storage) is at a limit: no event is stored until it is raised."""


class IdSquatted(BusError):
    """The append's event id is taken: the message the stream stored under it is on another subject.

    The duplicate window is per stream, so a publisher may pre-empt an id (deploy/README.md,
    "Nats-Msg-Id squatting"); the event is not in the log, and appending it again with the same id
    fails the same way until the duplicate window has passed.
    """

    def __init__(self, event_id: str, seq: int, subject: str, found: str) -> None:
        super().__init__(f"event id {event_id!r} is taken: the stream holds seq {seq} under it on {found}, "
                         f"not on {subject}; the event was not stored")
        self.event_id = event_id
        self.seq = seq
        self.subject = subject
        self.found = found


class NotLast(AppendRefused):
    """`append_after` refused: another message was stored on the subject after the one expected.

    `last_seq` is the stream sequence of the subject's newest message now (0 if the server did not say).
    """

    def __init__(self, refused: AppendRefused, last_seq: int) -> None:
        super().__init__(str(refused), code=refused.code, err_code=refused.err_code, description=refused.description)
        self.last_seq = last_seq


def describe(e: BaseException) -> str:
    """An exception as a log line: nats-py's APIError has an empty repr but a useful str."""
    return str(e) if isinstance(e, nats.js.errors.APIError) else repr(e)
