"""The lookup arms of draftnas's loop (`bench --lookup lookup:n=3,m=8`): the lookup alone and a hybrid with
the bench's drafter (`drafter.lookup_loop`), each against the target alone in the same engine, and both
compared with the drafter's own loop arm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from draftnas.bench.arms import MAIN, Arm, Bench, Run, arm_names
from draftnas.bench.records import ArmResult, BenchPrompt, Comparison
from draftnas.bench.stats import drafting_figures
from draftnas.drafter.lookup import LookupSettings, parse_lookup
from draftnas.drafter.lookup_loop import lookup_generate

LOOKUP, HYBRID, HF_LOOKUP = "lookup", "hybrid", "hf_lookup"


class LookupArm(Arm):
    """Lookup drafting in the loop's engine, alone or (`hybrid`) with the bench's drafter."""

    baseline = "target"

    def __init__(self, bench: Bench, settings: LookupSettings, hybrid: bool, policy: str) -> None:
        super().__init__(bench)
        self.settings, self.hybrid, self.policy = settings, hybrid, policy
        self.name = HYBRID if hybrid else LOOKUP
        self.engine = "static" if bench.engines else "hf"
        self.drafter = None

    @property
    def rival(self) -> str:
        """The bench drafter's arm in the same engine, which this arm is compared with."""
        return arm_names(MAIN)[1 if isinstance(self, HfLookupArm) else 0]

    @property
    def spec(self) -> str:
        if not self.hybrid:
            return self.settings.label
        return f"{self.settings.label}+{self.bench.drafters[MAIN].loaded.source.spec} ({self.policy})"

    def run(self, ids: list[int], seed: int, max_new_tokens: int) -> Run:
        b = self.bench
        target = b.engines.get("target", b.target.model)
        extra = {}
        if self.hybrid:
            d = b.drafters[MAIN]
            extra = {"drafter": b.engines.get(d.label, d.loaded.model), "gamma": d.gamma, "p_min": d.p_min,
                     "vocab_subset": d.subset, "policy": self.policy}
        out = lookup_generate(target, ids, self.settings, max_new_tokens=max_new_tokens, eos_token_ids=b.eos,
                              **extra)  # type: ignore[arg-type]
        return Run(tokens=out.tokens, elapsed_s=out.elapsed_s, steps=out.steps, accepted=sum(out.accepted),
                   drafted=sum(out.drafted), draft_s=out.draft_s, accepted_steps=tuple(out.accepted),
                   drafted_steps=tuple(out.drafted), first_step_s=out.first_step_s,
                   first_step_tokens=out.first_step_tokens)


class HfLookupArm(LookupArm):
    """transformers' own prompt lookup, `generate(prompt_lookup_num_tokens=m, max_matching_ngram_size=n)`,
    against transformers' target alone (its rule also tries shorter matches and takes the earliest, so
    its steps are counted, not replayed). transformers runs one candidate source per call: no hybrid."""

    def __init__(self, bench: Bench, settings: LookupSettings) -> None:
        super().__init__(bench, settings, False, "")
        self.name, self.engine = HF_LOOKUP, "hf"
        self.baseline = "hf_target" if bench.engines else "target"

    def run(self, ids: list[int], seed: int, max_new_tokens: int) -> Run:
        b = self.bench
        calls = [0]
        hook = b.target.model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            run = b.generate(ids, seed, max_new_tokens, **self.settings.transformers_kwargs())
        finally:
            hook.remove()
        run.steps = calls[0]
        return run


def lookup_arms(bench: Bench) -> list[Arm]:
    """The lookup and hybrid arms `bench.options.lookup` asks for (none without it), and transformers'
    prompt lookup where the bench runs transformers' arms."""
    spec = bench.options.lookup
    if spec is None or bench.options.temperature > 0:
        return []
    settings = parse_lookup(spec)
    arms: list[Arm] = [LookupArm(bench, settings, False, bench.options.hybrid_policy)]
    if MAIN in bench.drafters:  # a hybrid drafts with a model where the lookup finds nothing (not a head)
        arms.append(LookupArm(bench, settings, True, bench.options.hybrid_policy))
    return arms + ([HfLookupArm(bench, settings)] if bench.options.hf_assisted else [])


def lookup_result(arm: LookupArm, rows: Sequence[BenchPrompt], result: ArmResult, speedup: Comparison
                  ) -> ArmResult:
    """A lookup arm's figures (`result` holds its speed; `speedup`: over the target alone)."""
    runs = [p.run(arm.name) for p in rows]
    if isinstance(arm, HfLookupArm):  # transformers counts its target's calls, not drafts
        return replace(result, **drafting_figures(runs, speedup, counted=False), drafter=arm.spec,
                       gamma=arm.settings.m)
    gamma = max(arm.settings.m, arm.bench.drafters[MAIN].gamma) if arm.hybrid else arm.settings.m
    return replace(result, **drafting_figures(runs, speedup), drafter=arm.spec, gamma=gamma)
