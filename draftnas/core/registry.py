"""Architecture registry: known decoder shapes as data (`data/architectures.yaml`).

Importing this module does not import torch or transformers, so `draftnas targets`
and the analytical model stay fast.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import yaml

from draftnas.core.errors import UnknownTargetError
from draftnas.core.options import option
from draftnas.core.records import Record

Family = Literal["llama", "qwen2", "gemma3", "opt"]
FAMILIES: tuple[str, ...] = ("llama", "qwen2", "gemma3", "opt")


@dataclass(frozen=True)
class Architecture(Record):
    """A decoder-only transformer's shape, in Hugging Face config names."""

    name: str
    family: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_parameters(self) -> int:
        """Parameters of one decoder layer (attention + MLP + norms)."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.family == "opt":
            attn += self.q_dim + 2 * self.kv_dim + h  # q/k/v/out biases
            mlp = 2 * h * i + i + h  # fc1/fc2 with biases
            norms = 2 * 2 * h  # two LayerNorms, weight + bias
            return attn + mlp + norms
        mlp = 3 * h * i  # gate, up, down
        norms = 2 * h
        if self.family == "qwen2":
            attn += self.q_dim + 2 * self.kv_dim
        if self.family == "gemma3":
            norms = 4 * h + 2 * self.head_dim  # 4 RMSNorms + q_norm, k_norm
        return attn + mlp + norms

    def embedding_parameters(self) -> int:
        """Token embedding (+ learned positions for OPT)."""
        n = self.vocab_size * self.hidden_size
        if self.family == "opt":
            n += (2048 + 2) * self.hidden_size  # OPT's position table has an offset of 2
        return n

    def head_parameters(self) -> int:
        """LM head parameters that are not shared with the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def final_norm_parameters(self) -> int:
        return 2 * self.hidden_size if self.family == "opt" else self.hidden_size

    def count_parameters(self) -> int:
        """All parameters, computed from the shape (tied embeddings counted once)."""
        return (
            self.embedding_parameters()
            + self.num_hidden_layers * self.layer_parameters()
            + self.final_norm_parameters()
            + self.head_parameters()
        )

    def parameters_with_head(self, head_rows: int | None) -> int:
        """All parameters when the LM head keeps only `head_rows` rows (a reduced draft head, untied
        from the full input embedding); None: `count_parameters()`."""
        if head_rows is None:
            return self.count_parameters()
        return self.count_parameters() - self.head_parameters() + head_rows * self.hidden_size

    def non_embedding_parameters(self) -> int:
        return self.num_hidden_layers * self.layer_parameters() + self.final_norm_parameters()

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2 * self.num_hidden_layers * self.kv_dim * dtype_bytes

    def with_shape(self, **changes: Any) -> Architecture:
        return replace(self, **changes)

    def problems(self) -> list[str]:
        """Every inconsistency in this shape, as 'field: message' strings."""
        out = []
        for field in ("num_hidden_layers", "hidden_size", "intermediate_size",
                      "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"):
            if getattr(self, field) < 1:
                out.append(f"{field}: must be >= 1, got {getattr(self, field)}")
        if self.num_key_value_heads >= 1 and self.num_attention_heads % self.num_key_value_heads:
            out.append(
                f"num_attention_heads: {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.family not in FAMILIES:
            out.append(f"family: {self.family!r} is not one of {', '.join(FAMILIES)}")
        return out

    @classmethod
    def from_hf_config(cls, config: Any, name: str = "") -> Architecture:
        """Shape of a transformers `PretrainedConfig` (LLaMA-like or OPT)."""
        model_type = getattr(config, "model_type", "llama")
        family = {"qwen2": "qwen2", "gemma3_text": "gemma3", "gemma3": "gemma3", "opt": "opt"}
        text = getattr(config, "text_config", None) or config
        heads = text.num_attention_heads
        hidden = text.hidden_size
        return cls(
            name=name or getattr(text, "_name_or_path", "") or model_type,
            family=family.get(model_type, "llama"),
            num_hidden_layers=text.num_hidden_layers,
            hidden_size=hidden,
            intermediate_size=getattr(text, "intermediate_size", None) or text.ffn_dim,
            num_attention_heads=heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or hidden // heads,
            vocab_size=text.vocab_size,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )


@functools.cache
def load_registry() -> dict[str, Architecture]:
    """All registered architectures by name (lower-case)."""
    text = resources.files("draftnas").joinpath("data/architectures.yaml").read_text()
    raw = yaml.safe_load(text)
    defaults = raw.get("defaults", {})
    out: dict[str, Architecture] = {}
    for name, fields in raw["architectures"].items():
        entry = {**defaults, **fields}
        heads = entry["num_attention_heads"]
        entry["num_key_value_heads"] = entry["num_key_value_heads"] or heads
        entry["head_dim"] = entry["head_dim"] or entry["hidden_size"] // heads
        out[name] = Architecture(name=name, **entry)
    return out


def get_architecture(name: str) -> Architecture:
    """The registered architecture called `name` (case-insensitive)."""
    registry = load_registry()
    key = name.lower()
    if key in registry:
        return registry[key]
    close = difflib.get_close_matches(key, list(registry), n=3)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UnknownTargetError(
        f"unknown architecture {name!r}.{hint} Run `draftnas targets` for the list."
    )


def resolve_architecture(spec: str) -> Architecture:
    """A registry name's shape, or a Hugging Face folder's config (read without loading weights)."""

    if spec.lower() in load_registry():
        return get_architecture(spec)
    config = Path(spec).expanduser() / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        text = data.get("text_config") or data
        ns = SimpleNamespace(**{**text, "model_type": data.get("model_type", "llama"),
                                "tie_word_embeddings": data.get("tie_word_embeddings", False)})
        return Architecture.from_hf_config(ns, name=Path(spec).name)
    return get_architecture(spec)  # raises with close-name suggestions


@dataclass(frozen=True)
class TargetsRequest(Record):
    """What `draftnas targets` was asked: the registry, or one family of it."""

    family: str | None = option(None, choices=FAMILIES, help="Only this family.")


def registered_targets(request: TargetsRequest) -> list[Architecture]:
    """`draftnas targets`: the registry's architectures (of the request's family)."""
    return [a for a in load_registry().values() if request.family is None or a.family == request.family]
