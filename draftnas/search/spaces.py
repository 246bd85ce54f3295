"""Where search spaces come from: a YAML file or a shipped space by name (`load_search_space`), the
shipped space for a target and engine (`default_space_for`), and a latency-only space built from the
registry's shapes (`registry_space`). Reading and checking a space's fields is `search.space_file`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from draftnas.core.engine_kinds import engine_kind
from draftnas.core.errors import SearchSpaceError
from draftnas.search.space import SearchSpace
from draftnas.search.space_file import parse_search_space


def shipped_spaces_dir() -> Path:
    """The package's data/search_spaces/ (package data: found alike installed and editable)."""
    return Path(str(resources.files("draftnas").joinpath("data/search_spaces")))


def shipped_spaces() -> dict[str, Path]:
    """Shipped space files by name (file stem)."""
    folder = shipped_spaces_dir()
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}


def load_search_space(spec: str | Path) -> SearchSpace:
    """A space from a YAML path or a shipped name (e.g. `smollm2-135m`)."""
    path = Path(spec).expanduser()
    if not path.is_file():
        shipped = shipped_spaces()
        if str(spec) not in shipped:
            names = ", ".join(shipped) or "none"
            raise SearchSpaceError(f"search space {spec!r} is no file and no shipped space "
                                   f"(shipped: {names})")
        path = shipped[str(spec)]
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise SearchSpaceError(f"search space {path} is not valid YAML{where}") from None
    return parse_search_space(data, source=str(path))


def default_space_for(target: str, engine: str = "static") -> SearchSpace:
    """The shipped space whose `target` is `target` for `engine`: the one named after it when there is
    one (gemma-3-270m beside gemma-3-270m-shallow), else the first by name; for an engine whose spaces
    carry a suffix (`EngineKind.space_suffix`: ...-llama-cpp, ...-vllm) only those, and for draftnas's
    loops only the spaces no engine's suffix names. vLLM, which loads the folders draftnas's loops run,
    falls back to the loops' space where the target has no -vllm one (the search then says what in it vLLM
    cannot run)."""
    from draftnas.core.engine_kinds import ENGINE_KINDS

    suffix = engine_kind(engine).space_suffix
    suffixes = tuple(k.space_suffix for k in ENGINE_KINDS.values() if k.space_suffix)
    spaces = [space for space in map(load_search_space, shipped_spaces().values())
              if space.target.lower() == target.lower()]

    def mine(name: str, wanted: str) -> bool:
        return name.endswith(wanted) if wanted else not name.endswith(suffixes)

    matches = [sp for sp in spaces if mine(sp.name, suffix)]
    if not matches and engine_kind(engine).drafter_file == "folder":
        matches = [sp for sp in spaces if mine(sp.name, "")]
    if matches:
        return min(matches, key=lambda sp: (sp.name.lower().removesuffix(suffix) != target.lower(), sp.name))
    names = ", ".join(shipped_spaces()) or "none"
    raise SearchSpaceError(f"no shipped search space targets {target!r}; give a space file, or a base shape "
                           f"to build the default one from the registry (shipped: {names})")


def registry_space(target: str, base_shape: str) -> dict[str, Any]:
    """The default latency-only space for `target` from the registry shape `base_shape` (no weights):
    depth 1 to the base's, first-k layers, the width ratios the base's heads allow, priced on the H100
    spec sheet over batch sizes 1/8/32. A mapping `parse_search_space` reads, and YAML a user can save
    and edit. A KV-head ratio is offered where it keeps a head count no larger ratio keeps
    (`candidate.kept_count`, the drafter builder's rounding)."""
    from draftnas.core.registry import get_architecture
    from draftnas.search.candidate import kept_count

    t, b = get_architecture(target), get_architecture(base_shape)
    # ascending, so the larger of two ratios that keep the same count is the one kept
    counts = {kept_count(r, b.num_key_value_heads): r for r in (0.25, 0.5, 0.75, 1.0)}
    kv = sorted(counts.values(), reverse=True)
    return {
        "schema_version": 1, "name": f"{t.name}-from-{b.name}",
        "description": f"built from the registry: {b.name}-shaped drafters for {t.name}, latency-only",
        "target": t.name, "base": b.name, "latency_only": True, "profile": "h100-sxm",
        "depth": {"min": 1, "max": b.num_hidden_layers}, "layer_selection": ["first"],
        "width": {"kv_head_ratios": kv, "mlp_ratios": [1.0, 0.75, 0.5, 0.25],
                  "hidden_ratios": [1.0, 0.75, 0.5]},
        "gamma": {"min": 0, "max": 8},
        "workload": {"batch_sizes": {1: 0.6, 8: 0.3, 32: 0.1}, "temperature": 0.0, "context_tokens": 512,
                     "prompt_set": "chat"},
    }
