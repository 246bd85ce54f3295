"""What `draftnas bench --replay` measures (pure): the recorded acceptance replayed over random weights of
the named shapes, the target alone beside it, and the latency model's prediction."""

from __future__ import annotations

from dataclasses import dataclass

from draftnas.core.records import Record


@dataclass(frozen=True)
class ReplayRun(Record):
    """One prompt in one round: the target alone and the replayed loop (seconds, prefill included), and
    the loop's steps and tokens (equal to the record's when the replay is exact)."""

    prompt_id: str
    round: int
    prompt_tokens: int
    target_seconds: float
    loop_seconds: float
    new_tokens: int
    steps: int
    draft_seconds: float = 0.0


@dataclass(frozen=True)
class ReplayResult(Record):
    """A replay: the speculative loop over random weights of `target` and `drafter` (shapes), each step
    accepting the recorded count (`source`: "bench", "estimate" or "rate" as the accepts file says;
    a "rate" trace is a stand-in and `note` says for what).

    Tokens/s and the speedup are medians over prompts of each prompt's median over rounds, with 95%
    bootstrap intervals over prompts, as in `draftnas bench`; pooled figures are all tokens over all
    seconds. `exact`: every replayed run took the recorded steps and emitted the recorded tokens.
    `predicted_speedup`: the latency profile (`profile`) at batch 1 with the recorded tokens per step
    (None for a quantized drafter, which the profile does not price, or without a profile)."""

    target: str
    drafter: str
    label: str
    source: str
    gamma: int
    device: str
    dtype: str
    threads: int
    host: str
    rounds: int
    n_prompts: int
    recorded_steps: int
    recorded_tokens: int
    replayed_steps: int
    replayed_tokens: int
    exact: bool
    tokens_per_step: float
    acceptance_rate: float
    target_tokens_per_s: float
    target_tokens_per_s_interval: tuple[float, ...]
    tokens_per_s: float
    tokens_per_s_interval: tuple[float, ...]
    speedup: float
    speedup_interval: tuple[float, ...]
    pooled_target_tokens_per_s: float
    pooled_tokens_per_s: float
    draft_weights: str = "dense"
    head_rows: int | None = None  # a reduced draft head's rows (None: the full vocabulary)
    predicted_speedup: float | None = None
    profile: str = ""
    note: str = ""
    recorded_on: str = ""  # the host the accepts file was written on
    accepts: str = ""  # the accepts file, or alpha=RATE
    load_average_before: str = ""
    runs: tuple[ReplayRun, ...] = ()
    versions: dict[str, str] | None = None
    wall_s: float = 0.0
