"""Progress on stderr: rich bars on a terminal, plain lines in a log.

A job's stages report `progress(done, total)`; this module shows them. On a terminal each named stage
gets a bar with its elapsed time and ETA. When stderr is not a terminal (a log file, CI, `nohup`), a bar
would print nothing readable, so each stage gets a line when it starts and ends, and a heartbeat prints
a line at least every `interval_s` seconds while the command runs: the stage in flight, done/total,
elapsed and ETA (and what the library last said it was doing, where it said it during that stage), or,
between stages, what the library last said (its INFO log records, kept, not printed). The lines are
written by a small child process (`python -m draftnas.cli.heartbeat`) that the command feeds its
progress: a thread in the command itself cannot print while a long C call holds the GIL (a GGUF
conversion, for one).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
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


class LogProgress:
    """Progress as lines: a stage's start and end, and a heartbeat line every `interval_s` seconds.

    `clock` and `stream` are injectable (tests feed a fake clock and read the lines); `tick()` prints one
    heartbeat when one is due (the heartbeat child calls it every second); `said` is the library's last
    message (`_Forward` brings it).
    """

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic,
                 interval_s: float = LOG_INTERVAL_S) -> None:
        self.stream, self.clock, self.interval_s = stream, clock, interval_s
        self.started = clock()
        self.last_line = self.started
        self.stages: dict[str, tuple[int, int, float]] = {}  # name -> (done, total, started)
        self.current: str | None = None
        self._said, self.said_at = "", self.started

    @property
    def said(self) -> str:
        return self._said

    @said.setter
    def said(self, message: str) -> None:
        self._said, self.said_at = message, self.clock()

    def _said_text(self) -> str:
        return self._said if len(self._said) <= 100 else self._said[:97] + "..."

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
        if self._said and self.said_at >= began:  # what the stage is at (a build before its first step)
            text += f"; {self._said_text()}"
        return text

    def on(self, name: str) -> Callable[[int, int], None]:
        def update(done: int, total: int) -> None:
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
        if self.clock() - self.last_line < self.interval_s:
            return
        if self.current is not None:
            self._print(self._state(self.current))
        else:
            self._print("working" + (f": {self._said_text()}" if self._said else ""))

    def stop(self, report: bool = True) -> None:
        """With `report` and after any line, one more with the total time."""
        if report and self.last_line > self.started:
            self._print(f"finished in {clock_text(self.clock() - self.started)}")


class _QuietInfo:
    """Lets draftnas's INFO records reach a handler (the heartbeat's) without printing them: the
    command's own log level (WARNING unless --verbose) still decides what the log shows."""

    def start(self, handler: logging.Handler) -> None:
        logger = logging.getLogger("draftnas")
        logger.addHandler(handler)
        self.level = logger.level
        self.filter = _BelowWarning() if logger.getEffectiveLevel() > logging.INFO else None
        if self.filter is not None:
            logger.setLevel(logging.INFO)
            for h in logging.getLogger().handlers:
                h.addFilter(self.filter)

    def stop(self, handler: logging.Handler) -> None:
        logger = logging.getLogger("draftnas")
        logger.removeHandler(handler)
        if self.filter is not None:
            logger.setLevel(self.level)
            for h in logging.getLogger().handlers:
                h.removeFilter(self.filter)


class _BelowWarning(logging.Filter):
    """Drops draftnas's INFO records that only the heartbeat asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith("draftnas")


class ChildProgress:
    """The command's side of the heartbeat child: progress and INFO messages sent as JSON lines."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.child = subprocess.Popen([sys.executable, "-m", "draftnas.cli.heartbeat", str(interval_s)],
                                      stdin=subprocess.PIPE, text=True)
        self.info = _Forward(self._send)
        self.quiet_logs = _QuietInfo()

    def _send(self, *event: Any) -> None:
        import json

        with contextlib.suppress(OSError, ValueError):  # the child is gone: progress is not worth a crash
            assert self.child.stdin is not None
            self.child.stdin.write(json.dumps(event) + "\n")
            self.child.stdin.flush()

    def on(self, name: str) -> Callable[[int, int], None]:
        return lambda done, total: self._send("on", name, done, total)

    def start(self) -> None:
        self.quiet_logs.start(self.info)

    def stop(self, report: bool = True) -> None:
        self.quiet_logs.stop(self.info)
        self._send("stop", report)
        with contextlib.suppress(OSError, ValueError):
            assert self.child.stdin is not None
            self.child.stdin.close()
        try:
            self.child.wait(timeout=5)
        except subprocess.TimeoutExpired:  # a stuck heartbeat must not keep the command alive
            self.child.kill()


class _Forward(logging.Handler):
    """Sends each INFO (or higher) message of draftnas's loggers to the child."""

    def __init__(self, send: Callable[..., None]) -> None:
        super().__init__(level=logging.INFO)
        self.send = send

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.send("info", record.getMessage())


def child_main(interval_s: float) -> None:
    """The heartbeat child (`python -m draftnas.cli.heartbeat`): apply the command's events from stdin,
    tick every second, print to stderr. A thread reads stdin (lines already buffered are invisible to
    select), so the loop never waits on a line that has arrived."""
    import json
    import queue

    events: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            events.put(line)
        events.put("")  # the command closed its end

    threading.Thread(target=read, daemon=True).start()
    progress = LogProgress(sys.stderr, interval_s=interval_s)
    while True:
        try:
            line = events.get(timeout=min(1.0, interval_s / 4))
        except queue.Empty:
            progress.tick()
            continue
        if not line:
            return  # the command ended without a word: print nothing more
        event = json.loads(line)
        if event[0] == "on":
            progress.on(event[1])(event[2], event[3])
        elif event[0] == "info":
            progress.said = str(event[1])
        elif event[0] == "stop":
            progress.stop(report=bool(event[1]))
            return
        progress.tick()


@contextlib.contextmanager
def progress_bars(quiet: bool = False) -> Iterator[StageCallbacks]:
    """Progress of named stages on stderr: `on(name)` gives the stage's `progress(done, total)`.

    A terminal gets one rich bar per stage (elapsed, ETA); a log gets `LogProgress` lines from the
    heartbeat child (`ChildProgress`).
    `quiet` (--json) shows neither."""
    if not err_console.is_terminal:
        if quiet:
            yield lambda name: (lambda done, total: None)
            return
        log_progress = ChildProgress()
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
