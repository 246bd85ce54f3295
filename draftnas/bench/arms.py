"""The decoders a bench runs, each over the same prompts: the target alone, draftnas's loop,
transformers' assisted generation, and the same with routed linear layers.
"""


from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from draftnas.acceptance.traces import eos_token_ids
from draftnas.bench.records import BenchOptions
from draftnas.drafter.vocab import maybe_apply_saved_subset, model_subset
from draftnas.models.decoder import StaticDecoder
from draftnas.models.engines import StaticEngine
from draftnas.models.linears import route_linears
from draftnas.models.speculative import greedy_decode, speculative_generate

if TYPE_CHECKING:
    from draftnas.models.sources import LoadedModel


log = logging.getLogger(__name__)


@dataclass
class _Run:
    tokens: list[int]
    elapsed_s: float
    steps: int = 0
    accepted: int = 0
    drafted: int = 0
    draft_s: float = 0.0
    margins: list[float] | None = None  # greedy target runs in draftnas's engines


def _synchronize(device: str) -> None:
    if device == "cuda":

        torch.cuda.synchronize()


def product_rows(encoded: Sequence[list[int]], gamma: int) -> set[int]:
    """The row counts speculative decoding of these prompts multiplies by: steps of 1 to γ+1
    tokens; each prompt's prefill (n), a drafter's in the loop (n - 1, its last token left to the
    first step) and transformers' first verify of the prompt and γ drafts at once (n + γ)."""
    return set(range(1, gamma + 2)) | {len(ids) + k for ids in encoded for k in (-1, 0, gamma)}


class Bench:
    """Live models and settings shared by the three decoders."""

    def __init__(self, target: LoadedModel, draft: LoadedModel, options: BenchOptions) -> None:

        self.target, self.draft, self.options = target, draft, options
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
        self.full_head = self.reduced_head = None
        self.subset = self._reduced_head(draft)
        cfg = draft.model.generation_config
        cfg.num_assistant_tokens = options.gamma
        cfg.num_assistant_tokens_schedule = "constant"
        cfg.assistant_confidence_threshold = 0.0
        self.engines: tuple[Any, Any] | None = None
        self.routed = options.hf_assisted and options.hf_routed and options.device == "cpu"
        self.routings: dict[str, Any] = {}  # "target" / "draft" -> LinearRouting, made on first use
        self.routed_models: dict[str, Any] = {}  # "target" / "draft" -> the copy the routed pair runs

    def _routed_model(self, which: str) -> Any:
        """The target or drafter the routed pair runs: a copy of the model, so its weights lie in
        this process's memory, as `route_linears` leaves a user's model by default, while the
        plain pair keeps them as loaded (a view of the safetensors file)."""
        if which not in self.routed_models:
            model = self.target.model if which == "target" else self.draft.model
            full = which == "draft" and self.full_head is not None  # transformers needs the full head
            if full:
                model.set_output_embeddings(self.full_head)
            try:
                self.routed_models[which] = copy.deepcopy(model)
            finally:
                if full:
                    model.set_output_embeddings(self.reduced_head)
        return self.routed_models[which]

    def _routing(self, which: str) -> Any:
        """The (detached) routing of the routed pair's target's or drafter's linear layers."""

        if which not in self.routings:  # the copy is this process's memory already
            self.routings[which] = route_linears(self._routed_model(which), attach=False, own_weights=False)
        return self.routings[which]

    def build_engines(self, max_tokens: int) -> None:
        """Static engines (one KV cache each, `max_tokens` slots) for engine "static"."""

        capture = self.options.device == "cuda"
        target, draft = (StaticEngine(StaticDecoder.from_hf(m.model, max_positions=max_tokens), max_tokens,
                                      capture=capture) for m in (self.target, self.draft))
        self.engines = (target, draft)

    def choosers(self) -> list[Any]:
        """The CPU product choosers in play: the static engines' and, routed, transformers' models'."""
        out = [engine.decoder.matmul for engine in self.engines or ()]
        if self.routed:
            out += [self._routing(which).chooser for which in ("target", "draft")]
        return [c for c in out if c.enabled]

    def prepare(self, encoded: Sequence[list[int]]) -> None:
        """Time every product the runs will meet (`product_rows`) before any run is timed. One
        timing costs many passes over the weights; met first inside a timed run, it would be
        charged to that run."""
        rows = product_rows(encoded, self.options.gamma)
        for chooser in self.choosers():
            chooser.prepare(rows)

    def choice_timing_s(self) -> float:
        return sum(c.timing_s for c in self.choosers())

    def _target_loop_model(self) -> Any:
        return self.engines[0] if self.engines else self.target.model

    def _draft_loop_model(self) -> Any:
        return self.engines[1] if self.engines else self.draft.model

    def _reduced_head(self, draft: LoadedModel) -> Any:
        """A drafter folder with draft_vocab.json: draftnas's loop slices the head to the kept rows;
        HF assisted generation gets the stored full-vocabulary head back for its runs."""

        subset = model_subset(draft.model)
        if subset is None and draft.folder is not None:
            full = draft.model.get_output_embeddings()
            subset = maybe_apply_saved_subset(draft.model, draft.folder)
            if subset is not None:
                self.full_head, self.reduced_head = full, draft.model.get_output_embeddings()
        return subset

    def _generate(self, ids: list[int], seed: int, max_new_tokens: int, target: Any = None,
                  **extra: Any) -> _Run:
        """transformers' `generate` of `target` (default: the target as loaded)."""

        inputs = torch.tensor([ids])
        kwargs = {**self.gen_kwargs, "max_new_tokens": max_new_tokens, **extra}
        inputs = inputs.to(self.options.device)
        torch.manual_seed(seed)
        _synchronize(self.options.device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = (target or self.target.model).generate(inputs, attention_mask=torch.ones_like(inputs),
                                                         **kwargs)
        return _Run(tokens=out[0, len(ids):].tolist(), elapsed_s=time.perf_counter() - started)

    def run_target(self, ids: list[int], seed: int, max_new_tokens: int) -> _Run:
        """The target alone in the loop's engine (greedy: with its top-1/top-2 margins)."""
        if self.engines is None:
            return self._generate(ids, seed, max_new_tokens)


        if self.options.temperature <= 0:
            out = greedy_decode(self.engines[0], ids, max_new_tokens=max_new_tokens, eos_token_ids=self.eos)
            return _Run(tokens=out.tokens, elapsed_s=out.elapsed_s, margins=out.margins)
        run = speculative_generate(self.engines[0], self.engines[1], ids, gamma=0,
                                   max_new_tokens=max_new_tokens, temperature=self.options.temperature,
                                   eos_token_ids=self.eos, generator=torch.Generator().manual_seed(seed))
        return _Run(tokens=run.tokens, elapsed_s=run.elapsed_s)

    def run_hf_target(self, ids: list[int], seed: int, max_new_tokens: int, routed: bool = False) -> _Run:
        if not routed:
            return self._generate(ids, seed, max_new_tokens)
        with self._routing("target"):
            return self._generate(ids, seed, max_new_tokens, target=self._routed_model("target"))

    def run_hf(self, ids: list[int], seed: int, max_new_tokens: int, routed: bool = False) -> _Run:
        target = self._routed_model("target") if routed else self.target.model
        draft = self._routed_model("draft") if routed else self.draft.model
        calls = [0]
        hook = target.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        swap = not routed and self.full_head is not None  # transformers needs the full-vocabulary head
        if swap:
            draft.set_output_embeddings(self.full_head)
        try:
            with contextlib.ExitStack() as routings:
                if routed:
                    routings.enter_context(self._routing("target"))
                    routings.enter_context(self._routing("draft"))
                run = self._generate(ids, seed, max_new_tokens, target=target, assistant_model=draft)
        finally:
            hook.remove()
            if swap:
                draft.set_output_embeddings(self.reduced_head)
        run.steps = calls[0]
        return run

    def run_draftnas(self, ids: list[int], seed: int, max_new_tokens: int) -> _Run:


        out = speculative_generate(
            self._target_loop_model(), self._draft_loop_model(), ids, gamma=self.options.gamma,
            max_new_tokens=max_new_tokens, temperature=self.options.temperature,
            eos_token_ids=self.eos, generator=torch.Generator().manual_seed(seed),
            vocab_subset=self.subset,
        )
        return _Run(tokens=out.tokens, elapsed_s=out.elapsed_s, steps=out.steps,
                    accepted=sum(out.accepted), drafted=sum(out.drafted), draft_s=out.draft_s)

    def run(self, method: str, ids: list[int], seed: int, max_new_tokens: int) -> _Run:
        runner: dict[str, Callable[[list[int], int, int], _Run]] = {
            "target": self.run_target, "draftnas": self.run_draftnas, "hf_target": self.run_hf_target,
            "hf_assisted": self.run_hf,
            "hf_routed_target": functools.partial(self.run_hf_target, routed=True),
            "hf_routed": functools.partial(self.run_hf, routed=True)}
        return runner[method](ids, seed, max_new_tokens)

    def methods(self) -> list[str]:
        """The decoders this bench runs: hf_target only beside the static engine (else it is target);
        the routed pair on CPU unless turned off."""
        out = ["target", "draftnas"]
        if self.options.hf_assisted:
            out += (["hf_target"] if self.engines is not None else []) + ["hf_assisted"]
        if self.routed:
            out += ["hf_routed_target", "hf_routed"]
        return out
