"""What `draftnas bench --batch-size` measures (pure): a point per batch size and the crossovers."""

from __future__ import annotations

from dataclasses import dataclass

from draftnas.core.records import Record


@dataclass(frozen=True)
class BatchPoint(Record):
    """One batch size B: B prompts decoded together by the target alone and by each drafter's batched
    loop (dicts keyed by drafter label). Tokens/s count every sequence's new tokens; `tokens_per_step`
    is per sequence; `exact_match_rate`: share of sequences equal to the target's batched greedy
    output; `predicted_speedup`: the latency model at this B with this B's measured tokens per step, the
    batch in lockstep and each prompt's prefill priced as the loop runs them (`predicted_speedup`).
    With several runs per B, tokens/s are medians over runs and a speedup the median of the runs' paired
    ones."""

    batch_size: int
    target_tokens_per_s: float
    tokens_per_s: dict[str, float]
    speedup: dict[str, float]
    tokens_per_step: dict[str, float]
    exact_match_rate: dict[str, float]
    predicted_speedup: dict[str, float]
    # per drafter, each interleaved run's speedup over the target alone in that run (`speedup` is their
    # median; one run: that run's)
    speedup_runs: dict[str, tuple[float, ...]] | None = None
    # per drafter, the share of its loop's time (all runs) in prefill, draft, verify, read and bookkeeping
    # (`models.batched.BatchedOutput.split_s`), and of the target's verified rows spent on finished sequences
    time_split: dict[str, dict[str, float]] | None = None
    idle_row_share: dict[str, float] | None = None
    # the same paired median with the prompts' prefill left out of both runs (the decode steps alone, what a
    # latency model's step prices: the prefill reads one prompt at a time in both loops)
    decode_speedup: dict[str, float] | None = None
    # milliseconds per step of the whole batch, median over runs (`BatchedOutput.step_ms`): the target
    # alone's decode ("target": {"decode"}), per drafter its draft step and verify; and what the profile
    # priced each at (`bench.batched.priced_step_ms`; None without one)
    step_ms: dict[str, dict[str, float]] | None = None
    priced_ms: dict[str, dict[str, float]] | None = None


@dataclass(frozen=True)
class BatchedBenchResult(Record):
    """`draftnas bench --batch-size`: a point per batch size, and per drafter the measured crossover
    (the first measured B whose speedup is below 1; None: none of them) beside the predicted one (the
    first power of two up to 1024 the profile prices below 1 at the mean measured tokens per step)."""

    target: str
    drafters: dict[str, str]
    gamma: int
    max_new_tokens: int
    device: str
    dtype: str
    threads: int
    profile: str  # the latency profile the predictions come from ("" when there is none)
    points: tuple[BatchPoint, ...]
    measured_crossover: dict[str, int | None]
    predicted_crossover: dict[str, int | None]
    prompts: tuple[str, ...] = ()  # ids of the prompts, cycled to fill a batch
    host: str = ""  # the CPU (vendor, family, model, the ISA that decides its kernels) or the GPU
    load_average_before: str = ""
    versions: dict[str, str] | None = None
    wall_s: float = 0.0
    replay: str = ""  # `bench --replay`: the accepts replayed (file or alpha=RATE) and their source
    engine: str = "static"  # draftnas's batched loop, or vLLM's continuous batching
    # per drafter, the crossover in each interleaved run (the first B whose paired speedup in that run is
    # below 1; None: none is); `measured_crossover` is the medians'
    measured_crossover_runs: dict[str, tuple[int | None, ...]] | None = None
    # `--gamma-schedule`: the arm drafting by a batch-size schedule -> the arms of the same drafter at a
    # fixed γ it is held against at each B
    schedule_against: dict[str, tuple[str, ...]] | None = None
    schedules: dict[str, list[list[int]]] | None = None  # that arm's schedule: [start, end, γ] per range
