"""A head's shape, checked against its target: which target layers it reads, its draft vocabulary, its FFN
width and attention heads. Torch-free (the family table and the CLI read it without loading a model).

Layer i is the residual stream entering target layer i (transformers' `hidden_states[i]`; vLLM's aux hidden
state i), so 0..L are readable for a target of L layers. vLLM reads (2, L // 2, L - 3) where a head names
none; the folders draftnas writes name them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import OptionError
from draftnas.core.records import Record
from draftnas.core.registry import Architecture

#: rows of the draft vocabulary where none is asked for (the size published EAGLE-3 heads use)
DEFAULT_DRAFT_VOCAB = 32768


@dataclass(frozen=True)
class TargetKey(Record):
    """What a head must agree with in its target: its name (informative), layer count, width and
    vocabulary."""

    name: str
    layers: int
    hidden_size: int
    vocab_size: int

    def describe(self) -> str:
        return (f"{self.name} ({self.layers} layers, width {self.hidden_size}, "
                f"{self.vocab_size:,} tokens)")


@dataclass(frozen=True)
class HeadShape(Record):
    """One head: the target it reads, the target layers (ascending), the draft vocabulary's rows, the FFN
    width, attention heads and KV heads (head_dim from the target's), and the target's RoPE and norm
    constants the head's attention and norms reuse."""

    target: TargetKey
    layers: tuple[int, ...]
    draft_vocab: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_positions: int

    @property
    def hidden_size(self) -> int:
        return self.target.hidden_size

    def parameters(self) -> int:
        """Weights of the head (the target's input embedding, which it shares, not counted)."""
        h, q, kv = self.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        fc = len(self.layers) * h * h
        attention = 2 * h * (q + 2 * kv) + q * h
        mlp = 3 * h * self.ffn
        return fc + attention + mlp + 4 * h + self.draft_vocab * h

    def label(self) -> str:
        return (f"head L{'/'.join(map(str, self.layers))} V{self.draft_vocab} F{self.ffn}")


def target_key(config: Mapping[str, Any], name: str) -> TargetKey:
    """The key of a target from its transformers config."""
    return TargetKey(name=name, layers=int(config["num_hidden_layers"]),
                     hidden_size=int(config["hidden_size"]), vocab_size=int(config["vocab_size"]))


def default_layers(count: int) -> tuple[int, ...]:
    """vLLM's default for a target of `count` layers: early, middle and late."""
    return tuple(sorted({min(2, count), count // 2, max(count - 3, 0)}))


def rope_theta(config: Mapping[str, Any]) -> float:
    """The target's RoPE base (transformers 5 keeps it in `rope_parameters`)."""
    found = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    if found is None:
        raise InvalidInputError("the target's config names no rope_theta; a head reuses the target's RoPE")
    return float(found)


def head_shape(config: Mapping[str, Any], name: str, *, layers: Sequence[int] | None = None,
               draft_vocab: int | None = None, ffn: int | None = None, heads: int | None = None,
               kv_heads: int | None = None) -> HeadShape:
    """A head for the target of `config` (its transformers config): the named dimensions, else the target's
    own (its FFN width and heads), vLLM's default layers and a 32,768-row draft vocabulary (the target's
    whole vocabulary where that is smaller). One line naming each parameter that is wrong otherwise."""
    key = target_key(config, name)
    target_heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or key.hidden_size // target_heads)
    shape = HeadShape(
        target=key, layers=tuple(layers) if layers is not None else default_layers(key.layers),
        draft_vocab=draft_vocab if draft_vocab is not None else min(DEFAULT_DRAFT_VOCAB, key.vocab_size),
        ffn=ffn if ffn is not None else int(config["intermediate_size"]),
        heads=heads if heads is not None else target_heads,
        kv_heads=kv_heads if kv_heads is not None else int(config.get("num_key_value_heads") or target_heads),
        head_dim=head_dim, rope_theta=rope_theta(config),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_positions=int(config.get("max_position_embeddings", 4096)))
    check_shape(shape)
    return shape


def shape_problems(shape: HeadShape) -> list[tuple[str, str]]:
    """(parameter, what is wrong) for each thing a head cannot be for its target; the message follows the
    parameter's name (`core.options.OptionError`)."""
    key, out = shape.target, []
    outside = [i for i in shape.layers if not 0 <= i <= key.layers]
    if outside:
        out.append(("layers", f"{','.join(map(str, outside))}: outside the target {key.name} (allowed: "
                              f"0-{key.layers}, the residual stream entering each of its {key.layers} layers "
                              "and after the last)"))
    elif not shape.layers or list(shape.layers) != sorted(set(shape.layers)):
        out.append(("layers", f"{','.join(map(str, shape.layers))}: need one or more distinct layers in "
                              "ascending order (e.g. 2,14,25)"))
    if not 1 <= shape.draft_vocab <= key.vocab_size:
        out.append(("draft_vocab", f"{shape.draft_vocab:,}: more rows than the target {key.name}'s "
                                   f"vocabulary (allowed: 1-{key.vocab_size:,})"))
    if shape.ffn < 1:
        out.append(("ffn", f"{shape.ffn}: need a positive width"))
    if shape.heads < 1 or shape.kv_heads < 1 or shape.heads % shape.kv_heads:
        out.append(("heads", f"{shape.heads} with {shape.kv_heads} KV heads: need positive counts, the heads "
                             "a multiple of the KV heads"))
    return out


def check_shape(shape: HeadShape) -> None:
    """One line naming each thing a head cannot be for its target (an `OptionError`)."""
    problems = shape_problems(shape)
    if problems:
        raise OptionError(problems)


def check_same_target(made_for: TargetKey, here: TargetKey, where: str) -> None:
    """One line where a head made for one target is loaded with another (layers, width or vocabulary
    differ; the name alone may differ, as a folder and its GGUF do)."""
    if (made_for.layers, made_for.hidden_size, made_for.vocab_size) != \
            (here.layers, here.hidden_size, here.vocab_size):
        raise InvalidInputError(f"{where}: the head was made for {made_for.describe()}, not the target here, "
                                f"{here.describe()}")


def priced_arch(target: Architecture, layers_read: int, ffn: int, label: str) -> Architecture:
    """What the latency model prices one draft token of a head as: one layer at the target's width and
    heads whose weights equal the head's, its fc over `layers_read` target layers and its qkv reading two
    widths folded into the FFN (rounded up to a multiple of 64); the output rows are the draft vocabulary's,
    given as the head rows. A decode step reads every weight once, so equal bytes price alike on a host
    whose decode is bandwidth-bound; the fc runs once a step in vLLM, not once a draft, so this prices a
    head a little above its cost there."""
    h = target.hidden_size
    qkv = (target.num_attention_heads + 2 * target.num_key_value_heads) * target.head_dim
    extra = layers_read * h * h + h * qkv
    width = ffn + -(-extra // (3 * h))
    return target.with_shape(name=f"{target.name}:{label}", num_hidden_layers=1,
                             intermediate_size=-(-width // 64) * 64)
