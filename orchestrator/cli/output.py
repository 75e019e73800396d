"""Human tables and `--json` output, one place so every command looks alike."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import msgspec

_json = msgspec.json.Encoder()


def print_json(obj: Any) -> None:
    sys.stdout.write(msgspec.json.format(_json.encode(obj)).decode() + "\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain left-aligned table that survives `less`, `grep` and SSH."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, empty: str = "(none)") -> None:
    """A rich table on a terminal; the plain `table` when stdout is a pipe or a file, unchanged for scripts."""
    if not rows:
        print(empty)
        return
    if sys.stdout.isatty():
        print_rich_table(headers, rows)
        return
    print(table(headers, rows))


def print_rich_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Bold headers over a rule, columns fitted to the terminal. Cells are plain text, never markup: a job
    name such as `[red]x` prints as written."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for h in headers:
        t.add_column(Text(str(h)), overflow="fold")
    for r in rows:
        t.add_row(*(Text("" if c is None else str(c)) for c in r))
    Console(highlight=False).print(t)


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 172800:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
