"""Reduced-vocabulary draft heads: the drafter predicts over N kept target ids.

A `VocabSubset` is the sorted list of full-vocabulary ids a drafter's LM head
covers: the N most frequent tokens the target itself emits on the workload (its
traces' continuations), plus the tokenizer's special tokens (eos/bos/pad and the
ids its chat template emits). Head row j predicts full id ``ids[j]``.

Applying a subset to a drafter (`apply_vocab_subset`) replaces its LM head by one of
N rows (row j = the old head's row ``ids[j]``) and unties it from the input
embedding, which keeps the full vocabulary: the target may emit any token and the
drafter must read it. Verification by the target is unchanged, so decoding stays
lossless: a target token outside the subset is simply never drafted (a rejection).

For storage, `expand_head` writes the reduced head back into a full-vocabulary
head (rows outside the subset are the original head's rows), so a plain
`transformers` folder loads it; the kept ids travel beside it in
``draft_vocab.json`` (`VocabSubset.save` / `load_vocab_subset`), and draftnas's
loop slices the head back to N rows on load (`maybe_apply_saved_subset`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.records import VOCAB_FILE, VocabSubset, load_vocab_subset

log = logging.getLogger(__name__)


def special_token_ids(tokenizer: Any) -> list[int]:
    """eos/bos/pad/unk and every other special or chat-template token id of `tokenizer`."""
    ids: set[int] = set()
    if tokenizer is None:
        return []
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    for value in getattr(tokenizer, "all_special_ids", None) or []:
        ids.add(int(value))
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):  # added tokens named in the template (<|im_start|>, <end_of_turn>, ...)
        for token, tid in (getattr(tokenizer, "get_added_vocab", dict)() or {}).items():
            if token in template:
                ids.add(int(tid))
    return sorted(ids)


def rank_tokens(sequences: Iterable[Sequence[int]]) -> list[tuple[int, int]]:
    """(id, count) by decreasing count, ties by id."""
    counts: Counter[int] = Counter()
    for seq in sequences:
        counts.update(int(t) for t in seq)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def select_subset(ranking_sequences: Sequence[Sequence[int]], size: int, vocab_size: int, *,
                  required: Iterable[int] = (), fallback_sequences: Sequence[Sequence[int]] = (),
                  source: str = "", tokenizer_fingerprint: str = "") -> VocabSubset:
    """The `size` ids: `required` first, then the most frequent in `ranking_sequences`,
    then in `fallback_sequences` (e.g. prompts, top-k alternatives), then the lowest ids.
    """
    if not 1 <= size <= vocab_size:
        raise InvalidInputError(f"vocab subset size must be in [1, {vocab_size}], got {size}")
    keep: dict[int, None] = {}
    for t in required:
        if 0 <= int(t) < vocab_size:
            keep[int(t)] = None
    if len(keep) > size:
        raise InvalidInputError(f"vocab subset size {size} is smaller than the {len(keep)} special tokens")
    for ranked in (rank_tokens(ranking_sequences), rank_tokens(fallback_sequences)):
        for t, _ in ranked:
            if len(keep) >= size:
                break
            if 0 <= t < vocab_size:
                keep.setdefault(t, None)
    t = 0
    while len(keep) < size:
        keep.setdefault(t, None)
        t += 1
    ids = tuple(sorted(keep))
    total = sum(len(s) for s in ranking_sequences)
    kept = set(ids)
    inside = sum(1 for s in ranking_sequences for x in s if int(x) in kept)
    return VocabSubset(ids=ids, vocab_size=vocab_size, source=source,
                       tokenizer_fingerprint=tokenizer_fingerprint,
                       coverage=inside / total if total else None)


def subset_from_traces(traces: Any, size: int, tokenizer: Any = None, *, source: str = "") -> VocabSubset:
    """The `size` most frequent target tokens in `traces` (continuations), plus special tokens.

    Ties and leftover room are filled from the target's top-k alternatives, then the prompts.
    """
    records = list(traces.records)
    conts = [r.continuation_ids.tolist() for r in records]
    extra = [r.topk_ids.flatten().tolist() for r in records] + [r.prompt_ids.tolist() for r in records]
    meta = traces.metadata
    required = special_token_ids(tokenizer)
    for attr in ("eos_token_ids",):
        required += list(getattr(meta, attr, ()) or ())
    fingerprint = str(getattr(meta, "tokenizer_fingerprint", ""))
    subset = select_subset(conts, size, int(meta.vocab_size), required=required, fallback_sequences=extra,
                           source=source, tokenizer_fingerprint=fingerprint)
    log.info("vocab subset: %d of %d ids, coverage %.3f of the traces' tokens", subset.size,
             subset.vocab_size, subset.coverage or 0.0)
    return subset


def head_rows(model: Any) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def apply_vocab_subset(model: Any, subset: VocabSubset) -> Any:
    """Give `model` (in place) an untied LM head of `subset.size` rows (row j = old row ids[j]).

    The input embedding keeps the full vocabulary. Returns the model. A head that
    already has `subset.size` rows is left as it is.
    """

    head = model.get_output_embeddings()
    rows = int(head.weight.shape[0])
    if rows == subset.size:  # already reduced (e.g. a draftnas.models.hf_head model): record the ids
        model.draft_vocab_subset = subset
        return model
    if rows != subset.vocab_size:
        raise InvalidInputError(f"the drafter's LM head has {rows} rows; a subset of a "
                                f"{subset.vocab_size}-id vocabulary needs {subset.vocab_size} "
                                f"(or already {subset.size})")
    weight = head.weight.detach().index_select(0, kept_ids(subset).to(head.weight.device))
    new = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=head.bias is not None,
                          device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        new.weight.copy_(weight)
        if head.bias is not None:
            new.bias.copy_(head.bias.detach()[kept_ids(subset)])
    model.set_output_embeddings(new)
    model.config.tie_word_embeddings = False
    text_config = getattr(model.config, "get_text_config", None)
    if callable(text_config):
        text_config().tie_word_embeddings = False
    tied = getattr(model, "_tied_weights_keys", None)
    if tied:  # the head is no longer the embedding
        model._tied_weights_keys = type(tied)() if isinstance(tied, dict | list) else None
    model.draft_vocab_subset = subset
    return model


def expand_head(model: Any, subset: VocabSubset) -> Any:
    """In place: a full-vocabulary head again, kept rows from the reduced head, others from the input
    embedding (the tied head the drafter started from). Loads with plain transformers."""

    head = model.get_output_embeddings()
    if int(head.weight.shape[0]) == subset.vocab_size:
        return model
    if int(head.weight.shape[0]) != subset.size:
        raise InvalidInputError(f"the LM head has {int(head.weight.shape[0])} rows, the subset {subset.size}")
    emb = model.get_input_embeddings().weight.detach()
    full = emb.clone()
    full[kept_ids(subset).to(full.device)] = head.weight.detach().to(full.dtype)
    new = torch.nn.Linear(full.shape[1], full.shape[0], bias=False, device=full.device, dtype=full.dtype)
    with torch.no_grad():
        new.weight.copy_(full)
    model.set_output_embeddings(new)
    model.config.tie_word_embeddings = False
    return model


def maybe_apply_saved_subset(model: Any, folder: str | Path | None) -> VocabSubset | None:
    """If `folder` holds a draft_vocab.json, slice `model`'s head to it (in place) and return it."""
    if folder is None or not (Path(folder) / VOCAB_FILE).is_file():
        return None
    subset = load_vocab_subset(folder)
    apply_vocab_subset(model, subset)
    return subset


def model_subset(model: Any) -> VocabSubset | None:
    """The subset `apply_vocab_subset` attached to `model`, if any."""
    subset = getattr(model, "draft_vocab_subset", None)
    return subset if isinstance(subset, VocabSubset) else None


def kept_ids(subset: VocabSubset) -> torch.Tensor:
    """Long tensor [N]: head row -> full id."""
    return torch.tensor(subset.ids, dtype=torch.long)


def head_row_table(subset: VocabSubset) -> torch.Tensor:
    """Long tensor [V]: full id -> head row, -1 outside the subset."""
    table = torch.full((subset.vocab_size,), -1, dtype=torch.long)
    table[kept_ids(subset)] = torch.arange(subset.size)
    return table
