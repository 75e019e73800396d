"""A misbehaving HTTP server for the staging tests (#39), run as its own process:

    python tests/hostile_http.py PORT DIRECTORY EVENTS_FILE

- `/files/NAME`: DIRECTORY/NAME as it is (the hostile archives the test built);
- `/slow/TAG`: a valid tar of one 8 MiB file, 8 KiB every half second (never a stall, never done soon);
- `/trickle/TAG`: a 1 MiB body, one byte a second (a stall);
- `/endless`: a body without a length that never ends (random bytes after a zip's magic);
- `/lying`: a Content-Length of 100 GiB;
- `/garbage`: not HTTP at all.

A body that stops because the client went away appends "TAG closed after N bytes" to EVENTS_FILE: the test's
proof that a download stopped (a cancel, a stall, a limit), told by the server, not by corral.
"""

from __future__ import annotations

import os
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SLOW_FILE = 8 << 20
SLOW_STEP, SLOW_EVERY = 8 << 10, 0.5


def slow_tar_head() -> bytes:
    info = tarfile.TarInfo("slow/zeros")
    info.size = SLOW_FILE
    return info.tobuf(format=tarfile.GNU_FORMAT)


class Handler(BaseHTTPRequestHandler):
    directory: Path
    events: Path
    lock = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _tell(self, line: str) -> None:
        with self.lock, open(self.events, "a") as f:
            f.write(line + "\n")

    def _headers(self, length: int | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _stream(self, tag: str, pieces: object) -> None:
        """Send each piece of `pieces` (an iterator of (bytes, seconds to wait after)) until the client goes."""
        sent = 0
        try:
            for data, wait in pieces:  # type: ignore[attr-defined]
                self.wfile.write(data)
                self.wfile.flush()
                sent += len(data)
                if wait:
                    time.sleep(wait)
        except (BrokenPipeError, ConnectionResetError):
            self._tell(f"{tag} closed after {sent} bytes")
            return
        self._tell(f"{tag} done after {sent} bytes")

    def _answer(self, *, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        kind, _, tag = path.strip("/").partition("/")
        if kind == "files":
            f = self.directory / Path(tag).name
            if not f.is_file():
                self.send_error(404)
                return
            data = f.read_bytes()
            self._headers(len(data))
            if body:
                self.wfile.write(data)
        elif kind == "slow":
            head = slow_tar_head()
            total = len(head) + SLOW_FILE + 1024  # the file (a multiple of 512) and the end-of-archive blocks
            self._headers(total)
            if body:
                zeros = b"\0" * SLOW_STEP
                self._stream(f"slow/{tag}", [(head, 0.0)] + [(zeros, SLOW_EVERY)] * ((total - len(head)) // SLOW_STEP))
        elif kind == "trickle":
            self._headers(1 << 20)
            if body:
                self._stream(f"trickle/{tag}", ((b"\0", 1.0) for _ in range(1 << 20)))
        elif kind == "endless":
            self._headers(None)
            if body:
                self._stream("endless", ((b"PK\x03\x04" if i == 0 else os.urandom(1 << 16), 0.0)
                                         for i in range(1 << 40)))
        elif kind == "lying":
            self._headers(100 << 30)
            if body:
                self._stream("lying", [(b"\0" * 4096, 0.0)])
        elif kind == "garbage":
            self.wfile.write(b"SSH-2.0-OpenSSH_9.6 not a web server\r\n")
            self.close_connection = True
        else:
            self.send_error(404)


def main() -> None:
    port, directory, events = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    Handler.directory, Handler.events = directory, events
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
