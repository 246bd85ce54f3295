"""The proposer seam: what drafts tokens for the one speculative loop (`models.speculative.speculate`).

A drafter family (a model drafter, lookup, the two mixed, later a head on the target's hidden states) is
a `Proposer`: the loop asks it for up to `limit` drafts after the sequence so far, verifies them with the
target in one pass, and tells it how many were accepted, so it can drop what it read past them. The way
vLLM's `v1/spec_decode/` has one proposer per family over one verify.

- `reset(prompt_ids)`: ready for a new sequence;
- `propose(seq, limit) -> Proposal`: at most `limit` drafts after `seq` (prompt and tokens emitted so far),
  as full-vocabulary ids; with `sampled` it also returns q (the distribution each draft was drawn from);
- `rollback(length)`: the sequence's first `length` tokens stand; anything it read past them is stale;
- `drafts_at_prefill`: whether it drafts in the step that reads the prompt (a model drafter reads the
  prompt itself first; lookup waits for the target's first token, so its first step is the prefill alone);
- `hidden_layers` / `observe(hidden)`: the target layers whose hidden states it reads (empty: none); the
  loop then passes the verify step's hidden states at those layers, [layers, rows, hidden].

`ModelProposer` is the model-drafter family's proposer (a causal LM over its own cache, maybe a reduced
head); lookup and the hybrid live with their family in `drafter.lookup_loop`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from draftnas.models.engines import Engine


@dataclass
class Proposal:
    """One step's drafts: full-vocabulary ids [g] (on the target's device or the host), and for a sampled
    step q over the full vocabulary per draft (`None` where a draft is a point mass, as lookup's are)."""

    tokens: torch.Tensor
    qs: list[torch.Tensor | None] = field(default_factory=list)
    seconds: float = 0.0  # time spent proposing
    host_reads: int = 0  # reads of device results by the host while proposing

    def __len__(self) -> int:
        return int(self.tokens.numel())


class Proposer(Protocol):
    """What drafts for the speculative loop (see the module's docstring)."""

    hidden_layers: tuple[int, ...]
    drafts_at_prefill: bool  # drafts in the step that reads the prompt (else that step is the prefill alone)

    def reset(self, prompt_ids: Sequence[int]) -> None:
        """Ready for a new sequence that starts with `prompt_ids`."""

    def propose(self, seq: list[int], limit: int, *, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> Proposal:
        """At most `limit` drafts after `seq` (greedy at temperature 0, else sampled with their q)."""
        ...

    def rollback(self, length: int) -> None:
        """The sequence's first `length` tokens stand; drop what was read past them."""

    def observe(self, hidden: torch.Tensor) -> None:
        """The target's hidden states at `hidden_layers` for the rows it just verified: [L, rows, H]."""


def token_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The temperature-T softmax of `logits` [..., V], in fp32."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def spread_probs(head_probs: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q over a head's rows [R] as q over the full vocabulary [V]: row r at full id `ids[r]`, zero
    elsewhere."""
    full = torch.zeros(vocab_size, dtype=head_probs.dtype, device=head_probs.device)
    full[ids.to(head_probs.device)] = head_probs
    return full


def sample_token(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One id drawn from `probs` [V] (on the host, so a seeded generator replays)."""
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


class ModelProposer:
    """A causal LM drafting greedily (or by sampling) over its own cache; with `vocab_subset` its head
    covers only those full-vocabulary ids (q is zero elsewhere). `p_min` (greedy): stop a step's drafts
    after the first whose drafter probability is below it (transformers' `assistant_confidence_threshold`;
    one host read per draft). `eos`: a sampled step stops drafting after an end-of-sequence token."""

    hidden_layers: tuple[int, ...] = ()
    drafts_at_prefill = True  # it reads the prompt itself, then drafts

    def __init__(self, engine: Engine, vocab_size: int, vocab_subset: torch.Tensor | None = None, *,
                 p_min: float = 0.0, eos: Sequence[int] = ()) -> None:
        self.engine, self.cached, self.p_min, self.eos = engine, 0, p_min, set(eos)
        self.vocab_size, self.subset = vocab_size, vocab_subset
        self.table = None if vocab_subset is None else vocab_subset.to(engine.device)  # copied once

    def reset(self, prompt_ids: Sequence[int]) -> None:
        self.engine.reset()
        self.cached = 0

    def next_logits(self, feed: list[int] | torch.Tensor) -> torch.Tensor:
        """Logits over the head [V_head] after reading `feed` (after the cached positions)."""
        logits = self.engine.forward(feed, self.cached, 1)[-1]
        self.cached += len(feed)
        if self.table is not None and logits.shape[-1] != self.table.numel():
            logits = logits[self.table.to(logits.device)]
        return logits

    def next_token(self, feed: list[int] | torch.Tensor) -> tuple[torch.Tensor, bool]:
        """The greedy draft after reading `feed`, a full-vocabulary id [1] left on the device, and whether
        drafting goes on (with `p_min` the host reads the draft's probability over the head)."""
        logits = self.next_logits(feed)
        index = logits.argmax().reshape(1)
        go_on = self.p_min <= 0 or float(torch.softmax(logits.float(), dim=-1).amax()) >= self.p_min
        return (index if self.table is None else self.table[index]), go_on

    def propose(self, seq: list[int], limit: int, *, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> Proposal:
        started = time.perf_counter()
        if temperature > 0:
            proposal = self._sampled(seq, limit, temperature, generator)
        else:
            feed: list[int] | torch.Tensor = seq[self.cached:]
            drafts: list[torch.Tensor] = []
            for _ in range(limit):
                token, go_on = self.next_token(feed)
                drafts.append(token)
                feed = token
                if not go_on:
                    break
            device = self.engine.device
            tokens = torch.cat(drafts) if drafts else torch.empty(0, dtype=torch.long, device=device)
            proposal = Proposal(tokens, host_reads=len(drafts) if self.p_min > 0 else 0)
        proposal.seconds = time.perf_counter() - started
        return proposal

    def _sampled(self, seq: list[int], limit: int, temperature: float,
                 generator: torch.Generator | None) -> Proposal:
        """Drafts drawn from q (fewer after an end-of-sequence token), q over the full vocabulary each."""
        drafts: list[int] = []
        qs: list[torch.Tensor | None] = []
        feed = seq[self.cached:]
        for _ in range(limit):
            q = token_probs(self.next_logits(feed), temperature)
            index = sample_token(q, generator)
            token = int(self.subset[index]) if self.subset is not None else index
            qs.append(self.full_probs(q))
            drafts.append(token)
            feed = [token]
            if token in self.eos:
                break
        return Proposal(torch.tensor(drafts, dtype=torch.long), qs, host_reads=len(drafts))

    def full_probs(self, head_probs: torch.Tensor) -> torch.Tensor:
        """q over the full vocabulary [V] (zero outside the subset)."""
        return head_probs if self.subset is None else spread_probs(head_probs, self.subset, self.vocab_size)

    def rollback(self, length: int) -> None:
        self.cached = min(self.cached, length)

    def observe(self, hidden: torch.Tensor) -> None:
        """A model drafter reads tokens only."""
