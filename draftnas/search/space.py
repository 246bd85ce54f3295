"""Search spaces: schema-versioned YAML describing which drafters a search may propose.

A space names the base whose layers and widths are pruned, the depth range, the
layer-selection strategies, the width ratios (query heads per GQA group, KV heads,
MLP channels, and — only in latency-only spaces — the hidden size), the gamma
range, the healing budget per trial, and the workload the drafter is ranked on
(batch sizes with their share of generated tokens, temperature, prompt set).
Optionally ``vocab: {sizes: [full, 16384, 4096]}``: the drafter's LM head keeps
the N most frequent target tokens of the workload's traces (draftnas.drafter.vocab);
``full`` (or 0) is the whole vocabulary.

Loading validates everything at once: a file with three mistakes reports all
three, each as ``field: message (allowed: ...)``. Shipped spaces live in
``draftnas/data/search_spaces/`` (package data) and are found by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftnas.core.records import Record
from draftnas.core.registry import Architecture
from draftnas.drafter.prune.importance import LAYER_SELECTIONS as ALL_LAYER_SELECTIONS
from draftnas.models.records import GGUF_WEIGHTS, INT4_GROUP, format_kinds

SCHEMA_VERSION = 1
#: the registered layer-selection strategies a search may propose ("explicit" takes a hand-made list)
LAYER_SELECTIONS: tuple[str, ...] = tuple(n for n in ALL_LAYER_SELECTIONS if n != "explicit")
MAX_GAMMA = 16


@dataclass(frozen=True)
class DepthRange(Record):
    """Number of base layers the drafter keeps: min..max inclusive, every `step`."""

    min: int
    max: int
    step: int = 1

    def values(self) -> tuple[int, ...]:
        return tuple(range(self.min, self.max + 1, self.step))


@dataclass(frozen=True)
class WidthChoices(Record):
    """Width ratios relative to the base (1.0 = keep all), rounded as documented per field.

    - kv_head_ratios: share of KV heads (GQA groups) kept; round(r * base KV heads), >= 1.
    - query_head_ratios: share of each kept group's query heads kept; round(r * heads per group), >= 1.
    - mlp_ratios: share of MLP channels kept; rounded to a multiple of `channel_multiple`.
    - hidden_ratios: share of the hidden size kept (latency-only spaces; pruning plans cannot
      express it); rounded to a multiple of the head dimension.
    """

    kv_head_ratios: tuple[float, ...] = (1.0,)
    query_head_ratios: tuple[float, ...] = (1.0,)
    mlp_ratios: tuple[float, ...] = (1.0,)
    hidden_ratios: tuple[float, ...] = (1.0,)
    channel_multiple: int = 8


@dataclass(frozen=True)
class GammaRange(Record):
    """Draft tokens per step considered when picking each candidate's best gamma, and the confidence
    stops beside it (`p_min`: a step stops drafting after a draft the drafter gives less than p_min;
    0 drafts gamma every step). A stop is priced where the acceptance was measured greedily."""

    min: int = 0
    max: int = 8
    p_min: tuple[float, ...] = (0.0,)


@dataclass(frozen=True)
class HealBudget(Record):
    """Distillation each trial's drafter gets before its acceptance is estimated (0 steps = none)."""

    steps: int = 0
    batch_size: int = 4
    seq_len: int = 128
    learning_rate: float = 2e-3
    max_seconds: float | None = None
    # "cut": only the layers next to a cut train (`PruningPlan.cut_neighbours`); "lowrank": a low-rank
    # update over the stack (`drafter.adapters`), merged after
    train: str = "layers"


@dataclass(frozen=True)
class Workload(Record):
    """What the drafter is ranked on.

    `batch_weights[i]` is the share of generated tokens decoded at `batch_sizes[i]`;
    the workload's tokens/s is their weighted harmonic mean (total tokens / total time).
    """

    batch_sizes: tuple[int, ...] = (1,)
    batch_weights: tuple[float, ...] = (1.0,)
    temperature: float = 0.0
    context_tokens: int = 256
    prompt_set: str = "chat"
    domain: str | None = None
    # one request: a prompt of `prompt_tokens` prefilled (by the target, and by the drafter when it
    # speculates), then `new_tokens` generated; 0 prompt tokens = steady-state decoding, no prefill
    prompt_tokens: int = 0
    new_tokens: int = 64

    @property
    def primary_batch_size(self) -> int:
        """The batch size with the largest share (ties: the smallest batch)."""
        pairs = sorted(zip(self.batch_sizes, self.batch_weights, strict=True), key=lambda p: (-p[1], p[0]))
        return pairs[0][0]


@dataclass(frozen=True)
class TraceDefaults(Record):
    """Traces the search builds (once, cached in the run folder) when --traces is not given."""

    prompts: int = 8
    max_new_tokens: int = 48


@dataclass(frozen=True)
class SearchSpace(Record):
    """A validated search space (see the module docstring and draftnas/data/search_spaces/*.yaml)."""

    schema_version: int
    name: str
    target: str
    base: str
    depth: DepthRange
    layer_selection: tuple[str, ...] = ("first",)
    width: WidthChoices = WidthChoices()
    gamma: GammaRange = GammaRange()
    heal: HealBudget = HealBudget()
    workload: Workload = Workload()
    traces: TraceDefaults = TraceDefaults()
    latency_only: bool = False
    profile: str | None = None
    description: str = ""
    source: str = ""
    vocab_sizes: tuple[int, ...] = (0,)  # draft-head rows to try; 0 = the full vocabulary
    references: tuple[str, ...] = ()  # published drafters (registry names) ranked beside the searched ones
    # how the drafters' linear layers may run: "dense" (the run's dtype), "int8", "int4" or one per layer
    # group ("attn=int8,mlp=int8,head=int4"; weight-only, CPU; each priced by the host calibration, which
    # times the base's stack in every format)
    weights: tuple[str, ...] = ("dense",)

    def problems_for_base(self, base: Architecture) -> list[str]:
        """Problems that only show against the base's shape: depth beyond its layers, a head beyond its
        vocabulary, int4 weights over widths its groups do not divide."""
        out = []
        if self.depth.max > base.num_hidden_layers:
            out.append(f"depth.max: {self.depth.max} but base {base.name} has "
                       f"{base.num_hidden_layers} layers (allowed: 1..{base.num_hidden_layers})")
        above = [v for v in self.vocab_sizes if v >= base.vocab_size]
        if above:
            out.append(f"vocab.sizes: {', '.join(map(str, above))} rows but base {base.name}'s vocabulary "
                       f"has {base.vocab_size} (allowed: 1..{base.vocab_size - 1}, or full)")
        int4 = [w for w in self.weights if w not in GGUF_WEIGHTS and "int4" in format_kinds(w)]
        widths = {base.hidden_size, base.num_attention_heads * base.head_dim, base.intermediate_size}
        if int4 and any(w % INT4_GROUP for w in widths):
            out.append(f"weights: {int4[0]} needs layer widths in multiples of {INT4_GROUP}, and base "
                       f"{base.name}'s are {', '.join(map(str, sorted(widths)))} (allowed: dense, int8)")
        return out

    def size(self) -> int:
        """Number of distinct parameter combinations (before rounding collapses any)."""
        w = self.width
        return (len(self.depth.values()) * len(self.layer_selection) * len(w.kv_head_ratios)
                * len(w.query_head_ratios) * len(w.mlp_ratios) * len(w.hidden_ratios)
                * len(self.vocab_sizes) * len(self.weights))
