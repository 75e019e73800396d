"""submit, jobs, job, nodes, queues, cancel, queue set, node cordon/uncordon: tables and --json."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import yaml

from tests.cli.conftest import Up, corral, corral_json, job, statuses, submit, wait_state


def test_submit_wait_then_read_it_back(cluster: Up, tmp_path: Path) -> None:
    url = cluster.url
    spec = tmp_path / "train.yaml"
    spec.write_text(yaml.safe_dump(job("cli-train", queue="research", ranks=2, gpus=1, steps=30)))
    proc = corral("submit", str(spec), "--id", "cli-train-1", "--wait", "--timeout", "60", url=url)
    first, last = proc.stdout.strip().splitlines()[0], proc.stdout.strip().splitlines()[-1]
    assert first == "cli-train-1"
    assert "JobCompleted" in last

    # Like squeue: finished jobs only with --all (or --state); the submitter is recorded and filters.
    assert "cli-train-1" not in corral("jobs", url=url).stdout
    assert "cli-train-1" not in {j["job_id"] for j in corral_json("jobs", url=url)["jobs"]}
    table = corral("jobs", "--all", url=url).stdout
    header, *rows = table.splitlines()
    assert header.split()[:5] == ["JOB", "NAME", "USER", "QUEUE", "STATE"]
    row = next(r for r in rows if r.startswith("cli-train-1 "))
    me = getpass.getuser()
    assert row.split()[1:6] == ["cli-train", me, "research", "completed", "1"]
    assert [j["job_id"] for j in corral_json("jobs", "--all", "--by-user", me, url=url)["jobs"]] == ["cli-train-1"]
    assert corral_json("jobs", "--all", "-u", "someone-else", url=url)["jobs"] == []

    listed = corral_json("jobs", "--queue", "research", "--state", "completed", url=url)
    mine = next(j for j in listed["jobs"] if j["job_id"] == "cli-train-1")
    assert mine["status"] == "completed" and mine["gpus"] == 2 and mine["ranks"] == 2
    assert all(j["status"] == "completed" for j in listed["jobs"])

    detail = corral_json("job", "cli-train-1", url=url)
    assert detail["status"] == "completed" and detail["attempt"] == 1
    assert len(detail["placement"]) == 2 and detail["spec"]["name"] == "cli-train"
    assert detail["seq"] >= 1

    # A finished job's ranks keep node, GPUs, exit code and times (the fold drops live rank books).
    assert detail["submitted_by"] == me
    assert [(r["rank"], r["status"], r["exit_code"], r["reason"]) for r in detail["rank_states"]] == [
        (0, "exited", 0, "completed"), (1, "exited", 0, "completed")]
    for r, placed in zip(detail["rank_states"], detail["placement"], strict=True):
        assert (r["node_id"], r["gpus"]) == (placed["node_id"], placed["gpus"])
        assert detail["submitted_at"] <= r["started_at"] <= r["exited_at"] <= detail["finished_at"]

    text = corral("job", "cli-train-1", url=url).stdout
    assert "status" in text and "completed" in text and "placement" in text
    assert "not started" not in text and "exit=0" in text and "started 20" in text and " exited 20" in text


def test_job_shows_placement_pending_reason_and_ranks(cluster: Up) -> None:
    url = cluster.url
    # Needs all 8 GPUs while cli-running holds one: pends with a capacity reason.
    submit(url, {"cli-running": job("long", steps=100_000)})
    wait_state(url, lambda s: statuses(s, ["cli-running"]) == ["running"], 30, "cli-running")
    submit(url, {"cli-toobig": job("toobig", ranks=2, gpus=4)})
    state = wait_state(url, lambda s: s.jobs["cli-toobig"].waiting is not None, 30, "a pending reason")
    why = state.jobs["cli-toobig"].waiting
    assert why is not None
    pending = corral("job", "cli-toobig", url=url).stdout
    # (its place in its queue's line comes before the message, as the state is now: views.waiting_text)
    assert f"pending   {why.code}: " in pending and why.message in pending
    assert corral_json("job", "cli-toobig", url=url)["waiting"]["code"] == why.code
    running = corral_json("job", "cli-running", url=url)
    assert running["status"] == "running"
    assert [r["status"] for r in running["rank_states"]] == ["started"]
    assert running["rank_states"][0]["node_id"] in ("node-0", "node-1")
    text = corral("job", "cli-running", url=url).stdout
    assert "placement" in text and "rank 0" in text and "started" in text

    # cancel: pending and running alike; asking again is fine
    corral("cancel", "cli-toobig", "--reason", "too big", url=url)
    wait_state(url, lambda s: statuses(s, ["cli-toobig"]) == ["cancelled"], 30, "cli-toobig cancelled")
    out = corral("cancel", "cli-running", url=url).stdout
    assert "cancel requested for cli-running" in out
    wait_state(url, lambda s: statuses(s, ["cli-toobig", "cli-running"]) == ["cancelled", "cancelled"], 40,
               "cancellations")
    again = corral("cancel", "cli-running", url=url).stdout
    assert "already cancelled" in again
    assert corral_json("job", "cli-toobig", url=url)["end_reason"] == "too big"


def test_nodes_and_cordon(cluster: Up) -> None:
    url = cluster.url
    nodes = corral_json("nodes", url=url)["nodes"]
    assert [n["node_id"] for n in nodes] == ["node-0", "node-1"]
    assert all(n["gpus"] == 4 and n["used"] + n["free"] == 4 and n["state"] == "ready" for n in nodes)
    assert nodes[0]["labels"] == {"block": "b0", "leaf": "l0"}

    out = corral("node", "cordon", "node-1", "--reason", "maintenance", url=url).stdout
    assert "node-1 cordoned" in out
    table = corral("nodes", url=url).stdout
    assert any(r.split()[:2] == ["node-1", "cordoned"] for r in table.splitlines())
    # New work avoids the cordoned node.
    submit(url, {"cli-on-0": job("on0", gpus=2, steps=20)})
    state = wait_state(url, lambda s: statuses(s, ["cli-on-0"]) == ["completed"], 40, "job on node-0")
    assert {p.node_id for p in state.jobs["cli-on-0"].placement} == {"node-0"}
    assert corral_json("node", "uncordon", "node-1", url=url)["cordoned"] is False
    assert corral_json("nodes", url=url)["nodes"][1]["state"] == "ready"


def test_queue_set_and_queues(cluster: Up) -> None:
    url = cluster.url
    out = corral("queue", "set", "team-a", "--weight", "3", "--guarantee", "1", "--limit", "4", url=url).stdout
    assert "queue team-a: weight=3 guarantee=1 limit=4" in out
    # Options not given keep their value; 'none' removes the limit.
    corral("queue", "set", "team-a", "--limit", "none", url=url)
    corral("queue", "set", "team-a-child", "--parent", "team-a", "--limit", "2", url=url)
    queues = {q["queue"]: q for q in corral_json("queues", url=url)["queues"]}
    assert queues["team-a"]["weight"] == 3.0 and queues["team-a"]["guaranteed_gpus"] == 1
    assert queues["team-a"]["limit_gpus"] is None
    assert queues["team-a-child"]["parent"] == "team-a" and queues["team-a-child"]["limit_gpus"] == 2
    table = corral("queues", url=url).stdout
    header = table.splitlines()[0].split()
    assert header == ["QUEUE", "USED", "GUARANTEE", "LIMIT", "WEIGHT", "PENDING", "ACTIVE", "PARENT"]
    row = next(r.split() for r in table.splitlines() if r.startswith("team-a-child "))
    assert row[1:5] == ["0", "0", "2", "1"] and row[-1] == "team-a"
    # A cycle is refused.
    proc = corral("queue", "set", "team-a", "--parent", "team-a-child", url=url, check=2)
    assert "cycle" in proc.stderr
    assert json.loads(corral("queue", "set", "team-b", "--json", url=url).stdout)["weight"] == 1.0
