"""Slurm's time forms (#41 point 2): one parser for every span a flag takes; `-t 60` is an hour, as in Slurm."""

from __future__ import annotations

import argparse

import pytest

from orchestrator.cli import build_parser
from orchestrator.cli.errors import USAGE
from orchestrator.cli.timespec import minutes_arg, parse_span, seconds_arg
from tests.cli.conftest import assert_one_line_error, corral


@pytest.mark.parametrize(("text", "seconds"), [
    ("60", 3600), ("1", 60), ("0.5", 30), ("90:00", 5400), ("1:30", 90), ("00:00:45", 45), ("1:00:00", 3600),
    ("36:00:00", 129600), ("2-0", 172800), ("1-12", 129600), ("1-02:03", 93780), ("1-02:03:04", 93784),
    ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), (" 1H ", 3600), ("500ms", 0.5),
])
def test_a_job_time_limit_in_every_form(text: str, seconds: float) -> None:
    assert minutes_arg(text) == seconds


def test_other_flags_count_a_plain_number_in_seconds_but_take_the_same_forms() -> None:
    assert seconds_arg("60") == 60 and seconds_arg("0.25") == 0.25 and seconds_arg("2m") == 120
    assert seconds_arg("1:30") == 90 and seconds_arg("1-00:00:00") == 86400


@pytest.mark.parametrize("bad", ["", "x", "-5", "1:75", "1:2:3:4", "1-24", "1-02:60", "1:00:60", "1h-2", "1-",
                                 "1 h", "inf", "nan", "1e3", ":30", "1:"])
def test_bad_spans_say_every_form(bad: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_span(bad, bare_s=60)
    assert "MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS" in str(e.value) and "90s, 10m, 2h, 1d" in str(e.value)
    with pytest.raises(argparse.ArgumentTypeError, match="a number of minutes"):
        minutes_arg(bad)


def _span_flags(parser: argparse.ArgumentParser, path: str = "corral") -> list[tuple[str, str, object]]:
    """(command, flag, its type) of every option whose metavar says it takes seconds or a time."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _span_flags(sub, f"{path} {name}")
        elif action.option_strings and action.metavar in ("S", "TIME"):
            out.append((path, action.option_strings[-1], action.type))
    return out


def test_every_span_flag_goes_through_the_one_parser() -> None:
    found = _span_flags(build_parser())
    assert len(found) > 20, found
    assert {t for _, _, t in found} <= {seconds_arg, minutes_arg}, [f for f in found if f[2] not in
                                                                    (seconds_arg, minutes_arg)]
    limits = {(cmd, flag) for cmd, flag, t in found if t is minutes_arg}
    assert limits == {("corral run", "--time-limit"), ("corral submit", "--time-limit")}, limits


@pytest.mark.parametrize("argv", [["run", "-t", "soon", "--", "true"], ["submit", "x.yaml", "--time", "1:99"],
                                  ["submit", "x.yaml", "--wait", "--timeout", "ten"], ["top", "--interval", "x"]])
def test_a_bad_span_on_the_command_line_is_one_line_exit_2(argv: list[str]) -> None:
    proc = corral(*argv, check=USAGE)
    line = assert_one_line_error(proc, USAGE)
    assert "bad duration" in line and "D-HH:MM:SS" in line, line
