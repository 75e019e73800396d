"""The scheduler's Prometheus endpoint during a workload agrees with `corral queues` and `corral nodes`."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.scheduler.metrics import state_metrics
from tests.cli.conftest import Up, corral, corral_json, job, state_of, statuses, submit, wait_state
from tests.cli.test_top import known_state

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_gauges_match_queues_and_nodes_during_a_workload(cluster: Up, metrics_port: int) -> None:
    url = cluster.url
    corral("queue", "set", "metrics-q", "--guarantee", "1", "--limit", "3", url=url)
    ids = ["met-1", "met-2", "met-3"]
    submit(url, {i: job(i, queue="metrics-q", gpus=1 if i != "met-3" else 2, steps=100_000) for i in ids})
    # Two run (2 GPUs); the third would exceed the queue's limit of 3 and waits.
    wait_state(url, lambda s: statuses(s, ids) == ["running", "running", "pending"]
               and s.jobs["met-3"].waiting is not None, 40, "the workload to settle")
    try:
        for _ in range(20):  # compare at one log position: nothing appended between the two scrapes
            before = scrape(metrics_port)
            queues = corral_json("queues", url=url)
            nodes = corral_json("nodes", url=url)
            after = scrape(metrics_port)
            pos = value(before, "corral_log_position")
            if pos == value(after, "corral_log_position") == queues["seq"] == nodes["seq"]:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the log never held still for a comparison")

        for q in queues["queues"]:
            name = q["queue"]
            assert value(after, "corral_queue_gpus_allocated", queue=name) == q["gpus"], name
            assert value(after, "corral_queue_gpus_guaranteed", queue=name) == q["guaranteed_gpus"], name
            assert value(after, "corral_queue_gpus_limit", queue=name) == q["limit_gpus"], name
            assert value(after, "corral_queue_weight", queue=name) == q["weight"], name
            assert value(after, "corral_queue_pending_jobs", queue=name) == q["pending"], name
        mq = next(q for q in queues["queues"] if q["queue"] == "metrics-q")
        assert mq["gpus"] == 2 and mq["pending"] == 1
        assert value(after, "corral_queue_gpus_free", queue="metrics-q") == 1  # limit 3, 2 held
        for n in nodes["nodes"]:
            assert value(after, "corral_node_gpus", node=n["node_id"], state="allocated") == n["used"]
            assert value(after, "corral_node_gpus", node=n["node_id"], state="free") == n["free"]
            assert value(after, "corral_node_condition", node=n["node_id"], condition=n["state"]) == 1
            age = value(after, "corral_node_heartbeat_age_seconds", node=n["node_id"])
            assert age is not None and 0 <= age < 5
        code = state_of_pending_code(url, "met-3")
        assert (value(after, "corral_pending_jobs", reason=code) or 0) >= 1
        assert value(after, "corral_jobs", status="running") == sum(
            1 for j in corral_json("jobs", "--state", "running", url=url)["jobs"])
        assert (value(after, "corral_events_appended_total", service="scheduler") or 0) > 0
        assert (value(after, "corral_events_appended_total", service="agent") or 0) > 0
        assert (value(after, "corral_decide_seconds_count") or 0) > 0
        assert (value(after, "corral_events_read_total", service="scheduler", type="JobSubmitted") or 0) >= 3
        assert value(after, "corral_agent_workers", node="node-0") is not None
    finally:
        for i in ids:
            corral("cancel", i, url=url)
        wait_state(url, lambda s: statuses(s, ids) == ["cancelled"] * 3, 40, "cancellations")


def state_of_pending_code(url: str, job_id: str) -> str:
    waiting = state_of(url).jobs[job_id].waiting
    assert waiting is not None
    return waiting.code


def test_preemptions_are_counted(cluster: Up, metrics_port: int, preemption: object) -> None:
    samples = scrape(metrics_port)
    assert (value(samples, "corral_preemptions_total") or 0) >= 1


def test_state_metrics_of_a_known_state() -> None:
    state, _ = known_state()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for m in state_metrics(state) for s in m.samples}
    assert got[("corral_node_gpus", (("node", "n0"), ("state", "allocated")))] == 4
    assert got[("corral_node_gpus", (("node", "n1"), ("state", "free")))] == 2
    assert got[("corral_node_condition", (("condition", "failed"), ("node", "n2")))] == 1
    assert got[("corral_queue_gpus_allocated", (("queue", "prod"),))] == 2
    assert got[("corral_queue_gpus_free", (("queue", "prod"),))] == 2  # 2 free on live nodes, limit 6 - 2
    assert got[("corral_queue_gpus_limit", (("queue", "prod"),))] == 6
    assert ("corral_queue_gpus_limit", (("queue", "research"),)) not in got
    assert got[("corral_pending_jobs", (("reason", "capacity"),))] == 1
    assert got[("corral_pending_jobs", (("reason", "unexplained"),))] == 1
    assert got[("corral_log_position", ())] == 16


MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count"),
             "gauge": ("",), "info": ("_info",), "unknown": ("",)}


def exposed_names(port: int) -> set[str]:
    """Every series name the endpoint can expose: sample names, and each family's (even with no samples yet)."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: set[str] = set()
    for family in text_string_to_metric_families(body):
        out |= {s.name for s in family.samples}
        out |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}
    return out


def test_outcomes_waits_gpu_seconds_build_and_process_metrics(cluster: Up, metrics_port: int,
                                                              preemption: object) -> None:
    """What the scheduler counts as its fold finishes jobs (the preemption scenario ends some)."""
    url = cluster.url
    submit(url, {"met-done": job("met-done", queue="research", steps=5)})
    wait_state(url, lambda s: statuses(s, ["met-done"]) == ["completed"], 60, "met-done")
    samples = scrape(metrics_port)
    assert (value(samples, "corral_jobs_finished_total", outcome="completed", queue="research") or 0) >= 1
    assert (value(samples, "corral_queue_wait_seconds_count", queue="research") or 0) >= 1
    assert (value(samples, "corral_queue_gpu_seconds_total", queue="research") or 0) > 0
    assert value(samples, "corral_void_decisions_total") is not None
    assert any(name == "corral_build_info" and v == 1 for (name, _), v in samples.items())
    assert (value(samples, "process_resident_memory_bytes") or 0) > 0


def test_dashboard_and_alert_rules_name_only_what_a_scheduler_exposes(cluster: Up, metrics_port: int) -> None:
    exposed = exposed_names(metrics_port)
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    named = {m for e in exprs for m in re.findall(r"\b((?:corral|process)_[a-z_]+)", e)}
    # The archiver's own (`corral archive`, or `corral up --retention`): tests/archive/test_faults.py checks them.
    named = {m for m in named if not m.startswith("corral_archive_")}
    assert len(named) >= 15
    assert not named - exposed, f"named but never exposed: {sorted(named - exposed)}"
    assert all(r.get("alert") and r.get("annotations", {}).get("summary") for g in rules["groups"]
               for r in g["rules"])


def test_k8s_probes_and_metrics_ports_are_served(cluster: Up, metrics_port: int) -> None:
    """The manifests' probes ask the metrics port for paths a running service answers with 200."""
    k8s = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
    for manifest in ("scheduler.yaml", "agent.yaml"):
        docs = [d for d in yaml.safe_load_all((k8s / manifest).read_text()) if d and d.get("kind") in
                ("Deployment", "DaemonSet", "StatefulSet")]
        (container,) = docs[0]["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        command = container["command"]
        assert command[command.index("--metrics-port") + 1] == str(ports["metrics"]), manifest
        for probe in ("livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] == "metrics", (manifest, probe)
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}{get['path']}", timeout=10) as r:
                assert r.status == 200, (manifest, probe)


def _families_twice(body: str) -> list[str]:
    """An independent strict reading of the text format: the families whose HELP or TYPE comes more than once,
    or whose samples are not all together after their TYPE line (what `promtool check metrics` rejects)."""
    seen: dict[str, int] = {}
    bad: list[str] = []
    family = ""
    closed: set[str] = set()
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            if family:
                closed.add(family)
            family = line.split()[2]
            seen[family] = seen.get(family, 0) + 1
            if seen[family] > 1:
                bad.append(family)
        elif line.startswith("# HELP ") or not line.strip():
            continue
        elif not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            if not name.startswith(family) or name in closed:
                bad.append(name)
    return bad


def test_every_family_is_exposed_once_under_corral_up(cluster: Up, metrics_port: int) -> None:
    """#31: the scheduler and both agents of `corral up` each report their fold's position and digest: one
    family each (one HELP, one TYPE), the agents' series told apart by `node`."""
    import os
    import shutil
    import subprocess

    import pytest

    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    assert _families_twice(body) == [], body
    positions = [ln for ln in body.splitlines() if ln.startswith("corral_log_position")]
    assert len(positions) == 3 and sum('node="node-' in ln for ln in positions) == 2, positions
    promtool = shutil.which("promtool")
    if promtool is None:  # Debian's `prometheus` package; .ci/run installs it
        if os.environ.get("CI"):
            raise AssertionError("promtool is missing in CI (apt-get install prometheus)")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
