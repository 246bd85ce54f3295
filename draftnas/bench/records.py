"""What `draftnas bench` measures, and the records of e2e's analysis (pure). What it is asked:
`bench.request_records`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftnas.core.records import Record


@dataclass(frozen=True)
class ArmRun(Record):
    """One prompt through one arm. `seconds`: wall time, prefill included, in draftnas's engines and
    transformers'; in llama.cpp the server's decode time (`predicted_ms`), its prefill kept apart in
    `prompt_seconds` (`prompt_ms`), so both definitions of tokens/s are in the JSON; tokens are new tokens;
    `steps`: speculative steps (the target's forward calls for transformers' arms). `lossless`: greedy
    output equal to the baseline arm's; where it departs, the index and the target's top-1 minus top-2
    logit there (own greedy run in draftnas's engines)."""

    arm: str
    seconds: float
    new_tokens: int
    steps: int = 0
    accepted: int = 0
    drafted: int = 0
    draft_s: float = 0.0  # time inside the drafter (draftnas's loop)
    prompt_seconds: float = 0.0  # llama.cpp: the prompt's prefill, not in `seconds`
    # draftnas's loop: to the end of its first step (the prompt's prefill in each model, the first drafts
    # and their verify), within `seconds`, and the tokens it emitted: its decode-only figure leaves them out
    first_step_seconds: float = 0.0
    first_step_tokens: int = 0
    accepted_steps: tuple[int, ...] = ()  # draftnas's loop: drafts accepted at each step
    drafted_steps: tuple[int, ...] = ()  # and drafts proposed at each step
    lossless: bool | None = None
    first_divergence: int | None = None
    divergence_margin: float | None = None


@dataclass(frozen=True)
class BenchPrompt(Record):
    """One prompt's runs, one per arm."""

    prompt_id: str
    domain: str
    prompt_tokens: int
    runs: tuple[ArmRun, ...]
    round: int = 0  # which of the bench's interleaved rounds over the prompts

    def run(self, arm: str) -> ArmRun:
        return next(r for r in self.runs if r.arm == arm)


@dataclass(frozen=True)
class ArmResult(Record):
    """One arm over every prompt: tokens/s and, for a speculative arm, its speedup over its baseline
    (the target alone in the same engine), tokens per step, acceptance and losslessness, and the
    estimator's prediction for its drafter on these prompts.

    `tokens_per_s` and `speedup` are medians over prompts of each prompt's median over the rounds
    (a speedup is taken per prompt and round against the baseline's run of that prompt in that round);
    `*_interval` is the 95% bootstrap interval of that median, resampling prompts (`bench.stats`).
    `pooled_tokens_per_s`: every new token over every second, all rounds."""

    name: str
    engine: str  # "hf" | "static" | "hf-routed" (and later engines)
    tokens_per_s: float
    tokens_per_s_interval: tuple[float, ...] = ()  # (low, high)
    pooled_tokens_per_s: float | None = None
    # the other definition of tokens/s: draftnas's loop after its first step (the prompt's prefill left
    # out, as llama.cpp's server times); llama.cpp with its prefill (`ArmRun.prompt_seconds` added back)
    other_tokens_per_s: float | None = None
    other_tokens_per_s_interval: tuple[float, ...] = ()
    speedup_interval: tuple[float, ...] = ()  # (low, high)
    drafter: str | None = None  # the drafter's spec; None for the target alone
    baseline: str | None = None  # the arm the speedup is against
    speedup: float | None = None
    tokens_per_step: float | None = None
    mean_accepted_per_step: float | None = None
    draft_acceptance_rate: float | None = None
    draft_ms_per_token: float | None = None  # drafter seconds (its prompt prefill too) per drafted token
    draft_share: float | None = None  # draftnas's loop: share of its seconds inside the drafter
    # draftnas's loop: its speedup had drafting cost nothing (median over prompts; `stats.drafting_split`)
    free_draft_speedup: float | None = None
    free_draft_speedup_interval: tuple[float, ...] = ()  # (low, high)
    draft_vocab_size: int | None = None  # rows of a reduced draft head; None = the full vocabulary
    draft_weights: str | None = None  # how the drafter's linear layers ran: dense, int8, int4, per group
    gamma: int | None = None  # the drafter's tokens per step (a reference may run at its own)
    p_min: float = 0.0  # its confidence stop (0: gamma drafts every step)
    lossless: bool | None = None  # greedy: equal to the baseline's output on every prompt
    exact_match_rate: float | None = None  # greedy: share of prompts whose output equals the baseline's
    divergence_margins: tuple[float, ...] = ()  # target's top-1 minus top-2 logit at each divergence
    # vLLM: accepted drafts per position over the steps that drafted (its own counters), and draftnas's
    # replay of the same requests over the target alone's outputs
    accepted_per_position: tuple[float, ...] = ()
    predicted_accepted_per_position: tuple[float, ...] = ()
    predicted_tokens_per_step: float | None = None
    predicted_ci_low: float | None = None
    predicted_ci_high: float | None = None
    predicted_acceptance_rate: float | None = None
    estimator_s: float | None = None
    # the estimator's walk of each prompt at the arm's policy (tokens and drafts per step, in the prompts'
    # order), which a search's latencies price into the median over these prompts (`bench.predicted`)
    predicted_prompt_tokens_per_step: tuple[float, ...] = ()
    predicted_prompt_drafted_per_step: tuple[float, ...] = ()


@dataclass(frozen=True)
class Comparison(Record):
    """One arm's tokens/s over another's per prompt and round, the median over rounds and prompts with its
    95% bootstrap interval over prompts; `verdict`: "ahead" only when the interval lies above 1,
    "behind" below it, else "not separable on this host"."""

    numerator: str
    denominator: str
    ratio: float
    interval: tuple[float, ...]  # (low, high)
    verdict: str
    prompts: int


@dataclass(frozen=True)
class PredictionCheck(Record):
    """A search's prediction for one arm beside the bench's median over prompts and its pooled figure (all
    tokens over all seconds: what the model predicts); errors: predicted / measured - 1. `held_out`: a
    shape the calibration did not time; `source`: "search", or "export" (re-priced as exported)."""

    arm: str
    role: str
    name: str
    predicted_tokens_per_s: float
    measured_tokens_per_s: float
    tokens_per_s_error: float
    predicted_speedup: float | None = None
    measured_speedup: float | None = None
    speedup_error: float | None = None
    held_out: bool = False
    source: str = "search"
    pooled_tokens_per_s: float | None = None
    pooled_tokens_per_s_error: float | None = None
    pooled_speedup: float | None = None
    pooled_speedup_error: float | None = None
    # the prediction of the median over prompts (per-prompt walks priced alike), which the median's errors
    # then compare against; without it the pooled prediction stands for both
    predicted_median_tokens_per_s: float | None = None
    predicted_median_speedup: float | None = None
    # the same latencies priced on the bench's own prompts (the estimator's walk of each, with the bench's
    # tokens per request): what the median's errors compare against where it exists, since a median over
    # a few prompts moves with which prompts they are
    predicted_bench_median_tokens_per_s: float | None = None
    predicted_bench_median_speedup: float | None = None

    @property
    def compared_tokens_per_s(self) -> float:
        """The prediction `tokens_per_s_error` is computed from: on the bench's own prompts where priced,
        else the median request's, else the pooled one."""
        return self.predicted_bench_median_tokens_per_s or self.predicted_median_tokens_per_s \
            or self.predicted_tokens_per_s


@dataclass(frozen=True)
class BenchResult(Record):
    """A bench: every arm's result (`arms`) and every prompt's runs, with the host it ran on.

    `drafters`: label -> spec ("draftnas": the drafter benched, "reference": the drafter a user
    would otherwise pick). Arms are looked up by name (`arm`); `speedup` and `tokens_per_step` are
    the "draftnas" arm's.
    """

    target: str
    drafters: dict[str, str]
    gamma: int
    temperature: float
    max_new_tokens: int
    n_prompts: int
    device: str
    dtype: str
    threads: int
    engine: str
    arms: tuple[ArmResult, ...]
    prompts: tuple[BenchPrompt, ...] = ()
    versions: dict[str, str] | None = None
    wall_s: float = 0.0
    left_out: tuple[str, ...] = ()  # ids of prompts not benched: a drafter was healed on them
    # seconds the CPU product choosers spent timing inside the timed runs (0 unless a shape was
    # met there first: the bench times every step size and short prompt length beforehand)
    choice_timing_s: float = 0.0
    host: str = ""  # the CPU (vendor, family, model, the ISA that decides its kernels) or the GPU
    load_average_before: str = ""
    rounds: int = 1  # interleaved rounds over the prompts (each prompt ran once per arm per round)
    comparisons: tuple[Comparison, ...] = ()  # the drafter's loop over the reference's, with its interval
    predictions: tuple[PredictionCheck, ...] = ()  # the search's predictions beside the measured figures
    predicted_from: str = ""  # vLLM: the calibration the predictions were priced from, or why there are none
    verdict: dict[str, Any] | None = None  # llama.cpp: the search's verdict with this bench's figures
    ablation: dict[str, Any] | None = None  # --ablation: the chain's links measured (`bench.ablation`)

    def arm(self, name: str) -> ArmResult:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(f"no arm {name!r} in this bench (arms: {', '.join(a.name for a in self.arms)})")

    def has(self, name: str) -> bool:
        return any(a.name == name for a in self.arms)

    @property
    def speedup(self) -> float:
        return self.arm("draftnas").speedup or 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.arm("draftnas").tokens_per_step or 0.0
