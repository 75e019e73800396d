"""The shipped alert rules in a real Prometheus scraping `corral up` under a job name of the user's (#41).

`corral monitoring --out DIR` writes the rules and the dashboard the package holds; `promtool check rules`
accepts the rules; a Prometheus (Debian's `prometheus`, as .ci/run installs it) scrapes `corral up` as the
job "lab-gpus-7" (no "scheduler" in it) with the shipped rules, only CorralSchedulerDown's `for:` shortened
in a copy (the shipped 2m would make the test wait 2 minutes). While corral up runs the alert is inactive;
once it is killed (SIGKILL: the scheduler's target goes down) it becomes pending, then firing. A labelled
gauge at zero (no job failed yet, no node failed) has a series. Skips locally without Prometheus; fails in CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.conftest import Up, corral, free_port

JOB_NAME = "lab-gpus-7"
ALERT = "CorralSchedulerDown"


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            raise AssertionError(f"{name} is missing in CI (apt-get install prometheus)")
        pytest.skip(f"{name} not installed (apt-get install prometheus)")
    return found


class Prometheus:
    """A Prometheus server on loopback, asked through its HTTP API."""

    def __init__(self, exe: str, config: Path, data: Path) -> None:
        self.port = free_port()
        self.log = open(data.parent / "prometheus.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [exe, f"--config.file={config}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read()) if path.startswith("/api/") else r.read().decode()

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["data"]["result"]
        return result

    def rule(self, name: str) -> dict[str, Any]:
        for group in self.get("/api/v1/rules")["data"]["groups"]:
            for r in group["rules"]:
                if r["name"] == name:
                    assert r["health"] == "ok", r
                    return dict(r)
        raise AssertionError(f"Prometheus has no rule {name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as e:  # not listening yet
            last = e
        else:
            if last:
                return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:g} s (last: {last!r})")


@pytest.fixture
def prometheus_rules(tmp_path: Path) -> Path:
    """The shipped rules as `corral monitoring` writes them, checked by promtool."""
    promtool = binary("promtool")
    corral("monitoring", "--out", str(tmp_path / "shipped"))
    shipped = tmp_path / "shipped" / "prometheus-rules.yaml"
    check = subprocess.run([promtool, "check", "rules", str(shipped)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    return shipped


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[Up, int]]:
    port = free_port()
    cluster = Up(tmp_path / "corral", ["--nodes", "2", "--gpus-per-node", "2", "--runtime", "simulated",
                                       "--metrics-port", str(port)])
    cluster.start()
    try:
        yield cluster, port
    finally:
        cluster.stop()


def test_scheduler_down_fires_under_any_job_name_and_zero_gauges_have_series(
        tmp_path: Path, prometheus_rules: Path, up: tuple[Up, int]) -> None:
    exe = binary("prometheus")
    cluster, metrics_port = up
    rules = yaml.safe_load(prometheus_rules.read_text())
    (down,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert down["for"] == "2m" and "job" not in down["expr"], down  # shipped as is; the copy below is the test's
    down["for"] = "2s"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(tmp_path / "rules.yaml")],
              "scrape_configs": [{"job_name": JOB_NAME, "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom = Prometheus(exe, tmp_path / "prometheus.yml", tmp_path / "tsdb")
    try:
        wait_for("Prometheus ready", lambda: prom.get("/-/ready"))
        # 1. While corral up runs: its scheduler leads, scraped under the user's job name; the alert is inactive
        # on the evaluations after that scrape.
        leader = wait_for("a scraped leader", lambda: prom.query(f'corral_scheduler_leader{{job="{JOB_NAME}"}} == 1'))
        seen = time.time()
        wait_for("two evaluations after the scrape", lambda: _evaluated_at(prom.rule(ALERT)) > seen + 2)
        assert prom.rule(ALERT)["state"] == "inactive", prom.rule(ALERT)
        assert not [a for a in prom.get("/api/v1/alerts")["data"]["alerts"] if a["labels"]["alertname"] == ALERT]
        assert leader[0]["metric"]["scheduler"] == "up-scheduler"
        # 2. Labelled gauges at zero have series: no job failed, no node failed, no reason to wait.
        for expr in ('corral_jobs{status="failed"}', 'corral_node_condition{condition="failed",node="node-0"}',
                     'corral_pending_jobs{reason="capacity"}', 'corral_node_gpus{state="unhealthy",node="node-1"}'):
            got = prom.query(f'{expr} == 0')
            assert len(got) == 1 and got[0]["metric"]["job"] == JOB_NAME, (expr, got)

        # 3. The scheduler is killed (with all of corral up): pending, then firing.
        assert cluster.proc is not None
        cluster.proc.kill()
        cluster.proc.wait(30)
        states = []

        def firing() -> bool:
            alerts = [a for a in prom.get("/api/v1/alerts")["data"]["alerts"] if a["labels"]["alertname"] == ALERT]
            states.extend(a["state"] for a in alerts if a["state"] not in states)
            return "firing" in states

        wait_for(f"{ALERT} firing", firing, timeout=60)
        assert states[0] in ("pending", "firing"), states
        assert prom.rule(ALERT)["state"] == "firing"
        assert prom.query("up") and all(s["value"][1] == "0" for s in prom.query(f'up{{job="{JOB_NAME}"}}'))
    finally:
        prom.stop()


def _evaluated_at(rule: dict[str, Any]) -> float:
    """The rule's last evaluation as a Unix time (RFC 3339 with nanoseconds, as the API gives it; 0: never)."""
    stamp = rule.get("lastEvaluation", "")
    if not stamp or stamp.startswith("0001-"):
        return 0.0
    # Python reads at most microseconds: cut the fraction to 6 digits, keep the zone ("Z" or an offset).
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()
