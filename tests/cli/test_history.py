"""`corral jobs --all` as sacct: exit codes of real workers, through `corral up` (its index answers)."""

from __future__ import annotations

import sys

from tests.cli.conftest import Up, corral_json, job, statuses, submit, wait_state


def test_exit_codes_and_end_reasons_of_finished_jobs(cluster: Up) -> None:
    url = cluster.url
    submit(url, {
        "hist-ok": job("hist-ok", queue="research", steps=5),
        "hist-bad": job("hist-bad", queue="research", restart_policy="never",
                        command=[sys.executable, "-c", "import sys; sys.exit(3)"]),
    })
    wait_state(url, lambda s: statuses(s, ["hist-ok", "hist-bad"]) == ["completed", "failed"], 60, "both to end")
    listed = corral_json("jobs", "--all", "--format", "job,state,start,end,elapsed,exitcode,reason", url=url)
    rows = {j["job_id"]: j for j in listed["jobs"] if j["job_id"].startswith("hist-")}
    assert rows["hist-ok"]["exit_code"] == 0 and rows["hist-bad"]["exit_code"] == 3
    assert "exit 3" in rows["hist-bad"]["end_reason"]
    for j in rows.values():
        assert j["started_at"] <= j["ended_at"]
        assert j["elapsed_s"] == j["ended_at"] - j["started_at"]
    failed = corral_json("jobs", "--all", "--state", "failed", url=url)["jobs"]
    assert "hist-bad" in {j["job_id"] for j in failed} and {j["status"] for j in failed} == {"failed"}
