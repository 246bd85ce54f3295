"""The search: an Optuna study over drafter shapes, ranked by predicted speculative throughput.

Ask/tell loop (Optuna): each trial proposes a `CandidateChoice`, builds the
`Candidate`, reads its latency from a latency model, checks an upper bound
(acceptance 1 at that latency) against the best trial so far, and only then runs
the expensive evaluation (pruning plan on real weights, healing, acceptance on
traces) — or takes an acceptance the user assumed. The objective is the
workload's predicted tokens/s at each batch size's best gamma (Yan et al. 2025,
eq. 1-3; `draftnas.throughput`). Every trial stores its records as JSON user
attributes, so ranking, reports and export rebuild everything from storage.

Storage is Optuna's: a SQLite file beside the run's outputs by default,
`postgresql://...` for several machines, or a journal file. Several processes
can work on one study; a killed process loses at most its trial in flight, which
the next run marks FAIL (same host: its process is gone; other hosts: heartbeat).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import math
import os
import random
import signal
import socket
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from draftnas.candidate import Candidate, CandidateChoice, InfeasibleCandidateError, build_candidate
from draftnas.errors import DraftnasError, InvalidInputError
from draftnas.record import Record
from draftnas.registry import Architecture
from draftnas.space import GammaRange, SearchSpace, Workload
from draftnas.throughput import ThroughputEstimate, best_gamma, predict_throughput

if TYPE_CHECKING:
    from draftnas.latency import LatencyProfile

log = logging.getLogger(__name__)

SamplerName = Literal["tpe", "nsga2", "random"]
SAMPLERS: tuple[str, ...] = ("tpe", "nsga2", "random")
STUDY_SCHEMA = 1
HEARTBEAT_S = 30
GRACE_S = 120
MAX_CONSECUTIVE_FAILURES = 3
ASSUMED_NOTE = "acceptance is ASSUMED ({alpha:g} per token, --acceptance-prior), not measured"


class LatencyPredictor(Protocol):
    """What the search needs from `draftnas.latency.LatencyModel`."""

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float: ...


# ---------------------------------------------------------------- records stored in trials


@dataclass(frozen=True)
class LatencyReading(Record):
    """Latencies (ms) one candidate is ranked with, per workload batch size.

    `verify_ms[i][g]` is the target over g + 1 new tokens at `batch_sizes[i]`, g = 0..gamma max.
    """

    profile: str
    batch_sizes: tuple[int, ...]
    context_tokens: int
    draft_ms: tuple[float, ...]
    target_ms: tuple[float, ...]
    verify_ms: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class AcceptanceReading(Record):
    """How well the target accepts a candidate's drafts: measured on traces, or assumed.

    Assumed: `acceptance_rate` is the user's prior alpha (i.i.d. per token).
    Measured: `tokens_per_step[str(gamma)]` from `estimate_acceptance`, `acceptance_rate`
    its mean per-position acceptance (greedy: top-1 agreement); `estimate` and `heal` hold
    the full records.
    """

    kind: str  # "measured" | "assumed"
    acceptance_rate: float
    tokens_per_step: dict[str, float] | None = None
    estimate: dict[str, Any] | None = None
    heal: dict[str, Any] | None = None
    evaluate_s: float = 0.0

    @property
    def assumed(self) -> bool:
        return self.kind == "assumed"

    def tokens_at(self, gamma: int) -> float | None:
        """Measured E[tokens per step] at gamma (1.0 at gamma 0), None when assumed."""
        if self.tokens_per_step is None:
            return None
        return 1.0 if gamma == 0 else self.tokens_per_step.get(str(gamma))


@dataclass(frozen=True)
class WorkloadPrediction(Record):
    """Predicted throughput of the workload: best gamma per batch size, weighted harmonic mean.

    tokens/s = 1 / sum_b(w_b / tokens_per_s_b), w_b the share of tokens decoded at batch b.
    """

    per_batch: tuple[ThroughputEstimate, ...]
    batch_weights: tuple[float, ...]
    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float
    acceptance_assumed: bool

    def primary(self) -> ThroughputEstimate:
        """The estimate at the workload's largest-share batch size (the first of equal shares)."""
        weights = self.batch_weights
        return self.per_batch[max(range(len(weights)), key=lambda j: (weights[j], -j))]


@dataclass(frozen=True)
class RankedTrial(Record):
    """One completed trial, rebuilt from storage."""

    number: int
    candidate: Candidate
    latency: LatencyReading
    acceptance: AcceptanceReading
    throughput: WorkloadPrediction
    reused_from: int | None = None

    @property
    def primary(self) -> ThroughputEstimate:
        """The estimate at the workload's largest-share batch size."""
        return self.throughput.primary()


@dataclass(frozen=True)
class StudyInfo(Record):
    """What a study was created for (stored as the study's user attribute "draftnas")."""

    schema: int
    target: str
    base: str
    space: SearchSpace
    objectives: str  # "throughput" | "latency,acceptance"
    acceptance_assumed: bool
    acceptance_prior: float | None
    profile: str
    target_arch: Architecture
    base_arch: Architecture

    def fingerprint(self) -> dict[str, Any]:
        space = {k: v for k, v in self.space.to_dict().items() if k not in ("source", "description")}
        return {"target": self.target, "base": self.base, "space": space, "objectives": self.objectives,
                "acceptance_prior": self.acceptance_prior, "profile": self.profile}

    @property
    def note(self) -> str:
        if self.acceptance_assumed:
            return ASSUMED_NOTE.format(alpha=self.acceptance_prior or 0.0)
        return "acceptance measured on target traces"


@dataclass(frozen=True)
class SearchResult(Record):
    """A study's state after this process's run: the ranking and what happened."""

    study_name: str
    storage: str
    run_dir: str
    info: StudyInfo
    sampler: str
    n_trials: int
    ranked: tuple[RankedTrial, ...]
    pareto: tuple[int, ...]
    counts: dict[str, int]
    pruned_by_upper_bound: int
    pruned_infeasible: int
    reused: int
    told_here: tuple[int, ...]
    interrupted: bool
    wall_s: float
    baseline_tokens_per_s: float
    interrupted_trial: int | None = None  # the trial in flight at Ctrl-C (told FAIL), if any
    profile_note: str | None = None  # calibration summary, or: the profile was not measured here

    @property
    def best(self) -> RankedTrial | None:
        return self.ranked[0] if self.ranked else None


# ---------------------------------------------------------------- scoring (pure, fast)


def assumed_acceptance(alpha: float) -> AcceptanceReading:
    if not 0.0 <= alpha <= 1.0:
        raise InvalidInputError(f"--acceptance-prior must be in [0, 1], got {alpha:g}")
    return AcceptanceReading(kind="assumed", acceptance_rate=alpha)


def target_latency(predictor: LatencyPredictor, target: Architecture, workload: Workload,
                   gamma: GammaRange) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]:
    """Target decode ms per batch size, and verify ms per (batch size, gamma 0..max)."""
    ctx = workload.context_tokens
    decode = tuple(predictor.predict_ms(target, batch_size=b, new_tokens=1, context_tokens=ctx)
                   for b in workload.batch_sizes)
    verify = tuple(
        tuple(predictor.predict_ms(target, batch_size=b, new_tokens=g + 1, context_tokens=ctx)
              for g in range(gamma.max + 1))
        for b in workload.batch_sizes)
    return decode, verify


def read_latency(predictor: LatencyPredictor, profile: str, arch: Architecture, workload: Workload,
                 target: tuple[tuple[float, ...], tuple[tuple[float, ...], ...]],
                 head_vocab_size: int | None = None) -> LatencyReading:
    """The candidate's draft latency per batch size beside the (shared) target latencies.

    head_vocab_size: rows of a reduced draft head (None: the full vocabulary)."""
    ctx = workload.context_tokens
    draft = tuple(predictor.predict_ms(arch, batch_size=b, new_tokens=1, context_tokens=ctx,
                                       head_vocab_size=head_vocab_size)
                  for b in workload.batch_sizes)
    return LatencyReading(profile=profile, batch_sizes=workload.batch_sizes,
                          context_tokens=workload.context_tokens, draft_ms=draft,
                          target_ms=target[0], verify_ms=target[1])


def estimate_at(latency: LatencyReading, acceptance: AcceptanceReading, index: int,
                gamma: int) -> ThroughputEstimate:
    """Predicted throughput at batch `latency.batch_sizes[index]` and one gamma."""
    tokens = acceptance.tokens_at(gamma)
    return predict_throughput(
        gamma=gamma, draft_ms=latency.draft_ms[index], target_ms=latency.target_ms[index],
        verify_ms=latency.verify_ms[index][gamma], batch_size=latency.batch_sizes[index],
        acceptance_rate=acceptance.acceptance_rate if tokens is None else None,
        tokens_per_step=None if tokens is None else min(max(tokens, 1.0), gamma + 1.0),
    )


def _best_at(latency: LatencyReading, acceptance: AcceptanceReading, index: int,
             gamma: GammaRange) -> ThroughputEstimate:
    if acceptance.tokens_per_step is None and gamma.min == 0:
        verify = latency.verify_ms[index]
        return best_gamma(acceptance_rate=acceptance.acceptance_rate, draft_ms=latency.draft_ms[index],
                          target_ms=latency.target_ms[index], verify_ms=lambda g: verify[g],
                          max_gamma=gamma.max, batch_size=latency.batch_sizes[index])
    gammas = [g for g in range(gamma.min, gamma.max + 1) if acceptance.tokens_at(g) is not None
              or acceptance.tokens_per_step is None]
    if not gammas:
        raise InvalidInputError(f"acceptance has no tokens per step for gamma {gamma.min}..{gamma.max}")
    estimates = [estimate_at(latency, acceptance, index, g) for g in gammas]
    return max(estimates, key=lambda e: e.tokens_per_s * (1 - 1e-12 * e.gamma))


def predict_workload(latency: LatencyReading, acceptance: AcceptanceReading, workload: Workload,
                     gamma: GammaRange) -> WorkloadPrediction:
    """Each batch size at its best gamma; the workload's tokens/s is their weighted harmonic mean."""
    per_batch = tuple(_best_at(latency, acceptance, i, gamma) for i in range(len(latency.batch_sizes)))
    weights = workload.batch_weights
    tps = 1.0 / sum(w / e.tokens_per_s for w, e in zip(weights, per_batch, strict=True))
    base = 1.0 / sum(w / e.baseline_tokens_per_s for w, e in zip(weights, per_batch, strict=True))
    return WorkloadPrediction(per_batch=per_batch, batch_weights=weights, tokens_per_s=tps,
                              baseline_tokens_per_s=base, speedup=tps / base,
                              acceptance_assumed=acceptance.assumed)


# ---------------------------------------------------------------- evaluation (the expensive part)


@dataclass(frozen=True)
class Evaluation:
    """What evaluating a candidate yields: the candidate (with its real plan) and its acceptance."""

    candidate: Candidate
    acceptance: AcceptanceReading


class Evaluator(Protocol):
    """Turns a candidate into an acceptance reading. `measured` = it really runs a drafter."""

    measured: bool

    def evaluate(self, candidate: Candidate) -> Evaluation: ...


class PriorEvaluator:
    """Latency-only search: every candidate gets the acceptance the user assumed."""

    measured = False

    def __init__(self, acceptance_rate: float) -> None:
        self.reading = assumed_acceptance(acceptance_rate)

    def evaluate(self, candidate: Candidate) -> Evaluation:
        return Evaluation(candidate=candidate, acceptance=self.reading)


def held_out(index: int) -> bool:
    """Whether the trace record at `index` is held out for the acceptance estimate (every 3rd)."""
    return index % 3 == 0


def split_traces(traces: Any) -> tuple[Any, Any]:
    """(held out for the acceptance estimate, the rest for healing and the draft vocabulary).

    Every 3rd record is held out. Export calls this too, so a trial's reduced draft
    vocabulary is rebuilt from exactly the records the search chose it from.
    """
    from draftnas.traces import Traces

    held = [r for i, r in enumerate(traces.records) if held_out(i)]
    rest = [r for i, r in enumerate(traces.records) if not held_out(i)]
    return (Traces(metadata=traces.metadata, records=held),
            Traces(metadata=traces.metadata, records=rest or held))


# ---------------------------------------------------------------- storage


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
    raise InvalidInputError(f"--storage {url!r} is not understood (allowed: sqlite:///FILE, "
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
            raise InvalidInputError(f"cannot open storage {_redact(url)}: {exc}") from None
        except Exception as exc:  # unreachable server; or workers racing to create the tables
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if attempt == 4:
                raise InvalidInputError(f"cannot open storage {_redact(url)}: {first}") from None
            log.debug("opening %s failed (%s); retrying", _redact(url), first)
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
    raise InvalidInputError("--storage postgresql://... needs a PostgreSQL driver: "
                            "pip install 'draftnas[postgres]' (psycopg2-binary)")


def _sqlite_connect(path: Path) -> sqlite3.Connection:
    """WAL journal, relaxed fsync: a commit per user attribute stays cheap, readers never block.

    A crash (even of the machine) loses at most the last commits, never corrupts the file.
    """
    conn = sqlite3.connect(str(path), timeout=60, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _redact(url: str) -> str:
    """The URL without a password."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}" if ":" in creds else url
    return url


# ---------------------------------------------------------------- the study


@dataclass
class SearchOptions:
    """Everything `run_search` needs besides the latency model and the evaluator."""

    target: str
    target_arch: Architecture
    base: str
    base_arch: Architecture
    space: SearchSpace
    profile: str
    n_trials: int = 20
    timeout_s: float | None = None
    storage: str | None = None
    study_name: str | None = None
    sampler: str = "tpe"
    seed: int | None = 0
    acceptance_prior: float | None = None
    run_dir: str = "runs"
    upper_bound_pruning: bool = True
    profile_note: str | None = None  # calibration summary, or: the profile is not of this machine


def default_study_name(target: str, space: SearchSpace, sampler: str) -> str:
    name = space.name if space.target.lower() == target.lower() else f"{space.name}-for-{target}"
    return f"{name}-nsga2" if sampler == "nsga2" else name


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Optuna distributions of the space's knobs (a knob with one value is not searched)."""
    out: dict[str, BaseDistribution] = {}
    d = space.depth
    if d.max > d.min:
        out["depth"] = IntDistribution(d.min, d.max - (d.max - d.min) % d.step, step=d.step)
    w = space.width
    for name, values in (("layer_selection", space.layer_selection), ("kv_head_ratio", w.kv_head_ratios),
                         ("query_head_ratio", w.query_head_ratios), ("mlp_ratio", w.mlp_ratios),
                         ("hidden_ratio", w.hidden_ratios), ("vocab_size", space.vocab_sizes)):
        if len(values) > 1:
            out[name] = CategoricalDistribution(list(values))
    return out


def make_sampler(name: str, seed: int | None, n_trials: int) -> optuna.samplers.BaseSampler:
    """TPE (default; multivariate, constant liar for parallel workers), NSGA-II or random."""
    if name not in SAMPLERS:
        raise InvalidInputError(f"--sampler {name!r} is not known (allowed: {', '.join(SAMPLERS)})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(3, min(10, n_trials // 3)),
                                              multivariate=True, constant_liar=True)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(8, min(50, n_trials // 5)))
    return optuna.samplers.RandomSampler(seed=seed)


def _objectives(sampler: str) -> tuple[str, list[optuna.study.StudyDirection]]:
    up, down = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE
    if sampler == "nsga2":
        return "latency,acceptance", [down, up]
    return "throughput", [up]


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
        if _mark_failed(storage, t, f"worker {worker} died (killed)"):  # False: another worker did
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
        if t.user_attrs.get("worker") == me and _mark_failed(study._storage, t, reason):
            failed.append(t.number)
    return failed


def _mark_failed(storage: Any, trial: FrozenTrial, reason: str) -> bool:
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
def _heartbeat(study: optuna.Study, trial_id: int) -> Iterator[None]:
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


def open_study(options: SearchOptions, info: StudyInfo, storage_url: str) -> optuna.Study:
    """Create the study or load it (several workers, resume); refuse a study made for another search."""
    _, directions = _objectives(options.sampler)
    storage = open_storage(storage_url)
    name = options.study_name or default_study_name(options.target, options.space, options.sampler)
    study = optuna.create_study(study_name=name, storage=storage, directions=directions,
                                load_if_exists=True)
    stored = study.user_attrs.get("draftnas")
    if stored is None:
        study.set_user_attr("draftnas", info.to_dict())
        return study
    old = StudyInfo.from_dict(stored).fingerprint()
    new = info.fingerprint()
    diff = [k for k in new if old.get(k) != new[k]]
    if diff:
        raise InvalidInputError(f"study {name!r} in {_redact(storage_url)} was made with a different "
                                f"{', '.join(diff)}; pass another --study (or the same settings) to resume")
    return study


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


@dataclass
class _Run:
    """Mutable state of this process's loop."""

    study: optuna.Study
    options: SearchOptions
    info: StudyInfo
    predictor: LatencyPredictor
    evaluator: Evaluator
    target_latency: tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]
    dists: dict[str, BaseDistribution]
    told: list[int] = field(default_factory=list)
    failures_in_a_row: int = 0
    interrupted_trial: int | None = None
    gate: InterruptGate = field(default_factory=InterruptGate)


def run_search(options: SearchOptions, predictor: LatencyPredictor, evaluator: Evaluator, *,
               progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Run (or resume, or join) the study until it holds `n_trials` finished trials.

    Finished = COMPLETE or PRUNED (FAIL trials are retried). Stops early at `timeout_s`
    or Ctrl-C (the trial in flight is told FAIL; the result says `interrupted`).
    """
    start = time.monotonic()
    options.sampler = options.sampler.lower()
    objectives, _ = _objectives(options.sampler)
    if evaluator.measured != (options.acceptance_prior is None):
        raise InvalidInputError("an acceptance prior and a measuring evaluator exclude each other")
    info = StudyInfo(schema=STUDY_SCHEMA, target=options.target, base=options.base, space=options.space,
                     objectives=objectives, acceptance_assumed=not evaluator.measured,
                     acceptance_prior=options.acceptance_prior, profile=options.profile,
                     target_arch=options.target_arch, base_arch=options.base_arch)
    study_name = options.study_name or default_study_name(options.target, options.space, options.sampler)
    storage_url = normalize_storage(options.storage, study_name, options.run_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(options, info, storage_url)
    recover_stale_trials(study)
    existing = len(study.get_trials(deepcopy=False))
    seed = None if options.seed is None else options.seed + existing
    study.sampler = make_sampler(options.sampler, seed, options.n_trials)
    run = _Run(study=study, options=options, info=info, predictor=predictor, evaluator=evaluator,
               target_latency=target_latency(predictor, options.target_arch, options.space.workload,
                                             options.space.gamma),
               dists=distributions(options.space))
    interrupted = False
    try:
        with run.gate.installed():
            _loop(run, start, progress)
    except KeyboardInterrupt:
        interrupted = True
        # A second Ctrl-C raises wherever it lands (the gate's escape hatch), e.g. between
        # creating a trial and evaluating it: fail whatever this process left RUNNING.
        for number in fail_own_running_trials(study, "interrupted (Ctrl-C)"):
            if run.interrupted_trial is None:
                run.interrupted_trial = number
            if number not in run.told:
                run.told.append(number)
        log.info("interrupted (trial in flight: %s); re-run the command to resume", run.interrupted_trial)
    result = collect_result(study, storage_url, options, info, run.told, interrupted,
                            time.monotonic() - start)
    return replace(result, interrupted_trial=run.interrupted_trial)


def _loop(run: _Run, start: float, progress: Callable[[int, int], None] | None) -> None:
    target = run.options.n_trials
    while True:
        run.gate.check()
        trials = run.study.get_trials(deepcopy=False)
        stale = set(recover_stale_trials(run.study, trials))
        finished = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
        running = sum(t.state == TrialState.RUNNING and t.number not in stale for t in trials)
        if progress is not None:
            progress(min(finished, target), target)
        if finished + running >= target:
            return
        if run.options.timeout_s is not None and time.monotonic() - start >= run.options.timeout_s:
            log.info("timeout of %.0f s reached with %d/%d trials finished", run.options.timeout_s,
                     finished, target)
            return
        _one_trial(run, trials)


def _one_trial(run: _Run, trials: Sequence[FrozenTrial]) -> None:
    trial = _ask(run.study, run.dists)
    try:
        with _heartbeat(run.study, trial._trial_id):
            state, values = _evaluate_trial(run, trial, trials)
    except KeyboardInterrupt:
        run.interrupted_trial = trial.number
        with contextlib.suppress(Exception):
            trial.set_user_attr("failed_reason", "interrupted (Ctrl-C)")
            run.study.tell(trial, state=TrialState.FAIL)
        run.told.append(trial.number)
        raise
    except Exception as exc:  # a flaky evaluation fails one trial, not the study
        log.warning("trial %d failed: %s", trial.number, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        trial.set_user_attr("failed_reason", f"{type(exc).__name__}: {exc}"[:500])
        run.study.tell(trial, state=TrialState.FAIL)
        run.told.append(trial.number)
        run.failures_in_a_row += 1
        if run.failures_in_a_row >= MAX_CONSECUTIVE_FAILURES:
            raise DraftnasError(f"{run.failures_in_a_row} trials in a row failed; last: {exc}") from exc
        return
    run.failures_in_a_row = 0
    run.study.tell(trial, values=values, state=state)
    run.told.append(trial.number)


def _ask(study: optuna.Study, dists: dict[str, BaseDistribution]) -> optuna.Trial:
    """`Study.ask`, but the trial is created already carrying its worker's identity.

    One storage write creates the RUNNING trial together with `user_attrs["worker"]`, so a
    process killed at any moment leaves no RUNNING trial that a resume cannot attribute.
    """
    now = datetime.datetime.now()
    template = FrozenTrial(number=-1, state=TrialState.RUNNING, value=None, datetime_start=now,
                           datetime_complete=None, params={}, distributions={},
                           user_attrs={"worker": _worker_id()}, system_attrs={}, intermediate_values={},
                           trial_id=-1)
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    trial = optuna.Trial(study, trial_id)
    for name, dist in dists.items():
        trial._suggest(name, dist)
    return trial


def _prune(trial: optuna.Trial, kind: str, reason: str,
           records: dict[str, Any] | None = None) -> tuple[TrialState, None]:
    for key, value in (records or {}).items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("pruned_kind", kind)
    trial.set_user_attr("pruned_reason", reason)
    log.info("trial %d pruned (%s): %s", trial.number, kind, reason)
    return TrialState.PRUNED, None


def _evaluate_trial(run: _Run, trial: optuna.Trial,
                    trials: Sequence[FrozenTrial]) -> tuple[TrialState, list[float] | None]:
    o = run.options
    choice = CandidateChoice.from_params(trial.params, o.space)
    try:
        candidate = build_candidate(o.space, o.base_arch, o.base, choice, target=o.target_arch)
    except InfeasibleCandidateError as exc:
        return _prune(trial, "infeasible", str(exc), {"choice": choice.to_dict()})
    latency = read_latency(run.predictor, o.profile, candidate.arch, o.space.workload, run.target_latency,
                           candidate.head_vocab_size)
    bound = predict_workload(latency, assumed_acceptance(1.0), o.space.workload, o.space.gamma)
    records = {"candidate": candidate.to_dict(), "latency": latency.to_dict(),
               "upper_bound_tokens_per_s": bound.tokens_per_s}
    if bound.speedup <= 1.0 + 1e-9:
        return _prune(trial, "infeasible", f"even with every draft accepted it predicts {bound.speedup:.3f}x "
                      "the target alone (drafter too slow)", records)
    single = run.info.objectives == "throughput"
    if single and o.upper_bound_pruning:
        best = _best_value(trials)
        if best is not None and bound.tokens_per_s <= best:
            return _prune(trial, "upper_bound", f"upper bound {bound.tokens_per_s:.2f} tokens/s "
                          f"(acceptance 1) cannot beat the best trial's {best:.2f}", records)
    evaluation = _reuse(run, trial, candidate, trials)
    if evaluation is None:
        if run.evaluator.measured:  # so a trial that dies while healing still says what it was
            for key, value in records.items():
                trial.set_user_attr(key, value)
        with run.gate.immediate():  # minutes of healing: Ctrl-C stops it at once
            evaluation = run.evaluator.evaluate(candidate)
    return _finish(run, trial, evaluation, candidate, latency, single)


def _best_value(trials: Sequence[FrozenTrial]) -> float | None:
    values = [t.values[0] for t in trials if t.state == TrialState.COMPLETE and t.values]
    return max(values) if values else None


def _reuse(run: _Run, trial: optuna.Trial, candidate: Candidate,
           trials: Sequence[FrozenTrial]) -> Evaluation | None:
    """An earlier completed trial of the same drafter: reuse its evaluation instead of healing again."""
    if not run.evaluator.measured:
        return None
    for t in trials:
        stored = t.user_attrs.get("candidate")
        if (t.state == TrialState.COMPLETE and stored and "acceptance" in t.user_attrs
                and Candidate.from_dict(stored).key == candidate.key):
            trial.set_user_attr("reused_from", t.number)
            return Evaluation(candidate=Candidate.from_dict(stored),
                              acceptance=AcceptanceReading.from_dict(t.user_attrs["acceptance"]))
    return None


def _finish(run: _Run, trial: optuna.Trial, evaluation: Evaluation, proposed: Candidate,
            latency: LatencyReading, single: bool) -> tuple[TrialState, list[float]]:
    o = run.options
    candidate = evaluation.candidate
    if candidate.arch != proposed.arch:  # the real plan's shape differs from the proposed one
        latency = read_latency(run.predictor, o.profile, candidate.arch, o.space.workload, run.target_latency,
                               candidate.head_vocab_size)
    prediction = predict_workload(latency, evaluation.acceptance, o.space.workload, o.space.gamma)
    for key, rec in (("candidate", candidate), ("latency", latency), ("acceptance", evaluation.acceptance),
                     ("throughput", prediction)):
        trial.set_user_attr(key, rec.to_dict())
    trial.set_user_attr("plan", candidate.plan)
    if single:
        return TrialState.COMPLETE, [prediction.tokens_per_s]
    i = o.space.workload.batch_sizes.index(o.space.workload.primary_batch_size)
    return TrialState.COMPLETE, [latency.draft_ms[i], evaluation.acceptance.acceptance_rate]


# ---------------------------------------------------------------- results from storage


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
        if r.candidate.built_key not in seen:
            seen.add(r.candidate.built_key)
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
                       reused_from=a.get("reused_from"))


def acceptance_ceiling(result: SearchResult) -> tuple[RankedTrial, WorkloadPrediction] | None:
    """The ranked drafter whose prediction is highest if every drafted token were accepted, and
    that prediction: the most any drafter of the study can give on this machine's latencies."""
    space = result.info.space
    bounds = [(r, predict_workload(r.latency, assumed_acceptance(1.0), space.workload, space.gamma))
              for r in result.ranked]
    return max(bounds, key=lambda rb: rb[1].speedup) if bounds else None


def pareto_front(ranked: Sequence[RankedTrial]) -> tuple[int, ...]:
    """Trial numbers not dominated on (draft ms at the primary batch: lower, acceptance: higher)."""
    points = [(r.number, r.primary.draft_ms, r.acceptance.acceptance_rate) for r in ranked]
    front = [n for n, ms, acc in points
             if not any((m2 <= ms and a2 >= acc) and (m2 < ms or a2 > acc) for _, m2, a2 in points)]
    return tuple(sorted(front, key=lambda n: next(p[1] for p in points if p[0] == n)))


def collect_result(study: optuna.Study, storage_url: str, options: SearchOptions | None,
                   info: StudyInfo, told: Sequence[int], interrupted: bool, wall_s: float) -> SearchResult:
    """Rebuild the ranking and counts from storage."""
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    kinds = [t.user_attrs.get("pruned_kind") for t in trials if t.state == TrialState.PRUNED]
    ranked = ranked_trials(study)
    baseline = ranked[0].throughput.baseline_tokens_per_s if ranked else math.nan
    stored = StudyInfo.from_dict(study.user_attrs["draftnas"]) if "draftnas" in study.user_attrs else info
    return SearchResult(
        study_name=study.study_name, storage=_redact(storage_url),
        run_dir=str(Path(options.run_dir if options else "runs") / study.study_name), info=stored,
        sampler=options.sampler if options else "", n_trials=options.n_trials if options else len(trials),
        ranked=ranked, pareto=pareto_front(ranked), counts={k: v for k, v in counts.items() if v},
        pruned_by_upper_bound=kinds.count("upper_bound"), pruned_infeasible=kinds.count("infeasible"),
        reused=sum("reused_from" in t.user_attrs for t in trials), told_here=tuple(told),
        interrupted=interrupted, wall_s=wall_s, baseline_tokens_per_s=baseline,
        profile_note=options.profile_note if options else None,
    )


def load_study(study_name: str, storage: str | None, run_dir: str | Path = "runs") -> optuna.Study:
    """An existing study (one-line error if it does not exist)."""
    url = normalize_storage(storage, study_name, run_dir)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=study_name, storage=open_storage(url))
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(open_storage(url))]
        raise InvalidInputError(f"no study {study_name!r} in {_redact(url)} "
                                f"(studies there: {', '.join(names) or 'none'})") from None


def load_results(study_name: str, storage: str | None, run_dir: str | Path = "runs") -> SearchResult:
    """A study's ranking and counts, from storage alone."""
    study = load_study(study_name, storage, run_dir)
    if "draftnas" not in study.user_attrs:
        raise InvalidInputError(f"study {study_name!r} was not made by draftnas search")
    info = StudyInfo.from_dict(study.user_attrs["draftnas"])
    url = normalize_storage(storage, study_name, run_dir)
    return collect_result(study, url, None, info, (), False, 0.0)


def load_trial(study_name: str, storage: str | None, number: int | None = None,
               run_dir: str | Path = "runs") -> RankedTrial:
    """One completed trial's records (the best by predicted tokens/s when `number` is None)."""
    study = load_study(study_name, storage, run_dir)
    if number is None:
        best = ranked_trials(study)
        if not best:
            raise InvalidInputError(f"study {study_name!r} has no completed trial yet")
        return best[0]
    trials = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    if not trials or trials[0].state != TrialState.COMPLETE or _ranked(trials[0]) is None:
        state = trials[0].state.name if trials else "absent"
        raise InvalidInputError(f"trial {number} of study {study_name!r} is {state}, not a completed "
                                "draftnas trial")
    ranked = _ranked(trials[0])
    assert ranked is not None
    return ranked


def fingerprint_text(data: Any) -> str:
    """Short stable hash of JSON-able data (for cache file names)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- real weights: plan, heal, estimate


class WeightsEvaluator:
    """Measured acceptance: prune the base's real weights, heal briefly, estimate on traces.

    The base is loaded once per process. Traces are split: every 3rd record is held out
    for the acceptance estimate, the rest teach the healing (so a drafter is never scored
    on the sequences it was distilled on). Importance (block influence, activations) is
    measured on a small calibration sample: the search re-plans for every trial.
    """

    measured = True
    calibration_sequences = 4
    calibration_seq_len = 96

    def __init__(self, base: str, base_arch: Architecture, traces_path: Path, space: SearchSpace,
                 seed: int = 0) -> None:
        self.base = base
        self.base_arch = base_arch
        self.traces_path = traces_path
        self.space = space
        self.seed = seed
        self._loaded: Any = None
        self._heal_traces: Any = None
        self._eval_traces: Any = None
        self._heal_data: Any = None

    def _setup(self) -> None:
        if self._loaded is not None:
            return
        import torch

        from draftnas.sources import load_model
        from draftnas.traces import load_traces

        torch.manual_seed(self.seed)
        self._loaded = load_model(self.base)
        self._loaded.model.eval()
        traces = load_traces(self.traces_path).select(temperature=self.space.workload.temperature)
        self._eval_traces, self._heal_traces = split_traces(traces)

    def _heal_options(self) -> Any:
        from draftnas.distill import HealOptions

        h = self.space.heal
        return HealOptions(steps=h.steps, batch_size=h.batch_size, lr=h.learning_rate, eval_every=0,
                           max_seq_len=h.seq_len, max_seconds=h.max_seconds, seed=self.seed,
                           heldout_every=max(2, min(4, len(self._heal_traces.records))))

    def evaluate(self, candidate: Candidate) -> Evaluation:
        from draftnas.acceptance import estimate_acceptance
        from draftnas.distill import data_from_traces, heal
        from draftnas.prune import PlanOptions, PruningPlan, apply_plan, plan_pruning

        self._setup()
        started = time.perf_counter()
        a, choice = candidate.arch, candidate.choice
        plan = plan_pruning(self._loaded.model, PlanOptions(
            num_layers=a.num_hidden_layers, layer_selection=choice.layer_selection,
            num_attention_heads=a.num_attention_heads, num_key_value_heads=a.num_key_value_heads,
            intermediate_size=a.intermediate_size, base=self.base,
            calibration_sequences=self.calibration_sequences, calibration_seq_len=self.calibration_seq_len),
            tokenizer=self._loaded.tokenizer)
        drafter = apply_plan(self._loaded.model, plan)
        if candidate.head_vocab_size is not None:  # the N most frequent target tokens of the healing traces
            from draftnas.vocab import apply_vocab_subset, subset_from_traces

            subset = subset_from_traces(self._heal_traces, candidate.head_vocab_size, self._loaded.tokenizer,
                                        source=str(self.traces_path))
            apply_vocab_subset(drafter, subset)
        heal_result = None
        if self.space.heal.steps > 0:
            options = self._heal_options()
            if self._heal_data is None:
                self._heal_data = data_from_traces(self._heal_traces, options)
            heal_result = heal(drafter, self._heal_traces, options, tokenizer=self._loaded.tokenizer,
                               data=self._heal_data)
        drafter.eval()
        estimate = estimate_acceptance(drafter, self._eval_traces, max_gamma=self.space.gamma.max,
                                       temperature=self.space.workload.temperature)
        arch = PruningPlan.from_data(plan.to_dict()).architecture(self.base_arch)
        reading = AcceptanceReading(
            kind="measured", acceptance_rate=float(estimate.acceptance_rate),
            tokens_per_step={str(k): float(v) for k, v in estimate.tokens_per_step.items()},
            estimate=estimate.to_dict(), heal=heal_result.to_dict() if heal_result else None,
            evaluate_s=round(time.perf_counter() - started, 3))
        shaped = candidate.with_plan(plan.to_dict(), arch.with_shape(name=candidate.arch.name))
        return Evaluation(candidate=shaped, acceptance=reading)


# ---------------------------------------------------------------- the command's entry point


@dataclass
class SearchRequest:
    """What `draftnas search` was asked (CLI flags, before anything is resolved)."""

    target: str
    base: str | None = None
    base_shape: str | None = None
    space: str | None = None
    profile: str | None = None
    traces: str | None = None
    n_trials: int = 20
    timeout_s: float | None = None
    storage: str | None = None
    study_name: str | None = None
    sampler: str = "tpe"
    seed: int | None = 0
    acceptance_prior: float | None = None
    run_dir: str = "runs"
    calibrate: bool = True  # time the target on this machine before ranking (measured CPU profiles)


def resolve_architecture(spec: str) -> Architecture:
    """A registry name's shape, or a Hugging Face folder's config (read without loading weights)."""
    from draftnas.registry import get_architecture, load_registry

    if spec.lower() in load_registry():
        return get_architecture(spec)
    config = Path(spec).expanduser() / "config.json"
    if config.is_file():
        from types import SimpleNamespace

        data = json.loads(config.read_text())
        text = data.get("text_config") or data
        ns = SimpleNamespace(**{**text, "model_type": data.get("model_type", "llama"),
                                "tie_word_embeddings": data.get("tie_word_embeddings", False)})
        return Architecture.from_hf_config(ns, name=Path(spec).name)
    return get_architecture(spec)  # raises with close-name suggestions


def has_weights(spec: str) -> bool:
    """Whether `spec` names weights loadable here (embedded, folder, .gguf), without loading."""
    from draftnas.sources import resolve_source

    try:
        return resolve_source(spec).kind in ("embedded", "folder", "gguf")
    except DraftnasError:
        return False


def resolve_profile(spec: str | None, space: SearchSpace) -> tuple[str, LatencyProfile]:
    """A label naming the profile (file, device, kind) and the profile."""
    from draftnas.latency import default_profile, load_profile

    name = spec or space.profile or "cpu"
    path = Path(name).expanduser()
    profile = load_profile(path) if path.suffix == ".json" or path.is_file() else default_profile(name)
    return f"{name} ({profile.device_name}, {profile.kind}, {profile.dtype})", profile


def calibrated_predictor(profile: LatencyProfile, target: Architecture, space: SearchSpace,
                         progress: Callable[[int, int], None] | None = None) -> tuple[LatencyPredictor, str]:
    """The profile's model corrected by timing `target`'s decode, its verify at every gamma + 1
    the space considers, drafter-sized prefixes of it and the work outside the forward on this
    machine (`calibrate_host`, about 25 s for SmolLM2-135M on 2 cores), with the one-line summary
    of what was measured against what the profile said."""
    from draftnas.latency import CalibratedModel, LatencyModel
    from draftnas.profile import ProfileOptions, calibrate_host

    g = space.gamma
    counts = [n + 1 for n in range(max(1, g.min), g.max + 1)]
    options = ProfileOptions(device="cpu", dtype=profile.dtype, mode="eager", repeats=5, warmup=1)
    calibration = calibrate_host(options, target, counts, context_tokens=space.workload.context_tokens,
                                 progress=progress)
    model = CalibratedModel(LatencyModel.from_profile(profile), calibration, target)
    return model, model.summary()


def default_traces(request: SearchRequest, space: SearchSpace, study_name: str,
                   progress: Callable[[int, int], None] | None = None) -> Path:
    """Traces of the target over the space's prompt set, built once and cached in the run folder."""
    from draftnas.prompts import load_prompts
    from draftnas.traces import TraceOptions, build_traces

    w, t = space.workload, space.traces
    prompts = [p for p in load_prompts(w.prompt_set) if w.domain is None or p.domain == w.domain]
    prompts = prompts[:t.prompts]
    key = fingerprint_text([request.target, w.prompt_set, w.domain, t.prompts, t.max_new_tokens,
                            w.temperature])
    out = Path(request.run_dir).expanduser() / study_name / f"traces-{key}.safetensors"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    options = TraceOptions(max_new_tokens=t.max_new_tokens, temperatures=(w.temperature,),
                           batch_size=min(len(prompts), 16))
    log.info("building traces of %s over %d %s prompts into %s", request.target, len(prompts),
             w.prompt_set, out)
    return build_traces(request.target, prompts, options, out, prompt_set=w.prompt_set, progress=progress)


def plan_search(request: SearchRequest, trace_progress: Callable[[int, int], None] | None = None,
                calibration_progress: Callable[[int, int], None] | None = None
                ) -> tuple[SearchOptions, LatencyPredictor, Evaluator]:
    """Resolve the request: shapes, space, profile, and measured or assumed acceptance."""
    from draftnas.space import default_space_for, load_search_space

    space = load_search_space(request.space) if request.space else default_space_for(request.target)
    target_arch = resolve_architecture(request.target)
    base = request.base_shape or request.base or space.base
    base_arch = resolve_architecture(base)
    problems = space.problems_for_base(base_arch)
    if base_arch.vocab_size != target_arch.vocab_size:
        problems.append(f"base {base} reads {base_arch.vocab_size} token ids but target {request.target} "
                        f"{target_arch.vocab_size}; a drafter must share the target's tokenizer")
    if problems:
        raise InvalidInputError("; ".join(problems))
    from draftnas.latency import LatencyModel
    from draftnas.profile import host_mismatch

    profile, latency_profile = resolve_profile(request.profile, space)
    predictor: LatencyPredictor = LatencyModel.from_profile(latency_profile)
    profile_note = host_mismatch(latency_profile)
    if request.n_trials < 1:
        raise InvalidInputError(f"--trials must be >= 1, got {request.n_trials}")
    if request.calibrate and latency_profile.device == "cpu" and latency_profile.kind == "measured":
        predictor, profile_note = calibrated_predictor(latency_profile, target_arch, space,
                                                       calibration_progress)
    options = SearchOptions(
        target=request.target, target_arch=target_arch, base=base, base_arch=base_arch, space=space,
        profile=profile, n_trials=request.n_trials, timeout_s=request.timeout_s, storage=request.storage,
        study_name=request.study_name, sampler=request.sampler.lower(), seed=request.seed,
        acceptance_prior=request.acceptance_prior, run_dir=request.run_dir, profile_note=profile_note)
    if request.acceptance_prior is not None:
        return options, predictor, PriorEvaluator(request.acceptance_prior)
    return options, predictor, _measuring_evaluator(request, options, trace_progress)


def _measuring_evaluator(request: SearchRequest, options: SearchOptions,
                         trace_progress: Callable[[int, int], None] | None) -> Evaluator:
    space = options.space
    if space.latency_only:
        raise InvalidInputError(f"search space {space.name!r} is latency-only (it prunes the hidden "
                                "size); pass --acceptance-prior A (e.g. 0.7) to search it with an assumed "
                                "acceptance")
    missing = []
    if request.base_shape or not has_weights(options.base):
        missing.append(f"base weights (--base FOLDER; {options.base!r} has none here)")
    if request.traces is None and not has_weights(request.target):
        missing.append(f"target traces (--traces FILE from `draftnas trace`; {request.target!r} has no "
                       "weights here to build them)")
    if missing:
        raise InvalidInputError("measuring acceptance needs " + " and ".join(missing) + "; or pass "
                                "--acceptance-prior A to search on latency with an assumed acceptance")
    name = options.study_name or default_study_name(options.target, space, options.sampler)
    traces = Path(request.traces) if request.traces else default_traces(request, space, name, trace_progress)
    if not traces.is_file():
        raise InvalidInputError(f"--traces {traces} is not a file")
    return WeightsEvaluator(options.base, options.base_arch, traces, space, seed=request.seed or 0)


def search(request: SearchRequest, *, progress: Callable[[int, int], None] | None = None,
           trace_progress: Callable[[int, int], None] | None = None,
           calibration_progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """`draftnas search`: resolve the request, then run (or resume, or join) the study."""
    options, predictor, evaluator = plan_search(request, trace_progress, calibration_progress)
    return run_search(options, predictor, evaluator, progress=progress)
