"""Healing batches and losses: the positions a drafter is taught on, KL to live logits or to a
stored top-k, and the held-out reading of top-1 agreement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from draftnas.acceptance.estimate import head_logits
from draftnas.acceptance.steps import greedy_steps
from draftnas.drafter.heal.heal_data import HealSequence
from draftnas.drafter.vocab import head_row_table, kept_ids


@dataclass
class Batch:
    input_ids: Any  # [B, T] right padded
    attention_mask: Any  # [B, T]
    positions: Any  # [N, 2] (row, position) of every prediction of a continuation token
    top1: Any  # [N]
    topk_ids: Any = None  # [N, K]
    topk_probs: Any = None  # [N, K]
    leftover: Any = None  # [N]

    def to(self, device: Any) -> Batch:
        """The batch on `device` (the model's)."""
        moved = {k: None if v is None else v.to(device) for k, v in vars(self).items()}
        return Batch(**moved)


def collate(seqs: Sequence[HealSequence], pad_id: int, with_topk: bool) -> Batch:
    width = max(len(s.input_ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    rows: list[int] = []
    cols: list[int] = []
    for r, s in enumerate(seqs):
        ids[r, :len(s.input_ids)] = torch.tensor(s.input_ids)
        mask[r, :len(s.input_ids)] = 1
        # the logits at position p predict token p + 1: continuation token t sits at prompt_len + t
        cols += range(s.prompt_len - 1, len(s.input_ids) - 1)
        rows += [r] * s.continuation_len
    batch = Batch(ids, mask, torch.tensor([rows, cols]).T,
                   torch.tensor([t for s in seqs for t in s.top1], dtype=torch.long))
    if with_topk:
        batch.topk_ids = torch.cat([s.topk_ids for s in seqs]).long()
        batch.topk_probs = torch.cat([s.topk_probs for s in seqs]).float()
        batch.leftover = torch.cat([s.leftover for s in seqs]).float()
    return batch


def selected_logits(model: Any, batch: Batch) -> torch.Tensor:
    """Logits [N, V] at the batch's prediction positions only (the LM head skips prompt tokens),
    through `acceptance.head_logits` (float32, Gemma's soft-capping applied)."""

    inner = getattr(model, "model", None)
    if inner is None or model.get_output_embeddings() is None:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return logits[batch.positions[:, 0], batch.positions[:, 1]].float()
    hidden = inner(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    return head_logits(model, hidden[batch.positions[:, 0], batch.positions[:, 1]])  # [N, V]


def head_subset(model: Any) -> torch.Tensor | None:
    """Full ids of a reduced draft head's rows (draftnas.drafter.vocab.apply_vocab_subset), else None."""
    subset = getattr(model, "draft_vocab_subset", None)
    return None if subset is None else kept_ids(subset)


def topk_to_head(model: Any, batch: Batch) -> tuple[Any, ...]:
    """The batch's top-k teacher in the drafter's head rows: ids outside a reduced head's subset
    move their probability into the leftover bucket."""
    subset = getattr(model, "draft_vocab_subset", None)
    if subset is None:
        return batch.topk_ids, batch.topk_probs, batch.leftover, None
    return topk_in_rows(head_row_table(subset), batch.topk_ids, batch.topk_probs, batch.leftover)


def topk_in_rows(table: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor, leftover: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A top-k teacher [N, K] in a head's rows (`table`: full id -> row, -1 outside the head): (rows, the
    probabilities of the ids the head has, the leftover with the others' moved in, which ids it has), as
    `kl_to_topk` takes them."""
    rows = table.to(topk_ids.device)[topk_ids]  # [N, K], -1 outside
    inside = rows >= 0
    return rows.clamp(min=0), topk_probs * inside, leftover + (topk_probs * ~inside).sum(-1), inside


def kl_to_logits(drafter_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(softmax(target) || softmax(drafter)); inputs [N, V]."""

    log_q = torch.log_softmax(drafter_logits, dim=-1)
    log_p = torch.log_softmax(target_logits, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def kl_to_topk(drafter_logits: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor,
               leftover: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean KL of the target's top-k + leftover bucket to the drafter's matching buckets.

    drafter_logits [N, V]; topk_ids / topk_probs [N, K]; leftover [N] (1 - sum of top-k).
    The drafter's leftover bucket is 1 - the drafter's mass on the same K ids.
    """

    log_q = torch.log_softmax(drafter_logits, dim=-1)
    log_q_k = log_q.gather(1, topk_ids)  # [N, K]
    q_k = log_q_k.exp() if mask is None else log_q_k.exp() * mask  # mask: top-k ids the head has
    q_rest = (1.0 - q_k.sum(-1)).clamp(min=1e-8)
    p = topk_probs.clamp(min=0.0)
    eps = 1e-8
    kl_k = (p * (torch.log(p + eps) - log_q_k)).sum(-1)
    rest = leftover.clamp(min=0.0)
    kl_rest = rest * (torch.log(rest + eps) - torch.log(q_rest))
    return (kl_k + kl_rest).mean()


def measure_agreement(model: Any, seqs: Sequence[HealSequence], *, gamma: int = 4,
                      pad_id: int = 0, batch_size: int = 8) -> tuple[float, float, int]:
    """(top-1 agreement, greedy tokens per step at `gamma`, positions) over held-out sequences.

    Steps are `acceptance.greedy_steps`' replay of each continuation (the search's estimator)."""

    was_training = model.training
    model.eval()
    hits, total, tokens, steps = 0, 0, 0.0, 0
    with torch.no_grad():
        for start in range(0, len(seqs), batch_size):
            chunk = seqs[start:start + batch_size]
            batch = collate(chunk, pad_id, with_topk=False).to(next(model.parameters()).device)
            pred = selected_logits(model, batch).argmax(-1)
            subset = head_subset(model)
            if subset is not None:  # head rows -> full-vocabulary ids
                pred = subset.to(pred.device)[pred]
            agree = (pred == batch.top1).tolist()
            hits += sum(agree)
            total += len(agree)
            offset = 0
            for s in chunk:
                n = s.continuation_len
                steps += int(greedy_steps([np.asarray(agree[offset:offset + n], dtype=float)], gamma, n)[0])
                tokens += n
                offset += n
    model.train(was_training)
    return hits / max(total, 1), tokens / max(steps, 1), total
