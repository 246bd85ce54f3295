"""A static batch in lockstep: every sequence steps until the slowest has its tokens. Pure: numpy only.

draftnas's batched loop (`models.batched`) decodes B sequences together and runs as many speculative
steps as its slowest sequence needs for its `new_tokens`; the sequences already done are verified
for nothing (the bench's "finished rows"). A sequence needs S steps, a random number (each step yields
1 to gamma + 1 tokens), and the batch max(S_1, ..., S_B). Its tokens per batch step are therefore those
of one sequence times E[S] / E[max S], which this module prices: each drafted token accepted i.i.d. at
the alpha that gives the mean tokens per step (`throughput.acceptance_rate_from_tokens_per_step`), the
distribution of S by convolution, and E[max S] = sum over s of 1 - P(S <= s)^B. Plain decoding yields
one token a step for every sequence, so it never waits on a slow one.
"""

from __future__ import annotations

import functools

import numpy as np

from draftnas.core.errors import InvalidInputError


def lockstep_share(alpha: float, gamma: int, new_tokens: int, batch_size: int) -> float:
    """E[S] / E[max of `batch_size` draws of S], S the steps a sequence needs for `new_tokens` tokens when
    each of a step's `gamma` drafts is accepted at `alpha` until the first rejection: the share of a
    sequence's own tokens per step a batch in lockstep keeps (1 at batch 1, falling as the batch grows)."""
    if batch_size < 1 or new_tokens < 1 or gamma < 0 or not 0.0 <= alpha <= 1.0:
        raise InvalidInputError(f"lockstep needs batch >= 1, new tokens >= 1, gamma >= 0 and alpha in [0, 1] "
                                f"(got {batch_size}, {new_tokens}, {gamma}, {alpha:g})")
    if batch_size == 1:
        return 1.0
    cdf = np.asarray(_steps_cdf(round(alpha, 4), gamma, new_tokens))
    return float(np.sum(1.0 - cdf) / np.sum(1.0 - cdf ** batch_size))


@functools.lru_cache(maxsize=8192)
def _steps_cdf(alpha: float, gamma: int, new_tokens: int) -> tuple[float, ...]:
    """P(S <= s) for s = 0, 1, ..., until 1 (at most `new_tokens` steps: a step yields at least one)."""
    accepted = np.arange(gamma + 1)
    yields = np.zeros(gamma + 2)  # yields[t]: P(a step gives t tokens), k accepted drafts giving k + 1
    yields[1:] = alpha ** accepted * (1.0 - alpha)
    yields[gamma + 1] = alpha ** gamma
    have = np.zeros(new_tokens + 1)  # have[n]: P(n tokens so far), new_tokens and beyond in the last
    have[0] = 1.0
    cdf = [0.0]
    while cdf[-1] < 1.0 - 1e-12 and len(cdf) <= new_tokens:
        spread = np.convolve(have[:new_tokens], yields)
        have = np.concatenate([spread[:new_tokens], [have[new_tokens] + spread[new_tokens:].sum()]])
        cdf.append(float(have[new_tokens]))
    return tuple(min(c, 1.0) for c in cdf)
