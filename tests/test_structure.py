"""The package's shape: imports flow one way, modules stay readable, and a plan alone replays its drafter."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "draftnas"
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")}


def _runtime_imports(path: Path, known: set[str]) -> set[str]:
    """draftnas modules `path` imports when it runs (in functions too), not under TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("draftnas"):
            names = [f"{node.module}.{a.name}" for a in node.names]
            out |= {n for n in names if n in known} or {node.module}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("draftnas")}
    return {m for m in out if m in known}


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


def test_no_import_cycle_among_draftnas_modules():
    modules = _modules()
    known = set(modules) - {"draftnas"}
    graph = {m: _runtime_imports(p, known) - {m, "draftnas"} for m, p in modules.items() if m != "draftnas"}
    # a subpackage importing its own package's face (draftnas.cli -> draftnas.cli.app) is not a loop
    graph = {m: {n for n in deps if not m.startswith(n + ".")} for m, deps in graph.items()}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_a_long_module_says_why_in_its_docstring():
    long = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    unexplained = [f"{m} ({n} lines)" for m, n in sorted(long.items()) if n > MAX_LINES
                   and "Size:" not in (ast.get_docstring(ast.parse(_modules()[m].read_text())) or "")]
    assert not unexplained, f"over {MAX_LINES} lines with no 'Size:' reason in the docstring: {unexplained}"


def test_a_plan_alone_replays_an_exported_drafter_bit_for_bit_head_included(tiny_llama_config, tmp_path):
    """build -> export; then load_plan(draftnas.json) + the base -> apply_plan: every tensor in the
    exported folder, the reduced head and its kept ids included, is equal bit for bit."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from draftnas.export import ExportInfo, export_drafter
    from draftnas.prune import PruningPlan, apply_plan, load_plan
    from draftnas.vocab import VocabSubset

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


@pytest.mark.parametrize("module", ["draftnas.scoring", "draftnas.candidate", "draftnas.throughput",
                                    "draftnas.fidelity", "draftnas.placement", "draftnas.alpha"])
def test_pure_modules_import_without_torch_or_optuna(module):
    import subprocess
    import sys

    code = f"import sys, {module}; bad = [m for m in ('torch', 'optuna') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
