"""A new head for a target, and its proposer over a target model: the draft vocabulary from the target's own
tokens (its traces' continuations first, as a reduced draft head's), the output rows copied from the
target's, the rest initialised to train (`model.init_head`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from draftnas.drafter.head.model import Eagle3Head, init_head
from draftnas.drafter.head.proposer import HeadProposer
from draftnas.drafter.head.shape import HeadShape
from draftnas.drafter.vocab import select_subset


def draft_vocabulary(shape: HeadShape, sequences: Sequence[Sequence[int]], *, required: Sequence[int] = (),
                     fallback: Sequence[Sequence[int]] = ()) -> tuple[int, ...]:
    """The draft vocabulary's target ids, ascending: `required` (special tokens), then the most frequent
    in `sequences` (the target's own outputs), then in `fallback`, then the lowest ids."""
    return select_subset(sequences, shape.draft_vocab, shape.target.vocab_size, required=required,
                         fallback_sequences=fallback).ids


def new_head(target: Any, shape: HeadShape, draft_ids: Sequence[int], *, seed: int = 0) -> Eagle3Head:
    """A head of `shape` for the transformers model `target`, ready to train (fp32, on the target's
    device)."""
    weight = target.get_output_embeddings().weight
    head = Eagle3Head(shape, device=weight.device)
    return init_head(head, weight.detach().float(), draft_ids, seed=seed).eval()


def untrained_head(shape: HeadShape, out: Path, *, seed: int = 0) -> Path:
    """A head folder of `shape` whose weights are random (its output rows too, its draft vocabulary the
    lowest ids), made without the target: for timing, where what a forward reads is what counts."""
    from draftnas.drafter.head.folder import write_head

    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(shape.draft_vocab, shape.hidden_size, generator=generator) * 0.02
    head = init_head(Eagle3Head(shape), rows, range(shape.draft_vocab), seed=seed)
    return write_head(head, out)


def head_proposer(head: Eagle3Head, target: Any, max_tokens: int) -> HeadProposer:
    """`head`'s proposer over the transformers model `target` (whose input embedding it reads)."""
    return HeadProposer(head, target.get_input_embeddings().weight.detach(), max_tokens)


def target_hidden(target: Any, ids: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
    """The target's residual stream at `layers` over the rows of `ids` [B, T] -> [B, A, T, H] (one forward of
    its decoder, no cache; its LM head, 15% of the 1.5B's weights and [B, T, V] logits, is not run)."""
    decoder = getattr(target, getattr(target, "base_model_prefix", ""), None) or target
    with torch.inference_mode():
        states = decoder(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    return torch.stack([states[i] for i in layers], 1)
