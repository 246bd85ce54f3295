"""The alpha(drafter) model: features, fit and held-out error, files, and its use by the search."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.core.registry import get_architecture
from draftnas.search.alpha import (
    FEATURES,
    PAIRS_SCHEMA,
    AlphaPair,
    DrafterFeatures,
    drafter_features,
    fit_alpha_model,
    load_alpha_model,
    read_pairs,
    save_alpha_model,
)
from draftnas.search.candidate import build_candidate, reference_candidate
from draftnas.search.evaluate import ModelEvaluator
from draftnas.search.pairs import design
from draftnas.search.records import CandidateChoice, StudySettings
from draftnas.search.resolve import SearchRequest, search
from draftnas.search.spaces import default_space_for

SMOL = get_architecture("smollm2-135m")
L7 = get_architecture("llama-7b")


def _true_alpha(f: DrafterFeatures) -> float:
    """A known law: deeper and healed drafters are accepted more, narrow MLPs and small heads less."""
    z = (-2.0 + 3.0 * f.depth_fraction + 0.4 * f.log1p_heal_steps + 1.0 * f.mlp_ratio
         + 0.1 * f.log_head_fraction)
    return 1 / (1 + math.exp(-z))


def _pairs(family: str, n: int, seed: int) -> list[AlphaPair]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        f = DrafterFeatures(depth_fraction=float(rng.uniform(0.03, 0.5)),
                            mean_position=float(rng.uniform(0, 0.5)) if i % 3 else 0.0,
                            query_head_ratio=float(rng.choice([0.67, 1.0])),
                            kv_head_ratio=float(rng.choice([0.67, 1.0])),
                            mlp_ratio=float(rng.choice([0.5, 1.0])),
                            log_head_fraction=float(rng.choice([0, -1.8])),
                            log1p_heal_steps=float(rng.choice([0, math.log1p(30), math.log1p(150)])))
        alpha = _true_alpha(f)
        out.append(AlphaPair(schema=PAIRS_SCHEMA, family=family, base=family, candidate=f"d{i}",
                             choice=CandidateChoice(depth=1), layers=(0,), heal_steps=0, features=f,
                             alpha=alpha,
                             per_domain={"chat": alpha, "code": min(1.0, alpha * 1.1)}, n_positions=100,
                             tokens_per_step={}, traces="t", evaluate_s=1.0))
    return out


def test_features_are_relative_to_the_base():
    space = default_space_for("smollm2-135m")
    choice = CandidateChoice(depth=3, layer_selection="even", mlp_ratio=0.5, vocab_size=4096)
    c = build_candidate(space, SMOL, "smollm2-135m", choice)
    f = drafter_features(c, SMOL, heal_steps=30)
    assert f.depth_fraction == pytest.approx(3 / 30)
    assert f.mean_position == pytest.approx(np.mean(c.plan.layers) / 29)
    assert f.mlp_ratio == pytest.approx(768 / 1536)
    assert f.log_head_fraction == pytest.approx(math.log(4096 / 49152))
    assert f.log1p_heal_steps == pytest.approx(math.log1p(30))
    ref = drafter_features(reference_candidate("wide-sheared-llama-1l", "llama-7b", L7), L7, 0)
    assert ref.depth_fraction == pytest.approx(1 / 32) and ref.mean_position == 0 and ref.mlp_ratio == 1


def test_fit_recovers_a_known_law_and_states_its_held_out_error(tmp_path):
    pairs = _pairs("a", 30, 0) + _pairs("b", 20, 1)
    model = fit_alpha_model(pairs, ridge=1e-6)
    assert model.features == FEATURES and set(model.weights) == {"all", "chat", "code"}
    assert model.heldout.method == "leave-one-out" and model.heldout.n == 50
    assert model.heldout.mean_abs_error < 0.01  # the law is in the model's family: it is found
    assert set(model.heldout.by_family_left_out) == {"a", "b"}
    deep = _pairs("c", 1, 5)[0].features
    assert model.predict(deep) == pytest.approx(_true_alpha(deep), abs=0.01)
    path = save_alpha_model(model, tmp_path / "m.json")
    again = load_alpha_model(path)
    assert again.predict(deep) == pytest.approx(model.predict(deep))
    assert "FITTED ON a, b (50 measured pairs" in again.label()


def test_noise_shows_up_in_the_held_out_error():
    pairs = _pairs("a", 40, 2)
    rng = np.random.default_rng(3)
    noisy = [AlphaPair.from_dict({**p.to_dict(),
                                  "alpha": float(np.clip(p.alpha + rng.normal(0, 0.08), 0, 1))})
             for p in pairs]
    assert fit_alpha_model(noisy).heldout.mean_abs_error > 3 * fit_alpha_model(pairs).heldout.mean_abs_error


@pytest.mark.parametrize("content,needle", [
    ({"schema": "something-else", "version": 1}, "is not a draftnas acceptance model"),
    ({"schema": "draftnas-alpha-model", "version": 99}, "has version 99"),
    ({"schema": "draftnas-alpha-model", "version": 1, "features": ["depth_fraction"]}, "malformed"),
    ([1, 2], "is not a draftnas acceptance model"),
])
def test_a_model_file_with_the_wrong_schema_is_refused(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(InvalidInputError, match=needle):
        load_alpha_model(path)


def test_a_model_with_other_features_is_refused(tmp_path):
    data = fit_alpha_model(_pairs("a", 10, 0)).to_dict()
    data["features"] = ["depth_fraction"]
    (tmp_path / "m.json").write_text(json.dumps(data))
    with pytest.raises(InvalidInputError, match="does not have this draftnas's features"):
        load_alpha_model(tmp_path / "m.json")


def test_pairs_files_are_checked_line_by_line(tmp_path):
    good = _pairs("a", 2, 0)
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(p.to_dict()) for p in good) + '\n{"schema": "x"}\n')
    with pytest.raises(InvalidInputError, match=r"p.jsonl:3: not a draftnas-alpha-pairs/1 row"):
        read_pairs(path)
    with pytest.raises(InvalidInputError, match="at least 4"):
        fit_alpha_model(good)


def test_the_design_spreads_over_depths_and_heal_budgets():
    space = default_space_for("smollm2-135m")
    points = design(space, SMOL, "smollm2-135m", 16, seed=0, heal_steps=(0, 30))
    depths = [c.arch.num_hidden_layers for c, _ in points]
    assert len(points) == 16 and set(depths) == set(space.depth.values())
    assert {h for _, h in points} == {0, 30}
    assert design(space, SMOL, "smollm2-135m", 16, seed=0, heal_steps=(0, 30)) == points  # reproducible
    with pytest.raises(InvalidInputError, match="heal steps must be >= 0"):
        design(space, SMOL, "smollm2-135m", 4, heal_steps=(-1,))


def test_an_anchor_sets_the_reference_drafters_alpha_and_keeps_the_ordering():
    model = fit_alpha_model(_pairs("a", 30, 0))
    ref = reference_candidate("wide-sheared-llama-1l", "llama-7b", L7)
    deeper = reference_candidate("wide-sheared-llama-5l", "llama-7b", L7)
    plain = ModelEvaluator(model, L7, 150)
    anchored = ModelEvaluator(model, L7, 150, anchor=(ref, 0.7))
    assert anchored.evaluate(ref).acceptance.acceptance_rate == pytest.approx(0.7)
    assert anchored.evaluate(ref).acceptance.kind == "fitted"
    a_plain = [plain.evaluate(c).acceptance.acceptance_rate for c in (ref, deeper)]
    a_anch = [anchored.evaluate(c).acceptance.acceptance_rate for c in (ref, deeper)]
    assert (a_plain[1] > a_plain[0]) == (a_anch[1] > a_anch[0])


def test_with_a_fitted_model_the_cheapest_drafter_no_longer_wins_by_construction(tmp_path):
    model = fit_alpha_model(_pairs("a", 30, 0) + _pairs("b", 20, 1))
    model_path = save_alpha_model(model, tmp_path / "m.json")

    def study(name: str) -> StudySettings:
        return StudySettings(n_trials=30, run_dir=str(tmp_path), study_name=name)

    common = dict(target="llama-65b", base_shape="llama-7b")
    prior = search(SearchRequest(**common, acceptance_prior=0.7, study=study("prior")))
    fitted = search(SearchRequest(**common, acceptance_prior=str(model_path), acceptance_anchor=0.7,
                                  study=study("fitted")))
    cheapest = min(prior.ranked, key=lambda r: r.primary.draft_ms)
    assert prior.ranked[0].candidate.key == cheapest.candidate.key  # a constant alpha: latency alone decides
    assert fitted.info.acceptance_model and "FITTED ON a, b" in fitted.info.acceptance_model
    alphas = {r.acceptance.acceptance_rate for r in fitted.ranked}
    assert len(alphas) > 1  # acceptance depends on the drafter
    best = fitted.ranked[0]
    cheapest_fitted = min(fitted.ranked, key=lambda r: r.primary.draft_ms)
    assert best.primary.draft_ms > cheapest_fitted.primary.draft_ms
    assert all(r.economics is not None for r in fitted.ranked)
    assert {r.reference for r in fitted.references} == {"wide-sheared-llama-1l", "wide-sheared-llama-3l",
                                                       "wide-sheared-llama-5l"}
    ref1 = next(r for r in fitted.references if r.reference == "wide-sheared-llama-1l")
    assert ref1.acceptance.acceptance_rate == pytest.approx(0.7)


def test_cli_refuses_a_model_file_with_the_wrong_schema(tmp_path):
    bad = tmp_path / "alpha.json"
    bad.write_text(json.dumps({"schema": "nope"}))
    out = subprocess.run([sys.executable, "-m", "draftnas", "search", "--target", "llama-65b", "--base-shape",
                          "llama-7b", "--acceptance-prior", str(bad), "--trials", "2", "--run-dir",
                          str(tmp_path / "runs")], capture_output=True, text=True)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "is not a draftnas acceptance model" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_a_drafter_unlike_every_measured_pair_is_refused_not_extrapolated():
    from draftnas.core.errors import InfeasibleCandidateError

    model = fit_alpha_model(_pairs("a", 30, 0))  # kv and query ratios 0.67..1, full hidden size
    from draftnas.search.records import Candidate

    narrow = Candidate(name="n", base="llama-7b", arch=L7.with_shape(num_hidden_layers=2, hidden_size=2048),
                       choice=CandidateChoice(depth=2, hidden_ratio=0.5))
    with pytest.raises(InfeasibleCandidateError, match="hidden_ratio 0.5"):
        ModelEvaluator(model, L7, 30).evaluate(narrow)


def test_alpha_measure_from_the_command_line_writes_pairs_and_a_rerun_resumes(tiny_llama_config, tmp_path):
    """`draftnas alpha measure` end to end on a tiny folder model: a designed drafter cut from it, traced,
    measured, one JSON line per pair; a second call measures nothing again."""
    import torch
    import yaml
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast
    from typer.testing import CliRunner

    from draftnas.cli import app

    torch.manual_seed(0)
    folder = tmp_path / "base"
    LlamaForCausalLM(tiny_llama_config).eval().save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(128)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w1",
                            pad_token="w2").save_pretrained(folder)
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"schema_version": 1, "name": "tiny-alpha", "target": str(folder),
                                     "base": str(folder), "depth": {"min": 1, "max": 2},
                                     "traces": {"prompts": 3, "max_new_tokens": 4}}))
    out = tmp_path / "pairs.jsonl"
    args = ["alpha", "measure", "--base", str(folder), "--out", str(out), "--pairs", "2", "--per-domain", "1",
            "--heal-steps", "0", "--space", str(space)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(0.0 <= r["alpha"] <= 1.0 and r["heal_steps"] == 0 for r in rows)
    assert all(r["base"] == str(folder) and r["n_positions"] > 0 for r in rows)
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert out.read_text().splitlines() == [json.dumps(r) for r in rows]  # kept, not measured again
