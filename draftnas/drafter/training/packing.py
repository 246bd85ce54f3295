"""Packed training rows over a self-distillation set: sequences laid end to end and cut into rows, each
token that carries the target's top-k taught where the row predicts it (`drafter.train`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import option_error
from draftnas.drafter.heal.losses import Batch
from draftnas.drafter.training.distill_store import DistillSequence


@dataclass
class Stream:
    """A phase's data laid end to end: `ids` [N]; `teach` [N] the row of `topk_ids`/`topk_probs` [P, K] of
    the target's top-k for token n (-1: not taught, e.g. a prompt or a sequence's first token)."""

    ids: torch.Tensor
    teach: torch.Tensor
    topk_ids: torch.Tensor
    topk_probs: torch.Tensor
    sequences: list[tuple[int, int]]  # (start, length) of each sequence in ids


def build_stream(seqs: Sequence[DistillSequence]) -> Stream:
    """The sequences' tokens and top-k rows, concatenated in order."""
    ids, teach, sequences = [], [], []
    at, row = 0, 0
    for s in seqs:
        n = len(s.ids)
        ids.append(torch.tensor(s.ids, dtype=torch.int32))
        t = torch.full((n,), -1, dtype=torch.int64)
        t[s.prompt_len:] = torch.arange(row, row + s.positions)
        teach.append(t)
        sequences.append((at, n))
        at, row = at + n, row + s.positions
    if not seqs:
        raise InvalidInputError("no sequences to train on")
    return Stream(torch.cat(ids), torch.cat(teach), torch.cat([s.topk_ids.to(torch.int32) for s in seqs]),
                  torch.cat([s.topk_probs.to(torch.float16) for s in seqs]), sequences)


def epoch_rows(stream: Stream, seq_len: int, seed: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [R, seq_len], teach [R, seq_len]) of one epoch: sequences in a permutation seeded by
    (seed, epoch), laid end to end, cut into rows; teach[r, i] is the top-k row for predicting token i + 1
    (the last column predicts the next row's first token). A trailing partial row is dropped."""
    index, teach = epoch_index(stream, seq_len, seed, epoch)
    return stream.ids[index], teach


def epoch_index(stream: Stream, seq_len: int, seed: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`epoch_rows` as positions in the stream: (index [R, seq_len], teach [R, seq_len]), the rows' tokens
    being `stream.ids[index]` (what a store kept per stream position, e.g. a head's features, reads the
    same rows)."""
    perm = torch.randperm(len(stream.sequences),
                          generator=torch.Generator().manual_seed(seed * 7_919 + epoch))
    index = torch.cat([torch.arange(s, s + n) for s, n in (stream.sequences[int(i)] for i in perm)])
    rows = (len(index) - 1) // seq_len
    if rows < 1:
        raise option_error("seq_len", f"is {seq_len}: the data's {len(index)} tokens make no row that long; "
                                      "lower it or make more data")
    teach = stream.teach[index]
    return index[:rows * seq_len].view(rows, seq_len), teach[1:rows * seq_len + 1].view(rows, seq_len)


def row_batch(stream: Stream, ids: torch.Tensor, teach: torch.Tensor, limit: int | None) -> Batch:
    """A `losses.Batch` of packed rows: every taught position (at most `limit`, in row order)."""
    where = (teach >= 0).nonzero()  # [N, 2] (row, position)
    if limit is not None:
        where = where[:limit]
    rows = teach[where[:, 0], where[:, 1]]
    probs = stream.topk_probs[rows].float()
    batch = Batch(ids.long(), torch.ones_like(ids, dtype=torch.long), where,
                  stream.topk_ids[rows, 0].long(), stream.topk_ids[rows].long(), probs,
                  (1.0 - probs.sum(-1)).clamp(min=0.0))
    return batch
