"""`draftnas e2e`: the whole pipeline on a tiny random target, and its analysis on hand-made figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from draftnas.bench.fidelity import decompose, mape, spearman
from draftnas.bench.fidelity_records import Measured, MeasuredTerms, Prediction
from draftnas.core.errors import InvalidInputError
from draftnas.e2e.records import Budget, E2EOptions, budget_preset
from draftnas.e2e.run import run_e2e
from draftnas.export.folder import load_drafter

TINY_BUDGET = Budget(name="tiny", trace_per_domain=3, trace_new_tokens=10, trials=2, depth_max=2,
                     search_heal_steps=1, search_heal_seconds=5.0, heal_steps=2, heal_batch_size=2,
                     heal_seq_len=32, bench_per_domain=1, bench_new_tokens=8, repeats=2, fixed_gamma=2,
                     max_gamma=3, term_repeats=3)

SPACE = """schema_version: 1
name: tiny
target: {target}
base: {target}
depth: {{min: 1, max: 2}}
layer_selection: [first, even]
width: {{mlp_ratios: [1.0, 0.5]}}
vocab: {{sizes: [48]}}
gamma: {{min: 1, max: 3}}
heal: {{steps: 1, batch_size: 2, seq_len: 32}}
workload: {{context_tokens: 32}}
"""


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, tiny_llama_config):
    """A tiny random 12-layer LLaMA (1-2 layer drafters are cheaper) and a word-level tokenizer, as a
    HF folder with no end-of-sequence id (so every generation runs to its budget)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = tiny_llama_config.__class__(**{**tiny_llama_config.to_dict(), "initializer_range": 0.2,
                                            "num_hidden_layers": 12, "eos_token_id": None,
                                            "bos_token_id": None})
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    vocab = {f"w{i}": i for i in range(128)}
    for i, word in enumerate("the a to of and is in what how write translate code sum".split()):
        vocab[word] = 100 + i
        del vocab[f"w{100 + i}"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", pad_token="w2")
    folder = tmp_path_factory.mktemp("e2e") / "tiny-target"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    space = folder.parent / "space.yaml"
    space.write_text(SPACE.format(target=folder))
    return folder, space


@pytest.fixture(scope="module")
def tiny_run(tiny_target, tmp_path_factory):
    import torch

    folder, space = tiny_target
    out = tmp_path_factory.mktemp("run") / "e2e"
    options = E2EOptions(target=str(folder), out_dir=str(out), budget=TINY_BUDGET, profile="cpu",
                         space=str(space))
    seen: dict[str, int] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: thread hand-offs cost more than they save on a shared CPU
    try:
        result = run_e2e(options, progress=lambda stage, done, total: seen.__setitem__(stage, done))
    finally:
        torch.set_num_threads(threads)
    return options, result, seen


def test_pipeline_writes_records_and_a_consistent_table(tiny_run):
    options, result, seen = tiny_run
    out = options.out_dir
    assert {"profile", "traces", "search", "heal + export", "latency terms", "bench"} <= set(seen)
    assert [r.role for r in result.rows] == ["winner", "first-k", "deep-narrow", "even"]
    data = json.loads((Path(out) / "results.json").read_text())
    assert data["fidelity"]["n_drafters"] == result.fidelity.n_drafters >= 1
    md = (Path(out) / "results.md").read_text()
    assert "target alone" in md and "Per-domain acceptance of the winner" in md
    fixed = str(TINY_BUDGET.fixed_gamma)
    for row in result.rows:
        assert row.folder and (Path(row.folder) / "config.json").is_file()
        assert fixed in row.measured and fixed in row.predicted and row.terms is not None
        m = row.measured[fixed]
        assert m.repeats == TINY_BUDGET.repeats and m.lossless is True  # greedy: identical to the target
        assert 1.0 <= m.tokens_per_step <= TINY_BUDGET.fixed_gamma + 1
        # greedy estimate on the bench's own outputs reproduces the loop exactly
        assert m.bench_estimate_tokens_per_step == pytest.approx(m.tokens_per_step, rel=1e-6)
        assert m.speedup == pytest.approx(m.tokens_per_s / m.target_tokens_per_s, rel=0.35)
        # each swap re-priced by hand from the row's figures: tokens * target / (drafted * draft + verify)
        d, p, t = row.decomposition[fixed], row.predicted[fixed], row.terms
        tokens, drafted = m.tokens_per_step, m.drafted_per_step
        assert d.predicted == pytest.approx(p.speedup)
        assert d.with_acceptance == pytest.approx(tokens * p.target_ms / (drafted * p.draft_ms + p.verify_ms))
        assert d.with_draft == pytest.approx(tokens * p.target_ms / (drafted * t.draft_ms + p.verify_ms))
        verify = t.verify_ms[fixed]
        assert d.with_verify == pytest.approx(tokens * p.target_ms / (drafted * t.draft_ms + verify))
        assert d.with_target == pytest.approx(tokens * t.target_ms / (drafted * t.draft_ms + verify))
        assert d.measured == m.speedup
        assert d.loop_overhead_ms_per_step == pytest.approx(m.step_ms - (drafted * t.draft_ms + verify))
        assert f"| {m.speedup:.3f}x |" in md
    winner, first = result.row("winner"), result.row("first-k")
    assert len(first.layers) == len(winner.layers) and first.layers == tuple(range(len(winner.layers)))
    narrow = result.row("deep-narrow")
    assert narrow.non_embedding_parameters < 2.5 * winner.non_embedding_parameters
    assert len(narrow.layers) > len(winner.layers) or len(narrow.layers) == 12
    distinct = [r for r in result.rows if r.same_as is None]
    pred = [r.predicted[fixed].speedup for r in distinct]
    meas = [r.measured[fixed].speedup for r in distinct]
    assert result.fidelity.mape_fixed_gamma == pytest.approx(mape(pred, meas))
    assert result.notes and any("MAPE" in n for n in result.notes)
    # the GPU line names this run's target and says it is a roofline, not a 135M target's measurement
    gpu = [n for n in result.notes if "spec-sheet profile predicts" in n]
    assert len(gpu) == (1 if any(r.gpu_predicted_speedup is not None for r in result.rows) else 0)
    assert all(f"on {options.target} (a roofline" in n and "NOT MEASURED" in n for n in gpu)
    assert not any("135M" in n for n in gpu)
    assert result.machine.logical_cores >= 1 and result.machine.load_average_after


def test_winner_keeps_the_searched_draft_head_and_baselines_the_full_one(tiny_run):
    """The space allows only a 48-row draft head: the winner is healed, exported, timed and priced
    with it; the baselines (what one builds without a search) keep the base's full head."""
    from draftnas.drafter.records import load_vocab_subset
    from draftnas.drafter.vocab import maybe_apply_saved_subset

    _, result, _ = tiny_run
    winner = result.row("winner")
    assert winner.name.endswith("-v48") and "head 48" in winner.shape
    subset = load_vocab_subset(winner.folder)
    assert subset.size == 48 and subset.vocab_size == 128
    loaded = load_drafter(winner.folder)
    maybe_apply_saved_subset(loaded.model, loaded.folder)
    assert loaded.model.get_output_embeddings().weight.shape[0] == 48
    first = result.row("first-k")
    assert len(winner.layers) == len(first.layers)
    for row in result.rows:
        if row.role != "winner" and row.same_as is None:
            assert not (Path(row.folder) / "draft_vocab.json").exists() and "head" not in row.shape
    # an untied 48-row head beside the full input embedding: the row counts the live module
    assert winner.parameters == sum(p.numel() for p in loaded.model.parameters())
    # the notes say where the winner's edge over each distinct baseline comes from
    edge = next(n for n in result.notes if n.startswith("winner vs first-k"))
    assert f"{winner.terms.draft_ms:.1f} vs {first.terms.draft_ms:.1f} ms" in edge
    assert any(n.startswith("margin over the next drafter") for n in result.notes)


def test_the_winner_plan_healed_on_one_domain_is_built_scored_and_benched(tiny_run):
    """Self-distillation for a domain: the winner's plan healed on the translation heal traces alone,
    scored on the same held-out traces (all domains) and benched at the fixed gamma."""
    from draftnas.acceptance.traces import load_traces, split_traces

    options, result, seen = tiny_run
    winner, tuned = result.row("winner"), result.tuned
    assert options.tuned_domain == "translation" and "heal on translation only" in seen
    assert tuned is not None and tuned.role == "winner-translation" and tuned.same_as is None
    assert tuned.layers == winner.layers and tuned.shape == winner.shape  # same plan, same head size
    assert tuned.folder != winner.folder and (Path(tuned.folder) / "config.json").is_file()
    _, rest = split_traces(load_traces(Path(options.out_dir) / "traces.safetensors"))
    n_domain = sum(r.info.domain == "translation" for r in rest.records)
    record = json.loads((Path(options.out_dir) / "drafters" / "winner-translation.json").read_text())
    heal = record["built"]["heal"]
    assert 2 <= n_domain < len(rest.records)
    assert heal["n_train_sequences"] + heal["n_heldout_sequences"] == n_domain  # translation records only
    assert set(tuned.estimate_per_domain) == set(winner.estimate_per_domain) >= {"translation", "code"}
    fixed = str(TINY_BUDGET.fixed_gamma)
    assert set(tuned.measured) == {fixed} and tuned.measured[fixed].lossless is True
    assert tuned.terms == winner.terms and "translation" in tuned.measured_per_domain
    md = (Path(options.out_dir) / "results.md").read_text()
    assert "healed on translation only (winner-translation" in md
    note = next(n for n in result.notes if n.startswith("healed on translation only"))
    assert f"translation {tuned.estimate_per_domain['translation']['top1']:.3f}" in note
    versus = "against the winner healed on all four domains: translation top-1"
    assert any(n.startswith(versus) for n in result.notes)
    assert [r.role for r in result.rows] == ["winner", "first-k", "deep-narrow", "even"]  # not a baseline


def test_a_bad_tuned_domain_is_refused_before_any_work():
    from draftnas.e2e.stages import check_tuned_domain, split_prompts

    traced, _ = split_prompts(budget_preset("quick"))
    check_tuned_domain(E2EOptions(budget=budget_preset("quick")), traced)  # the default budget fits
    with pytest.raises(InvalidInputError, match="tuned_domain 'poetry' is not a domain \\(allowed: chat"):
        check_tuned_domain(E2EOptions(tuned_domain="poetry"), traced)
    few, _ = split_prompts(budget_preset("quick", trace_per_domain=2))
    with pytest.raises(InvalidInputError, match="1 traced translation prompt\\(s\\) in the heal split"):
        check_tuned_domain(E2EOptions(tuned_domain="translation"), few)
    check_tuned_domain(E2EOptions(tuned_domain=None), few)


def test_rerun_resumes_from_the_run_folder(tiny_run):
    options, first, _ = tiny_run
    written = {p: p.stat().st_mtime_ns for p in Path(options.out_dir).glob("drafters/*/model.safetensors")}
    again = run_e2e(options)
    # drafters read back, not rebuilt
    assert written and all(p.stat().st_mtime_ns == t for p, t in written.items())
    for a, b in zip(first.rows, again.rows, strict=True):
        assert a.measured == b.measured  # benches read back from bench/*.json
        assert a.layers == b.layers


def test_budget_presets_and_bad_budgets():
    assert budget_preset("smoke").trials < budget_preset("quick").trials < budget_preset("full").trials
    assert budget_preset("full", repeats=5).repeats == 5
    with pytest.raises(InvalidInputError, match="allowed: smoke, quick, full"):
        budget_preset("huge")
    with pytest.raises(InvalidInputError, match="fixed_gamma must be <= max_gamma 4, got 5"):
        budget_preset("quick", fixed_gamma=5, max_gamma=4)


def test_spearman_and_mape_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1, 2], [1, 2]) is None
    assert mape([1.1, 0.9], [1.0, 1.0]) == pytest.approx(10.0)


def test_decomposition_names_the_term_that_is_off():
    # predicted: 2 tokens/step, draft 2 ms, verify 10 ms, target 10 ms at gamma 2 -> 2*10/14 = 1.4286
    pred = Prediction(gamma=2, tokens_per_step=2.0, draft_ms=2.0, verify_ms=10.0, target_ms=10.0,
                      tokens_per_s=0.0, speedup=20 / 14)
    terms = MeasuredTerms(context_tokens=64, draft_ms=5.0, target_ms=10.0, verify_ms={"2": 10.0},
                          prefill_target_ms=0.0, prefill_draft_ms=0.0, prompt_tokens=8, repeats=3)
    # measured: same acceptance, but the drafter costs 5 ms: 2*10/20 = 1.0 (+ no overhead)
    meas = Measured(gamma=2, target_tokens_per_s=100.0, tokens_per_s=100.0, speedup=1.0,
                    speedup_spread=(1.0, 1.0), tokens_per_step=2.0, mean_accepted_per_step=1.0,
                    bench_estimate_tokens_per_step=2.0, lossless=True, repeats=1, step_ms=20.0,
                    target_token_ms=10.0, drafted_per_step=2.0)
    d = decompose(pred, meas, terms)
    assert d.worst_term == "draft latency"
    assert d.delta_draft == pytest.approx(1.0 - 20 / 14)
    assert d.delta_acceptance == pytest.approx(0.0) and math.isclose(d.delta_overhead, 0.0, abs_tol=1e-12)
    assert d.loop_overhead_ms_per_step == pytest.approx(0.0)
