"""The docs cannot drift from behaviour (#21 acceptance 6): every command of README.md and examples/README.md runs.

The fenced shell blocks of each document are read line by line (comments stripped, `&&` split) and
every `corral ...` command runs, in order, against one real `corral up` (4 simulated nodes x 8 GPUs,
as the README's `corral up`) with `CORRAL_NATS_URL` set, and must exit 0. The docs' placeholders
are filled from earlier output (the id a `corral submit` printed, a job of the simulated log), and
commands that follow run once (`tail --no-follow`, `top --once`). `make`, `pip` and `python` lines
are checked, not run: their target, extra or script must exist. The README's SDK example runs too.

What cannot run as written is in NOT_RUN or REWRITTEN below with the reason; an entry the docs no
longer use fails the test, and so does a command of a kind this file does not know, so a new
command in the docs is either run here or listed here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.jobspec import read_jobspec
from tests.cli.conftest import CORRAL, Up, state_of, wait_state

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "examples" / "README.md"]
SHELL_LANGS = {"", "sh", "bash", "shell", "console"}

# Commands (as written, comments stripped) that this test does not run, and why.
NOT_RUN = {
    "corral up": "this test's fixture is that command (with --port 0 and a temporary --data-dir)",
    "corral ui": "serves until Ctrl-C (`corral up`, this test's fixture, serves one too): tests/cli/test_webui.py "
                 "drives its pages in Chromium",
    "corral ui --listen 0.0.0.0 --token-file /etc/corral/ui-token": "the same, with a token file of the reader's: "
                                                                  "tests/cli/test_webui.py runs it with one",
    "corral up --demo --data-dir .corral/demo": "the whole demo takes minutes: tests/test_install.py runs it to the end (installed, "
                                                "from another directory), tests/cli/test_demo.py its failure path",
    "corral scheduler --policy drf": "a service that runs until stopped: tests/integration/test_policy_live.py runs it "
                                     "against simulated agents and compares its decisions with the simulator's",
    "corral up --policy fifo-backfill": "the fixture's cluster is this command's (--policy only picks the scheduler's "
                                        "policy: tests/cli/test_policy_option.py checks its names)",
}
# Parts of commands that run differently here, and why: (as written, as run).
REWRITTEN = {
    "sim gen --jobs 2000": ("sim gen --jobs 200", "2,000 jobs under five policies take ~40 s on two cores"),
    "--jobs 1000 --out small.csv": ("--jobs 200 --out small.csv", "1,000 jobs at four loads under five policies "
                                                                 "take minutes on two cores"),
    "--generate 1000": ("--generate 200", "the same"),
    "--load 0.5,0.8,1.0,1.2 --policy all": ("--load 0.5,1.2 --policy corral,fifo --no-figures", "the same"),
}
# Commands that follow the log until Ctrl-C: the options that make them print once and exit.
# (`top` without a terminal prints one frame by itself: run as written.)
ONCE = {"tail": ["--no-follow"]}
# Lines that set up a shell and need no check.
SHELL_SETUP = {"export PATH=$PWD/.venv/bin:$PATH": "puts the venv's corral first on PATH (this test runs it so)"}
JOB_ID_PLACEHOLDER = "j-3f2a9c1b0d"  # "prints the job id, e.g. j-3f2a9c1b0d": the id that submit printed
SIM_JOB_PLACEHOLDER = "j000930"  # a job of the simulated log


@dataclass(frozen=True)
class Line:
    doc: str
    lineno: int
    raw: str
    argv: list[str]

    @property
    def text(self) -> str:
        return shlex.join(self.argv)

    def where(self) -> str:
        return f"{self.doc}:{self.lineno}: {self.raw.strip()}"


def fenced_blocks(text: str, langs: set[str]) -> Iterator[tuple[int, list[str]]]:
    """(line number of the block's first line, its lines) for each fenced block in one of `langs`."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```\s*(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i + 1, m.group(1)
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        # A plain block drawn with box characters is a diagram (README's "How it works"), not commands.
        if lang in langs and not (lang == "" and any(c in "\n".join(lines[start:i]) for c in "─│▲▼►")):
            yield start + 1, lines[start:i]
        i += 1


def doc_commands(path: Path) -> list[Line]:
    """Each command of the document's shell blocks; `a && b` is two."""
    out: list[Line] = []
    for first, block in fenced_blocks(path.read_text(), SHELL_LANGS):
        for n, raw in enumerate(block, first):
            tokens = shlex.split(raw, comments=True)
            while tokens:
                cut = tokens.index("&&") if "&&" in tokens else len(tokens)
                out.append(Line(path.relative_to(ROOT).as_posix(), n, raw, tokens[:cut]))
                tokens = tokens[cut + 1:]
    return out


def all_commands() -> list[Line]:
    return [line for doc in DOCS for line in doc_commands(doc)]


def check_not_run(line: Line) -> str | None:
    """Why a non-corral line is fine, or None when it is of a kind this test does not know."""
    argv = line.argv
    if line.raw.split("#")[0].strip() in SHELL_SETUP or (argv[0] == "export" and argv[1].startswith("CORRAL_NATS_URL=")):
        return "shell setup"
    if argv[0] == "make":
        targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
        missing = [t for t in argv[1:] if t not in targets]
        assert not missing, f"{line.where()}: no Makefile target {missing}"
        return "make target exists"
    if Path(argv[0]).name == "pip" and argv[1] == "install":
        pyproject = (ROOT / "pyproject.toml").read_text()
        for spec in argv[2:]:
            if spec.startswith("."):
                for extra in re.findall(r"\[([\w,]+)\]", spec)[:1]:
                    for name in extra.split(","):
                        assert re.search(rf"^{name} = \[", pyproject, re.M), f"{line.where()}: no extra {name}"
        return "pip target exists"
    if Path(argv[0]).name in ("python", "python3"):
        if argv[1:3] == ["-m", "venv"]:
            return "creates a venv"
        assert (ROOT / argv[1]).is_file(), f"{line.where()}: no script {argv[1]}"
        return "script exists"
    return None


def test_every_doc_command_is_of_a_known_kind_and_every_allowance_is_used() -> None:
    lines = all_commands()
    assert len(lines) > 30, "the docs' shell blocks were not found"
    unknown = [line.where() for line in lines if line.argv[0] != "corral" and check_not_run(line) is None]
    assert not unknown, "commands this test neither runs nor checks (run them, or list them with a reason):\n" + \
        "\n".join(unknown)
    texts = [line.text for line in lines]
    assert not [c for c in NOT_RUN if c not in texts], "NOT_RUN names commands the docs no longer have"
    assert not [r for r in REWRITTEN if not any(r in t for t in texts)], "REWRITTEN matches nothing in the docs"
    assert any(JOB_ID_PLACEHOLDER in t for t in texts) and any(SIM_JOB_PLACEHOLDER in t for t in texts)


def test_every_example_spec_is_a_valid_job_spec() -> None:
    specs = sorted((ROOT / "examples" / "jobs").glob("*.yaml"))
    assert {p.name for p in specs} >= {"single-gpu.yaml", "torchrun.yaml", "container.yaml", "train.yaml"}
    for path in specs:
        spec = read_jobspec(path.read_bytes())  # raises InvalidJobSpec listing every problem
        assert path.name in (ROOT / "examples" / "README.md").read_text(), f"examples/README.md omits {path.name}"
        assert spec.name


# --- running them -----------------------------------------------------------------------------------


def sim_job(log: Path) -> str:
    """A job of a simulated log to explain: a preempted one if any, else the first submitted."""
    first = ""
    for raw in log.read_text().splitlines():
        event = json.loads(raw)
        if event["type"] == "Preempted":
            return str(event["job_id"])
        if event["type"] == "JobSubmitted" and not first:
            first = str(event["job_id"])
    assert first, f"no job in {log}"
    return first


def run_line(line: Line, url: str, env: dict[str, str], work: Path, ids: dict[str, str]) -> int:
    """Run one doc line if it is a corral command (1), else nothing (0)."""
    if line.argv[0] != "corral" or line.text in NOT_RUN:
        return 0
    text = line.text
    for written, (run_as, _why) in REWRITTEN.items():
        text = text.replace(written, run_as)
    for placeholder, value in ids.items():
        text = text.replace(placeholder, value)
    if SIM_JOB_PLACEHOLDER in text:
        text = text.replace(SIM_JOB_PLACEHOLDER, sim_job(work / "out" / "events-corral.jsonl"))
    argv = shlex.split(text)[1:]
    argv += ONCE.get(argv[0], [])
    proc = subprocess.run([*CORRAL, *argv], capture_output=True, text=True, env=env, cwd=work, timeout=120,
                          stdin=subprocess.DEVNULL)  # not the test runner's: `corral run` forwards its stdin
    assert proc.returncode == 0, (
        f"{line.where()}\n  ran: corral {shlex.join(argv)}\n  exit {proc.returncode}\n"
        f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-2000:]}")
    if argv[0] == "submit" and JOB_ID_PLACEHOLDER in line.raw:
        job_id = proc.stdout.strip()
        ids[JOB_ID_PLACEHOLDER] = job_id
        # The next commands read the job as a user would a few seconds later: placed and started.
        wait_state(url, lambda s: job_id in s.jobs and s.jobs[job_id].status != "pending", 60, f"{job_id} to start")
    return 1


def run_sdk_example(url: str, env: dict[str, str], work: Path) -> None:
    """The README's SDK example, against this cluster: its job completes."""
    blocks = ["\n".join(b) for _, b in fenced_blocks((ROOT / "README.md").read_text(), {"python"})]
    (code,) = [b for b in blocks if "Client(" in b]
    assert "nats://127.0.0.1:4222" in code
    proc = subprocess.run([sys.executable, "-c", code.replace("nats://127.0.0.1:4222", url)],
                          capture_output=True, text=True, env=env, cwd=work, timeout=120)
    assert proc.returncode == 0 and "JobCompleted" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
    job_id = proc.stdout.split()[0]
    assert state_of(url).jobs[job_id].status == "completed"


@pytest.mark.slow
def test_every_doc_command_runs(tmp_path: Path) -> None:
    up = Up(tmp_path / "corral").start()
    work = tmp_path / "work"  # the commands' directory: the docs' relative paths, and what sim writes
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "CORRAL_NATS_URL": up.url, "CORRAL_LOG_LEVEL": "warning"}
    ids: dict[str, str] = {}
    ran = 0
    try:
        for doc in DOCS:
            for line in doc_commands(doc):
                ran += run_line(line, up.url, env, work, ids)
            if doc.name == "README.md" and doc.parent == ROOT:
                run_sdk_example(up.url, env, work)  # after the README's own commands (queues defined)
        assert ran > 25, ran
    finally:
        assert up.stop() == 0


# --- what the README promises of itself (#31) --------------------------------------------------------


def test_every_link_of_the_readme_stays_in_the_repository() -> None:
    """A link or a path to a doc outside the checkout (`../shared/DESIGN.md`) is dead for everyone else."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"`(\.\./[^`\s]+)`", text)
    assert targets, "no links found"
    for target in targets:
        if re.match(r"^[a-z]+://", target) or target.startswith("#"):
            continue
        path = (ROOT / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"README links outside the repository: {target}"
        assert path.exists(), f"README links a missing file: {target}"


def test_every_exit_code_is_in_the_readmes_table() -> None:
    from orchestrator.cli import errors

    codes = {v for k, v in vars(errors).items() if k.isupper() and isinstance(v, int)}
    text = (ROOT / "README.md").read_text()
    table = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert codes == documented, f"exit codes of orchestrator/cli/errors.py vs the README's table: {codes} vs {documented}"
