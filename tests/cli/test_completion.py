"""`corral completion bash|zsh`: generated from the parser, and completes in a real bash."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from orchestrator.cli import build_parser
from orchestrator.cli.completion import bash_script, command_tree, job_commands
from tests.cli.conftest import ROOT, Up, job, submit, wait_state

SCRIPT = bash_script(command_tree(build_parser()), job_commands(build_parser()))


def complete(line: str, prelude: str = "", env: dict[str, str] | None = None) -> list[str]:
    """What bash offers for the last word of `line` (a trailing space: a new, empty word)."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    quoted = " ".join(f"'{w}'" for w in words)
    probe = f"{prelude}{SCRIPT}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _corral; printf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    out = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ, **(env or {})})
    return out.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_commands_subcommands_and_options() -> None:
    assert complete("corral qu") == ["queue", "queues"]
    assert complete("corral queue a") == ["apply"]
    assert "--prune" in complete("corral queue apply --")
    assert complete("corral logs --fo") == ["--follow"]
    assert {"logs", "usage", "completion", "jobs"} <= set(complete("corral "))
    assert "--by-user" in complete("corral --nats nats://x:4222 jobs --")


def test_every_command_of_the_parser_is_in_the_tree_and_zsh_gets_it_too() -> None:
    tree = command_tree(build_parser())
    assert {"corral logs", "corral usage", "corral queue apply", "corral completion"} <= set(tree)
    assert "--all" in tree["corral jobs"] and "apply" in tree["corral queue"]
    from orchestrator.cli import main

    with pytest.raises(SystemExit) as done:
        main(["completion", "zsh"])
    assert done.value.code == 0


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_job_ids_from_the_cluster(cluster: Up) -> None:
    """#31: a job id completes where one goes (`corral job <TAB>`, `logs`, `cancel`, `explain`, `tail --job`)."""
    submit(cluster.url, {"compl-alpha": job("alpha", steps=5), "compl-beta": job("beta", steps=5)})
    wait_state(cluster.url, lambda s: {"compl-alpha", "compl-beta"} <= set(s.jobs), 30, "the jobs in the log")
    corral_fn = f"corral() {{ PYTHONPATH={ROOT} {sys.executable} -m orchestrator.cli \"$@\"; }}\n"
    env = {"CORRAL_NATS_URL": cluster.url}
    for line in ("corral job compl-", "corral logs compl-", "corral cancel compl-", "corral explain compl-",
                 "corral tail --job compl-", "corral --nats x job compl-"):
        assert sorted(complete(line, prelude=corral_fn, env=env)) == ["compl-alpha", "compl-beta"], line
    assert complete("corral job compl-a", prelude=corral_fn, env=env) == ["compl-alpha"]
    assert complete("corral job --j", prelude=corral_fn, env=env) == ["--json"]  # options still complete
    assert complete("corral job compl-", prelude=corral_fn, env={"CORRAL_NATS_URL": "nats://127.0.0.1:1"}) == []
