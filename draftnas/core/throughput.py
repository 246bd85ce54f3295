"""Analytical model of speculative-decoding throughput. Pure functions; no torch.

Notation (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", ICML; Chen et al. 2023; Yan et al. 2025, "Decoding Speculative
Decoding", NAACL, eq. 1-3):

- alpha: probability that one drafted token is accepted, i.i.d. per position.
- gamma: draft tokens proposed per step (gamma = 0 is plain decoding).
- One step drafts gamma tokens autoregressively (gamma * T_draft(b, 1)) and then
  verifies them in one target pass over gamma + 1 positions (T_target(b, gamma+1));
  it emits the accepted prefix plus one token from the target (the correction or
  the bonus token), so at least 1 and at most gamma + 1 tokens.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draftnas.core.bisection import turning_point
from draftnas.core.errors import InvalidInputError, check_range
from draftnas.core.lockstep import lockstep_share
from draftnas.core.options import option
from draftnas.core.records import Record

MS_PER_S = 1000.0


def expected_tokens_per_step(acceptance_rate: float, gamma: int) -> float:
    """E[tokens per step] = (1 - alpha^(gamma+1)) / (1 - alpha)  (Leviathan et al., eq. 1).

    The alpha -> 1 limit is gamma + 1 (every draft accepted plus the bonus token);
    gamma = 0 gives 1 (plain decoding).
    """
    check_range("acceptance rate", acceptance_rate, 0.0, 1.0)
    _check_gamma(gamma)
    if gamma == 0:
        return 1.0
    if math.isclose(acceptance_rate, 1.0, rel_tol=0.0, abs_tol=1e-12):
        return float(gamma + 1)
    return (1.0 - acceptance_rate ** (gamma + 1)) / (1.0 - acceptance_rate)


def expected_tokens_from_distribution(accepted_probs: Sequence[float]) -> float:
    """E[tokens per step] from P(k drafts accepted), k = 0..gamma: sum over k of (k + 1) P(k).

    `accepted_probs[k]` is the empirical probability that exactly k of the gamma
    drafted tokens were accepted; the step then emits k + 1 tokens.
    """
    if not accepted_probs:
        raise InvalidInputError("accepted-count distribution is empty (need P(k) for k=0..gamma)")
    if any(p < 0 for p in accepted_probs):
        raise InvalidInputError("accepted-count probabilities must be >= 0")
    total = sum(accepted_probs)
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        raise InvalidInputError(f"accepted-count probabilities must sum to 1, got {total:.6f}")
    return sum((k + 1) * p for k, p in enumerate(accepted_probs))


def acceptance_rate_from_tokens_per_step(tokens_per_step: float, gamma: int) -> float:
    """Inverse of `expected_tokens_per_step` in alpha (bisection; monotone in alpha)."""
    _check_gamma(gamma)
    check_range("tokens per step", tokens_per_step, 1.0, float(gamma + 1))
    lo, hi = turning_point(lambda alpha: expected_tokens_per_step(alpha, gamma) >= tokens_per_step, 0.0, 1.0)
    return (lo + hi) / 2


def step_latency_ms(drafted: float, draft_ms: float, verify_ms: float) -> float:
    """One speculative step: `drafted` sequential drafts (gamma, or the mean a confidence stop drafts)
    plus one verification pass."""
    if isinstance(drafted, bool) or not drafted >= 0:
        raise InvalidInputError(f"drafts per step must be >= 0, got {drafted!r}")
    return drafted * draft_ms + verify_ms


def speculative_tokens_per_s(
    tokens_per_step: float, drafted: float, draft_ms: float, verify_ms: float, batch_size: int = 1
) -> float:
    """tokens/s = b * E[tokens] / (drafted * T_draft(b, 1) + T_target(b, drafted + 1)); `drafted` is gamma,
    or the mean drafts a step makes under a confidence stop."""
    _check_latency("draft latency", draft_ms)
    _check_latency("verify latency", verify_ms, strictly_positive=True)
    return batch_size * tokens_per_step / (step_latency_ms(drafted, draft_ms, verify_ms) / MS_PER_S)


def speculative_speedup(tokens_per_step: float, drafted_per_step: float, draft_ms: float, verify_ms: float,
                        target_ms: float) -> float:
    """Speculative over plain decoding at one batch size: E[tokens] * T_target(b, 1) /
    (drafted * T_draft(b, 1) + T_target(b, drafted + 1)); `drafted_per_step` is gamma, or the mean
    a real loop drafted (fewer at the end of a budget or after an end-of-sequence token)."""
    _check_latency("target latency", target_ms, strictly_positive=True)
    return tokens_per_step * target_ms / (drafted_per_step * draft_ms + verify_ms)


def with_prefill(tokens_per_s: float, tokens: int, prefill_ms: float) -> float:
    """Tokens/s of whole requests: `tokens` generated at `tokens_per_s` after a prefill of `prefill_ms`
    (tokens / (prefill + tokens / tokens_per_s)); 0 ms leaves it unchanged."""
    _check_latency("prefill latency", prefill_ms)
    if tokens < 1:
        raise InvalidInputError(f"tokens per request must be >= 1, got {tokens}")
    return tokens / (prefill_ms / MS_PER_S + tokens / tokens_per_s)


def baseline_tokens_per_s(target_ms: float, batch_size: int = 1) -> float:
    """Plain autoregressive decoding: b / T_target(b, 1)."""
    _check_latency("target latency", target_ms, strictly_positive=True)
    return batch_size / (target_ms / MS_PER_S)


@dataclass(frozen=True)
class ThroughputEstimate(Record):
    """Predicted speculative throughput at one (batch size, gamma)."""

    batch_size: int
    gamma: int
    acceptance_rate: float | None
    tokens_per_step: float
    draft_ms: float
    verify_ms: float
    target_ms: float
    step_ms: float
    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float
    baseline_batch_size: int | None = None  # plain decoding's batch where memory lets it differ
    # a confidence stop: each step drafts up to gamma, stopping after a draft below p_min (0: never), and
    # drafts `drafted_per_step` on average (None: gamma); `verify_ms` is then the verify at that mean
    p_min: float = 0.0
    drafted_per_step: float | None = None
    # a static batch in lockstep (`core.lockstep`): the share of a sequence's tokens per step the batch
    # keeps while it waits for its slowest sequence (1: sequences independent, or batch 1)
    lockstep: float = 1.0

    @property
    def drafting(self) -> str:
        """The drafting policy as tables print it: gamma, with its confidence stop ("8 <0.5") if any."""
        return f"{self.gamma} <{self.p_min:g}" if self.p_min else str(self.gamma)


def predict_throughput(
    *,
    gamma: int,
    draft_ms: float,
    target_ms: float,
    verify_ms: float | None = None,
    acceptance_rate: float | None = None,
    tokens_per_step: float | None = None,
    batch_size: int = 1,
    baseline_batch_size: int | None = None,
    drafted_per_step: float | None = None,
    p_min: float = 0.0,
    lockstep_tokens: int = 0,
) -> ThroughputEstimate:
    """Predicted tokens/s and speedup for one gamma.

    `drafted_per_step`: the mean drafts a step makes where it is not `gamma` (a confidence stop at
    `p_min`); `verify_ms` is then the verify of that many drafts plus one.

    Give either `acceptance_rate` (i.i.d. alpha) or a measured `tokens_per_step`.
    `verify_ms` (target latency over gamma + 1 positions) defaults to `target_ms`,
    the memory-bound approximation that verifying a few tokens costs one decode step.
    `baseline_batch_size`: where memory lets plain decoding run a larger batch than speculation
    (the drafter's weights and cache take room), the batch of plain decoding, whose step is
    `target_ms`; speculation runs `batch_size` sequences (gamma = 0 needs no drafter: it is plain
    decoding at the baseline batch).
    `lockstep_tokens`: the batch runs in lockstep until each sequence has this many new tokens (draftnas's
    batched loop), so its tokens per step are a sequence's times `lockstep.lockstep_share`; 0: the
    sequences do not wait for each other.
    """
    if (acceptance_rate is None) == (tokens_per_step is None):
        raise InvalidInputError("give exactly one of acceptance rate or tokens per step")
    if batch_size < 1:
        raise InvalidInputError(f"batch size must be >= 1, got {batch_size}")
    _check_gamma(gamma)
    plain_batch = batch_size if baseline_batch_size is None else baseline_batch_size
    if gamma == 0:
        batch_size = plain_batch
    verify = target_ms if verify_ms is None or gamma == 0 else verify_ms
    if acceptance_rate is not None:
        tokens = expected_tokens_per_step(acceptance_rate, gamma)
    else:
        assert tokens_per_step is not None
        check_range("tokens per step", tokens_per_step, 1.0, float(gamma + 1))
        tokens = tokens_per_step
    drafted = float(gamma) if drafted_per_step is None or gamma == 0 else drafted_per_step
    if not 0.0 <= drafted <= gamma:
        raise InvalidInputError(f"drafts per step must be in [0, gamma={gamma}], got {drafted:g}")
    share = 1.0
    if lockstep_tokens and gamma and batch_size > 1:
        alpha = (acceptance_rate if acceptance_rate is not None
                 else acceptance_rate_from_tokens_per_step(tokens, gamma))
        share = lockstep_share(alpha, gamma, lockstep_tokens, batch_size)
    tps = speculative_tokens_per_s(tokens * share, drafted, draft_ms, verify, batch_size)
    base = baseline_tokens_per_s(target_ms, plain_batch)
    speedup = (speculative_speedup(tokens * share, drafted, draft_ms, verify, target_ms)
               if plain_batch == batch_size else tps / base)
    return ThroughputEstimate(
        batch_size=batch_size, gamma=gamma, acceptance_rate=acceptance_rate,
        tokens_per_step=tokens, draft_ms=draft_ms, verify_ms=verify, target_ms=target_ms,
        step_ms=step_latency_ms(drafted, draft_ms, verify), tokens_per_s=tps,
        baseline_tokens_per_s=base, speedup=speedup,
        baseline_batch_size=plain_batch if plain_batch != batch_size else None,
        p_min=p_min if gamma else 0.0, drafted_per_step=None if drafted_per_step is None or gamma == 0
        else drafted_per_step, lockstep=share,
    )


def best_gamma(
    *,
    acceptance_rate: float,
    draft_ms: float,
    target_ms: float,
    verify_ms: float | Callable[[int], float] | None = None,
    max_gamma: int = 8,
    batch_size: int = 1,
    lockstep_tokens: int = 0,
) -> ThroughputEstimate:
    """The gamma in 0..max_gamma with the highest predicted tokens/s (`lockstep_tokens`: as in
    `predict_throughput`).

    `verify_ms` may be a function gamma -> T_target(b, gamma + 1) (from a latency
    profile), a constant, or None (= target_ms). gamma = 0 (no speculation) is a
    candidate, so a drafter too slow to help is answered with gamma = 0.
    """
    _check_gamma(max_gamma)
    best: ThroughputEstimate | None = None
    for gamma in range(0, max_gamma + 1):
        verify = verify_ms(gamma) if callable(verify_ms) else verify_ms
        est = predict_throughput(
            gamma=gamma, draft_ms=draft_ms, target_ms=target_ms, verify_ms=verify,
            acceptance_rate=acceptance_rate, batch_size=batch_size, lockstep_tokens=lockstep_tokens,
        )
        if best is None or est.tokens_per_s > best.tokens_per_s * (1 + 1e-12):
            best = est
    assert best is not None
    return best


def break_even_acceptance(gamma: int, draft_ms: float, target_ms: float,
                          verify_ms: float | None = None) -> float | None:
    """The alpha at which speculation at this gamma (`gamma` drafts of `draft_ms` and a verify of `verify_ms`,
    the target's step where None) exactly matches plain decoding at `target_ms` a token; None where even
    alpha = 1 does not."""
    _check_gamma(gamma)
    if gamma == 0:
        return 0.0
    verify = target_ms if verify_ms is None else verify_ms
    needed = step_latency_ms(gamma, draft_ms, verify) / target_ms  # tokens per step needed
    if needed > gamma + 1:
        return None
    if needed <= 1:
        return 0.0
    return acceptance_rate_from_tokens_per_step(needed, gamma)


def _check_gamma(gamma: int) -> None:
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 0:
        raise InvalidInputError(f"gamma must be an integer >= 0, got {gamma!r}")


def _check_latency(name: str, value_ms: float, strictly_positive: bool = False) -> None:
    if value_ms < 0 or (strictly_positive and value_ms == 0) or math.isnan(value_ms):
        bound = "> 0" if strictly_positive else ">= 0"
        raise InvalidInputError(f"{name} must be {bound} ms, got {value_ms:g}")


def verify_at(row: Sequence[float], drafted: float) -> float:
    """The verify of `drafted` drafts plus one (row[g]: of g + 1 tokens), linear between whole counts."""
    low = min(int(math.floor(drafted)), len(row) - 1)
    high = min(low + 1, len(row) - 1)
    return row[low] + (drafted - low) * (row[high] - row[low])


@dataclass(frozen=True)
class RequestTerms(Record):
    """The latencies that price one whole request at batch 1: a draft step, a plain decode step, the verify
    of g drafts plus one (`verify_ms[g]`, g = 0, 1, ...), the prefills before the first token (0: left
    out) and the tokens a request generates. With a walk of prompts (tokens and drafts per step, one
    each), `median_request` prices the median over those prompts, as a bench reports it."""

    draft_ms: float
    target_ms: float
    verify_ms: tuple[float, ...]
    spec_prefill_ms: float = 0.0
    target_prefill_ms: float = 0.0
    new_tokens: int = 1
    baseline_batch_size: int | None = None


def median_request(terms: RequestTerms, gamma: int, prompt_tokens_per_step: Sequence[float],
                   prompt_drafted_per_step: Sequence[float]) -> tuple[float, float]:
    """(median tokens/s, median speedup) over prompts of whole requests: each prompt's steps at `gamma`
    (its tokens and drafts per step; the verify priced at its mean drafts, `verify_at`), then the prefill
    (`with_prefill`) beside plain decoding's. The prefill is the same for every prompt and raises each
    prompt's tokens/s alike, so the median of whole requests is the whole request of the median."""
    if not prompt_tokens_per_step or len(prompt_tokens_per_step) != len(prompt_drafted_per_step):
        raise InvalidInputError("a median over prompts needs each prompt's tokens and drafts per step")
    if gamma < 1 or gamma >= len(terms.verify_ms):
        priced = len(terms.verify_ms) - 1
        raise InvalidInputError(f"gamma {gamma} has no verify latency (priced: gamma 1..{priced})")
    prompts = [predict_throughput(gamma=gamma, draft_ms=terms.draft_ms, target_ms=terms.target_ms,
                                  verify_ms=verify_at(terms.verify_ms, min(d, float(gamma))),
                                  tokens_per_step=min(max(t, 1.0), gamma + 1.0),
                                  drafted_per_step=min(d, float(gamma)),
                                  baseline_batch_size=terms.baseline_batch_size)
               for t, d in zip(prompt_tokens_per_step, prompt_drafted_per_step, strict=True)]
    tps = statistics.median(p.tokens_per_s for p in prompts)
    spec = with_prefill(tps, terms.new_tokens, terms.spec_prefill_ms)
    plain = with_prefill(prompts[0].baseline_tokens_per_s, terms.new_tokens, terms.target_prefill_ms)
    return spec, spec / plain


@dataclass(frozen=True)
class PredictRequest(Record):
    """What `draftnas predict` was asked: an acceptance rate and the step latencies."""

    acceptance: float = option(short="-a", low=0.0, high=1.0,
                               help="Per-token acceptance rate alpha in [0, 1].")
    draft_ms: float = option(low=0.0, low_open=True, help="Drafter latency for one token (ms).")
    target_ms: float = option(low=0.0, low_open=True, help="Target latency for one plain decode step (ms).")
    gamma: int | None = option(None, short="-g", low=0, high=64,
                               help="Draft tokens per step; omitted: the best.")
    verify_ms: float | None = option(None, low=0.0, low_open=True,
                                     help="Target latency to verify gamma+1 tokens (ms); default: the "
                                          "target's.")
    max_gamma: int = option(8, low=1, high=64, help="Largest gamma tried when gamma is omitted.")
    batch_size: int = option(1, short="-b", low=1, help="Sequences decoded together.")


def predict_from_request(request: PredictRequest) -> ThroughputEstimate:
    """`draftnas predict`: the request's gamma priced, or the best gamma up to its `max_gamma`."""
    if request.gamma is None:
        return best_gamma(acceptance_rate=request.acceptance, draft_ms=request.draft_ms,
                          target_ms=request.target_ms, verify_ms=request.verify_ms,
                          max_gamma=request.max_gamma, batch_size=request.batch_size)
    return predict_throughput(gamma=request.gamma, draft_ms=request.draft_ms, target_ms=request.target_ms,
                              verify_ms=request.verify_ms, acceptance_rate=request.acceptance,
                              batch_size=request.batch_size)
