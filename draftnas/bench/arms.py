"""The arms of a bench: each one way of decoding the same prompts, with the same fields in its result.

- `target`: the target alone in the loop's engine (transformers `generate` under engine "hf";
  draftnas's static decoder one token a step under "static", replayed from a CUDA graph on a GPU);
- one speculative-loop arm per drafter (`draftnas` for the drafter benched, `reference` for the
  drafter a user would otherwise pick), in that engine;
- transformers' assisted generation with each drafter (`hf`, `reference_hf`), beside transformers'
  own `generate` of the target alone (`hf_target`; the same as `target` under engine "hf");
- on CPU, the transformers pair again with every model's linear layers routed through the product
  that timed fastest here (`hf_routed_target`, `hf_routed`, `reference_hf_routed`).

An arm's speedup is against its baseline: the target alone in the same engine. A new engine
(llama.cpp, vLLM) is one more arm.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from draftnas.acceptance.traces import eos_token_ids
from draftnas.bench.request_records import BenchOptions
from draftnas.drafter.lookup import parse_lookup
from draftnas.drafter.records import VocabSubset
from draftnas.drafter.vocab import maybe_apply_saved_subset, model_subset
from draftnas.models.decoder import StaticDecoder
from draftnas.models.engines import StaticEngine
from draftnas.models.linears import LinearRouting, route_linears
from draftnas.models.records import quantized
from draftnas.models.row_padding import choose_row_padding
from draftnas.models.sources import LoadedModel
from draftnas.models.speculative import greedy_decode, speculative_generate

log = logging.getLogger(__name__)

#: label of the drafter the bench is for; further drafters (the reference) bring their own arms
MAIN = "draftnas"
#: label of the drafter a user would otherwise pick, benched beside it (further ones: `reference_label`)
REFERENCE = "reference"


def reference_label(index: int) -> str:
    """The label of the bench's `index`-th reference drafter: "reference", then "reference2", ..."""
    return REFERENCE if index == 0 else f"{REFERENCE}{index + 1}"


@dataclass
class Run:
    """One decoding of one prompt by one arm (not a record: per-call detail)."""

    tokens: list[int]
    elapsed_s: float
    steps: int = 0
    accepted: int = 0
    drafted: int = 0
    draft_s: float = 0.0
    margins: list[float] | None = None
    accepted_steps: tuple[int, ...] = ()  # draftnas's loop: per step
    drafted_steps: tuple[int, ...] = ()  # greedy target runs in draftnas's engines: top-1 minus top-2
    first_step_s: float = 0.0  # draftnas's engines: to the end of the first step (the prompt's prefill)
    first_step_tokens: int = 0


@dataclass
class Drafter:
    """A drafter in the bench: its label, the loaded model and its reduced head (if any). `full_head`
    / `reduced_head`: a folder with a full head and draft_vocab.json, sliced for draftnas's loop; its
    full head goes back in for transformers, which needs full-vocabulary logits."""

    label: str
    loaded: LoadedModel
    subset: VocabSubset | None = None
    full_head: Any = None
    reduced_head: Any = None
    weights: str = "dense"  # how its linear layers run in the static engine and the routed arm
    gamma: int = 4  # draft tokens per step, in every arm of this drafter
    p_min: float = 0.0  # its confidence stop (greedy; 0: gamma drafts every step)
    # (gamma, stop) where transformers runs it plainly (dense): a quantized export's own (`plain_gamma`)
    plain: tuple[int, float] | None = None

    @classmethod
    def of(cls, label: str, loaded: LoadedModel, weights: str = "dense", gamma: int = 4,
           p_min: float = 0.0) -> Drafter:
        subset = model_subset(loaded.model)
        if subset is not None or loaded.folder is None:
            return cls(label, loaded, subset, weights=weights, gamma=gamma, p_min=p_min)
        full = loaded.model.get_output_embeddings()
        subset = maybe_apply_saved_subset(loaded.model, loaded.folder)
        if subset is None:
            return cls(label, loaded, weights=weights, gamma=gamma, p_min=p_min)
        return cls(label, loaded, subset, full, loaded.model.get_output_embeddings(), weights, gamma, p_min)

    def own_products(self) -> Any:
        """A context inside which this drafter's model multiplies its linear layers as it drafts (its
        weight format: on the CPU, or int4 on CUDA), so an estimate reads the probabilities and argmaxes it
        drafts with: what `drafter.build.build_drafter` does around its estimate (`route_linears`)."""
        if not quantized(self.weights):
            return contextlib.nullcontext()
        return route_linears(self.loaded.model, attach=False, own_weights=False, weights=self.weights)

    @contextlib.contextmanager
    def full_vocabulary(self, model: Any) -> Any:
        """`model` (this drafter or a copy of it) with the full-vocabulary head while inside."""
        if self.full_head is None:
            yield model
            return
        model.set_output_embeddings(self.full_head)
        try:
            yield model
        finally:
            model.set_output_embeddings(self.reduced_head)


def arm_names(label: str) -> tuple[str, str, str]:
    """(loop, transformers, routed transformers) arm names of the drafter labelled `label`."""
    if label == MAIN:
        return MAIN, "hf", "hf_routed"
    return label, f"{label}_hf", f"{label}_hf_routed"


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def product_rows(lengths: Sequence[int], gamma: int) -> set[int]:
    """The row counts speculative decoding of prompts of these lengths multiplies by: steps of 1 to γ+1
    tokens; each prompt's prefill (n), a drafter's in the loop (n - 1, its last token left to the
    first step) and transformers' first verify of the prompt and γ drafts at once (n + γ)."""
    return set(range(1, gamma + 2)) | {n + k for n in lengths for k in (-1, 0, gamma)}


class Bench:
    """Live models and settings shared by the arms: the target, the drafters, the static engines
    (engine "static") and, for the routed arms, copies of the models with routed linear layers."""

    def __init__(self, target: LoadedModel, drafters: Sequence[Drafter], options: BenchOptions) -> None:
        self.target, self.drafters, self.options = target, {d.label: d for d in drafters}, options
        self.eos = eos_token_ids(target.model, target.tokenizer)
        tok = target.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else (self.eos[0] if self.eos else 0)
        sampling = options.temperature > 0
        self.gen_kwargs: dict[str, Any] = {
            "max_new_tokens": options.max_new_tokens, "do_sample": sampling, "pad_token_id": pad,
            "eos_token_id": list(self.eos) or None,
        }
        if sampling:  # the plain temperature-T softmax: no top-k/top-p warping
            self.gen_kwargs.update(temperature=options.temperature, top_k=0, top_p=1.0)
        for d in drafters:  # a constant gamma and the drafter's confidence stop, as the loop drafts (run
            _drafting_config(d.loaded.model, *(d.plain or (d.gamma, d.p_min)))  # plainly: its dense ones)
        self.engines: dict[str, StaticEngine] = {}  # "target" / drafter label -> engine
        self.routed = options.hf_assisted and options.hf_routed and options.device == "cpu"
        self._routings: dict[str, LinearRouting] = {}
        self._copies: dict[str, Any] = {}

    def routed_model(self, key: str) -> Any:
        """The target's ("target") or a drafter's copy the routed arms run: a copy, so its weights lie
        in this process's memory as `route_linears` leaves a user's model by default, while the plain
        arms keep them as loaded (a view of the safetensors file)."""
        if key not in self._copies:
            if key == "target":
                self._copies[key] = copy.deepcopy(self.target.model)
            else:
                d = self.drafters[key]
                with d.full_vocabulary(d.loaded.model) as model:  # transformers needs the full head
                    self._copies[key] = copy.deepcopy(model)
                _drafting_config(self._copies[key], d.gamma, d.p_min)  # routed: its own kernels' settings
        return self._copies[key]

    def routing(self, key: str) -> LinearRouting:
        """The (detached) routing of a routed copy's linear layers."""
        if key not in self._routings:  # the copy is this process's memory already
            weights = "dense" if key == "target" else self.drafters[key].weights
            self._routings[key] = route_linears(self.routed_model(key), attach=False, own_weights=False,
                                                weights=weights)
        return self._routings[key]

    @property
    def max_gamma(self) -> int:
        """The longest draft any arm verifies: a drafter's gamma or the lookup's draft length."""
        lookup = parse_lookup(self.options.lookup).m if self.options.lookup else 0
        return max(max((d.gamma for d in self.drafters.values()), default=self.options.gamma), lookup)

    def build_engines(self, max_tokens: int) -> None:
        """Static engines (one KV cache each, `max_tokens` slots) for engine "static"."""
        capture = self.options.device == "cuda"
        models = {"target": self.target.model} | {k: d.loaded.model for k, d in self.drafters.items()}
        log.info("building the static engines (%s), %d cache slots each", ", ".join(models), max_tokens)
        self.engines = {k: StaticEngine(StaticDecoder.from_hf(m, max_positions=max_tokens), max_tokens,
                                        capture=capture) for k, m in models.items()}
        for k, d in self.drafters.items():
            if quantized(d.weights):
                self.engines[k].decoder.quantize_weights(d.weights)

    def choosers(self) -> list[Any]:
        """The CPU product choosers in play: the static engines' and, routed, transformers' models'."""
        out = [engine.decoder.matmul for engine in self.engines.values()]
        if self.routed:
            out += [self.routing(k).chooser for k in ("target", *self.drafters)]
        return [c for c in out if c.enabled]

    def prepare(self, encoded: Sequence[list[int]]) -> None:
        """Time every product the runs will meet (`product_rows`) before any run is timed. One
        timing costs many passes over the weights; met first inside a timed run, it would be
        charged to that run."""
        rows = product_rows([len(ids) for ids in encoded], self.max_gamma)
        log.info("choosing the products' kernels at the %d step sizes the runs will meet, before any "
                 "timed run", len(rows))
        for chooser in self.choosers():
            chooser.prepare(rows)
        for engine in self.engines.values():  # one-token steps padded to two rows where that is faster
            choose_row_padding(engine.decoder)

    def warm(self, arms: Sequence[Arm], encoded: Sequence[list[int]]) -> None:
        """Every arm run once before timing: in full on the first prompt (a static engine's full-length
        run meets, and on CUDA captures, every step size), then two tokens of every other prompt, so
        that no timed run is the first at its prompt's length. A serving engine has met its lengths (or
        buckets them into captured shapes); a first prefill at a new length (CUDA's kernel selection,
        an allocation) is a one-time cost of the process, not of the request."""
        warm_tokens = self.options.max_new_tokens if self.engines else min(8, self.options.max_new_tokens)
        for arm in arms:
            log.info("warming the %s arm: %d tokens of the first prompt, untimed", arm.name, warm_tokens)
            arm.run(encoded[0], self.options.seed, warm_tokens)
        log.info("warming every arm at the other %d prompts' lengths, untimed", len(encoded) - 1)
        for ids in encoded[1:]:
            for arm in arms:
                arm.run(ids, self.options.seed, min(2, self.options.max_new_tokens))

    def choice_timing_s(self) -> float:
        return sum(c.timing_s for c in self.choosers())

    def generate(self, ids: list[int], seed: int, max_new_tokens: int, target: Any = None,
                 **extra: Any) -> Run:
        """transformers' `generate` of `target` (default: the target as loaded)."""
        inputs = torch.tensor([ids]).to(self.options.device)
        kwargs = {**self.gen_kwargs, "max_new_tokens": max_new_tokens, **extra}
        torch.manual_seed(seed)
        _synchronize(self.options.device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = (target or self.target.model).generate(inputs, attention_mask=torch.ones_like(inputs),
                                                         **kwargs)
        _synchronize(self.options.device)
        return Run(tokens=out[0, len(ids):].tolist(), elapsed_s=time.perf_counter() - started)

    def arms(self) -> list[Arm]:
        """Every arm this bench runs, baselines first (see the module docstring)."""
        out: list[Arm] = [TargetArm(self)]
        loop_engine = "static" if self.engines else "hf"
        out += [LoopArm(self, label, loop_engine) for label in self.drafters]
        if self.options.hf_assisted:  # (a head, `bench.head_arm`, runs no transformers arm of its own)
            hf_base = "hf_target" if self.engines else "target"
            if self.engines:
                out.append(HfTargetArm(self, routed=False))
            out += [HfAssistedArm(self, label, hf_base, routed=False) for label in self.drafters]
        if self.routed:
            out.append(HfTargetArm(self, routed=True))
            out += [HfAssistedArm(self, label, "hf_routed_target", routed=True) for label in self.drafters]
        return out


def _drafting_config(model: Any, gamma: int, p_min: float) -> None:
    """Assisted generation's settings for a drafter `model`: a constant `gamma` and the confidence stop."""
    cfg = model.generation_config
    cfg.num_assistant_tokens = gamma
    cfg.num_assistant_tokens_schedule = "constant"
    cfg.assistant_confidence_threshold = p_min


class Arm:
    """One way of decoding: `run` one prompt; `baseline` names the arm its speedup is against (None
    for a baseline), `drafter` the drafter's label (None for the target alone)."""

    name: str
    engine: str
    baseline: str | None = None
    drafter: str | None = None

    def __init__(self, bench: Bench) -> None:
        self.bench = bench

    def run(self, ids: list[int], seed: int, max_new_tokens: int) -> Run:
        raise NotImplementedError


class TargetArm(Arm):
    """The target alone in the loop's engine (greedy: with its top-1/top-2 margins)."""

    name = "target"

    def __init__(self, bench: Bench) -> None:
        super().__init__(bench)
        self.engine = "static" if bench.engines else "hf"

    def run(self, ids: list[int], seed: int, max_new_tokens: int) -> Run:
        b = self.bench
        if not b.engines:
            return b.generate(ids, seed, max_new_tokens)
        if b.options.temperature <= 0:
            out = greedy_decode(b.engines["target"], ids, max_new_tokens=max_new_tokens, eos_token_ids=b.eos)
            return Run(tokens=out.tokens, elapsed_s=out.elapsed_s, margins=out.margins,
                       first_step_s=out.first_step_s, first_step_tokens=min(1, len(out.tokens)))
        drafter = next(iter(b.engines.values()))  # gamma 0: plain sampling through the loop
        run = speculative_generate(b.engines["target"], drafter, ids, gamma=0, max_new_tokens=max_new_tokens,
                                   temperature=b.options.temperature, eos_token_ids=b.eos,
                                   generator=torch.Generator().manual_seed(seed))
        return Run(tokens=run.tokens, elapsed_s=run.elapsed_s, first_step_s=run.first_step_s,
                   first_step_tokens=run.first_step_tokens)


class LoopArm(Arm):
    """draftnas's speculative loop with one drafter, in the loop's engine."""

    baseline = "target"

    def __init__(self, bench: Bench, label: str, engine: str) -> None:
        super().__init__(bench)
        self.drafter, self.engine, self.name = label, engine, arm_names(label)[0]

    def run(self, ids: list[int], seed: int, max_new_tokens: int) -> Run:
        b, d = self.bench, self.bench.drafters[self.drafter or ""]
        target = b.engines.get("target", b.target.model)
        drafter = b.engines.get(d.label, d.loaded.model)
        out = speculative_generate(target, drafter, ids, gamma=d.gamma, max_new_tokens=max_new_tokens,
                                   temperature=b.options.temperature, eos_token_ids=b.eos,
                                   generator=torch.Generator().manual_seed(seed), vocab_subset=d.subset,
                                   p_min=d.p_min)
        return Run(tokens=out.tokens, elapsed_s=out.elapsed_s, steps=out.steps, accepted=sum(out.accepted),
                   drafted=sum(out.drafted), draft_s=out.draft_s, accepted_steps=tuple(out.accepted),
                   drafted_steps=tuple(out.drafted), first_step_s=out.first_step_s,
                   first_step_tokens=out.first_step_tokens)


class HfTargetArm(Arm):
    """transformers' `generate` of the target alone (routed: over a routed copy)."""

    def __init__(self, bench: Bench, routed: bool) -> None:
        super().__init__(bench)
        self.routed = routed
        self.name, self.engine = ("hf_routed_target", "hf-routed") if routed else ("hf_target", "hf")

    def run(self, ids: list[int], seed: int, max_new_tokens: int) -> Run:
        b = self.bench
        if not self.routed:
            return b.generate(ids, seed, max_new_tokens)
        with b.routing("target"):
            return b.generate(ids, seed, max_new_tokens, target=b.routed_model("target"))


class HfAssistedArm(Arm):
    """transformers' assisted generation `generate(assistant_model=drafter)` at a constant gamma;
    steps are the target's forward calls."""

    def __init__(self, bench: Bench, label: str, baseline: str, routed: bool) -> None:
        super().__init__(bench)
        self.drafter, self.baseline, self.routed = label, baseline, routed
        self.name = arm_names(label)[2 if routed else 1]
        self.engine = "hf-routed" if routed else "hf"

    def run(self, ids: list[int], seed: int, max_new_tokens: int) -> Run:
        b, d = self.bench, self.bench.drafters[self.drafter or ""]
        target = b.routed_model("target") if self.routed else b.target.model
        calls = [0]
        hook = target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            with contextlib.ExitStack() as stack:
                if self.routed:
                    draft = b.routed_model(d.label)
                    stack.enter_context(b.routing("target"))
                    stack.enter_context(b.routing(d.label))
                else:  # transformers needs the full-vocabulary head
                    draft = stack.enter_context(d.full_vocabulary(d.loaded.model))
                run = b.generate(ids, seed, max_new_tokens, target=target, assistant_model=draft)
        finally:
            hook.remove()
        run.steps = calls[0]
        return run
