"""The step math of the acceptance estimator (numpy only, no torch): expected and exact greedy steps of
speculative decoding from per-position acceptance, their replay at every gamma, and each domain's
tokens per step with its bootstrap interval over prompts. `acceptance.estimate` feeds it the
teacher-forced per-position readings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draftnas.acceptance.accepts import walk_accepts
from draftnas.acceptance.records import DomainAcceptance


def expected_steps(beta: np.ndarray, lengths: np.ndarray, gamma: int, max_new_tokens: int) -> np.ndarray:
    """Expected number of speculative steps to emit each sequence.

    beta: [N, T] per-position acceptance probability (1/0 under greedy), zero past each
    sequence's length; lengths: [N] tokens in each sequence (the last may be EOS).
    A step at position t drafts g = min(gamma, max_new_tokens - t - 1) tokens (the
    decoding loops' end-of-budget rule), accepts a prefix of k with probability
    prod_{j<k} beta_{t+j} * (1 - beta_{t+k}) (k < g) or prod_{j<g} beta_{t+j} (k = g),
    and moves to min(t + k + 1, length). Returns [N] expected steps (exact under greedy).
    """
    n, width = beta.shape
    padded = np.zeros((n, width + gamma + 2))
    padded[:, :width] = beta
    steps = np.zeros((n, width + gamma + 2))  # steps[:, t] = expected steps from position t
    cols = np.arange(width + gamma + 2)
    for t in range(width - 1, -1, -1):
        g = max(0, min(gamma, max_new_tokens - t - 1))
        reach = np.ones(n)  # prod_{j<k} beta_{t+j}
        total = np.ones(n)
        for k in range(g + 1):
            p_k = reach * (1.0 - padded[:, t + k]) if k < g else reach
            nxt = np.minimum(t + k + 1, lengths)
            total += p_k * steps[np.arange(n), np.minimum(nxt, cols[-1])]
            reach = reach * padded[:, t + k]
        steps[:, t] = np.where(t < lengths, total, 0.0)
    return steps[:, 0]


def greedy_steps(agree: Sequence[np.ndarray], gamma: int, max_new_tokens: int) -> np.ndarray:
    """Exact steps of greedy speculative decoding per sequence (the replay `expected_steps`
    computes, walked directly: much faster for 0/1 agreement). agree: per sequence [C] of 0/1."""
    return np.array([len(walk_accepts(a.tolist(), gamma, max_new_tokens)[0]) for a in agree], dtype=float)


def bootstrap_ratio(tokens: np.ndarray, steps: np.ndarray, n: int, confidence: float,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of sum(tokens)/sum(steps) over prompts resampled with replacement.

    tokens [N]; steps [N, G]. Returns (low [G], high [G]).
    """
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(tokens), size=(n, len(tokens)))
    ratios = tokens[idx].sum(1)[:, None] / steps[idx].sum(1)  # [n, G]
    tail = (1.0 - confidence) / 2 * 100
    return np.percentile(ratios, tail, axis=0), np.percentile(ratios, 100 - tail, axis=0)


@dataclass
class Steps:
    """Per record: tokens [N], expected steps [N, G] (point and upper), and per-position sums."""

    tokens: np.ndarray
    steps: np.ndarray
    steps_hi: np.ndarray
    beta_sum: np.ndarray
    beta_hi_sum: np.ndarray
    top1_sum: np.ndarray


def summarize(s: Steps, rows: np.ndarray, n_bootstrap: int, confidence: float,
               seed: int) -> DomainAcceptance:
    tokens, steps = s.tokens[rows], s.steps[rows]
    low, high = bootstrap_ratio(tokens, steps, n_bootstrap, confidence, seed)
    point = tokens.sum() / steps.sum(0)
    positions = max(int(tokens.sum()), 1)
    keys = [str(g) for g in range(1, steps.shape[1] + 1)]
    return DomainAcceptance(
        n_prompts=int(rows.sum()), n_positions=int(tokens.sum()),
        top1_agreement=float(s.top1_sum[rows].sum() / positions),
        acceptance_rate=float(s.beta_sum[rows].sum() / positions),
        tokens_per_step=dict(zip(keys, point.tolist(), strict=True)),
        ci_low=dict(zip(keys, low.tolist(), strict=True)),
        ci_high=dict(zip(keys, high.tolist(), strict=True)),
    )


@dataclass
class PerPosition:
    beta: list[np.ndarray]  # per record [C]
    beta_hi: list[np.ndarray]
    top1: list[np.ndarray]
    confidence: list[np.ndarray]  # the drafter's probability of its own argmax


def padded(arrays: Sequence[np.ndarray]) -> np.ndarray:
    width = max((len(a) for a in arrays), default=0)
    out = np.zeros((len(arrays), width))
    for i, a in enumerate(arrays):
        out[i, :len(a)] = a
    return out


def replay_steps(per: PerPosition, lengths: np.ndarray, max_gamma: int, max_new: int, *,
            greedy: bool) -> Steps:
    gammas = range(1, max_gamma + 1)
    if greedy:
        steps = np.stack([greedy_steps(per.beta, g, max_new) for g in gammas], 1)  # [N, G]
        steps_hi = steps
    else:
        beta, beta_hi = padded(per.beta), padded(per.beta_hi)
        steps = np.stack([expected_steps(beta, lengths, g, max_new) for g in gammas], 1)
        steps_hi = np.stack([expected_steps(beta_hi, lengths, g, max_new) for g in gammas], 1)
    return Steps(
        tokens=lengths.astype(float), steps=steps, steps_hi=steps_hi,
        beta_sum=np.array([b.sum() for b in per.beta]), beta_hi_sum=np.array([b.sum() for b in per.beta_hi]),
        top1_sum=np.array([b.sum() for b in per.top1]),
    )
