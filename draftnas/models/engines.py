"""Engines: a model that reads tokens at a given start position and returns logits.

- `HFEngine`: a transformers model over a DynamicCache; rejected tokens are rolled
  back with ``DynamicCache.crop`` (which takes a negative count of tokens to drop).
- `StaticEngine`: `models.decoder.StaticDecoder` over a KV cache allocated once;
  rollback is moving the position (the next step overwrites the stale slots, which
  are masked out until then). On CUDA each step size (the 1-2 token draft step, the
  gamma + 1 token verify) is captured once as a CUDA graph and replayed, the way
  serving engines run them; the prompt's prefill runs eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from draftnas.core.errors import InvalidInputError
from draftnas.models.hf_head import CACHE_ARG
from draftnas.models.static_step import StaticStep


class Engine(Protocol):
    """What the speculative and plain loops drive: a model over its own KV cache that reads tokens at
    a start position and returns the logits of the last `keep` of them. Reading at `start` drops (or
    overwrites) what was cached from `start` on, which is how a rejected draft is rolled back."""

    device: torch.device

    @property
    def vocab_size(self) -> int:
        """The vocabulary the engine's input embeddings read."""
        ...

    def reset(self) -> None:
        """Ready for a new sequence."""

    def forward(self, tokens: Sequence[int] | torch.Tensor, start: int, keep: int) -> torch.Tensor:
        """Logits [keep, V] of the last `keep` of `tokens`, read at positions start..start+len-1."""
        ...


#: A model the loops accept: an `Engine`, or a transformers causal LM (wrapped in an `HFEngine`).
EngineLike = Any


class HFEngine:
    """A transformers causal LM with a DynamicCache (rolled back by cropping)."""

    def __init__(self, model: Any) -> None:
        self.model, self.cache = model, DynamicCache()
        self.device = next(model.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[0])

    def reset(self) -> None:
        self.cache = DynamicCache()

    def forward(self, tokens: Sequence[int] | torch.Tensor, start: int, keep: int) -> torch.Tensor:
        """Read `tokens` at positions start.. (dropping cached positions >= start): logits [keep, V]."""

        crop_cache(self.cache, start)
        ids = token_ids(tokens, self.device)
        return self.model(input_ids=ids, **{CACHE_ARG: self.cache}, use_cache=True,
                          logits_to_keep=keep).logits[0]

    def forward_hidden(self, tokens: Sequence[int] | torch.Tensor, start: int, keep: int,
                       layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s logits [keep, V] and the residual stream entering each of `layers` for every row
        read, [len(layers), len(tokens), hidden] (`hidden_states[i]`: the embeddings at 0, the last layer's
        output at the layer count): a head reads them all, the prompt's included."""
        crop_cache(self.cache, start)
        out = self.model(input_ids=token_ids(tokens, self.device), **{CACHE_ARG: self.cache}, use_cache=True,
                         logits_to_keep=keep, output_hidden_states=True)
        check_layers(layers, len(out.hidden_states) - 1)
        return out.logits[0], torch.stack([out.hidden_states[i][0] for i in layers])


def check_layers(layers: Sequence[int], count: int) -> None:
    """One line naming the layer indices outside a model of `count` layers (0..count are readable)."""
    wrong = [i for i in layers if not 0 <= i <= count]
    if wrong:
        raise InvalidInputError(f"hidden-state layer {', '.join(map(str, wrong))} is outside the target "
                                f"(allowed: 0-{count}; {count} layers)")


class StaticEngine:
    """A `StaticDecoder` over one KV cache of `max_tokens` slots; CUDA graphs per step size.

    `capture`: replay steps of up to `max_graph_tokens` tokens from CUDA graphs (one per
    size, captured on first use). A captured step's warm-up and capture compute the same
    tokens at the same positions as its first real call, so they leave the cache as that
    call would.
    """

    def __init__(self, decoder: Any, max_tokens: int, *, capture: bool = False,
                 max_graph_tokens: int = 16) -> None:
        self.decoder, self.capture, self.max_graph_tokens = decoder, capture, max_graph_tokens
        self.cache = decoder.new_cache(1, max_tokens)
        self.vocab_size = int(decoder.arch.vocab_size)
        self.device = decoder.device
        self.steps: dict[int, Any] = {}

    def reset(self) -> None:
        """Nothing to clear: a new sequence writes from position 0 and masks what lies past it."""

    def forward(self, tokens: Sequence[int] | torch.Tensor, start: int, keep: int) -> torch.Tensor:
        """Read `tokens` at positions start..start+T-1 (overwriting those slots): logits [keep, V]."""

        t = len(tokens)
        if start + t > self.cache.slots:
            raise InvalidInputError(f"sequence of {start + t} tokens is longer than the engine's cache "
                                    f"({self.cache.slots} slots)")
        ids = token_ids(tokens, self.device)
        positions = torch.arange(start, start + t, device=self.device)
        if not (self.capture and t <= self.max_graph_tokens):
            return self.decoder(ids, positions, self.cache, keep=keep, slots=start + t)[0]
        step = self.steps.get(t)
        if step is None:
            # the step owns its input buffers (ids may be a view of the loop's drafted tokens)
            step = self.steps[t] = StaticStep(self.decoder, self.cache, ids.clone(), positions, capture=True)
        else:
            step.input_ids.copy_(ids)
            step.positions.copy_(positions)
        return step()[0, -keep:]

    def forward_hidden(self, tokens: Sequence[int] | torch.Tensor, start: int, keep: int,
                       layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """`HFEngine.forward_hidden`: logits [keep, V] and hidden states [len(layers), len(tokens), hidden].
        Runs eagerly (a captured step returns logits only)."""
        check_layers(layers, int(self.decoder.arch.num_hidden_layers))
        t = len(tokens)
        if start + t > self.cache.slots:
            raise InvalidInputError(f"sequence of {start + t} tokens is longer than the engine's cache "
                                    f"({self.cache.slots} slots)")
        found: dict[int, torch.Tensor | None] = dict.fromkeys(layers)
        positions = torch.arange(start, start + t, device=self.device)
        logits = self.decoder(token_ids(tokens, self.device), positions, self.cache, keep=keep,
                              slots=start + t, hidden=found)[0]
        return logits, torch.stack([found[i][0] for i in layers])  # type: ignore[index]


def token_ids(tokens: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Input ids [1, T] on `device`: a list is copied from the host, a tensor already there is used as is
    (so tokens drafted on the device never travel through the host)."""
    if isinstance(tokens, torch.Tensor):
        return tokens.to(device=device, dtype=torch.long).reshape(1, -1)
    return torch.tensor([list(tokens)], dtype=torch.long, device=device)


def as_engine(model: EngineLike) -> Engine:
    """An engine as is; a transformers model wrapped in an `HFEngine`."""
    return model if isinstance(model, HFEngine | StaticEngine) else HFEngine(model)


def crop_cache(cache: Any, length: int) -> None:
    """Drop cached positions past `length` (crop takes a negative count in transformers 5)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
