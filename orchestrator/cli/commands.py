"""Which subcommands `corral` has, and the module that registers (and runs) each.

`corral --help` lists every command, but a run needs only one: importing all
the command modules (the services pull in the scheduler, the agent, the
archiver; `top` pulls in rich) cost ~0.7 s of CPU on every start. So the
top-level parser knows each command by its name and one-line help (COMMANDS),
and imports a command's module, which adds its real parser, only when that
command is chosen. `load_all` fills in every command (completion, tests);
tests/cli/test_cli_start.py checks that COMMANDS says what the modules say.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

#: module (under orchestrator.cli) -> its commands and their help, in `corral --help` order.
COMMANDS: dict[str, dict[str, str]] = {
    "services": {
        "scheduler": "run the scheduler service (one leader, others stand by)",
        "agent": "run a node agent",
        "agent-host": "run many simulated node agents in one process, for scale tests",
        "admission": "run the admission service: team accounts submit and cancel through it",
        "index": "run the accounting and forensics index: `usage`, `jobs --all`, `job`, `explain` answer from it",
        "demo": "submit the small demo workload to a running cluster and narrate it",
        "up": "embedded cluster: NATS + scheduler + simulated nodes in one command",
    },
    "archive": {"archive": "run the archiver: the log into compressed segment files, and stream retention"},
    "notify": {"notifier": "run the end-of-job notifier: webhooks (--notify-url) and a command"},
    "jobs": {"submit": "submit a job spec (YAML or JSON file, - for stdin)", "cancel": "cancel jobs",
             "hold": "keep pending jobs from starting until `corral release`", "release": "let held jobs start again"},
    "listing": {
        "jobs": "list jobs not finished (--all: finished ones too)",
        "job": "one job in detail",
        "nodes": "list nodes",
        "queues": "list queues",
        "datasets": "which node caches which dataset",
    },
    "controls": {"update": "change a job's priority, time limit or queue (like scontrol update)",
                 "requeue": "put jobs back in the queue (like scontrol requeue)",
                 "reservation": "reserve nodes for a window (maintenance, an event)"},
    "usage": {"usage": "GPU-hours per queue, user or state from the whole log (like sacct)"},
    "logs": {"logs": "a worker's output (stdout and stderr), like kubectl logs [-f]"},
    "completion": {"completion": "print a shell completion script (bash or zsh)"},
    "admin": {"queue": "define or change a queue", "node": "cordon or uncordon a node",
              "gpu": "drain or undrain one GPU (NODE:IDX)"},
    "tail": {"tail": "follow the log, one line per event"},
    "forensics": {"replay": "the cluster as it was at a past log position", "explain": "a job's story from the log"},
    "top": {"top": "live view: GPU grid, queues, pending jobs, recent events"},
    "ui": {"ui": "serve the read-only web UI: cluster, queues, jobs, history"},
    "sim": {"sim": "simulate a workload trace under scheduling policies (virtual clock)"},
    "run": {"run": "submit a job from flags and stay attached: every rank's output, its exit status"},
    "examples": {"examples": "write the example jobs, queues and workers into a directory"},
    "monitoring": {"monitoring": "write the Grafana dashboard and Prometheus alert rules into a directory"},
}


def import_structlog_without_rich() -> None:
    """Import structlog as corral uses it: without rich, which it imports whenever installed (~0.1 s of CPU).

    structlog's console renderer would format tracebacks with rich, but corral's log set-up never lets it:
    `format_exc_info` turns an exception into text before any renderer sees it (orchestrator/logging.py),
    so the lines are the same. Whoever needs rich (`corral top`) imports it as usual afterwards. Called before a command's module
    is imported (most import the bus, which imports structlog).
    """
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` raises ImportError while structlog loads
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


class LazyCommands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose parsers are placeholders (name and help) until one is chosen.

    Choosing a command imports its module, whose `register` replaces the placeholders of all the
    commands it defines (the help listing keeps its order); parsing then goes on as argparse does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._module_of: dict[str, str] = {}

    def add_placeholders(self) -> None:
        for module, commands in COMMANDS.items():
            for name, text in commands.items():
                self._module_of[name] = module
                self.add_parser(name, help=text)

    def load(self, name: str) -> None:
        """Import the module of command `name` and let it register its real parsers (once)."""
        module = self._module_of.get(name)
        if module is None:
            return
        names = [n for n, m in self._module_of.items() if m == module]
        order = [a.dest for a in self._choices_actions]
        for n in names:
            del self._module_of[n]
            del self._name_parser_map[n]
        self._choices_actions = [a for a in self._choices_actions if a.dest not in names]
        import_structlog_without_rich()
        # __import__, not importlib.import_module: the interpreter's own import, which `python -X importtime`
        # (bench/cli_start.py, tests/cli/test_cli_start.py) sees.
        __import__(f"orchestrator.cli.{module}", fromlist=["register"]).register(self)
        self._choices_actions.sort(key=lambda a: order.index(a.dest) if a.dest in order else len(order))

    def load_all(self) -> None:
        for name in list(self._module_of):
            self.load(name)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        self.load(values[0])
        super().__call__(parser, namespace, values, option_string)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Every command, its module imported now (what `corral completion` and the tests walk)."""
    assert isinstance(sub, LazyCommands), "build_parser adds the subcommands as LazyCommands"
    sub.add_placeholders()
    sub.load_all()
