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
    drafted (last), and each request's steps (accepted, drafted); empty for the target alone. A head reads
    the target's hidden states (`target_folder`'s model, fp32)."""
    if arm.drafter is None or arm.config is None:
        return [], []
    gamma, lookup = arm.gamma, arm.drafter.lookup
    if gamma == 0:  # a schedule's batches past its break-even: a token a step, no drafts
        return [0], [[(0, 0)] * (min(len(a), budget) - 1) for a in extended]
    counts = [0] * (gamma + 1)
    head = arm.drafter.family == "head"
    model = None if lookup is not None or head else load_model(arm.folder).model
    per_request = []
    for prompt, answer in zip(encoded, extended, strict=True):
        if lookup is not None:
            replay = replay_lookup(prompt, answer, lookup.n, lookup.m, rule="earliest-longest", budget=budget)
            steps = list(zip(replay.accepted, replay.drafted, strict=True))
        elif head:
            steps = _head_steps(arm.folder, target_folder, prompt, answer, gamma, budget)
        else:
            steps = _model_steps(model, prompt, answer, gamma, budget)
        per_request.append(steps)
        for accepted, drafted in steps:
            if drafted:
                counts[-1] += 1
                for position in range(min(accepted, gamma)):
                    counts[position] += 1
    return counts, per_request


def release_models() -> None:
    """Drop the heads and targets a bench's replays loaded."""
    _head_and_target.cache_clear()


@functools.cache
def _head_and_target(head: str, target: str) -> tuple[Any, Any]:
    """A head and the target (fp32, transformers) whose hidden states it reads, loaded once per bench."""
    from draftnas.drafter.head.folder import load_head

    model = load_model(target).model.float().eval()
    return load_head(head, target_key(model.config.to_dict(), target)), model


def _head_steps(head_folder: str, target_folder: str, prompt: Sequence[int], answer: Sequence[int],
                gamma: int, budget: int) -> list[tuple[int, int]]:
    """(accepted, drafted) per step of a head over the target's greedy `answer` (past the `budget`): the
    target's hidden states from one pass over prompt and answer, the head's drafts from its unrolled steps
    (`drafter.head.train`; exact for greedy), each step drafting γ after the prefill as vLLM's do."""
    import torch

    from draftnas.drafter.head.build import target_hidden
    from draftnas.drafter.head.train import head_drafts, head_walk

    head, target = _head_and_target(head_folder, target_folder)
    ids = torch.tensor(list(prompt) + list(answer))
    hidden = target_hidden(target, ids[None], head.shape.layers)[0]
    drafts = head_drafts(head, target.get_input_embeddings().weight.detach(), ids, hidden, gamma)
    return head_walk(drafts, ids, len(prompt), gamma, budget)


def _model_steps(model: Any, prompt: Sequence[int], answer: Sequence[int], gamma: int, budget: int
                 ) -> list[tuple[int, int]]:
    """(accepted, drafted) per step of a model drafter over the target's greedy `answer` (which runs past
    the `budget` of new tokens): one teacher-forced pass gives its argmax after each prefix; after the
    prefill each step drafts γ, steps go on until the budget is reached, or the answer's end where it
    ended first (exact for greedy)."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([list(prompt) + list(answer)])).logits[0]
    guesses = logits[len(prompt):len(prompt) + len(answer) - 1].argmax(-1).tolist()  # after answer[:j+1]
    agree = [float(g == t) for g, t in zip(guesses, answer[1:], strict=True)]
    steps, t = [], 0
    # the prefill emitted answer[0]; a step at t drafts γ and emits accepted + 1; an answer that ended
    # first (an end-of-sequence token) stops there
    while t < min(budget, len(answer)) - 1:
        k = 0
        while k < gamma and t + k < len(agree) and agree[t + k] > 0.5:
            k += 1
        steps.append((k, gamma))
        t += k + 1
    return steps
