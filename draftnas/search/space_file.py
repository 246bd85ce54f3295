"""Reading a search space file: every field checked at once, each problem as
``field: message (allowed: ...)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from draftnas.core.errors import SearchSpaceError
from draftnas.core.registry import load_registry
from draftnas.models.records import GGUF_WEIGHTS, WEIGHT_FORMATS, WEIGHT_ROLES, weight_roles, weights_name
from draftnas.search.space import (
    LAYER_SELECTIONS,
    MAX_GAMMA,
    SCHEMA_VERSION,
    DepthRange,
    GammaRange,
    HealBudget,
    SearchSpace,
    TraceDefaults,
    WidthChoices,
    Workload,
)

_TOP_FIELDS = ("schema_version", "name", "description", "target", "base", "latency_only", "profile",
               "depth", "layer_selection", "width", "gamma", "heal", "workload", "traces", "vocab",
               "references", "weights")
_SECTION_FIELDS: dict[str, tuple[str, ...]] = {
    "depth": ("min", "max", "step"),
    "width": ("kv_head_ratios", "query_head_ratios", "mlp_ratios", "hidden_ratios", "channel_multiple"),
    "gamma": ("min", "max", "p_min"),
    "heal": ("steps", "batch_size", "seq_len", "learning_rate", "max_seconds"),
    "workload": ("batch_sizes", "temperature", "context_tokens", "prompt_set", "domain", "prompt_tokens",
                 "new_tokens"),
    "traces": ("prompts", "max_new_tokens"),
    "vocab": ("sizes",),
}


class _Checker:
    """Collects every problem instead of stopping at the first."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, field: str, message: str) -> None:
        self.problems.append(f"{field}: {message}")

    def int_(self, field: str, value: Any, low: int, high: int | None = None) -> int | None:
        allowed = f"an integer in {low}..{high}" if high is not None else f"an integer >= {low}"
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(field, f"{value!r} is not an integer (allowed: {allowed})")
            return None
        if value < low or (high is not None and value > high):
            self.add(field, f"{value} is out of range (allowed: {allowed})")
            return None
        return value

    def float_(self, field: str, value: Any, low: float, high: float, low_open: bool = False) -> float | None:
        bracket = "(" if low_open else "["
        allowed = f"a number in {bracket}{low:g}, {high:g}]"
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            self.add(field, f"{value!r} is not a number (allowed: {allowed})")
            return None
        if value > high or value < low or (low_open and value == low):
            self.add(field, f"{value:g} is out of range (allowed: {allowed})")
            return None
        return float(value)

    def str_(self, field: str, value: Any, choices: tuple[str, ...] | None = None) -> str | None:
        if not isinstance(value, str) or not value:
            self.add(field, f"{value!r} is not a non-empty string")
            return None
        if choices is not None and value not in choices:
            self.add(field, f"{value!r} is not allowed (allowed: {', '.join(choices)})")
            return None
        return value

    def mapping(self, field: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(field, f"must be a mapping with fields {', '.join(allowed)}")
            return {}
        for key in value:
            if key not in allowed:
                self.add(f"{field}.{key}" if field else str(key),
                         f"unknown field (allowed: {', '.join(allowed)})")
        return dict(value)

    def ratios(self, field: str, value: Any) -> tuple[float, ...]:
        if not isinstance(value, list | tuple) or not value:
            self.add(field, f"{value!r} is not a non-empty list of ratios (allowed: numbers in (0, 1])")
            return (1.0,)
        out = [self.float_(f"{field}[{i}]", v, 0.0, 1.0, low_open=True) for i, v in enumerate(value)]
        kept = tuple(v for v in out if v is not None)
        if len(set(kept)) != len(kept):
            self.add(field, f"{list(value)} repeats a ratio (allowed: distinct values)")
        return kept or (1.0,)


def parse_search_space(data: Any, source: str = "<search space>") -> SearchSpace:
    """Validate a parsed YAML mapping; raise `SearchSpaceError` listing every problem."""
    if not isinstance(data, Mapping):
        raise SearchSpaceError(f"search space {source}: must be a YAML mapping with fields "
                               f"{', '.join(_TOP_FIELDS)}")
    c = _Checker()
    top = c.mapping("", data, _TOP_FIELDS)
    version = top.get("schema_version")
    if version != SCHEMA_VERSION:
        c.add("schema_version", f"{version!r} is not supported (allowed: {SCHEMA_VERSION})")
    for key in ("name", "target", "base"):
        if key not in top:
            c.add(key, "is required")
    name = c.str_("name", top.get("name", "?")) or "?"
    target = c.str_("target", top.get("target", "?")) or "?"
    base = c.str_("base", top.get("base", "?")) or "?"
    latency_only = top.get("latency_only", False)
    if not isinstance(latency_only, bool):
        c.add("latency_only", f"{latency_only!r} is not a boolean (allowed: true, false)")
        latency_only = False
    profile = top.get("profile")
    if profile is not None:
        profile = c.str_("profile", profile)
    depth = _parse_depth(c, top.get("depth"))
    selection = _parse_choices(c, "layer_selection", top.get("layer_selection", ["first"]),
                               LAYER_SELECTIONS, "first")
    width = _parse_width(c, top.get("width"), latency_only)
    gamma = _parse_gamma(c, top.get("gamma"))
    heal = _parse_heal(c, top.get("heal"))
    workload = _parse_workload(c, top.get("workload"))
    traces = _parse_traces(c, top.get("traces"))
    vocab_sizes = _parse_vocab(c, top.get("vocab"))
    references = _parse_references(c, top.get("references", []))
    weights = _parse_weights(c, top.get("weights", ["dense"]))
    if c.problems:
        n = len(c.problems)
        raise SearchSpaceError(f"search space {source} has {n} problem{'s' if n > 1 else ''}: "
                               + "; ".join(c.problems))
    return SearchSpace(
        schema_version=SCHEMA_VERSION, name=name, target=target, base=base, depth=depth,
        layer_selection=selection, width=width, gamma=gamma, heal=heal, workload=workload,
        traces=traces, latency_only=latency_only, profile=profile,
        description=str(top.get("description", "")).strip(), source=source, vocab_sizes=vocab_sizes,
        references=references, weights=weights,
    )


def _parse_references(c: _Checker, raw: Any) -> tuple[str, ...]:
    """Registry names of published drafters shown beside the searched ones."""

    if not isinstance(raw, list) or not all(isinstance(r, str) for r in raw):
        c.add("references", f"{raw!r} is not a list of architecture names")
        return ()
    unknown = [r for r in raw if r.lower() not in load_registry()]
    if unknown:
        c.add("references", f"{', '.join(unknown)} not in the registry (`draftnas targets` lists it)")
    return tuple(r.lower() for r in raw)


def _parse_depth(c: _Checker, raw: Any) -> DepthRange:
    if raw is None:
        c.add("depth", "is required (a mapping with min, max and optionally step)")
        return DepthRange(1, 1)
    d = c.mapping("depth", raw, _SECTION_FIELDS["depth"])
    low = c.int_("depth.min", d.get("min", 1), 1)
    high = c.int_("depth.max", d.get("max"), 1)
    step = c.int_("depth.step", d.get("step", 1), 1)
    if low is not None and high is not None and high < low:
        c.add("depth.max", f"{high} is below depth.min={low} (allowed: >= {low})")
        high = low
    return DepthRange(low or 1, high or low or 1, step or 1)


def _parse_choices(c: _Checker, key: str, raw: Any, allowed: tuple[str, ...],
                   default: str) -> tuple[str, ...]:
    """A non-empty list of `allowed` names (a bare name counts as a list of one), duplicates dropped."""
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not items:
        c.add(key, f"{raw!r} is not a non-empty list (allowed: {', '.join(allowed)})")
        return (default,)
    out = [c.str_(f"{key}[{i}]", v, allowed) for i, v in enumerate(items)]
    return tuple(dict.fromkeys(v for v in out if v is not None)) or (default,)


def _parse_weights(c: _Checker, raw: Any) -> tuple[str, ...]:
    """How the drafters' linear layers may run in draftnas's loop: dense, int8, int4 (weight-only; CUDA:
    int4), each for every layer or one per layer group: a list [attn, mlp, head] or "attn=F,mlp=F,head=F",
    attn and mlp maybe one per band of depth, "F/G" (`models.records.weight_roles`); ggml types (Q8_0,
    Q4_0) for llama.cpp drafters (`--engine llama.cpp`)."""
    items = [raw] if isinstance(raw, str) else raw
    allowed = (f"{', '.join((*WEIGHT_FORMATS, *GGUF_WEIGHTS))}, or per layer group [attn, mlp, head] "
               f"with each one of {', '.join(WEIGHT_FORMATS)}, attn and mlp maybe one per band of depth: "
               "int8/int4")
    if not isinstance(items, list | tuple) or not items:
        c.add("weights", f"{raw!r} is not a non-empty list (allowed: {allowed})")
        return ("dense",)
    out: list[str] = []
    for i, item in enumerate(items):
        if isinstance(item, list | tuple):
            if len(item) != len(WEIGHT_ROLES) or not all(isinstance(k, str) for k in item):
                c.add(f"weights[{i}]", f"{item!r} lists {len(item)} formats: a per-layer format lists one "
                      f"for each of {', '.join(WEIGHT_ROLES)} ({len(WEIGHT_ROLES)})")
                continue
            item = ",".join(f"{r}={k}" for r, k in zip(WEIGHT_ROLES, item, strict=True))
        if isinstance(item, str) and item in GGUF_WEIGHTS:
            out.append(item)
            continue
        try:
            out.append(weights_name(weight_roles(item)))
        except (ValueError, AttributeError):
            c.add(f"weights[{i}]", f"{item!r} is not allowed (allowed: {allowed})")
    return tuple(dict.fromkeys(out)) or ("dense",)


def _parse_width(c: _Checker, raw: Any, latency_only: bool) -> WidthChoices:
    w = c.mapping("width", raw, _SECTION_FIELDS["width"])
    hidden = c.ratios("width.hidden_ratios", w.get("hidden_ratios", [1.0]))
    if hidden != (1.0,) and not latency_only:
        c.add("width.hidden_ratios", f"{list(hidden)} prunes the hidden size, which a pruning plan "
              "cannot apply to weights (allowed: [1.0], or set latency_only: true)")
    return WidthChoices(
        kv_head_ratios=c.ratios("width.kv_head_ratios", w.get("kv_head_ratios", [1.0])),
        query_head_ratios=c.ratios("width.query_head_ratios", w.get("query_head_ratios", [1.0])),
        mlp_ratios=c.ratios("width.mlp_ratios", w.get("mlp_ratios", [1.0])),
        hidden_ratios=hidden,
        channel_multiple=c.int_("width.channel_multiple", w.get("channel_multiple", 8), 1) or 8,
    )


def _parse_gamma(c: _Checker, raw: Any) -> GammaRange:
    g = c.mapping("gamma", raw, _SECTION_FIELDS["gamma"])
    low = c.int_("gamma.min", g.get("min", 0), 0, MAX_GAMMA)
    high = c.int_("gamma.max", g.get("max", 8), 1, MAX_GAMMA)
    if low is not None and high is not None and high < low:
        c.add("gamma.max", f"{high} is below gamma.min={low} (allowed: {low}..{MAX_GAMMA})")
    raw_p = g.get("p_min", [0.0])
    stops: set[float] = set()
    if not isinstance(raw_p, list) or not raw_p:
        c.add("gamma.p_min", f"{raw_p!r} is not a list of confidence stops (allowed: numbers in [0, 0.99])")
    else:
        read = (c.float_(f"gamma.p_min[{i}]", v, 0.0, 0.99) for i, v in enumerate(raw_p))
        stops = {f for f in read if f is not None}
    return GammaRange(low if low is not None else 0, high or 8, tuple(sorted(stops | {0.0})))


def _parse_vocab(c: _Checker, raw: Any) -> tuple[int, ...]:
    """Draft-head sizes: positive ints, or "full" / 0 for the whole vocabulary."""
    if raw is None:
        return (0,)
    v = c.mapping("vocab", raw, _SECTION_FIELDS["vocab"])
    items = v.get("sizes", ["full"])
    if not isinstance(items, list | tuple) or not items:
        c.add("vocab.sizes", f"{items!r} is not a non-empty list (allowed: positive ints and 'full')")
        return (0,)
    out: list[int] = []
    for i, item in enumerate(items):
        if item == "full" or item == 0:
            out.append(0)
        elif isinstance(item, int) and not isinstance(item, bool) and item > 0:
            out.append(item)
        else:
            c.add(f"vocab.sizes[{i}]", f"{item!r} is not a draft-head size "
                  "(allowed: positive ints and 'full')")
    return tuple(dict.fromkeys(out)) or (0,)


def _parse_heal(c: _Checker, raw: Any) -> HealBudget:
    h = c.mapping("heal", raw, _SECTION_FIELDS["heal"])
    return HealBudget(
        steps=c.int_("heal.steps", h.get("steps", 0), 0) or 0,
        batch_size=c.int_("heal.batch_size", h.get("batch_size", 4), 1) or 4,
        seq_len=c.int_("heal.seq_len", h.get("seq_len", 128), 8) or 128,
        learning_rate=c.float_("heal.learning_rate", h.get("learning_rate", 2e-3), 0.0, 1.0,
                               low_open=True) or 2e-3,
        max_seconds=None if h.get("max_seconds") is None
        else c.float_("heal.max_seconds", h.get("max_seconds"), 0.0, 86400.0, low_open=True),
    )


def _parse_workload(c: _Checker, raw: Any) -> Workload:
    w = c.mapping("workload", raw, _SECTION_FIELDS["workload"])
    sizes, weights = _parse_batches(c, w.get("batch_sizes", {1: 1.0}))
    temperature = c.float_("workload.temperature", w.get("temperature", 0.0), 0.0, 2.0)
    domain = w.get("domain")
    return Workload(
        batch_sizes=sizes, batch_weights=weights,
        temperature=temperature if temperature is not None else 0.0,
        context_tokens=c.int_("workload.context_tokens", w.get("context_tokens", 256), 1) or 256,
        prompt_set=c.str_("workload.prompt_set", w.get("prompt_set", "chat")) or "chat",
        domain=c.str_("workload.domain", domain) if domain is not None else None,
        prompt_tokens=c.int_("workload.prompt_tokens", w.get("prompt_tokens", 0), 0) or 0,
        new_tokens=c.int_("workload.new_tokens", w.get("new_tokens", 64), 1) or 64,
    )


def _parse_batches(c: _Checker, raw: Any) -> tuple[tuple[int, ...], tuple[float, ...]]:
    field = "workload.batch_sizes"
    if isinstance(raw, list | tuple):  # a plain list means equal shares
        raw = {b: 1.0 for b in raw} if raw else None
    if not isinstance(raw, Mapping) or not raw:
        c.add(field, f"{raw!r} is not a mapping of batch size to share of tokens "
              "(allowed: e.g. {1: 0.7, 8: 0.3})")
        return (1,), (1.0,)
    sizes, weights = [], []
    for key, share in raw.items():
        b = c.int_(f"{field}[{key!r}]", int(key) if isinstance(key, str) and key.isdigit() else key, 1, 1024)
        s = c.float_(f"{field}[{key!r}]", share, 0.0, 1e9, low_open=True)
        if b is not None and s is not None:
            sizes.append(b)
            weights.append(s)
    total = sum(weights)
    if not sizes:
        return (1,), (1.0,)
    return tuple(sizes), tuple(round(w / total, 12) for w in weights)


def _parse_traces(c: _Checker, raw: Any) -> TraceDefaults:
    t = c.mapping("traces", raw, _SECTION_FIELDS["traces"])
    return TraceDefaults(
        prompts=c.int_("traces.prompts", t.get("prompts", 8), 1) or 8,
        max_new_tokens=c.int_("traces.max_new_tokens", t.get("max_new_tokens", 48), 1) or 48,
    )
