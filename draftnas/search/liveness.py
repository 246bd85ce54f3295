"""Worker liveness in a shared study: each trial created carrying its worker's identity, heartbeats where
the storage records them, dead workers' RUNNING trials told FAIL on resume, and the Ctrl-C gate that lets
a trial finish (or not) before the study stops.

Optuna's private entry points used here: `study._storage` / `study._study_id` and `FrozenTrial._trial_id`
(a RUNNING trial created with its worker's identity in one write, `ask_with_worker`; a dead worker's trial
told FAIL, `mark_failed`), `Trial._suggest` (sampling right after that creation, as `Study.ask` does) and
`optuna.storages._heartbeat.BaseHeartbeat` (whether a storage records heartbeats).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import signal
import socket
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

log = logging.getLogger(__name__)
HEARTBEAT_S = 30
GRACE_S = 120


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    with contextlib.suppress(OSError):  # a zombie (killed, not yet reaped) is dead too
        return " Z" in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:3]
    return False


def recover_stale_trials(study: optuna.Study, trials: Sequence[FrozenTrial] | None = None) -> list[int]:
    """Mark FAIL the RUNNING trials whose worker is gone; returns their numbers.

    Same host: the worker's process no longer exists. Other hosts (RDB storages): its
    heartbeat is older than the grace period (Optuna's `fail_stale_trials`).
    """
    host, me = socket.gethostname(), os.getpid()
    failed = []
    storage = study._storage
    if trials is None:
        trials = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        worker = str(t.user_attrs.get("worker", ""))
        w_host, _, w_pid = worker.rpartition(":")
        if w_host != host or not w_pid.isdigit() or int(w_pid) == me or not _pid_dead(int(w_pid)):
            continue
        if mark_failed(storage, t, f"worker {worker} died (killed)"):  # False: another worker did
            failed.append(t.number)
    if _heartbeat_enabled(storage):
        with contextlib.suppress(Exception), _quiet():
            optuna.storages.fail_stale_trials(study)
    if failed:
        log.warning("marked %d stale trial(s) from killed workers as FAIL: %s", len(failed), failed)
    return failed


def fail_own_running_trials(study: optuna.Study, reason: str) -> list[int]:
    """Mark FAIL the RUNNING trials this process created; returns their numbers."""
    me = _worker_id()
    failed: list[int] = []
    try:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    except Exception as exc:  # the storage itself may be what failed; a resume recovers them
        log.warning("could not list this process's running trials to fail them: %s", exc)
        return failed
    for t in running:
        if t.user_attrs.get("worker") == me and mark_failed(study._storage, t, reason):
            failed.append(t.number)
    return failed


def mark_failed(storage: Any, trial: FrozenTrial, reason: str) -> bool:
    """Tell a RUNNING trial FAIL with its reason; False when the storage refused (already finished)."""
    try:
        storage.set_trial_user_attr(trial._trial_id, "failed_reason", reason)
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except Exception:
        return False
    return True


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence Optuna's experimental-feature and heartbeat warnings (expected here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        yield


def _heartbeat_enabled(storage: Any) -> bool:
    return isinstance(storage, BaseHeartbeat) and storage.get_heartbeat_interval() is not None


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Record the trial's heartbeat (RDB storages) so other hosts can tell it is alive."""
    storage = study._storage
    if not _heartbeat_enabled(storage):
        yield
        return
    assert isinstance(storage, BaseHeartbeat)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):
                storage.record_heartbeat(trial_id)

    with contextlib.suppress(Exception):
        storage.record_heartbeat(trial_id)
    thread = threading.Thread(target=beat, name="draftnas-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


class InterruptGate:
    """Ctrl-C (and a SIGTERM the caller already turns into KeyboardInterrupt) raise only where safe.

    A KeyboardInterrupt raised inside SQLAlchemy's flush can leave its session looping forever
    (seen in CI: a CLI search hung after Ctrl-C in `Trial._suggest`'s commit). So while the gate
    is installed a signal only marks itself pending; it is raised at the top of the loop or on
    entering an evaluation, and raised at once inside `immediate()` (the evaluation itself: no
    storage there). A second signal while one is pending raises at once: the escape hatch.
    """

    def __init__(self) -> None:
        self.pending = False
        self._immediate = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self._immediate or self.pending:
            raise KeyboardInterrupt
        self.pending = True
        log.warning("stopping after the storage write in progress (press Ctrl-C again to abort now)")

    def check(self) -> None:
        if self.pending:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[InterruptGate]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals reach only the main thread: nothing to gate here
            return
        signums = [signal.SIGINT] + [signal.SIGTERM] * callable(signal.getsignal(signal.SIGTERM))
        self._previous = {n: signal.signal(n, self._handle) for n in signums}
        try:
            yield self
        finally:
            for n, handler in self._previous.items():
                signal.signal(n, handler)

    @contextlib.contextmanager
    def immediate(self) -> Iterator[None]:
        self.check()
        self._immediate = True
        try:
            yield
        finally:
            self._immediate = False


def ask_with_worker(study: optuna.Study, dists: dict[str, BaseDistribution],
                    fixed: dict[str, Any] | None = None,
                    user_attrs: dict[str, Any] | None = None) -> optuna.Trial:
    """`Study.ask`, but the trial is created already carrying its worker's identity.

    One storage write creates the RUNNING trial together with `user_attrs["worker"]`, so a
    process killed at any moment leaves no RUNNING trial that a resume cannot attribute.
    `fixed`: params the trial takes as given instead of sampling them (with `user_attrs` saying why).
    """
    now = datetime.datetime.now()
    fixed = {k: v for k, v in (fixed or {}).items() if k in dists}
    template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, datetime_start=now,
                           datetime_complete=None, params=fixed, distributions={k: dists[k] for k in fixed},
                           user_attrs={"worker": _worker_id(), **(user_attrs or {})}, system_attrs={},
                           intermediate_values={}, trial_id=-1)
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    trial = optuna.Trial(study, trial_id)
    for name, dist in dists.items():
        trial._suggest(name, dist)
    return trial
