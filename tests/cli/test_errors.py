"""Every error a user can hit prints one line and a meaningful exit code, never a traceback."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from orchestrator.cli import build_parser
from orchestrator.cli.errors import NOT_FOUND, UNREACHABLE, USAGE
from tests.cli.conftest import Up, assert_one_line_error, corral, corral_many, free_port

NOBODY = f"nats://127.0.0.1:{free_port()}"


NO_SERVER = [
    ["jobs"], ["job", "j-1"], ["nodes"], ["queues"], ["tail", "--no-follow"], ["tail"], ["replay"],
    ["explain", "j-1"], ["top", "--once"], ["cancel", "j-1"], ["node", "cordon", "n1"],
    ["queue", "set", "q", "--weight", "2"], ["submit", "examples/jobs/train.yaml"],
]


def test_no_server_exits_3() -> None:
    for args, proc in zip(NO_SERVER, corral_many([["--nats", NOBODY, *a] for a in NO_SERVER]), strict=True):
        line = assert_one_line_error(proc, UNREACHABLE)
        assert "cannot reach NATS" in line and NOBODY in line, args


def test_env_url_is_used() -> None:
    line = assert_one_line_error(corral("jobs", url=NOBODY, check=None), UNREACHABLE)
    assert NOBODY in line


USAGE_ERRORS = [
    (["tail", "--type", "JobExploded"], "unknown event type 'JobExploded'"),
    (["tail", "--type", "JobRunning,Nope"], "unknown event type 'Nope'"),
    (["tail", "--since", "10 parsecs"], "bad time"),
    (["tail", "--since", "5m", "--from-seq", "3"], "not both"),
    (["tail", "--from-seq", "abc"], "--from-seq"),
    (["tail", "--from-seq", "0"], "sequences start at 1"),
    (["tail", "--job", "a.b"], "not a valid corral id"),
    (["jobs", "--state", "sleeping"], "unknown job state 'sleeping'"),
    (["job", "bad id!"], "not a valid corral id"),
    (["replay", "--at", "yesterday-ish"], "bad time"),
    (["replay", "--at", "999999"], "in the future"),
    (["queue", "set", "q", "--limit", "many"], "--limit"),
    (["queue", "set", "q", "--guarantee", "8", "--limit", "4"], "above limit"),
    (["node", "reboot", "n1"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
]


def test_usage_errors_exit_2(cluster: Up) -> None:
    results = corral_many([args for args, _ in USAGE_ERRORS], url=cluster.url)
    for (args, says), proc in zip(USAGE_ERRORS, results, strict=True):
        line = assert_one_line_error(proc, USAGE)
        assert says in line, (args, line)


BAD_SPEC = textwrap.dedent("""\
    name: broken
    ranks: 0
    gpus_per_rank: many
    restart_policy: sometimes
    colour: blue
    mounts:
      - {source: data, target: /data}
    topology: {level: leaf, mode: maybe}
    env: {CORRAL_JOB_ID: x}
""")


def test_bad_spec_lists_every_problem_with_its_path(cluster: Up, tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(BAD_SPEC)
    proc = corral("submit", str(spec), url=cluster.url, check=None)
    assert proc.returncode == USAGE
    assert "Traceback" not in proc.stderr
    head, *problems = proc.stderr.strip().splitlines()
    assert head.startswith("corral: error:") and "7 problem(s)" in head, proc.stderr
    paths = {p.strip().split(":")[0] for p in problems}
    assert paths == {"ranks", "gpus_per_rank", "restart_policy", "colour", "mounts[0].source", "topology.mode",
                     "env.CORRAL_JOB_ID"}
    assert proc.stdout == ""


def test_unparsable_yaml_is_one_line(cluster: Up, tmp_path: Path) -> None:
    spec = tmp_path / "syntax.yaml"
    spec.write_text("name: [unclosed\nranks: 2\n")
    line = assert_one_line_error(corral("submit", str(spec), url=cluster.url, check=None), USAGE)
    assert "not valid YAML" in line and "line" in line


def test_spec_from_stdin_and_missing_file(cluster: Up) -> None:
    proc = corral("submit", "-", url=cluster.url, stdin="ranks: 1\n", check=None)
    assert proc.returncode == USAGE and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[1:] == ["  name: is required"]
    assert_one_line_error(corral("submit", "/nonexistent/job.yaml", url=cluster.url, check=None), NOT_FOUND)


NOT_FOUND_ERRORS = [
    (["job", "no-such-job"], "unknown job 'no-such-job'"),
    (["explain", "no-such-job"], "unknown job 'no-such-job'"),
    (["cancel", "no-such-job"], "unknown job 'no-such-job'"),
    (["node", "cordon", "node-99"], "unknown node 'node-99'"),
    (["jobs", "--queue", "no-such-queue"], "unknown queue 'no-such-queue'"),
    (["queue", "set", "child", "--parent", "no-such-parent"], "unknown parent queue"),
]


def test_unknown_things_exit_4(cluster: Up) -> None:
    results = corral_many([args for args, _ in NOT_FOUND_ERRORS], url=cluster.url)
    for (args, says), proc in zip(NOT_FOUND_ERRORS, results, strict=True):
        line = assert_one_line_error(proc, NOT_FOUND)
        assert says in line, (args, line)


def test_help_everywhere() -> None:
    """Every command and subcommand has help (checked in-process: one subprocess each is slow)."""
    seen = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        assert parser.format_help().strip(), path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    seen.append(" ".join([*path, name]))
                    walk(sub, [*path, name])

    walk(build_parser(), [])
    assert {"jobs", "job", "nodes", "queues", "queue set", "node cordon", "node uncordon", "tail", "replay",
            "explain", "top", "submit", "cancel", "up"} <= set(seen)
    out = corral("tail", "--help").stdout
    assert "--since" in out and "--queue" in out
