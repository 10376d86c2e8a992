"""A one-line progress display on stderr: pages done, pages/s, ETA.

No dependency: a carriage-return line on a terminal, one line every few seconds otherwise (logs
of a long run stay readable).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Pages embedded out of the pages planned, with rate and ETA."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = total
        self.done = 0
        self.files_done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._last = 0.0

    def advance(self, pages: int = 0, files: int = 0) -> None:
        self.done += pages
        self.files_done += files
        now = time.monotonic()
        if not self.enabled or (not files and now - self._last < (0.2 if self.tty else 5.0)):
            return
        self._last = now
        self._write(self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = (now or time.monotonic()) - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        width = 24
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        eta_text = format_duration(eta) if eta == eta else "?"
        return (
            f"[{bar}] {self.done}/{self.total} pages  {rate:.2f} pages/s  "
            f"ETA {eta_text}  ({self.files_done} files written)"
        )

    def _write(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + text.ljust(79))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._last = 0.0
            self._write(self.line())
            if self.tty:
                self.stream.write("\n")
            self.stream.flush()
