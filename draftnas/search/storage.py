"""Study storage: URLs, opening SQLite/PostgreSQL/journal storages, worker liveness, the
Ctrl-C gate, and reading a study's trials back as records.

Optuna's public API covers most of this. Three private entry points are used, all here:
- `study._storage` / `study._study_id` and `FrozenTrial._trial_id`: to create a RUNNING trial
  already carrying its worker's identity in one write (`ask_with_worker`) and to tell a dead
  worker's trial FAIL (`mark_failed`); `Study.ask` has no way to set a user attribute atomically
  with the trial's creation, and `Study.tell` refuses a trial this process did not ask for.
- `Trial._suggest`: to sample every distribution right after that creation, as `Study.ask`
  with fixed distributions does internally.
- `optuna.storages._heartbeat.BaseHeartbeat`: to know whether a storage records heartbeats
  (RDB storages do), which Optuna exposes no public predicate for.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import random
import signal
import socket
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import option_error
from draftnas.search.records import (
    AcceptanceReading,
    BatchEconomics,
    Candidate,
    LatencyReading,
    RankedTrial,
    StudyInfo,
    WorkloadPrediction,
)

log = logging.getLogger(__name__)
HEARTBEAT_S = 30
GRACE_S = 120


def default_storage(study_name: str, run_dir: str | Path = "runs") -> str:
    """`sqlite:///<run_dir>/<study>/study.db` (absolute, folder created)."""
    folder = Path(run_dir).expanduser().resolve() / study_name
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'study.db'}"


def normalize_storage(url: str | None, study_name: str, run_dir: str | Path = "runs") -> str:
    """A storage URL from the user's --storage: None, a URL, `journal:PATH`, or a file path."""
    if url is None:
        return default_storage(study_name, run_dir)
    if "://" in url or url.startswith("journal:"):
        return url
    path = Path(url).expanduser().resolve()
    if path.suffix in (".log", ".journal", ".jsonl"):
        return f"journal:{path}"
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        return f"sqlite:///{path}"
    raise option_error("storage", f"{url!r} is not understood (allowed: sqlite:///FILE, "
                       "postgresql://USER@HOST/DB, journal:FILE, or a FILE ending .db or .log)")


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for a normalized URL (RDB storages record heartbeats)."""
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(url.removeprefix("journal:"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    url = _with_postgres_driver(url)
    engine: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        engine["creator"] = lambda: _sqlite_connect(path)
    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine,
                                                  heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
        except ImportError as exc:
            raise InvalidInputError(f"cannot open storage {redact(url)}: {exc}") from None
        except Exception as exc:  # unreachable server; or workers racing to create the tables
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if attempt == 4:
                raise InvalidInputError(f"cannot open storage {redact(url)}: {first}") from None
            log.debug("opening %s failed (%s); retrying", redact(url), first)
            time.sleep(0.3 * (attempt + 1) + random.random() * 0.5)
    raise AssertionError("unreachable")


def _with_postgres_driver(url: str) -> str:
    """`postgresql://` with the driver that is installed (SQLAlchemy 2.1 defaults to psycopg 3)."""
    scheme, sep, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return url
    import importlib.util

    for module, dialect in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"{dialect}{sep}{rest}"
    raise option_error("storage", "postgresql://... needs a PostgreSQL driver: "
                                  "pip install 'draftnas[postgres]' (psycopg2-binary)")


def _sqlite_connect(path: Path) -> sqlite3.Connection:
    """WAL journal, relaxed fsync: a commit per user attribute stays cheap, readers never block.

    A crash (even of the machine) loses at most the last commits, never corrupts the file.
    """
    conn = sqlite3.connect(str(path), timeout=60, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def redact(url: str) -> str:
    """The URL without a password."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}" if ":" in creds else url
    return url


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


def ranked_trials(study: optuna.Study) -> tuple[RankedTrial, ...]:
    """Completed trials by predicted tokens/s (best first), one per distinct drafter."""
    out: list[RankedTrial] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        ranked = _ranked(t)
        if ranked is not None:
            out.append(ranked)
    out.sort(key=lambda r: (-r.throughput.tokens_per_s, r.number))
    seen: set[str] = set()
    unique = []
    for r in out:
        key = r.candidate.built_key + ("|healed" if r.healed else "")  # a healed drafter beside its own
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return tuple(unique)


def _ranked(t: FrozenTrial) -> RankedTrial | None:
    a = t.user_attrs
    if not all(k in a for k in ("candidate", "latency", "acceptance", "throughput")):
        return None
    return RankedTrial(number=t.number, candidate=Candidate.from_dict(a["candidate"]),
                       latency=LatencyReading.from_dict(a["latency"]),
                       acceptance=AcceptanceReading.from_dict(a["acceptance"]),
                       throughput=WorkloadPrediction.from_dict(a["throughput"]),
                       reused_from=a.get("reused_from"), hand_made=a.get("hand_made"), healed=a.get("healed"),
                       economics=BatchEconomics.from_dict(a["economics"]) if "economics" in a else None)


def load_study(study_name: str, storage: str | None, run_dir: str | Path = "runs") -> optuna.Study:
    """An existing study (one-line error if it does not exist)."""
    url = normalize_storage(storage, study_name, run_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=study_name, storage=open_storage(url))
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(open_storage(url))]
        raise InvalidInputError(f"no study {study_name!r} in {redact(url)} "
                                f"(studies there: {', '.join(names) or 'none'})") from None


def study_info(study: optuna.Study) -> StudyInfo:
    """What the study was made for (its "draftnas" attribute); one line if draftnas did not make it."""
    if "draftnas" not in study.user_attrs:
        raise InvalidInputError(f"study {study.study_name!r} was not made by draftnas search")
    return StudyInfo.from_dict(study.user_attrs["draftnas"])


def load_trial(study_name: str, storage: str | None, number: int | None = None,
               run_dir: str | Path = "runs") -> tuple[StudyInfo, RankedTrial]:
    """What the study was made for, and one completed trial's records (the best by predicted
    tokens/s when `number` is None)."""
    study = load_study(study_name, storage, run_dir)
    info = study_info(study)
    if number is None:
        best = ranked_trials(study)
        if not best:
            raise InvalidInputError(f"study {study_name!r} has no completed trial yet")
        return info, best[0]
    trials = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    ranked = _ranked(trials[0]) if trials and trials[0].state == TrialState.COMPLETE else None
    if ranked is None:
        state = trials[0].state.name.lower() if trials else "absent"
        complete = [r.number for r in ranked_trials(study)][:20]
        raise InvalidInputError(f"trial {number} of study {study_name!r} is {state}, not a completed "
                                f"draftnas trial (complete: {complete})")
    return info, ranked
