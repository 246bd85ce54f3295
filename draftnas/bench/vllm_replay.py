"""draftnas's replay of a vLLM bench's requests over the target alone's outputs: each step's accepted and
drafted tokens as vLLM would take them (exact for greedy), a step drafting γ after the prefill as vLLM's do:
lookup by vLLM's n-gram rule (`drafter.lookup`), a model drafter by one teacher-forced pass, a head from the
target's hidden states. `bench.vllm` sets it beside vLLM's own counters; `bench.vllm_predicted` prices it."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol

from draftnas.drafter.families import DrafterSpec
from draftnas.drafter.head.shape import target_key
from draftnas.drafter.lookup import replay_lookup
from draftnas.latency.vllm import Chain
from draftnas.models.sources import load_model


class ReplayedArm(Protocol):
    """What a replay reads of an arm (`bench.vllm.VllmArm`)."""

    @property
    def drafter(self) -> DrafterSpec | None: ...

    @property
    def folder(self) -> str: ...

    @property
    def config(self) -> dict[str, Any] | None: ...

    @property
    def gamma(self) -> int: ...


def replayed(arm: ReplayedArm, encoded: Sequence[Sequence[int]], extended: Sequence[Sequence[int]],
             budget: int, target_folder: str = "") -> tuple[list[int], list[list[tuple[int, int]]]]:
    """draftnas's replay of the arm's requests over the target alone's outputs (`extended` past the
    `budget` of new tokens: vLLM's last step drafts past it): accepted per position and the steps that
    drafted (last), and each request's steps (accepted, drafted) at the arm's γ; empty for the target alone.
    A head reads the target's hidden states (`target_folder`'s model, fp32)."""
    if arm.drafter is None or arm.config is None:
        return [], []
    gamma, lookup = arm.gamma, arm.drafter.lookup
    if gamma == 0:  # a schedule's batches past its break-even: a token a step, no drafts
        return [0], [[(0, 0)] * (min(len(a), budget) - 1) for a in extended]
    if lookup is not None:
        per_request = []
        for prompt, answer in zip(encoded, extended, strict=True):
            replay = replay_lookup(prompt, answer, lookup.n, lookup.m, rule="earliest-longest", budget=budget)
            per_request.append(list(zip(replay.accepted, replay.drafted, strict=True)))
    else:
        per_request = [c.walk(gamma) for c in chains(arm, encoded, extended, budget, target_folder)]
    counts = [0] * (gamma + 1)
    for steps in per_request:
        for accepted, drafted in steps:
            if drafted:
                counts[-1] += 1
                for position in range(min(accepted, gamma)):
                    counts[position] += 1
    return counts, per_request


def chains(arm: ReplayedArm, encoded: Sequence[Sequence[int]], extended: Sequence[Sequence[int]],
           budget: int, target_folder: str = "") -> list[Chain]:
    """Each request's `Chain` at the arm's largest γ: a draft model's (one teacher-forced pass) or a head's
    (from the target's hidden states), which prices the arm at any γ up to it, or at a schedule's."""
    assert arm.drafter is not None and arm.drafter.lookup is None
    if arm.drafter.family == "head":
        return [_head_chain(arm.folder, target_folder, p, a, arm.gamma, budget)
                for p, a in zip(encoded, extended, strict=True)]
    model = load_model(arm.folder).model
    return [_model_chain(model, p, a, arm.gamma, budget) for p, a in zip(encoded, extended, strict=True)]


def release_models() -> None:
    """Drop the heads and targets a bench's replays loaded."""
    _head_and_target.cache_clear()


@functools.cache
def _head_and_target(head: str, target: str) -> tuple[Any, Any]:
    """A head and the target (fp32, transformers) whose hidden states it reads, loaded once per bench."""
    from draftnas.drafter.head.folder import load_head

    model = load_model(target).model.float().eval()
    return load_head(head, target_key(model.config.to_dict(), target)), model


def _head_chain(head_folder: str, target_folder: str, prompt: Sequence[int], answer: Sequence[int],
                gamma: int, budget: int) -> Chain:
    """A head's chain over the target's greedy `answer` (past the `budget`): the target's hidden states from
    one pass over prompt and answer, the head's drafts from its unrolled steps (`drafter.head.train`;
    exact for greedy; its j-th draft is the same at any γ above j)."""
    import torch

    from draftnas.drafter.head.build import target_hidden
    from draftnas.drafter.head.train import head_drafts

    head, target = _head_and_target(head_folder, target_folder)
    ids = torch.tensor(list(prompt) + list(answer))
    hidden = target_hidden(target, ids[None], head.shape.layers)[0]
    drafts = head_drafts(head, target.get_input_embeddings().weight.detach(), ids, hidden, gamma)
    return drafts_chain([d.tolist() for d in drafts], ids.tolist(), len(prompt), gamma, budget)


def drafts_chain(drafts: Sequence[Sequence[int]], ids: Sequence[int], prompt_len: int, gamma: int,
                 budget: int) -> Chain:
    """The chain of a request `ids` (prompt and answer) from a head's drafts (`drafts[j][r]`: its j-th draft
    after row r, wherever the drafts before it were the sequence's own), up to the `budget` of new tokens
    or the answer's end where it ended first."""
    runs = []
    for t in range(min(budget, len(ids) - prompt_len) - 1):  # the prefill gave the answer's first token
        base, a = prompt_len - 1 + t, 0
        while a < gamma and base + a + 2 < len(ids) and drafts[a][base + a] == ids[base + a + 2]:
            a += 1
        runs.append(a)
    return Chain(tuple(runs), min(budget, len(ids) - prompt_len))


def _model_chain(model: Any, prompt: Sequence[int], answer: Sequence[int], gamma: int, budget: int) -> Chain:
    """A model drafter's chain over the target's greedy `answer` (which runs past the `budget` of new
    tokens): one teacher-forced pass gives its argmax after each prefix, so its run at each position is
    how many of its next guesses agree, up to γ (exact for greedy). An answer that ended first (an
    end-of-sequence token) stops there."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([list(prompt) + list(answer)])).logits[0]
    guesses = logits[len(prompt):len(prompt) + len(answer) - 1].argmax(-1).tolist()  # after answer[:j+1]
    agree = [g == t for g, t in zip(guesses, answer[1:], strict=True)]
    end = min(budget, len(answer))
    runs = []
    for t in range(end - 1):
        k = 0
        while k < gamma and t + k < len(agree) and agree[t + k]:
            k += 1
        runs.append(k)
    return Chain(tuple(runs), end)
