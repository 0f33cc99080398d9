"""Progress of a long command: a ``rich`` bar on a terminal, plain log lines elsewhere.

``model init`` trains for minutes, ``weights pull`` moves hundreds of MiB, ``rewards claim``
settles thousands of entries, the devnet waits for its nodes: each shows where it is. On a
terminal that is a live bar (done/total, percent, rate for bytes, elapsed and remaining
time); where the output is not a terminal (CI logs, pipes, ``| tee``) it is one plain line
at most every ``log_every`` seconds, plus the last, with no carriage returns or escape codes,
so logs stay readable and greppable. Library code reports through plain callbacks
(``progress=`` parameters) and never imports this module.

    with progress("SFT", total=300, unit="steps") as bar:
        for step in ...:
            bar.update(step + 1, info=f"loss {loss:.3f}")
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:  # rich is imported when a command shows progress, so --help stays instant
    from rich.console import Console
    from rich.progress import Progress

MiB = 1024 * 1024
BYTES = "bytes"  # the unit that is shown as MiB, with a transfer rate


class Tracker(Protocol):
    def update(self, completed: float, *, total: float | None = None, info: str = "") -> None:
        """``completed`` of ``total`` (None: keep the last total) done; ``info``: a short
        note shown after the figures (a loss, peers, a stage)."""


class _Bar:
    """A live ``rich`` bar, drawn from its first update on (work that turns out to be
    done already, such as a model found in the cache, leaves no empty bar behind)."""

    def __init__(self, bar: Progress, task: Any) -> None:
        self.bar, self.task = bar, task

    def update(self, completed: float, *, total: float | None = None, info: str = "") -> None:
        if total is not None:
            self.bar.update(self.task, total=total)
        self.bar.update(self.task, completed=completed, info=info, visible=True)


class _LogLines:
    """Plain lines, at most one every ``every`` seconds (and the last one on leaving)."""

    def __init__(self, label: str, total: float | None, unit: str, out: IO[str], every: float):
        self.label, self.total, self.unit, self.out, self.every = label, total, unit, out, every
        self.completed: float = 0
        self.info = ""
        self.last_line_at: float | None = None
        self.pending = False

    def update(self, completed: float, *, total: float | None = None, info: str = "") -> None:
        self.completed, self.info = completed, info
        if total is not None:
            self.total = total
        now = time.monotonic()
        self.pending = True
        if self.last_line_at is None or now - self.last_line_at >= self.every:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        self.out.write(self.line() + "\n")
        self.out.flush()
        self.last_line_at = time.monotonic() if now is None else now
        self.pending = False

    def line(self) -> str:
        scale, unit = (MiB, "MiB") if self.unit == BYTES else (1, self.unit)
        done = self._number(self.completed / scale)
        text = f"{self.label}: {done}"
        if self.total:
            text += f"/{self._number(self.total / scale)}"
        if unit:
            text += f" {unit}"
        if self.total:
            text += f" ({100 * self.completed / self.total:.0f}%)"
        return text + (f" {self.info}" if self.info else "")

    @staticmethod
    def _number(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


class _Silent:
    def update(self, completed: float, *, total: float | None = None, info: str = "") -> None:
        pass


def _columns(unit: str) -> list[Any]:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    figures: list[Any] = (
        [DownloadColumn(binary_units=True), TransferSpeedColumn()]
        if unit == BYTES
        else [MofNCompleteColumn(), TextColumn(unit)]
    )
    return [
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        *figures,
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    ]


@contextmanager
def progress(
    label: str,
    total: float | None = None,
    *,
    unit: str = "",
    out: TextIO | None = None,
    console: Console | None = None,
    log_every: float = 2.0,
    enabled: bool = True,
) -> Iterator[Tracker]:
    """Track one long piece of work on ``out`` (default stdout; a command with ``--json``
    passes stderr). A bar when that is a terminal, else log lines. ``unit`` ``"bytes"``
    shows MiB and a rate. ``console`` overrides the terminal check (tests pass one with
    ``force_terminal``)."""
    if not enabled:
        yield _Silent()
        return
    from rich.console import Console
    from rich.progress import Progress

    console = console or Console(file=out or sys.stdout)
    if not console.is_terminal:
        lines = _LogLines(label, total, unit, console.file, log_every)
        yield lines
        if lines.pending:  # the last state, once the work is done
            lines.flush()
        return
    with Progress(*_columns(unit), console=console) as bar:
        yield _Bar(bar, bar.add_task(label, total=total, info="", visible=False))
