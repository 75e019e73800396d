"""End-of-job notifications (issue #41) against a real local HTTP server.

`corral up` runs the notifier: jobs submitted with --notify-url get a JSON POST when they end; a bad URL fails only
its own note. `corral notifier` on its own (a subprocess on a real nats-server): its position survives a restart,
so a job that ended while it was down is notified once, and none twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from events.bus import Bus
from events.server import NatsServer
from schemas import JobSpec, JobSubmitted
from schemas.events import JobCompleted
from tests.cli.conftest import CORRAL, ROOT, Up, corral, free_port, job


class Hooks:
    """A loopback HTTP server recording every POST (path, headers, JSON body); /fail answers 500 every time."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with hooks.lock:
                    hooks.posts.append((self.path, dict(self.headers), json.loads(body)))
                self.send_response(500 if self.path == "/fail" else 204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def to(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [b for p, _, b in self.posts if p == path]

    def wait(self, until: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, f"timed out waiting for {what}; posts: {self.posts}"
            time.sleep(0.1)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    h = Hooks()
    try:
        yield h
    finally:
        h.close()


def test_corral_up_posts_a_note_when_a_job_ends_and_a_bad_url_fails_alone(hooks: Hooks, tmp_path: Path) -> None:
    up = Up(tmp_path / "corral", ["--nodes", "1", "--gpus-per-node", "2", "--notify-tries", "2"]).start()
    try:
        url = up.url
        dead = f"http://127.0.0.1:{free_port()}/nobody"  # nothing listens there: connection refused

        def submit(job_id: str, notify: str, **fields: Any) -> None:
            spec = tmp_path / f"{job_id}.json"
            spec.write_text(json.dumps(job(job_id, **fields)))
            corral("submit", str(spec), "--id", job_id, "--notify-url", notify, url=url)

        submit("nt-dead", dead, steps=5)
        submit("nt-fail", f"{hooks.url}/fail", steps=5)
        submit("nt-ok", f"{hooks.url}/hook", steps=5)
        submit("nt-bad", f"{hooks.url}/hook", command=["sh", "-c", "exit 3"], restart_policy="never")
        hooks.wait(lambda: len(hooks.to("/hook")) >= 2 and len(hooks.to("/fail")) >= 2, 60, "the notes")
        notes = {b["job_id"]: b for b in hooks.to("/hook")}
        ok, bad = notes["nt-ok"], notes["nt-bad"]
        assert (ok["state"], ok["exit_code"], ok["name"], ok["queue"]) == ("completed", 0, "nt-ok", "default")
        assert (bad["state"], bad["exit_code"]) == ("failed", 3)
        assert ok["user"] and ok["submitted_at"] <= ok["started_at"] <= ok["ended_at"]
        assert ok["dedupe_key"].startswith("nt-ok:")
        headers = next(h for p, h, b in hooks.posts if b["job_id"] == "nt-ok")
        assert headers["Idempotency-Key"] == ok["dedupe_key"]
        # /fail answered 500: tried --notify-tries times, the same note each time; nothing else was held up.
        assert [b["dedupe_key"] for b in hooks.to("/fail")] == [hooks.to("/fail")[0]["dedupe_key"]] * 2
        time.sleep(1.0)  # (no third try comes)
        assert len(hooks.to("/fail")) == 2
        log = (tmp_path / "corral-up1.stderr").read_text()
        assert "notify_failed" in log and "nt-dead" in log and "Connection refused" in log
    finally:
        assert up.stop() == 0


def _notifier(url: str, state: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CORRAL_LOG_LEVEL": "info"}
    return subprocess.Popen([*CORRAL, "--nats", url, "notifier", "--state", str(state), "--notify-tries", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


async def _ended(bus: Bus, job_id: str, notify: str) -> None:
    now = time.time()
    await bus.append(JobSubmitted(event_id=f"submit:{job_id}", occurred_at=now, job_id=job_id, submitted_by="alice",
                                  spec=JobSpec(name=job_id, notify_url=notify)))
    await bus.append(JobCompleted(event_id=f"completed:{job_id}:1", occurred_at=now, job_id=job_id, attempt=1))


async def test_the_notifier_keeps_its_position_across_a_restart(hooks: Hooks, tmp_path: Path) -> None:
    async with NatsServer(tmp_path / "nats") as server:
        bus = await Bus.connect(server.url)
        try:
            state, log = tmp_path / "notifier.json", tmp_path / "notifier.log"
            await _ended(bus, "before", f"{hooks.url}/hook")  # ended before any notifier: not notified
            proc = _notifier(server.url, state, log)
            hooks.wait(state.exists, 30, "the notifier to keep its first position")
            await _ended(bus, "first", f"{hooks.url}/hook")
            hooks.wait(lambda: len(hooks.to("/hook")) == 1, 30, "the first note")
            _stop(proc)
            await _ended(bus, "while-down", f"{hooks.url}/hook")  # ends while no notifier runs
            proc = _notifier(server.url, state, log)
            hooks.wait(lambda: len(hooks.to("/hook")) == 2, 30, "the note of the job that ended while it was down")
            await _ended(bus, "after", f"{hooks.url}/hook")
            hooks.wait(lambda: len(hooks.to("/hook")) == 3, 30, "the third note")
            _stop(proc)
            assert [b["job_id"] for b in hooks.to("/hook")] == ["first", "while-down", "after"]
            assert json.loads(state.read_text())["seq"] == await bus.last_seq()
        finally:
            await bus.close()
