"""Exit codes the CLI promises, so scripts can branch on them."""

OK = 0
FAILURE = 1  # the thing asked for ran and failed (e.g. --wait on a job that failed)
USAGE = 2  # bad arguments, invalid job spec, bad filter
UNREACHABLE = 3  # no NATS server at the URL
NOT_FOUND = 4  # unknown job, node or queue
TIMEOUT = 5  # --wait/--timeout ran out
DENIED = 6  # NATS refused the credentials or a permission, or TLS could not verify the server
INTERRUPTED = 130


class CliError(Exception):
    """A problem the user can act on: printed as one line, no traceback."""

    def __init__(self, message: str, code: int = FAILURE) -> None:
        super().__init__(message)
        self.code = code
