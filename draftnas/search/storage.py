"""Study storage: URLs, opening SQLite/PostgreSQL/journal storages (with heartbeats where the storage
records them), and reading a study's trials back as records. Worker liveness and the Ctrl-C gate:
`search.liveness`."""

from __future__ import annotations

import logging
import random
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import option_error
from draftnas.search.liveness import GRACE_S, HEARTBEAT_S
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
                       economics=BatchEconomics.from_dict(a["economics"]) if "economics" in a else None,
                       dense_latency=(LatencyReading.from_dict(a["dense_latency"]) if "dense_latency" in a
                                      else None))


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
