"""Submit checks and `corral queue apply` (#21): an unknown queue is refused at submit time once queues are
defined; a queue file is applied declaratively, `--prune` deletes (QueueDeleted) what it does not name."""

from __future__ import annotations

from pathlib import Path

import yaml

from events.server import NatsServer
from orchestrator.cli.errors import USAGE
from tests.cli.conftest import assert_one_line_error, corral, corral_json, job


def _write(path: Path, queues: list[dict[str, object]]) -> str:
    path.write_text(yaml.safe_dump({"queues": queues}))
    return str(path)


def test_queue_apply_and_submit_checks(nats_server: NatsServer, tmp_path: Path) -> None:
    url = nats_server.url
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(job("anywhere", queue="nosuch")))
    # No queue defined yet: every name runs (implicit queues).
    assert corral("submit", str(spec), "--id", "j-free", url=url).stdout.strip() == "j-free"

    three = _write(tmp_path / "q3.yaml", [
        {"name": "research", "weight": 2, "guarantee": 4, "limit_gpus": 8, "parent": "org"},  # parent first
        {"name": "org"}, {"name": "sandbox", "limit": 2}])
    out = corral("queue", "apply", three, url=url).stdout.splitlines()
    assert [line.split()[1:3] for line in out] == [["org", "created"], ["research", "created"],
                                                   ["sandbox", "created"]], out
    queues = {q["queue"]: q for q in corral_json("queues", url=url)["queues"]}
    assert (queues["research"]["weight"], queues["research"]["guaranteed_gpus"], queues["research"]["limit_gpus"],
            queues["research"]["parent"]) == (2.0, 4, 8, "org")
    again = corral_json("queue", "apply", three, url=url)
    assert (again["created"], again["updated"], again["unchanged"]) == ([], [], ["org", "research", "sandbox"])

    # Queues are defined: an unknown one is refused, naming those that exist; a defined one is taken.
    line = assert_one_line_error(corral("submit", str(spec), url=url, check=None), USAGE)
    assert "unknown queue 'nosuch'" in line and "org, research, sandbox" in line
    spec.write_text(yaml.safe_dump(job("here", queue="research")))
    corral("submit", str(spec), "--id", "j-research", url=url)

    # --prune deletes what the file leaves out; a change is an update.
    two = _write(tmp_path / "q2.yaml", [{"name": "org"}, {"name": "research", "weight": 3, "parent": "org"}])
    dry = corral("queue", "apply", two, "--prune", "--dry-run", url=url).stdout
    assert "queue sandbox would be deleted" in dry and "queue research would be updated (weight 2.0 -> 3.0" in dry
    assert "sandbox" in {q["queue"] for q in corral_json("queues", url=url)["queues"]}
    applied = corral_json("queue", "apply", two, "--prune", url=url)
    assert (applied["updated"], applied["deleted"]) == (["research"], ["sandbox"])
    assert {q["queue"] for q in corral_json("queues", url=url)["queues"] if q["defined"]} == {"org", "research"}
    assert corral("tail", "--no-follow", "--type", "QueueDeleted", "--json", url=url).stdout.count("sandbox") >= 1

    # Pruning a queue a job waits in is refused whole: nothing is appended.
    one = _write(tmp_path / "q1.yaml", [{"name": "org", "weight": 5}])
    proc = corral("queue", "apply", one, "--prune", url=url, check=None)
    assert proc.returncode == USAGE and "queue research: not in the file, but jobs still wait in it" in proc.stderr
    assert "j-research" in proc.stderr
    assert {q["queue"]: q["weight"] for q in corral_json("queues", url=url)["queues"] if q["defined"]} == {
        "org": 1.0, "research": 3.0}


def test_a_bad_queue_file_lists_every_problem(nats_server: NatsServer, tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.yaml", [
        {"name": "a", "weight": -1}, {"name": "b", "guaranteed_gpus": 4, "limit_gpus": 2}, {"name": "a"},
        {"name": "c", "colour": "red"}, {"name": "x.y"}, {"name": "d", "parent": "e"}, {"name": "e", "parent": "d"},
        {"name": "f", "parent": "nowhere"}])
    proc = corral("queue", "apply", bad, url=nats_server.url, check=None)
    assert proc.returncode == USAGE, proc.stderr
    for words in ("weight must be positive", "guarantee 4 is above limit 2", "queue a is declared twice",
                  "unknown field(s) colour", "'x.y' is not a valid queue name", "parents make a cycle"):
        assert words in proc.stderr, (words, proc.stderr)
    proc = corral("queue", "apply", _write(tmp_path / "orphan.yaml", [{"name": "f", "parent": "nowhere"}]),
                  url=nats_server.url, check=None)
    assert proc.returncode == USAGE and "unknown parent 'nowhere'" in proc.stderr
    assert corral_json("queues", url=nats_server.url)["queues"] == []
