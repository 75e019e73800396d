"""The web UI (#43) against a real `corral up`: its pages in a real headless Chromium, and its guard.

The browser tests need Debian's chromium and chromium-driver (.ci/run installs them): they skip
without them here and fail in CI. The guard and the 400s are plain HTTP.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.core.model.state import FREE, ClusterState
from schemas import JobSubmitted
from tests.browser import Browser, browser_or_skip
from tests.cli.conftest import (
    CORRAL,
    ROOT,
    Up,
    corral,
    free_port,
    job,
    log_of,
    state_of,
    statuses,
    submit,
    wait_state,
)
from tests.deploy.pki import have_openssl, make_pki

pytestmark = pytest.mark.xdist_group("webui")

LONG = 100_000  # steps of 10 ms: runs for the whole module


@dataclass
class Cluster:
    up: Up
    ui: str  # the UI's URL, as `corral up` printed it

    @property
    def nats(self) -> str:
        return self.up.url


def _ui_url(up: Up, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(up.lines):
            if "web UI at " in line:
                return line.split("web UI at ", 1)[1].split()[0]
        time.sleep(0.1)
    raise AssertionError(f"corral up printed no web UI address: {''.join(up.lines)}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """2 nodes x 4 GPUs: prod runs two jobs, one of them preempted research's job (checkpointed, waiting
    again), and a research job waits."""
    up = Up(tmp_path_factory.mktemp("webui") / "corral",
            ["--nodes", "2", "--gpus-per-node", "4", "--min-runtime", "1", "--ui-port", "0"]).start()
    try:
        url = up.url
        corral("queue", "set", "prod", "--guarantee", "8", "--weight", "2", url=url)
        corral("queue", "set", "research", "--weight", "1", url=url)
        submit(url, {"ui-victim": job("victim", queue="research", gpus=4, steps=LONG),
                     "ui-runner": job("runner", queue="prod", gpus=4, steps=LONG, preemptible=False)})
        wait_state(url, lambda s: statuses(s, ["ui-victim", "ui-runner"]) == ["running"] * 2, 60, "both running")
        submit(url, {"ui-urgent": job("urgent", queue="prod", gpus=4, steps=LONG, priority=100, preemptible=False)})
        wait_state(url, lambda s: statuses(s, ["ui-urgent", "ui-victim"]) == ["running", "pending"]
                   and s.jobs["ui-victim"].checkpoint is not None, 60, "the victim preempted, checkpointed")
        submit(url, {"ui-waiting": job("waiting", queue="research", gpus=2, steps=LONG)})
        wait_state(url, lambda s: "ui-waiting" in s.pending and s.jobs["ui-waiting"].waiting is not None, 30,
                   "a waiting job with its reason")
        yield Cluster(up, _ui_url(up))
    finally:
        corral("cancel", "ui-victim", "ui-runner", "ui-urgent", "ui-waiting", "ui-new", url=up.url, check=None)
        assert up.stop() == 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium, driver = browser_or_skip()
    b = Browser(chromium, driver)
    try:
        yield b
    finally:
        b.close()


def _busy(state: ClusterState) -> dict[str, str]:
    """`gpu-<node>-<i>` -> the job holding it ('' free), as the cluster grid labels its cells."""
    return {f"gpu-{node}-{i}": ("" if o == FREE else o) for node, owners in state.owners.items()
            for i, o in enumerate(owners)}


def test_the_cluster_grid_shows_the_gpus_each_job_holds(cluster: Cluster, browser: Browser) -> None:
    browser.get(cluster.ui + "#/cluster")
    expected = _busy(state_of(cluster.nats))
    assert sorted(set(expected.values())) == ["ui-runner", "ui-urgent"], expected  # (the cluster is full)
    script = "const o = {}; for (const g of document.querySelectorAll('.gpu')) o[g.id] = g.dataset.job; return o;"
    browser.wait("the grid to show every GPU's job", lambda: browser.js(script) == expected)
    # Grouped by topology (corral up labels nodes block/leaf).
    assert browser.js("return document.querySelectorAll('.group[data-level=block]').length") >= 1


def test_the_queue_page_shows_each_queues_usage(cluster: Cluster, browser: Browser) -> None:
    browser.get(cluster.ui + "#/queues")
    used = "return Object.fromEntries([...document.querySelectorAll('#queues tbody tr')].map(r => [r.id, r.dataset.used]))"
    rows = browser.wait("the queue rows", lambda: (r := browser.js(used)) and "queue-prod" in r and r)
    assert rows["queue-prod"] == "8" and rows["queue-research"] == "0", rows
    assert browser.js("return !!document.querySelector('svg#fairshare')")


def test_the_job_page_tells_the_preemption_and_its_checkpoint_step(cluster: Cluster, browser: Browser) -> None:
    step = state_of(cluster.nats).jobs["ui-victim"].checkpoint
    assert step is not None
    browser.get(cluster.ui + "#/job/ui-victim")
    text = browser.wait("the timeline", lambda: browser.js(
        "const t = document.getElementById('timeline'); return t && t.innerText"))
    assert f"step {step.step}" in text, text
    assert "ui-urgent" in text and "preempt" in text.lower(), text
    kinds = browser.js("return [...document.querySelectorAll('#timeline li')].map(li => li.dataset.type)")
    assert "Checkpointed" in kinds and "Preempted" in kinds, kinds
    assert browser.js("return document.getElementById('ranks') !== null")


def test_a_new_job_appears_in_the_table_without_a_reload(cluster: Cluster, browser: Browser) -> None:
    browser.get(cluster.ui + "#/jobs")
    browser.wait("the jobs table", lambda: browser.js("return !!document.getElementById('job-row-ui-waiting')"))
    browser.js("window.notReloaded = true; return 0")
    started = time.monotonic()
    submit(cluster.nats, {"ui-new": job("new", queue="research", gpus=1, steps=LONG)})
    browser.wait("the new job's row", lambda: browser.js("return !!document.getElementById('job-row-ui-new')"))
    took = time.monotonic() - started
    assert browser.js("return window.notReloaded === true"), "the page reloaded"
    print(f"ui-new appeared {took:.2f}s after its submit")  # (the 2 s: bench/ui.py measures it)


def test_the_history_page_answers_from_the_index_and_shows_a_past_moment(cluster: Cluster, browser: Browser) -> None:
    browser.get(cluster.ui + "#/history/1h")
    hours = browser.wait("the GPU-hours per queue", lambda: browser.js(
        "const t = document.getElementById('gpu-hours'); return t && t.innerText"), timeout=60)
    assert "prod" in hours and "research" in hours, hours
    assert "prod" in browser.js("return document.getElementById('waits').innerText")
    # The cluster just before the first job was submitted: every GPU free, as `corral replay --at` says.
    first_job = next(env.seq for env in log_of(cluster.nats) if isinstance(env.event, JobSubmitted))
    browser.js(f"document.getElementById('at').value = '#{first_job - 1}'; historyPage.at(); return 0")
    cells = browser.wait("the past grid", lambda: browser.js(
        "const c = document.querySelectorAll('#at-view .gpu'); return c.length && [...c].map(g => g.dataset.job)"))
    assert len(cells) == 8 and set(cells) == {""}, cells


# --- the guard and bad requests (plain HTTP) ------------------------------------------------------------


def test_no_page_shows_a_jobs_environment(cluster: Cluster) -> None:
    secret = "hunter2-not-for-other-users"
    submit(cluster.nats, {"ui-env": job("env", queue="research", gpus=1, steps=LONG, env={"API_KEY": secret})})
    wait_state(cluster.nats, lambda s: "ui-env" in s.jobs, 30, "the job with an environment")
    status, _, body = _get(cluster.ui + "api/job/ui-env")
    assert status == 200 and secret.encode() not in body and b"API_KEY" not in body, body[:2000]
    assert json.loads(body)["spec"]["env_vars"] == "1 (not shown)"
    for path in ("api/overview", "api/jobs", "api/jobs?state=pending"):
        status, _, body = _get(cluster.ui + path)
        assert status == 200 and secret.encode() not in body, path
    corral("cancel", "ui-env", url=cluster.nats)



def _get(url: str, headers: dict[str, str] | None = None,
         context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    handlers: list[urllib.request.BaseHandler] = [NoRedirect()]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=20) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@contextlib.contextmanager
def ui_process(nats: str, *args: str) -> Iterator[tuple[int, str]]:
    """`corral ui ARGS` on a free port: (its port, the first line it printed)."""
    port = free_port()
    proc = subprocess.Popen([*CORRAL, "ui", "--nats", nats, "--port", str(port), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        assert "corral ui: http" in first, (first, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield port, first
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.parametrize("path", [
    "/api/jobs?limit=abc", "/api/jobs?limit=-5", "/api/jobs?state=runing", "/api/jobs?nope=1",
    "/api/jobs?limit=1&limit=2", "/api/job/bad%20id", "/api/job/ui-victim/log?rank=x", "/api/history?window=yesterday",
    "/api/history?buckets=0", "/api/at?at=tomorrow-ish", "/api/at", "/api/at?at=%23999999999", "/?x=1",
])
def test_a_malformed_query_gets_400_and_one_line_never_a_traceback(cluster: Cluster, path: str) -> None:
    status, headers, body = _get(cluster.ui.rstrip("/") + path)
    assert status == 400, (status, body)
    assert headers["Content-Type"].startswith("application/json")
    message = json.loads(body)["error"]
    assert message and "\n" not in message and "Traceback" not in message, message


def test_off_loopback_without_a_token_it_refuses_to_start(cluster: Cluster) -> None:
    proc = corral("ui", "--listen", "0.0.0.0", "--port", "0", url=cluster.nats, check=2, env={"CORRAL_UI_TOKEN": None})
    assert "needs a token" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_a_browser_that_falls_behind_gets_one_full_view_instead_of_its_backlog() -> None:
    from orchestrator.cli.webui.live import MAX_BACKLOG, Client

    client = Client()
    for i in range(MAX_BACKLOG):
        client.offer(f"delta {i}".encode())
    assert client.queue.qsize() == MAX_BACKLOG
    client.offer(b"one too many")
    assert client.queue.qsize() == 1 and client.queue.get_nowait() is None  # None: send the full view now
    client.offer(b"next")
    assert client.queue.get_nowait() == b"next"


def test_corral_up_refuses_a_ui_off_loopback_without_a_token_before_starting(tmp_path: Path) -> None:
    proc = corral("up", "--ui-listen", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path / "up"), check=2,
                  env={"CORRAL_UI_TOKEN": None})
    assert "needs a token" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "up").exists(), "it started something"


def test_a_port_taken_is_one_line_and_exit_1(cluster: Cluster) -> None:
    taken = cluster.ui.rstrip("/").rsplit(":", 1)[1]
    proc = corral("ui", "--port", taken, url=cluster.nats, check=1)
    assert f"cannot listen on 127.0.0.1:{taken}" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_off_loopback_every_request_needs_the_token(cluster: Cluster, tmp_path: Path) -> None:
    token = "s3cret-token-0123456789"
    (tmp_path / "token").write_text(token + "\n")
    with ui_process(cluster.nats, "--listen", "0.0.0.0", "--token-file", str(tmp_path / "token")) as (port, first):
        assert "http://0.0.0.0:" in first, first
        base = f"http://127.0.0.1:{port}"
        for path in ("/", "/api/overview", "/api/live", "/static/app.js", "/api/job/ui-victim"):
            status, _, body = _get(base + path)
            assert status == 401 and b"token" in body, (path, status, body)
        assert _get(base + "/api/overview", {"Authorization": "Bearer wrong-token-0123456789"})[0] == 401
        assert _get(base + "/?token=wrong-token-0123456789")[0] == 401
        status, headers, body = _get(base + "/api/overview", {"Authorization": f"Bearer {token}"})
        assert status == 200 and json.loads(body)["cluster"]["gpus_total"] == 8
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        # ?token= once: a cookie (an HMAC of it, never the token) and a redirect to the page without it.
        status, headers, _ = _get(base + f"/?token={token}")
        assert status == 302 and headers["Location"] == "/", headers
        cookie = headers["Set-Cookie"].split(";", 1)[0]
        assert token not in cookie and "HttpOnly" in headers["Set-Cookie"]
        assert _get(base + "/", {"Cookie": cookie})[0] == 200
        assert _get(base + "/", {"Cookie": "corral_ui=forged"})[0] == 401


@pytest.mark.skipif(not have_openssl(), reason="needs the openssl CLI")
def test_with_tls_it_serves_https_and_still_needs_the_token(cluster: Cluster, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    token = "tls-token-0123456789abcdef"
    (tmp_path / "token").write_text(token)
    with ui_process(cluster.nats, "--listen", "0.0.0.0", "--token-file", str(tmp_path / "token"), "--https-cert",
                    str(pki.server_cert), "--https-key", str(pki.server_key)) as (port, first):
        assert "https://0.0.0.0:" in first, first
        trusted = ssl.create_default_context(cafile=str(pki.ca))
        base = f"https://localhost:{port}"
        assert _get(base + "/api/overview", context=trusted)[0] == 401
        assert _get(base + "/api/overview", {"Authorization": f"Bearer {token}"}, context=trusted)[0] == 200
        status, headers, _ = _get(base + f"/?token={token}", context=trusted)
        assert status == 302 and "Secure" in headers["Set-Cookie"], headers
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            _get(f"http://localhost:{port}/api/overview", {"Authorization": f"Bearer {token}"})
