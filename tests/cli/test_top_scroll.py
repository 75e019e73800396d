"""`corral top`'s keys and window (orchestrator/cli/top_scroll.py), and `--dependency` as Slurm writes it (#41)."""

from __future__ import annotations

import argparse

import pytest

from orchestrator.cli.errors import CliError
from orchestrator.cli.jobflags import add_job_args, dependencies
from orchestrator.cli.top_scroll import Scroll, keys


def test_keys_from_what_terminals_send() -> None:
    assert keys(b"jk q") == ["down", "up", "pgdn", "quit"]
    assert keys(b"\x1b[A\x1b[B\x1bOA\x1bOB") == ["up", "down", "up", "down"]
    assert keys(b"\x1b[5~\x1b[6~\x1b[H\x1b[F\x1b[1~\x1b[4~gGb") == ["pgup", "pgdn", "home", "end", "home", "end",
                                                                     "home", "end", "pgup"]
    assert keys(b"\x1b[15~x\x1b[1;5Cq") == ["quit"]  # F5, a stray x and Ctrl-Right skipped whole


def test_the_window_stays_inside_the_frame() -> None:
    s = Scroll()
    total, height = 100, 24  # 23 lines of frame and the status line
    s.press("up", total, height)
    assert s.offset == 0
    s.press("down", total, height)
    s.press("pgdn", total, height)
    assert s.offset == 1 + 22
    s.press("end", total, height)
    assert s.offset == 100 - 23 and s.status(total, height).startswith("lines 78-100 of 100")
    s.press("pgdn", total, height)
    assert s.offset == 77
    s.press("pgup", total, height)
    assert s.offset == 55
    s.press("home", total, height)
    assert s.offset == 0 and not s.quit
    s.press("end", 10, height)  # a frame shorter than the screen does not scroll
    assert s.offset == 0
    s.press("quit", total, height)
    assert s.quit


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_job_args(p, run=False)
    return p.parse_args(list(argv))


def test_dependency_in_slurms_form_joins_after_ok_and_after_any() -> None:
    ok, any_ = dependencies(_args("--dependency", "afterok:a:b,afterany:c", "--after-ok", "d,e",
                                  "--dependency", "AFTEROK:f"))
    assert ok == ["d", "e", "a", "b", "f"] and any_ == ["c"]


@pytest.mark.parametrize("bad", ["singleton", "afterok", "afterok:", "aftercorr:j", "after:j"])
def test_dependency_types_corral_lacks_are_refused(bad: str) -> None:
    with pytest.raises(CliError, match="use afterok:JOB"):
        dependencies(_args("--dependency", bad))


def test_only_the_pending_rows_the_window_can_reach_are_rendered_until_end() -> None:
    s = Scroll()
    assert s.rows(24, 1000) == 48  # the first screen and the next page
    s.press("pgdn", 500, 24)
    assert s.rows(24, 1000) == 22 + 48
    s.press("end", 500, 24)
    assert s.at_end and s.rows(24, 1000) == 1000
    s.press("up", 500, 24)
    assert not s.at_end and s.offset == 500 - 23 - 1
