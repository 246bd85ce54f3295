"""The head family's proposer: it reads the target's hidden states at the head's layers from each verify
(`observe`) and drafts from them (`models.proposers.Proposer`).

Row p of the head reads the target's features at position p and the token at p + 1, so it can read a
position only once the token after it stands. It waits for the target's first token (it drafts from the
prompt's hidden states, which only the prefill computes), then each step:

- reads every position whose next token now stands and that it has not read, with the target's features
  (the prefill's, or the last verify's accepted rows): the last row drafts the first token;
- drafts the rest one position further each, reading its own output (before the final norm) as the hidden
  input and the previous draft's embedding, as vLLM's EAGLE proposer does.

Rows past what stood are overwritten when read again (the cache is positional).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.head.model import Eagle3Head, HeadCache
from draftnas.models.proposers import Proposal, sample_token, spread_probs, token_probs


class HeadProposer:
    drafts_at_prefill = False  # it drafts from the prompt's hidden states, which the prefill computes

    def __init__(self, head: Eagle3Head, embeddings: torch.Tensor, max_tokens: int) -> None:
        """`embeddings`: the target's input embedding table [V, H]; `max_tokens`: the longest sequence
        (prompt, answer and drafts) it drafts for."""
        self.head, self.embeddings = head, embeddings
        self.hidden_layers: tuple[int, ...] = tuple(head.shape.layers)
        self.vocab_size = int(embeddings.shape[0])
        self.table = head.draft_ids()
        self.cache: HeadCache = head.new_cache(max_tokens)
        self.features = torch.zeros(max_tokens, head.shape.hidden_size, dtype=head.fc.weight.dtype,
                                    device=head.fc.weight.device)
        self.read = 0  # positions read with the target's features
        self.target_at = 0  # where the target's next read starts (the rows `observe` is given)

    def reset(self, prompt_ids: Sequence[int]) -> None:
        self.read = self.target_at = 0

    def observe(self, hidden: torch.Tensor) -> None:
        """The target's hidden states [A, rows, H] for the rows it read from `target_at` on."""
        rows = hidden.shape[1]
        if self.target_at + rows > self.features.shape[0]:
            raise InvalidInputError(f"a sequence of {self.target_at + rows} tokens is longer than the head's "
                                    f"{self.features.shape[0]} slots")
        self.features[self.target_at:self.target_at + rows] = self.head.fuse(hidden.to(self.features.device))

    def rollback(self, length: int) -> None:
        self.target_at = length
        self.read = min(self.read, max(length - 1, 0))

    def _embed(self, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(tokens, dtype=torch.long, device=self.embeddings.device).reshape(-1)
        return self.embeddings[ids].to(self.features)

    def _step(self, tokens: Sequence[int] | torch.Tensor, hidden: torch.Tensor, start: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits over the draft vocabulary of the last of the rows read at `start`.., and its output
        before the final norm."""
        positions = torch.arange(start, start + hidden.shape[0], device=hidden.device)
        normed, prenorm = self.head(self._embed(tokens), hidden, positions, self.cache)
        return self.head.logits(normed[-1]), prenorm[-1:]

    def propose(self, seq: list[int], limit: int, *, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> Proposal:
        started = time.perf_counter()
        stands = len(seq) - 1  # positions whose next token stands
        if limit < 1 or stands < 1:
            return Proposal(torch.empty(0, dtype=torch.long), seconds=time.perf_counter() - started)
        with torch.inference_mode():
            logits, prenorm = self._step(seq[self.read + 1:], self.features[self.read:stands], self.read)
            self.read = stands
            drafts: list[int] = []
            qs: list[torch.Tensor | None] = []
            for i in range(limit):
                if i:
                    logits, prenorm = self._step(drafts[-1:], prenorm, stands + i - 1)
                if temperature > 0:
                    q = token_probs(logits, temperature)
                    drafts.append(int(self.table[sample_token(q, generator)]))
                    qs.append(spread_probs(q, self.table, self.vocab_size))
                else:
                    drafts.append(int(self.table[int(logits.argmax())]))
        return Proposal(torch.tensor(drafts, dtype=torch.long), qs, seconds=time.perf_counter() - started,
                        host_reads=len(drafts))
