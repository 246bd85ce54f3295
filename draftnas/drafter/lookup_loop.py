"""Lookup and hybrid drafting in draftnas's loop (greedy, one sequence).

The prefill emits the target's first token; then each step drafts by lookup (`drafter.lookup.propose`: the
rule llama.cpp's `ngram-simple` follows, so `replay_lookup` over the target's answer gives exactly these
steps) and the target verifies the drafts in one pass, accepting while they equal its argmax. With a model
drafter (a hybrid), a step where lookup finds nothing drafts `gamma` tokens with the model instead
(`policy` "fallback"), or every step drafts with both and verifies the longer ("longer"; a tie keeps the
lookup's). The model drafter
reads the tokens it has not seen when it next drafts. The output equals the target's own greedy decode.
Both are proposers (`models.proposers.Proposer`) of the one speculative loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.lookup import LookupSettings, propose
from draftnas.models.engines import EngineLike, as_engine
from draftnas.models.proposers import ModelProposer, Proposal, Proposer
from draftnas.models.speculative import SpeculativeOutput, drafter_proposer, speculate

POLICIES = ("fallback", "longer")


class LookupProposer:
    """The lookup family's proposer: `propose`'s rule over the prompt and the answer so far. It drafts
    nothing before the target's first token (the loop's prefill alone emits it), so `replay_lookup` over
    the target's answer gives exactly its steps."""

    hidden_layers: tuple[int, ...] = ()
    drafts_at_prefill = False

    def __init__(self, settings: LookupSettings) -> None:
        self.settings = settings

    def reset(self, prompt_ids: Sequence[int]) -> None:
        """Lookup keeps nothing between sequences."""

    def propose(self, seq: list[int], limit: int, *, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> Proposal:
        started = time.perf_counter()
        drafts = propose(seq, self.settings.n, self.settings.m)[:limit]
        return Proposal(torch.tensor(drafts, dtype=torch.long), [None] * len(drafts),
                        seconds=time.perf_counter() - started)

    def rollback(self, length: int) -> None:
        """Lookup reads the sequence afresh each step: nothing to drop."""

    def observe(self, hidden: torch.Tensor) -> None:
        """Lookup reads tokens only."""


class HybridProposer:
    """Lookup first, a model drafter where lookup finds nothing (`policy` "fallback"), or both every step,
    the longer proposal kept ("longer"; a tie keeps the lookup's). The model drafter reads the tokens it has
    not seen when it next drafts, and drops its own drafts when lookup's were verified."""

    hidden_layers: tuple[int, ...] = ()
    drafts_at_prefill = False

    def __init__(self, lookup: LookupProposer, model: ModelProposer, gamma: int, policy: str) -> None:
        if policy not in POLICIES:
            raise InvalidInputError(f"hybrid policy {policy!r} is unknown (allowed: {', '.join(POLICIES)})")
        self.lookup, self.model, self.gamma, self.policy = lookup, model, gamma, policy
        self.by_model, self.base = False, 0

    def reset(self, prompt_ids: Sequence[int]) -> None:
        self.lookup.reset(prompt_ids)
        self.model.reset(prompt_ids)

    def propose(self, seq: list[int], limit: int, *, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> Proposal:
        chosen = self.lookup.propose(seq, limit)
        self.by_model, self.base = False, len(seq)
        if limit > 0 and (not len(chosen) or self.policy == "longer"):
            mine = self.model.propose(seq, min(self.gamma, limit))
            mine.seconds += chosen.seconds
            if len(mine) > len(chosen):
                chosen, self.by_model = Proposal(mine.tokens.cpu(), [None] * len(mine), mine.seconds,
                                                 mine.host_reads + 1), True
            else:
                chosen.seconds, chosen.host_reads = mine.seconds, mine.host_reads + 1
        return chosen

    def rollback(self, length: int) -> None:
        # the model read its own drafts but the last; when lookup's were verified nothing past `base` holds
        self.model.rollback(length if self.by_model else self.base)

    def observe(self, hidden: torch.Tensor) -> None:
        """The hybrid reads tokens only."""


def lookup_generate(target: EngineLike, prompt_ids: Sequence[int], settings: LookupSettings, *,
                    max_new_tokens: int, eos_token_ids: Sequence[int] = (), drafter: EngineLike | None = None,
                    gamma: int = 0, vocab_subset: Any = None, p_min: float = 0.0,
                    policy: str = "fallback") -> SpeculativeOutput:
    """Greedy decoding of `prompt_ids` with lookup drafts (and `drafter`'s, as `policy` says), through
    the one speculative loop (`models.speculative.speculate`)."""
    if policy not in POLICIES:
        raise InvalidInputError(f"hybrid policy {policy!r} is unknown (allowed: {', '.join(POLICIES)})")
    if max_new_tokens < 1 or gamma < 0:
        raise InvalidInputError(f"need max_new_tokens >= 1 and gamma >= 0; got {max_new_tokens}, {gamma}")
    engine = as_engine(target)
    proposer: Proposer = LookupProposer(settings)
    if drafter is not None and gamma > 0:
        model = drafter_proposer(drafter, engine.vocab_size, vocab_subset, p_min=p_min)
        proposer = HybridProposer(LookupProposer(settings), model, gamma, policy)
    return speculate(engine, proposer, prompt_ids, gamma=max(settings.m, gamma),
                     max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids)
