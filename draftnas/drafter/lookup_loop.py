"""Lookup and hybrid drafting in draftnas's loop (greedy, one sequence).

The prefill emits the target's first token; then each step drafts by lookup (`drafter.lookup.propose`: the
rule llama.cpp's `ngram-simple` follows, so `replay_lookup` over the target's answer gives exactly these
steps) and the target verifies the drafts in one pass, accepting while they equal its argmax. With a model
drafter (a hybrid), a step where lookup finds nothing drafts `gamma` tokens with the model instead
(`policy` "fallback"), or every step drafts with both and verifies the longer ("longer"; a tie keeps the
lookup's). The model drafter
reads the tokens it has not seen when it next drafts. The output equals the target's own greedy decode.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.lookup import LookupSettings, propose
from draftnas.models.engines import EngineLike, as_engine, token_ids
from draftnas.models.speculative import SpeculativeOutput, _Drafter, emit_step

POLICIES = ("fallback", "longer")


def _model_drafts(draft: _Drafter, seq: list[int], g: int, p_min: float) -> list[int]:
    """The model drafter's greedy drafts after `seq` (it reads what it has not seen), g at most."""
    feed: list[int] | torch.Tensor = seq[draft.cached:]
    out: list[int] = []
    for _ in range(g):
        token, go_on = draft.next_token(feed, p_min)
        out.append(int(token))
        feed = token
        if not go_on:
            break
    return out


def lookup_generate(target: EngineLike, prompt_ids: Sequence[int], settings: LookupSettings, *,
                    max_new_tokens: int, eos_token_ids: Sequence[int] = (), drafter: EngineLike | None = None,
                    gamma: int = 0, vocab_subset: Any = None, p_min: float = 0.0,
                    policy: str = "fallback") -> SpeculativeOutput:
    """Greedy decoding of `prompt_ids` with lookup drafts (and `drafter`'s, as `policy` says)."""
    if policy not in POLICIES:
        raise InvalidInputError(f"hybrid policy {policy!r} is unknown (allowed: {', '.join(POLICIES)})")
    if max_new_tokens < 1 or gamma < 0:
        raise InvalidInputError(f"need max_new_tokens >= 1 and gamma >= 0; got {max_new_tokens}, {gamma}")
    started = time.perf_counter()
    engine = as_engine(target)
    engine.reset()
    model = None
    if drafter is not None and gamma > 0:
        subset = getattr(drafter, "draft_vocab_subset", None) if vocab_subset is None else vocab_subset
        if subset is not None and hasattr(subset, "ids"):
            subset = list(subset.ids)
        draft_engine = as_engine(drafter)
        draft_engine.reset()
        model = _Drafter(draft_engine, engine.vocab_size,
                         None if subset is None else torch.as_tensor(subset, dtype=torch.long))
    eos = set(eos_token_ids)
    out = SpeculativeOutput(tokens=[])
    with torch.inference_mode():
        first = int(engine.forward(list(prompt_ids), 0, 1)[-1].argmax())
        seq, cached = [*prompt_ids, first], len(prompt_ids)
        out.tokens.append(first)
        while len(out.tokens) < max_new_tokens and out.tokens[-1] not in eos:
            base, room = len(seq), max_new_tokens - len(out.tokens) - 1
            drafts, by_model = propose(seq, settings.n, settings.m)[:room], False
            if model is not None and room > 0 and (not drafts or policy == "longer"):
                t0 = time.perf_counter()
                mine = _model_drafts(model, seq, min(gamma, room), p_min)
                out.draft_s += time.perf_counter() - t0
                if len(mine) > len(drafts):
                    drafts, by_model = mine, True
            ids = torch.cat((token_ids(seq[cached:], engine.device)[0],
                             torch.tensor(drafts, dtype=torch.long, device=engine.device)))
            best = engine.forward(ids, cached, len(drafts) + 1).argmax(-1).tolist()
            k = 0
            while k < len(drafts) and drafts[k] == best[k]:
                k += 1
            if model is not None:  # it read its own drafts but the last; else nothing past `base` holds
                model.rollback(base + min(k, len(drafts) - 1) if by_model else base)
            emit_step(out, seq, drafts[:k] + [int(best[k])], len(drafts), k, eos, max_new_tokens)
            if out.steps == 1:
                out.first_step_s, out.first_step_tokens = time.perf_counter() - started, len(out.tokens)
            cached = base + k  # the target read seq + all drafts; keep the accepted ones
    out.elapsed_s = time.perf_counter() - started
    return out
