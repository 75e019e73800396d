"""Services log readable lines to a terminal and JSON lines anywhere else (#21 "Output")."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import structlog

from orchestrator.logging import configure_logging


def _log_line(stream: object) -> None:
    old = sys.stderr
    sys.stderr = stream  # type: ignore[assignment]
    try:
        configure_logging("info")
        structlog.get_logger("t").info("agent_started", node_id="n1")
        sys.stderr.flush()
    finally:
        sys.stderr = old
        configure_logging("warning", json=False)


def test_a_terminal_gets_readable_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_LOG_FORMAT", raising=False)
    master, slave = os.openpty()  # a real terminal device
    with os.fdopen(slave, "w") as tty:
        assert tty.isatty()
        _log_line(tty)
    out = os.read(master, 65536).decode()
    os.close(master)
    assert "agent_started" in out and "node_id=n1" in out and not out.lstrip().startswith("{")


def test_a_file_gets_json_and_the_variable_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_LOG_FORMAT", raising=False)
    path = tmp_path / "log"
    with path.open("w") as f:
        _log_line(f)
    rec = json.loads(path.read_text().splitlines()[-1])
    assert rec["event"] == "agent_started" and rec["node_id"] == "n1" and rec["level"] == "info"
    monkeypatch.setenv("CORRAL_LOG_FORMAT", "console")
    with path.open("w") as f:
        _log_line(f)
    assert not path.read_text().startswith("{")
