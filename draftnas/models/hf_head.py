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

When assisted generation decodes greedily, it asks its assistant for each step's candidates
through a full `generate` call (configuration copied, arguments validated, logits processors
built over the whole vocabulary). This class answers that call with a short greedy loop of its
own (`_propose`): the same forward, logits processors and stopping rules (end-of-sequence, the
assistant's confidence threshold), the same tokens, and what `generate` returns (sequences,
scores, the cache). Any other call, or one it does not recognize, goes to transformers'
`generate`; `model.fast_assistant = False` sends every call there. The loop spends less time per
step outside both models' forwards than `generate` does (`benchmarks/hf_assisted_parts.py` measures
the parts; docs/hosts/amd-epyc-zen2-2core.md has figures).

Shapes: B batch, T tokens, N kept rows, V the full vocabulary.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch
from transformers import Cache, DynamicCache, Gemma3ForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM
from transformers.generation import GenerateDecoderOnlyOutput

CLASS_BY_BASE = {"LlamaForCausalLM": "DraftnasLlamaReducedHead",
                 "Qwen2ForCausalLM": "DraftnasQwen2ReducedHead",
                 "Gemma3ForCausalLM": "DraftnasGemma3ReducedHead"}

#: the name transformers gives a model's cache argument: `cache` from 5.24, `past_key_values` before
CACHE_ARG = ("cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters
             else "past_key_values")
#: the field of generate's output that holds the cache (renamed with the argument)
_OUTPUT_CACHE = ("cache" if "cache" in {f.name for f in dataclasses.fields(GenerateDecoderOnlyOutput)}
                 else "past_key_values")
#: the arguments of the call assisted generation makes on its assistant (decoder-only pair)
_ASSISTANT_CALL = frozenset({"input_ids", "generation_config", "logits_processor", "min_new_tokens",
                             "max_new_tokens", "attention_mask", "past_key_values", "cache", "position_ids",
                             "logits_to_keep", "use_cache"})


def _greedy_assistant_call(kwargs: dict[str, Any]) -> bool:
    """Whether `generate(**kwargs)` is assisted generation asking for greedy candidates of one
    sequence, with nothing the short loop of `_ReducedHeadMixin._propose` leaves out."""
    config: Any = kwargs.get("generation_config")
    ids = kwargs.get("input_ids")
    cache = kwargs["cache"] if kwargs.get("cache") is not None else kwargs.get("past_key_values")
    mask = kwargs.get("attention_mask")
    if not (set(kwargs) <= _ASSISTANT_CALL and getattr(config, "is_assistant", False)
            and isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[0] == 1):
        return False
    plain_config = (not config.do_sample and (config.num_beams or 1) == 1 and config.stop_strings is None
                    and config.max_time is None and not config.output_logits
                    and not config.output_attentions and not config.output_hidden_states)
    max_new = kwargs.get("max_new_tokens")
    return (plain_config and isinstance(max_new, int) and max_new >= 1
            and not kwargs.get("min_new_tokens") and kwargs.get("use_cache", True) is not False
            and (cache is None or (isinstance(cache, Cache) and cache.get_seq_length() < ids.shape[1]))
            and (mask is None or bool(mask.all())))


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
                use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0, cache: Any = None,
                **kwargs: Any) -> Any:
        """The base class's forward, full-vocabulary logits out. The parameters are spelled out
        because transformers' `generate` reads this signature: behind a bare `**kwargs` it gets
        no `logits_to_keep`, and assisted generation fed the drafter the whole sequence at every
        step, several times the cost of reading one new token.
        The cache comes as `cache` (transformers 5.24 on) or `past_key_values` (before) and goes on
        under the name the installed transformers reads."""
        kwargs[CACHE_ARG] = cache if cache is not None else past_key_values
        out = super().forward(  # type: ignore[misc]
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            inputs_embeds=inputs_embeds, use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
        out.logits = self._full_logits(out.logits)
        if labels is not None:
            out.loss = self.loss_function(out.logits, labels, vocab_size=self.config.vocab_size)  # type: ignore[attr-defined]
        return out

    #: answer assisted generation's greedy candidate calls with `_propose` (see the module docstring)
    fast_assistant = True

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """transformers' `generate`, except for assisted generation's greedy candidate call
        (see the module docstring), which `_propose` answers with the same tokens."""
        if self.fast_assistant and not args and _greedy_assistant_call(kwargs):
            return self._propose(**kwargs)
        return super().generate(*args, **kwargs)  # type: ignore[misc]

    @torch.no_grad()
    def _propose(self, input_ids: torch.Tensor, generation_config: Any, max_new_tokens: int,
                 logits_processor: Any = None, past_key_values: Any = None, cache: Any = None,
                 **_: Any) -> Any:
        """Up to `max_new_tokens` greedy tokens after `input_ids`, as transformers' greedy
        `generate` picks them: the last position's logits in fp32 through `logits_processor`,
        argmax; stop after an end-of-sequence token, or before the limit when the token's
        probability is under the assistant's confidence threshold. The cache holds every
        position but the last token's; the attention mask is all ones (checked by the caller)."""
        config = generation_config
        eos = getattr(config, "_eos_token_tensor", None)
        if eos is None and config.eos_token_id is not None:
            eos = torch.tensor(config.eos_token_id, device=input_ids.device).view(-1)
        threshold = float(getattr(config, "assistant_confidence_threshold", None) or 0.0)
        if cache is None:
            cache = past_key_values
        if cache is None:  # as generate makes an assistant's: rolled back by cropping, so sliding
            cache = DynamicCache(config=self.config.get_text_config(decoder=True))  # layers keep their past
            if hasattr(cache, "activate_past_recording"):  # transformers versions that trim them
                cache.activate_past_recording()
        sequences, scores = input_ids, []
        for step in range(max_new_tokens):
            done = cache.get_seq_length()
            positions = torch.arange(done, sequences.shape[1], device=sequences.device).unsqueeze(0)
            out = self(input_ids=sequences[:, done:], position_ids=positions,  # type: ignore[operator]
                       use_cache=True, logits_to_keep=1, **{CACHE_ARG: cache})
            chosen = out.logits[:, -1].to(dtype=torch.float32, copy=True)
            for processor in logits_processor or ():  # a plain list when the candidate generator filtered it
                chosen = processor(sequences, chosen)
            token = chosen.argmax(-1)
            scores.append(chosen)
            sequences = torch.cat([sequences, token[:, None]], dim=-1)
            if eos is not None and bool(torch.isin(token, eos).all()):
                break
            if threshold and step + 1 < max_new_tokens and float(chosen.softmax(-1)[0, token[0]]) < threshold:
                break
        return GenerateDecoderOnlyOutput(sequences=sequences, scores=tuple(scores),  # type: ignore[arg-type]
                                         **{_OUTPUT_CACHE: cache})


class DraftnasLlamaReducedHead(_ReducedHeadMixin, LlamaForCausalLM):
    """A LLaMA-family drafter with a reduced LM head (full-vocabulary logits out)."""

    _tied_weights_keys: Any = None

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._reduce_head()
        self.post_init()


class DraftnasQwen2ReducedHead(_ReducedHeadMixin, Qwen2ForCausalLM):
    """A Qwen2-family drafter with a reduced LM head (full-vocabulary logits out)."""

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
