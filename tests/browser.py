"""A real headless Chromium driven over W3C WebDriver (Debian's `chromium` and `chromium-driver`).

A few dozen lines of the protocol over urllib, not a client library: the tests
and bench/ui_screenshots.py only open pages, run a line of JavaScript, wait, and
take a screenshot. Without the packages `browser_or_skip` skips, except under
CI=true, where .ci/run installs them and their absence fails.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,800"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chromium_paths() -> tuple[str, str] | None:
    """(chromium, chromedriver), or None when either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def browser_or_skip() -> tuple[str, str]:
    import pytest

    found = chromium_paths()
    if found is None:
        if os.environ.get("CI") == "true":
            raise AssertionError("chromium or chromedriver is missing in CI (.ci/run installs chromium chromium-driver)")
        pytest.skip("chromium and chromedriver not installed (apt-get install chromium chromium-driver)")
    return found


class Browser:
    """One chromedriver process and one headless Chromium session; close() ends both."""

    def __init__(self, browser: str, driver: str) -> None:
        self.port = _free_port()
        self.profile = tempfile.mkdtemp(prefix="corral-chromium-")
        self.driver = subprocess.Popen([driver, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        self.session = ""
        try:
            self._wait_ready()
            caps = {"browserName": "chrome", "goog:chromeOptions": {
                "binary": browser, "args": [*CHROMIUM_FLAGS, f"--user-data-dir={self.profile}"]}}
            value = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
            self.session = value["sessionId"]
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self._call("GET", "/status").get("ready"):
                    return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        raise RuntimeError("chromedriver did not start")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"webdriver {method} {path}: {e.read()[:500]!r}") from None

    def _s(self, path: str) -> str:
        return f"/session/{self.session}{path}"

    def get(self, url: str) -> None:
        self._call("POST", self._s("/url"), {"url": url})

    def js(self, script: str, *args: Any) -> Any:
        """Run `script` (a function body: `return ...`) in the page."""
        return self._call("POST", self._s("/execute/sync"), {"script": script, "args": list(args)})

    def wait(self, what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Poll `check` until it returns something truthy; AssertionError naming `what` when it never does."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what} (last: {last!r})")

    def viewport(self, width: int, height: int) -> None:
        self._call("POST", self._s("/goog/cdp/execute"), {"cmd": "Emulation.setDeviceMetricsOverride", "params": {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}})

    def screenshot(self, path: Path) -> None:
        """The viewport as a PNG."""
        path.write_bytes(base64.b64decode(self._call("GET", self._s("/screenshot"))))

    def close(self) -> None:
        if self.session:
            try:
                self._call("DELETE", self._s(""))
            except (OSError, RuntimeError, urllib.error.URLError):
                pass
            self.session = ""
        if self.driver.poll() is None:
            self.driver.terminate()
            try:
                self.driver.wait(10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
                self.driver.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
