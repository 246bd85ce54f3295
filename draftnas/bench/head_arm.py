"""The head arm of draftnas's loop (`bench --draft head:FOLDER`): a head (`drafter.head`) drafting through the
one speculative loop on the target's hidden states, in the loop's engine, against the target alone there.
It takes the drafter's place: references are model drafters benched beside it, `--lookup`'s lookup arm is
compared with it (a hybrid needs a model drafter), and no transformers arm runs it (assisted generation
takes a model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from draftnas.bench.arms import MAIN, Arm, Bench, Run, arm_names
from draftnas.bench.records import ArmResult, BenchPrompt, Comparison
from draftnas.bench.stats import drafting_figures
from draftnas.models.speculative import speculate


@dataclass(frozen=True)
class HeadDrafter:
    """A head in the bench: the spec as typed, its folder, the loaded head and the γ it drafts."""

    spec: str
    folder: str
    head: Any  # drafter.head.model.Eagle3Head
    gamma: int


def load_bench_head(spec: str, target: Any, gamma: int) -> HeadDrafter:
    """The head `spec` names (`head:FOLDER`), checked against and placed beside the loaded `target` (a
    transformers model) in its dtype."""
    from draftnas.drafter.families import parse_drafter
    from draftnas.drafter.head.folder import load_head
    from draftnas.drafter.head.shape import target_key

    folder = parse_drafter(spec).model
    weight = target.get_input_embeddings().weight
    head = load_head(folder, target_key(target.config.to_dict(), "the target"), device=str(weight.device))
    return HeadDrafter(spec, folder, head.to(weight.dtype), gamma)


class HeadArm(Arm):
    """The bench's head drafting through the loop in its engine (named as the drafter's loop arm)."""

    baseline = "target"

    def __init__(self, bench: Bench, head: HeadDrafter) -> None:
        super().__init__(bench)
        self.head, self.name = head, arm_names(MAIN)[0]
        self.engine = "static" if bench.engines else "hf"
        self.drafter = None

    def run(self, ids: list[int], seed: int, max_new_tokens: int) -> Run:
        from draftnas.drafter.head.build import head_proposer

        b = self.bench
        target = b.engines.get("target", b.target.model)
        slots = len(ids) + max_new_tokens + self.head.gamma + 1
        proposer = head_proposer(self.head.head, b.target.model, slots)
        out = speculate(target, proposer, ids, gamma=self.head.gamma, max_new_tokens=max_new_tokens,
                        temperature=b.options.temperature, eos_token_ids=b.eos,
                        generator=torch.Generator().manual_seed(seed))
        return Run(tokens=out.tokens, elapsed_s=out.elapsed_s, steps=out.steps, accepted=sum(out.accepted),
                   drafted=sum(out.drafted), draft_s=out.draft_s, accepted_steps=tuple(out.accepted),
                   drafted_steps=tuple(out.drafted), first_step_s=out.first_step_s,
                   first_step_tokens=out.first_step_tokens)


def head_result(arm: HeadArm, rows: Sequence[BenchPrompt], result: ArmResult, speedup: Comparison
                ) -> ArmResult:
    """The head arm's figures (`result` holds its speed; `speedup`: over the target alone)."""
    runs = [p.run(arm.name) for p in rows]
    return replace(result, **drafting_figures(runs, speedup, timed=True), drafter=arm.head.spec,
                   draft_vocab_size=arm.head.head.shape.draft_vocab, gamma=arm.head.gamma)
