"""What `corral` needs to start: its version from the installed package, `--help` without the extras' heavy
imports, and one line naming the extra to install when a command needs one that is missing.

A missing extra is played here by blocking its import (`sys.modules[name] = None`, which makes
`import name` raise ModuleNotFoundError); tests/test_install.py runs the real thing in a fresh venv.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from events.server import NatsServer
from orchestrator.cli.errors import NOT_FOUND, USAGE
from tests.cli.conftest import CORRAL, ROOT, assert_one_line_error

#: Extras (or what they pull in) that `corral --help` must not import.
HEAVY = {"matplotlib", "numpy", "docker"}
#: Nor the simulator library: only `corral sim` needs it (orchestrator/cli/sim.py imports it when run).
SIMULATOR = ("orchestrator.sim", "orchestrator.cli.simrun")


def without(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` in an interpreter where `module` cannot be imported."""
    code = f"import sys; sys.modules[{module!r}] = None; from orchestrator.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_version_is_the_installed_packages() -> None:
    proc = subprocess.run([*CORRAL, "--version"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    version = importlib.metadata.version("corral")
    assert proc.stdout == f"corral {version}\n"
    assert version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _imported(*args: str) -> set[str]:
    """The modules `corral ARGS` imports (python -X importtime)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator.cli", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


#: What a start that runs none of them must not import: the services' code (scheduler, agent, archiver,
#: index service), the live view's terminal library, the policies' decisions, and the log's readers.
SERVICES = ("nodeagent", "orchestrator.scheduler", "orchestrator.archiver", "orchestrator.index.service",
            "orchestrator.cli.services", "orchestrator.cli.top", "orchestrator.core.decide", "orchestrator.policies",
            "prometheus_client", "events.telemetry")
#: Nor, for `--help` and `--version`, NATS or structlog (whose import pulls in rich when it is installed).
CLIENT = ("nats", "structlog", "rich", "events.bus", "asyncio")


def _under(imported: set[str], prefixes: tuple[str, ...] | set[str]) -> list[str]:
    return sorted(m for m in imported if any(m == p or m.startswith(f"{p}.") for p in prefixes))


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["jobs", "--help"], ["usage", "--help"],
                                  ["explain", "--help"], ["job", "--help"]], ids=" ".join)
def test_start_imports_neither_the_simulator_extras_services_nor_other_commands(args: list[str]) -> None:
    imported = _imported(*args)
    assert "orchestrator.cli.commands" in imported, "not parsed"
    heavy = _under(imported, HEAVY | set(SIMULATOR) | set(SERVICES))
    assert not heavy, f"corral {' '.join(args)} imports {heavy}"
    # Only the chosen command's module (and what it shares with the other read commands) is imported.
    from orchestrator.cli.commands import COMMANDS

    chosen = [module for module, names in COMMANDS.items() if args[0] in names]
    others = {f"orchestrator.cli.{m}" for m in COMMANDS if m not in chosen} - {
        "orchestrator.cli.listing"}  # (checked_id, shared by the read commands)
    assert not _under(imported, others), f"corral {' '.join(args)} imports {_under(imported, others)}"
    if not chosen:  # the top level: no command's code at all, nor a NATS client
        assert not _under(imported, CLIENT), f"corral {' '.join(args)} imports {_under(imported, CLIENT)}"
    else:
        assert f"orchestrator.cli.{chosen[0]}" in imported, "the command's own parser was not built"


def test_a_query_commands_help_imports_no_nats_client_nor_rich() -> None:
    """`corral usage --help` on a pipe: argparse and the command's parser, not NATS, the bus or rich (structlog
    and the asyncio it imports, yes: a command's module is imported after structlog is, without rich, see
    commands.py)."""
    imported = _imported("usage", "--help")
    client = tuple(m for m in CLIENT if m not in ("structlog", "asyncio", "rich"))  # (rich: below)
    assert not _under(imported, client), _under(imported, client)
    assert "structlog" in imported and "rich" in imported, "structlog was not imported before the command's module"
    assert not [m for m in imported if m.startswith("rich.")], "structlog imported rich"


def test_the_command_table_says_what_the_modules_register() -> None:
    """The top-level parser lists COMMANDS without importing the modules: the same names, order and help as
    the modules' own parsers, and each command, once chosen, parses with its module's real parser."""
    from orchestrator.cli import build_parser

    eager, lazy = build_parser(), build_parser(lazy=True)
    assert lazy.format_help() == eager.format_help()
    sub = next(a for a in eager._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        fresh = build_parser(lazy=True)
        with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as out:
            fresh.parse_args([name, "--help"])
        assert out.getvalue() == parser.format_help(), name


def test_sim_help_names_the_policies(capsys: pytest.CaptureFixture[str]) -> None:
    """The policy names are filled in when `corral sim --help` is shown, not when the parser is built."""
    from orchestrator.cli.sim import main
    from orchestrator.sim.baselines import POLICY_NAMES

    with pytest.raises(SystemExit):
        main(["--help"])
    assert f"comma-separated policies ({', '.join(POLICY_NAMES)})" in " ".join(capsys.readouterr().out.split())


def test_sim_without_the_sim_extra_says_what_to_install(tmp_path: Path) -> None:
    proc = without("matplotlib", "sim", "--trace", "t.csv", "--cluster", "c.yaml", cwd=tmp_path)
    line = assert_one_line_error(proc, USAGE)
    assert "pip install 'corral[sim]'" in line, line


def test_sim_gen_and_no_figures_need_no_extra(tmp_path: Path) -> None:
    gen = without("matplotlib", "sim", "gen", "--jobs", "30", "--out", "t.csv", "--cluster-out", "c.yaml",
                  cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    run = without("matplotlib", "sim", "--trace", "t.csv", "--cluster", "c.yaml", "--policy", "fifo",
                  "--no-figures", "--out", "out", "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert not list((tmp_path / "out").glob("*.png"))


def test_docker_runtime_without_the_docker_extra_says_what_to_install(tmp_path: Path) -> None:
    proc = without("docker", "agent", "--node-id", "n1", "--runtime", "docker", "--fake-gpus", "2",
                   "--data-dir", str(tmp_path), cwd=tmp_path)
    line = assert_one_line_error(proc, USAGE)
    assert "pip install 'corral[docker]'" in line, line


@pytest.mark.parametrize(("args", "code"), [(["usage", "--json"], 0), (["job", "j-none"], NOT_FOUND),
                                           (["explain", "j-none"], NOT_FOUND)], ids=lambda a: " ".join(a)
                         if isinstance(a, list) else None)
def test_a_query_imports_no_services_nor_rich(nats_server: NatsServer, args: list[str], code: int) -> None:
    """A query run for real (no index answers: it says so and reads the log) imports what it runs only:
    no services' code, no command module but its own (and the read commands' shared helpers), and
    structlog without rich (corral's logs never use it)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator.cli", "--nats", nats_server.url,
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == code, proc.stderr[-2000:]
    if args[0] == "usage":
        assert json.loads(proc.stdout)["rows"] == []
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and line.count("|") == 2}
    assert {"structlog", "events.bus"} <= imported, "not run"
    from orchestrator.cli.commands import COMMANDS

    chosen = next(m for m, names in COMMANDS.items() if args[0] in names)
    assert f"orchestrator.cli.{chosen}" in imported
    # (--archive: archive.py, read by every reader; listing: checked_id, shared by the read commands)
    others = {f"orchestrator.cli.{m}" for m in COMMANDS if m not in (chosen, "archive", "listing")}
    unwanted = _under(imported, HEAVY | set(SIMULATOR) | set(SERVICES) | others)
    assert not unwanted, f"corral {' '.join(args)} imports {unwanted}"
    # structlog tried rich and was told it is missing (a sentinel in sys.modules: a 0-2 us line, no submodule).
    assert not [m for m in imported if m.startswith("rich.")], f"corral {' '.join(args)} imported rich"


def test_logs_read_the_same_with_structlog_imported_without_rich() -> None:
    """The CLI's log lines, an exception's traceback included, are the same text whether structlog loaded rich."""
    code = """if 1:
        import sys
        if sys.argv[1] == "without":
            from orchestrator.cli.commands import import_structlog_without_rich
            import_structlog_without_rich()
        import structlog
        from orchestrator.logging import configure_logging
        configure_logging("warning", json=False)
        try:
            {}["missing"]
        except KeyError:
            structlog.get_logger("corral.cli").warning("bus_read_retry", seq=7, exc_info=True)
        print(structlog.dev.rich is not None)
    """
    out = {}
    for how in ("with", "without"):
        proc = subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, cwd=ROOT,
                              timeout=60, check=True)
        out[how] = proc.stdout, proc.stderr.split(" ", 1)[1]  # (after the timestamp)
    assert out["with"][0] == "True\n" and out["without"][0] == "False\n"  # rich is installed: both ways were tried
    assert "bus_read_retry" in out["with"][1] and "KeyError: 'missing'" in out["with"][1]
    assert out["without"][1] == out["with"][1]
