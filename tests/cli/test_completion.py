"""`corral completion bash|zsh`: generated from the parser, and completes in a real bash."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from orchestrator.cli import build_parser
from orchestrator.cli.completion import bash_script, command_tree

SCRIPT = bash_script(command_tree(build_parser()))


def complete(line: str) -> list[str]:
    """What bash offers for the last word of `line` (a trailing space: a new, empty word)."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    quoted = " ".join(f"'{w}'" for w in words)
    probe = f"{SCRIPT}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _corral; printf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    out = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
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
