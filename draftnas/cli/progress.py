"""Progress on stderr: rich bars on a terminal, plain lines in a log.

A job's stages report `progress(done, total)`; this module shows them. On a terminal each named stage
gets a bar with its elapsed time and ETA. When stderr is not a terminal (a log file, CI, `nohup`), a bar
would print nothing readable, so each stage gets a line when it starts and ends, and a heartbeat prints
a line at least every `interval_s` seconds while the command runs: the stage in flight, done/total,
elapsed and ETA, or, between stages, what the library last said it was doing (its INFO log records,
kept, not printed).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from draftnas.cli.app import err_console

#: on(name) -> that stage's progress(done, total)
StageCallbacks = Callable[[str], Callable[[int, int], None]]
LOG_INTERVAL_S = 30.0


def clock_text(seconds: float) -> str:
    """1h02m03s / 2m03s / 3s."""
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


class _LastInfo(logging.Handler):
    """Keeps the last INFO (or higher) message of draftnas's loggers for the heartbeat."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.message = record.getMessage()


class LogProgress:
    """Progress as lines: a stage's start and end, and a heartbeat line every `interval_s` seconds.

    `clock` and `stream` are injectable (tests feed a fake clock and read the lines); `start()` runs the
    heartbeat thread, `tick()` prints one heartbeat when one is due (the thread calls it).
    """

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic,
                 interval_s: float = LOG_INTERVAL_S) -> None:
        self.stream, self.clock, self.interval_s = stream, clock, interval_s
        self.started = clock()
        self.last_line = self.started
        self.stages: dict[str, tuple[int, int, float]] = {}  # name -> (done, total, started)
        self.current: str | None = None
        self.info = _LastInfo()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _print(self, text: str) -> None:
        now = self.clock()
        self.last_line = now
        self.stream.write(f"[draftnas {clock_text(now - self.started)}] {text}\n")
        self.stream.flush()

    def _state(self, name: str) -> str:
        done, total, began = self.stages[name]
        spent = self.clock() - began
        text = f"{name}: {done}/{total}" if total else f"{name}: {done}"
        text += f", {clock_text(spent)} in this stage"
        if 0 < done < total:
            text += f", eta {clock_text(spent * (total - done) / done)}"
        return text

    def on(self, name: str) -> Callable[[int, int], None]:
        def update(done: int, total: int) -> None:
            with self._lock:
                first = name not in self.stages
                began = self.clock() if first else self.stages[name][2]
                self.stages[name] = (done, total, began)
                self.current = name
                if first:
                    self._print(f"{name}: started ({total} steps)" if total else f"{name}: started")
                elif total and done >= total:
                    self._print(f"{name}: done, {clock_text(self.clock() - began)}")
                    self.current = None
        return update

    def tick(self) -> None:
        with self._lock:
            if self.clock() - self.last_line < self.interval_s:
                return
            if self.current is not None:
                self._print(self._state(self.current))
            else:
                said = self.info.message
                said = said if len(said) <= 100 else said[:97] + "..."
                self._print("working" + (f": {said}" if said else ""))

    def start(self) -> None:
        logging.getLogger("draftnas").addHandler(self.info)
        if logging.getLogger("draftnas").getEffectiveLevel() > logging.INFO:
            logging.getLogger("draftnas").setLevel(logging.INFO)
            # records at INFO now reach the root logger's handler too: keep them out of the log unless asked
            self._filter = _BelowWarning()
            for handler in logging.getLogger().handlers:
                handler.addFilter(self._filter)

        def beat() -> None:
            while not self._stop.wait(min(1.0, self.interval_s / 4)):
                self.tick()

        self._thread = threading.Thread(target=beat, name="draftnas-progress", daemon=True)
        self._thread.start()

    def stop(self, report: bool = True) -> None:
        """End the heartbeat; with `report` and after any line, one more with the total time."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        logging.getLogger("draftnas").removeHandler(self.info)
        if hasattr(self, "_filter"):
            logging.getLogger("draftnas").setLevel(logging.NOTSET)
            for handler in logging.getLogger().handlers:
                handler.removeFilter(self._filter)
        if report and self.last_line > self.started:
            self._print(f"finished in {clock_text(self.clock() - self.started)}")


class _BelowWarning(logging.Filter):
    """Drops draftnas's INFO records that only the heartbeat asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith("draftnas")


@contextlib.contextmanager
def progress_bars(quiet: bool = False, stream: Any = None) -> Iterator[StageCallbacks]:
    """Progress of named stages on stderr: `on(name)` gives the stage's `progress(done, total)`.

    A terminal gets one rich bar per stage (elapsed, ETA); a log (or `stream`) gets `LogProgress` lines.
    `quiet` (--json) shows neither."""
    if not err_console.is_terminal or stream is not None:
        if quiet:
            yield lambda name: (lambda done, total: None)
            return
        import sys

        log_progress = LogProgress(stream or sys.stderr)
        log_progress.start()
        try:
            yield log_progress.on
        except BaseException:
            log_progress.stop(report=False)  # the error's own line says what happened
            raise
        log_progress.stop()
        return
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=err_console,
                  transient=True, disable=quiet) as bar:
        tasks: dict[str, Any] = {}

        def on(name: str) -> Callable[[int, int], None]:
            def update(done: int, total: int) -> None:
                if name not in tasks:
                    tasks[name] = bar.add_task(name, total=total or None)
                bar.update(tasks[name], completed=done, total=total or None)
            return update
        yield on
