"""A drafter whose LM head computes only its kept vocabulary rows, for plain transformers.

draftnas copies this file verbatim into an exported drafter folder whose head is reduced
(as `modeling_draftnas_head.py`, named in the config's `auto_map`), so that

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

gives a model whose head multiplies by its `draft_vocab_size` kept rows only and returns
logits over the whole vocabulary: the kept ids' logits at their ids and -inf everywhere
else. `target.generate(assistant_model=drafter)` then stays lossless (a drafted token is
always a kept id) and pays for the small head. draftnas itself never runs the copy in a
folder: it checks the copy is this file, byte for byte, and builds the class from its own
package. Only torch and transformers are imported here, so the copy runs without draftnas.

Shapes: B batch, T tokens, N kept rows, V the full vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Gemma3ForCausalLM, LlamaForCausalLM

CLASS_BY_BASE = {"LlamaForCausalLM": "DraftnasLlamaReducedHead",
                 "Gemma3ForCausalLM": "DraftnasGemma3ReducedHead"}


class _ReducedHeadMixin:
    """Replaces the LM head by `config.draft_vocab_size` rows; `draft_vocab_ids` [N] maps them."""

    config: Any
    draft_vocab_ids: torch.Tensor
    register_buffer: Any  # from torch.nn.Module, which the concrete classes are

    def _reduce_head(self) -> None:
        rows = int(self.config.draft_vocab_size)
        self.lm_head = torch.nn.Linear(self.config.hidden_size, rows, bias=False)
        self.register_buffer("draft_vocab_ids", torch.arange(rows, dtype=torch.long))

    def _full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, T, N] kept-row logits -> [B, T, V], -inf outside the kept ids."""
        full = logits.new_full((*logits.shape[:-1], int(self.config.vocab_size)), float("-inf"))
        return full.index_copy_(-1, self.draft_vocab_ids, logits)

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: Any = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0, **kwargs: Any) -> Any:
        """The base class's forward, full-vocabulary logits out. The parameters are spelled out
        because transformers' `generate` reads this signature: behind a bare `**kwargs` it gets
        no `logits_to_keep`, and assisted generation fed the drafter the whole sequence at every
        step (11.5 ms a call for a 1-layer SmolLM2 drafter, against 2.0 ms for one new token)."""
        out = super().forward(  # type: ignore[misc]
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
            logits_to_keep=logits_to_keep, **kwargs)
        out.logits = self._full_logits(out.logits)
        if labels is not None:
            out.loss = self.loss_function(out.logits, labels, vocab_size=self.config.vocab_size)  # type: ignore[attr-defined]
        return out


class DraftnasLlamaReducedHead(_ReducedHeadMixin, LlamaForCausalLM):
    """A LLaMA-family drafter with a reduced LM head (full-vocabulary logits out)."""

    _tied_weights_keys: Any = None

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._reduce_head()
        self.post_init()


class DraftnasGemma3ReducedHead(_ReducedHeadMixin, Gemma3ForCausalLM):
    """A Gemma-3 drafter with a reduced LM head (full-vocabulary logits out, soft-capping first)."""

    _tied_weights_keys: Any = None

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._reduce_head()
        self.post_init()
