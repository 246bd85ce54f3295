"""The package's shape: one package per pipeline stage, imports only from a stage to an earlier one,
no import cycle, modules a reader can hold in mind, torch-free records, and a plan alone replays its
drafter.

Run alone (`python tests/test_structure.py`) it prints the stage graph: each stage, its modules and the
earlier stages it imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "draftnas"
#: The pipeline's stages in order (docs/architecture.md draws the same): a module may import its own
#: stage and earlier ones, never a later one.
STAGES = ("core", "models", "latency", "acceptance", "drafter", "search", "export", "bench", "report",
          "e2e", "cli")
MAX_LINES = 400  # a warning: read the module for two concerns
HARD_LINES = 600  # a failure
#: Modules that must import without torch (and without optuna): every stage's records, and the pure
#: arithmetic the search and the analysis run thousands of times a second.
LIGHT = sorted({f"draftnas.{s}.records" for s in STAGES if (PACKAGE / s / "records.py").is_file()}
               | {"draftnas.core.throughput", "draftnas.core.placement", "draftnas.core.registry",
                  "draftnas.core.prompts", "draftnas.latency.model", "draftnas.latency.corrected",
                  "draftnas.drafter.prune.importance", "draftnas.search.space_file",
                  "draftnas.search.candidate", "draftnas.search.scoring", "draftnas.search.alpha",
                  "draftnas.export.card", "draftnas.bench.fidelity", "draftnas.e2e.render",
                  "draftnas.search.requests", "draftnas.core.public"}
               | {f"draftnas.{s}" for s in STAGES})  # a stage's public face loads its modules on first use


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """draftnas modules `path` imports anywhere: at the top, inside functions, under TYPE_CHECKING."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("draftnas"):
            names = {f"{node.module}.{a.name}" for a in node.names}
            out |= (names & known) or {node.module}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("draftnas")}
    return out & known


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: {n for n in _imports(p, known) if n != m and not m.startswith(n + ".")}
            for m, p in modules.items()}


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in STAGES else None


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def stage_graph() -> str:
    """Each stage, its modules and the earlier stages it imports, in pipeline order."""
    graph = _graph()
    uses: dict[str, set[str]] = defaultdict(set)
    members: dict[str, list[str]] = defaultdict(list)
    for m, deps in graph.items():
        s = _stage(m)
        if s is None:
            continue
        members[s].append("__init__" if m == f"draftnas.{s}" else m.removeprefix(f"draftnas.{s}."))
        uses[s] |= {t for t in map(_stage, deps) if t and t != s}
    lines = []
    for s in STAGES:
        used = [t for t in STAGES if t in uses[s]]
        lines.append(f"{s:<11} <- {', '.join(used) or '-':<60} [{', '.join(sorted(members[s]))}]")
    return "\n".join(lines)


def test_the_architecture_page_draws_the_graph_the_code_has():
    """docs/architecture.md shows `stage_graph()` as it is: each stage (room), the earlier stages it
    imports (arrows) and its modules."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    assert "```\n" + stage_graph() + "\n```" in page, "regenerate with `python tests/test_structure.py`"


def test_every_module_lives_in_a_stage_package():
    loose = [m for m in _modules() if _stage(m) is None and m not in ("draftnas", "draftnas.__main__")]
    assert not loose, f"modules outside the stage packages {STAGES}: {loose}"


def test_imports_go_from_a_stage_to_an_earlier_one_only():
    print("\n" + stage_graph())
    backward = [f"{m} -> {n}" for m, deps in sorted(_graph().items()) for n in sorted(deps)
                if _stage(m) and _stage(n) and STAGES.index(_stage(n)) > STAGES.index(_stage(m))]  # type: ignore[arg-type]
    assert not backward, "imports from an earlier stage to a later one: " + "; ".join(backward)


def test_no_import_cycle_among_draftnas_modules():
    graph = _graph()
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_the_cycle_finder_and_the_stage_rule_catch_what_they_should():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _stage("draftnas.search.loop") == "search" and _stage("draftnas") is None


@pytest.mark.parametrize("stage", [s for s in STAGES if s != "cli"])
def test_every_stage_exports_its_api_with_all_and_every_name_resolves(stage):
    import importlib

    package = importlib.import_module(f"draftnas.{stage}")
    assert package.__all__ and sorted(package.__all__) == sorted(package._EXPORTS)
    missing = [n for n in package.__all__ if getattr(package, n, None) is None]
    assert missing == [] and sorted(dir(package)) == sorted(package.__all__)


def test_no_module_is_longer_than_a_reader_holds_in_mind():
    """Past MAX_LINES a module is a smell to read (a warning: split it by concern when it holds two, never
    squeeze lines to stay under a number); past HARD_LINES it fails."""
    lengths = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    long = {m: n for m, n in lengths.items() if n > MAX_LINES}
    if long:
        warnings.warn(f"over {MAX_LINES} lines (read them for two concerns): {long}", stacklevel=1)
    too_long = {m: n for m, n in long.items() if n > HARD_LINES}
    assert not too_long, f"over {HARD_LINES} lines: {too_long}"


@pytest.mark.parametrize("module", LIGHT)
def test_records_and_pure_modules_import_with_torch_blocked(module):
    """A finder that refuses torch and optuna: any import of them, however indirect, fails."""
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'optuna', 'transformers'):\n"
            "            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            f"import {module}\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_plan_alone_replays_an_exported_drafter_bit_for_bit_head_included(tiny_llama_config, tmp_path):
    """build -> export; then load_plan(draftnas.json) + the base -> apply_plan: every tensor in the
    exported folder, the reduced head and its kept ids included, is equal bit for bit."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PruningPlan, VocabSubset, load_plan
    from draftnas.export.folder import export_drafter
    from draftnas.export.records import ExportInfo

    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_llama_config).eval()
    size = tiny_llama_config.vocab_size
    vocab = VocabSubset(ids=tuple(range(0, size, 3)), vocab_size=size)
    plan = PruningPlan(base="tiny", base_num_layers=tiny_llama_config.num_hidden_layers, layers=(0, 3),
                       layer_selection="explicit", num_attention_heads=2, num_key_value_heads=1,
                       intermediate_size=32, importance="magnitude",
                       kept_channels=(tuple(range(1, 64, 2)), tuple(range(32))), vocab=vocab)
    drafter = apply_plan(base, plan)
    out = export_drafter(drafter, None, tmp_path / "d", ExportInfo(base="tiny", target="tiny", plan=plan))
    replayed = apply_plan(base, load_plan(out / "draftnas.json"))
    saved = load_file(str(out / "model.safetensors"))
    state = {**replayed.state_dict(), "draft_vocab_ids": torch.tensor(vocab.ids)}
    assert saved["lm_head.weight"].shape[0] == vocab.size
    assert set(saved) <= set(state)
    for name, tensor in saved.items():
        assert torch.equal(tensor, state[name]), name
    other = apply_plan(base, PruningPlan.from_dict({**plan.to_dict(), "vocab": None}))
    assert other.get_output_embeddings().weight.shape[0] == size  # the head is the plan's


if __name__ == "__main__":
    print(stage_graph())
