"""Bad traces and cluster specs fail with every problem and its line; good ones round-trip."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from orchestrator.sim.cluster import (
    ClusterSpecError,
    cluster_warnings,
    dump_cluster,
    load_cluster,
    node_labels,
    parse_cluster,
)
from orchestrator.sim.engine import SimConfig, simulate
from orchestrator.sim.gen import standard_cluster
from orchestrator.sim.specs import shape, sim_jobs
from orchestrator.sim.trace import TraceError, TraceJob, load_trace, read_jobs, write_trace
from tests.sim.conftest import scenario


def test_trace_errors_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "job_id,submit_time,duration,num_gpus,queue,priority\n"
        "a,0,100,1,q,0\n"
        "b,zero,100,1,q,0\n"
        "c,5,-1,1,q,0\n"
        "a,6,10,2,q,0\n"
        "d,7,10,1,q,high\n"
        "e,8,10\n"
    )
    with pytest.raises(TraceError) as err:
        load_trace(path)
    problems = err.value.problems
    assert f"{path}:3: submit_time must be a number of seconds, got 'zero'" in problems
    assert any(p.startswith(f"{path}:4: duration") for p in problems)
    assert f"{path}:5: job_id 'a' already used on line 2" in problems
    assert f"{path}:6: priority must be an integer, got 'high'" in problems
    assert f"{path}:7: 3 fields, the header has 6" in problems


def test_trace_header_problems() -> None:
    with pytest.raises(TraceError, match=r"missing column.*duration"):
        read_jobs(io.StringIO("job_id,submit_time,num_gpus,queue\n"), "x.csv")
    with pytest.raises(TraceError, match=r"unknown column.*colour"):
        read_jobs(io.StringIO("job_id,submit_time,duration,num_gpus,queue,colour\n"), "x.csv")


def test_trace_round_trip() -> None:
    jobs = [TraceJob("a", 0.5, 100, 16, "q", priority=3, preemptible=False, gpu_model="H100",
                     topology=("leaf", "require"), time_limit=900, line=2),
            TraceJob("b", 1, 60.25, 1, "q", line=3)]
    buf = io.StringIO()
    write_trace(jobs, buf)
    assert read_jobs(io.StringIO(buf.getvalue())) == jobs


def test_jobs_the_cluster_cannot_take_are_named_by_line() -> None:
    cluster = parse_cluster({"nodes": 4, "gpus_per_node": 8, "queues": [{"name": "q"}],
                             "topology": [{"level": "leaf", "size": 2}]})
    jobs = [TraceJob("a", 0, 1, 12, "q", line=2), TraceJob("b", 0, 1, 8, "nope", line=3),
            TraceJob("c", 0, 1, 64, "q", line=4), TraceJob("d", 0, 1, 8, "q", topology=("rack", "prefer"), line=5),
            TraceJob("e", 0, 1, 8, "q", gpu_model="A100", line=6)]
    with pytest.raises(TraceError) as err:
        sim_jobs(jobs, cluster, "t.csv")
    text = str(err.value)
    for line, words in [(2, "not a multiple"), (3, "queue 'nope'"), (4, "more than the cluster"),
                        (5, "topology level 'rack'"), (6, "gpu_model 'A100'")]:
        assert f"t.csv:{line}: " in text and words in text


def test_gang_shapes() -> None:
    assert shape(1, 8) == (1, 1)
    assert shape(8, 8) == (1, 8)
    assert shape(128, 8) == (16, 8)
    with pytest.raises(ValueError):
        shape(12, 8)


def test_cluster_spec_errors_carry_yaml_lines(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "nodes: 4\n"
        "gpus_per_node: 8\n"
        "colour: blue\n"
        "topology:\n"
        "  - {level: leaf, size: 0}\n"
        "queues:\n"
        "  - name: a\n"
        "    weight: -1\n"
        "  - {name: b, parent: nobody}\n"
    )
    with pytest.raises(ClusterSpecError) as err:
        load_cluster(path)
    text = str(err.value)
    assert f"{path}:1: colour: unknown key" in text
    assert f"{path}:5: topology[0].size: must be a whole number >= 1, got 0" in text
    assert "needs both" not in text
    assert f"{path}:7: queues[0].weight: must be a number > 0, got -1" in text
    assert f"{path}:9: queues[1].parent: unknown queue 'nobody'" in text


def test_cluster_spec_yaml_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("nodes: [1,\n")
    with pytest.raises(ClusterSpecError, match="not valid YAML"):
        load_cluster(path)


def test_cluster_round_trip_and_labels(tmp_path: Path) -> None:
    spec = standard_cluster(nodes=64, queues=3)
    path = tmp_path / "c.yaml"
    path.write_text(dump_cluster(spec))
    assert load_cluster(path) == spec
    # block: 4 leaves of 8 nodes -> node 33 is in leaf 4, block 1.
    assert node_labels(33, spec.levels) == {"block": "b1", "leaf": "l4"}


def test_node_groups_and_gpu_model_constraint(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("nodes:\n  - {count: 2, gpu_model: H100}\n  - {count: 1, gpu_model: A100, gpus_per_node: 4}\n"
                    "queues: [{name: q}]\nmin_runtime_s: 0\n")
    spec = load_cluster(path)
    assert (spec.node_count, spec.total_gpus, spec.gpus_per_node) == (3, 20, 8)
    assert parse_cluster(yaml.safe_load(dump_cluster(spec))) == spec
    jobs = [TraceJob("a", 0, 10, 4, "q", gpu_model="A100"), TraceJob("h", 0, 10, 8, "q", gpu_model="H100")]
    result = simulate(scenario(spec, jobs), "corral", SimConfig(strict=True))
    placed = {j: result.state.jobs[j].placement[0].node_id for j in ("a", "h")}
    assert placed["a"] == "n0002" and placed["h"] in ("n0000", "n0001")


@pytest.mark.parametrize(("doc", "line"), [
    ({"nodes": 2.5}, "nodes: must be a whole number >= 1, got 2.5"),
    ({"nodes": 0}, "nodes: must be a whole number >= 1, got 0"),
    ({"nodes": [{"count": 0}]}, "nodes[0].count: must be a whole number >= 1, got 0"),
    ({"nodes": 2, "gpus_per_node": 0}, "gpus_per_node: must be a whole number >= 1, got 0"),
    ({"nodes": 2, "topology": [{"level": "rack", "size": 0}]}, "topology[0].size: must be a whole number >= 1, got 0"),
    ({"nodes": 2, "topology": [{"level": "rack"}]}, "topology[0]: needs both level and size (no size)"),
    ({"nodes": 2, "queues": [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}]},
     "queues[0].parent: makes a cycle: a -> b -> a"),
    ({"nodes": 2, "queues": [{"name": "a", "parent": "a"}]}, "queues[0].parent: makes a cycle: a -> a"),
    ({"nodes": 2, "queues": [{"name": "a", "guaranteed_gpus": 6, "limit_gpus": 2}]},
     "queues[0].guaranteed_gpus: 6 is above the queue's limit_gpus 2"),
])
def test_a_bad_cluster_spec_is_one_clear_line(doc: dict[str, object], line: str) -> None:
    with pytest.raises(ClusterSpecError) as err:
        parse_cluster(doc, "c.yaml")
    assert err.value.problems == [f"c.yaml: {line}"]


def test_guarantees_over_the_cluster_are_a_warning_as_in_queue_set() -> None:
    over = parse_cluster({"nodes": 2, "gpus_per_node": 4, "queues": [
        {"name": "a", "guaranteed_gpus": 6}, {"name": "b", "guaranteed_gpus": 6}]})
    assert cluster_warnings(over) == ["the queues' guarantees add up to 12 GPUs, more than the cluster's 8: "
                                      "not every queue can get its guarantee back at once"]
    # A child's guarantee is inside its parent's: counted once.
    nested = parse_cluster({"nodes": 2, "gpus_per_node": 4, "queues": [
        {"name": "org", "guaranteed_gpus": 8}, {"name": "team", "parent": "org", "guaranteed_gpus": 6}]})
    assert cluster_warnings(nested) == []


def test_a_trace_with_a_byte_order_mark_and_columns_in_any_order(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes("\ufeffqueue,num_gpus,duration,submit_time,job_id\r\nq,2,60,0,a\r\n".encode())
    assert load_trace(path).jobs == (TraceJob("a", 0.0, 60.0, 2, "q", line=2),)
    path.write_text("job_id,submit_time,num_gpus,queue\n")
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value) == (f"{path}:1: missing column(s) duration; the header must name job_id, submit_time, "
                              "duration, num_gpus, queue (in any order, optional columns anywhere)")
    path.write_bytes(b"job_id,submit_time,duration,num_gpus,queue\n\xff,0,1,1,q\n")
    with pytest.raises(TraceError, match="not UTF-8 text"):
        load_trace(path)


def test_a_job_over_its_queue_limit_is_a_trace_error_with_its_line() -> None:
    """The scheduler would reject it at once (policies/reject.py): the trace says so before the run instead."""
    cluster = parse_cluster({"nodes": 2, "gpus_per_node": 4, "queues": [
        {"name": "org", "limit_gpus": 6}, {"name": "prod", "limit_gpus": 8, "parent": "org"},
        {"name": "default", "limit_gpus": 2}]})
    jobs = [TraceJob("a", 0, 1, 8, "prod", line=2), TraceJob("b", 0, 1, 4, "unknown", line=3),
            TraceJob("c", 0, 1, 4, "prod", line=4), TraceJob("d", 0, 1, 2, "elsewhere", line=5)]
    with pytest.raises(TraceError) as err:
        sim_jobs(jobs, cluster, "t.csv")
    assert err.value.problems == ["t.csv:2: needs 8 GPUs, more than queue org's limit_gpus 6",
                                  "t.csv:3: needs 4 GPUs, more than queue default's limit_gpus 2"]
