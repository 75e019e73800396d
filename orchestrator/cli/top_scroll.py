"""`corral top`'s keys and scrolling: the whole frame is a page of lines, the terminal a window onto it.

A frame is taller than a small terminal (80x24 holds the GPU grid and the
queues, not the pending jobs below them), so the live view shows the lines
[offset, offset + height - 1) of the frame and a status line; keys move the
window as `less` and `htop` do: Up/Down or k/j a line, PgUp/PgDn (b/space) a
page, Home/End (g/G) the top and the bottom; q quits. Pure: bytes in, an
offset out, so tests drive it without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Escape sequences terminals send for the keys (normal and application cursor modes), longest first.
SEQUENCES = (
    (b"\x1b[5~", "pgup"), (b"\x1b[6~", "pgdn"), (b"\x1b[1~", "home"), (b"\x1b[4~", "end"),
    (b"\x1b[7~", "home"), (b"\x1b[8~", "end"),
    (b"\x1b[A", "up"), (b"\x1b[B", "down"), (b"\x1b[H", "home"), (b"\x1b[F", "end"),
    (b"\x1bOA", "up"), (b"\x1bOB", "down"), (b"\x1bOH", "home"), (b"\x1bOF", "end"),
)
LETTERS = {b"q": "quit", b"Q": "quit", b"j": "down", b"k": "up", b" ": "pgdn", b"b": "pgup", b"g": "home",
           b"G": "end"}
#: What the status line says the keys do.
HINT = "q quit  ↑↓ j/k line  PgUp/PgDn page  g/G top/end"


def keys(data: bytes) -> list[str]:
    """The keys in what the terminal sent (other bytes, and sequences not listed, are skipped)."""
    out: list[str] = []
    i = 0
    while i < len(data):
        for seq, name in SEQUENCES:
            if data.startswith(seq, i):
                out.append(name)
                i += len(seq)
                break
        else:
            letter = LETTERS.get(data[i:i + 1])
            if letter is not None:
                out.append(letter)
            elif data[i:i + 1] == b"\x1b" and data[i + 1:i + 2] in (b"[", b"O"):  # an unknown sequence: skip it
                j = i + 2
                while j < len(data) and not (0x40 <= data[j] <= 0x7E):
                    j += 1
                i = j
            i += 1
    return out


@dataclass
class Scroll:
    """Where the window is in a frame of `total` lines, on a terminal `height` lines tall (one is the status)."""

    offset: int = 0
    quit: bool = False
    #: End was pressed: the window stays on the frame's last lines however many there are now.
    at_end: bool = False

    def press(self, key: str, total: int, height: int) -> None:
        page = max(1, height - 2)
        step = {"up": -1, "down": 1, "pgup": -page, "pgdn": page}.get(key)
        if key == "quit":
            self.quit = True
        elif key == "home":
            self.offset, self.at_end = 0, False
        elif key == "end":
            self.offset, self.at_end = total, True
        elif step is not None:
            self.offset, self.at_end = self.offset + step, False
        self.clamp(total, height)

    def rows(self, height: int, most: int) -> int:
        """Pending jobs worth rendering: enough to fill the window and the next page (each is a line or more),
        all of them (up to `most`) at the end. Rendering a thousand rows to show twenty-three costs ~0.5 s."""
        return most if self.at_end else min(most, max(10, self.offset + 2 * height))

    def clamp(self, total: int, height: int) -> None:
        self.offset = max(0, min(self.offset, total - visible(height)))

    def status(self, total: int, height: int) -> str:
        shown = min(total, self.offset + visible(height))
        return f"lines {self.offset + 1}-{shown} of {total}  {HINT}"


def visible(height: int) -> int:
    """Frame lines a terminal of `height` shows: all but the status line."""
    return max(1, height - 1)
