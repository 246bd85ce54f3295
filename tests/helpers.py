"""Small helpers shared by tests (not fixtures)."""

from __future__ import annotations

import copy

import torch


def tiny_llama(config, seed=0, **changes):
    """A LLaMA model with random weights (seed `seed`), eval mode, on its own copy of `config` with
    `changes` (e.g. initializer_range=0.2: a model whose layers matter; 0.02 makes every layer
    ~identity). Pruning or a reduced head rewrites a model's config in place, which must not reach
    the session fixture other tests build from."""
    from transformers import LlamaForCausalLM

    own = copy.deepcopy(config)
    for key, value in changes.items():
        setattr(own, key, value)
    torch.manual_seed(seed)
    return LlamaForCausalLM(own).eval()


def truncated(model, k):
    """A copy of a LLaMA-style model with only its first k layers (layer_idx re-indexed, config updated)."""
    small = copy.deepcopy(model)
    small.model.layers = torch.nn.ModuleList(list(small.model.layers)[:k])
    for i, layer in enumerate(small.model.layers):
        layer.self_attn.layer_idx = i
    small.config.num_hidden_layers = k
    return small


class TinyTokenizer:
    """Character-level stand-in: ids are code points mod 128 (no chat template, no end-of-sequence).

    `shift` renames the vocabulary (same ids, other strings): a different tokenizer fingerprint.
    """

    chat_template = None
    eos_token_id = None

    def __init__(self, shift: int = 0) -> None:
        self.shift = shift

    def get_vocab(self):
        return {f"t{(i + self.shift) % 128}": i for i in range(128)}

    def __call__(self, text):
        return {"input_ids": [ord(c) % 128 for c in text]}


class PaddedTinyTokenizer(TinyTokenizer):
    """`TinyTokenizer` with a pad id (transformers' generate needs one to batch or stop)."""

    pad_token_id = 0


def loaded(model, spec, tokenizer=None, folder=None):
    """A `LoadedModel` around an in-memory model (no files), with a padded tiny tokenizer by default."""
    from draftnas.models.records import ModelSource
    from draftnas.models.sources import LoadedModel

    source = ModelSource(spec=spec, kind="folder", location=spec)
    return LoadedModel(model, tokenizer or PaddedTinyTokenizer(), source, folder, 0.0, True)
