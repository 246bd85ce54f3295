"""`draftnas bench` on tiny random models (structure), and one short run on the real SmolLM2."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from draftnas.bench.records import BenchResult
from draftnas.bench.request_records import BenchOptions
from draftnas.bench.run import run_bench
from draftnas.cli.cmd_bench import drafting_lines
from draftnas.core.errors import InvalidInputError
from draftnas.core.options import OptionError
from draftnas.core.prompts import Prompt
from draftnas.models.records import ModelSource
from draftnas.models.sources import LoadedModel
from tests.helpers import PaddedTinyTokenizer as TinyTokenizer
from tests.helpers import loaded as _loaded
from tests.helpers import tiny_llama, truncated


@pytest.fixture(scope="module")
def tiny_pair(tiny_llama_config):
    target = tiny_llama(tiny_llama_config, initializer_range=0.2)
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    drafter = truncated(target, 2)
    return _loaded(target, "tiny-target"), _loaded(drafter, "tiny-draft")


PROMPTS = (Prompt(id="a", domain="x", text="speculate "), Prompt(id="b", domain="y", text="draft nas " * 2),
           Prompt(id="c", domain="x", text="verify"))


def test_greedy_bench_is_lossless_and_the_estimate_is_exact(tiny_pair):
    target, draft = tiny_pair
    result = run_bench(target, draft, PROMPTS, BenchOptions(gamma=3, max_new_tokens=16, rounds=2))
    assert [a.name for a in result.arms] == ["target", "draftnas", "hf", "hf_routed_target", "hf_routed"]
    own, hf, routed = result.arm("draftnas"), result.arm("hf"), result.arm("hf_routed")
    assert own.lossless is True and hf.lossless is True and routed.lossless is True
    assert own.baseline == "target" and hf.baseline == "target" and routed.baseline == "hf_routed_target"
    assert all(p.run("draftnas").lossless for p in result.prompts)
    assert result.rounds == 2 and [(p.round, p.prompt_id) for p in result.prompts] == [
        (0, "a"), (0, "b"), (0, "c"), (1, "a"), (1, "b"), (1, "c")]  # every run kept
    assert own.predicted_tokens_per_step == pytest.approx(own.tokens_per_step, rel=1e-9)
    assert 1.0 <= result.tokens_per_step <= 4.0
    # and each prompt's walk (what a search's latencies price into the median over these prompts) is that
    # prompt's run, prompt by prompt (fp32: the loop's steps are the walk's)
    first = [p.run("draftnas") for p in result.prompts if p.round == 0]
    assert own.predicted_prompt_tokens_per_step == pytest.approx([r.new_tokens / r.steps for r in first],
                                                                 abs=1e-4)
    assert own.predicted_prompt_drafted_per_step == pytest.approx([r.drafted / r.steps for r in first],
                                                                  abs=1e-4)
    assert own.mean_accepted_per_step == pytest.approx(result.tokens_per_step - 1.0)
    for a in result.arms:  # medians over prompts inside their 95% intervals
        low, high = a.tokens_per_s_interval
        assert low <= a.tokens_per_s <= high and a.pooled_tokens_per_s
    low, high = own.speedup_interval
    assert own.speedup is not None and low <= own.speedup <= high
    assert own.draft_share is not None and 0 < own.draft_share < 1  # the loop's time inside the drafter
    assert own.free_draft_speedup is not None and own.free_draft_speedup > own.speedup
    assert hf.draft_share is None and hf.free_draft_speedup is None  # transformers' arms time no drafting
    lines = drafting_lines(result)  # what the command prints under its table: one line per loop arm
    assert len(lines) == 1 and lines[0].startswith(f"draftnas: {own.draft_share:.0%} of its seconds drafting")
    assert f"{own.free_draft_speedup:.3f}x [{own.free_draft_speedup_interval[0]:.3f}, " in lines[0]
    assert hf.tokens_per_s > 0 and hf.tokens_per_step and routed.speedup
    assert result.arm("target").speedup is None and result.arm("target").drafter is None
    assert not any("forward" in vars(m) for m in target.model.modules())  # the routed arms run a copy
    assert BenchResult.from_dict(result.to_dict()) == result


def test_a_confidence_stop_benches_lossless_with_the_estimate_of_its_own_walk(tiny_pair):
    """--p-min: the loop stops drafting below it and the estimate walks the same stop, so the prediction
    of tokens per step stays exact; the stop is refused where it does not run, in one line."""
    target, draft = tiny_pair
    options = BenchOptions(gamma=4, max_new_tokens=16, rounds=1, p_min=0.99, engine="static",
                           hf_assisted=False)
    result = run_bench(target, draft, PROMPTS[:2], options)
    own = result.arm("draftnas")
    assert own.lossless is True and own.p_min == 0.99 and own.gamma == 4
    assert own.predicted_tokens_per_step == pytest.approx(own.tokens_per_step, rel=1e-9)
    fixed = run_bench(target, draft, PROMPTS[:2], replace(options, p_min=0.0)).arm("draftnas")
    assert own.draft_acceptance_rate >= fixed.draft_acceptance_rate  # drafts it was unsure of are not made
    with pytest.raises(InvalidInputError, match="p_min runs in the greedy one-sequence loops"):
        BenchOptions(p_min=0.5, batch_sizes=(1, 2)).validate()
    with pytest.raises(InvalidInputError, match="p_min runs in the greedy one-sequence loops"):
        BenchOptions(reference_p_min=0.5, temperature=0.7).validate()


def test_a_reference_drafter_gets_the_same_arms_in_the_same_run(tiny_pair):
    target, draft = tiny_pair
    other = _loaded(truncated(target.model, 1), "tiny-reference")
    result = run_bench(target, draft, PROMPTS[:2], BenchOptions(gamma=2, max_new_tokens=8, hf_routed=False),
                       reference=other)
    assert result.drafters == {"draftnas": "tiny-draft", "reference": "tiny-reference"}
    assert [a.name for a in result.arms] == ["target", "draftnas", "reference", "hf", "reference_hf"]
    ref = result.arm("reference")
    assert ref.lossless is True and ref.drafter == "tiny-reference" and ref.baseline == "target"
    assert ref.predicted_tokens_per_step == pytest.approx(ref.tokens_per_step, rel=1e-9)
    # the two drafters differ, so their acceptance does: each arm ran its own drafter
    assert ref.tokens_per_step != result.arm("draftnas").tokens_per_step
    loop = result.comparisons[0]  # the drafter over the reference, per prompt and round, with its interval
    assert (loop.numerator, loop.denominator, loop.prompts) == ("draftnas", "reference", 2)
    assert [(c.numerator, c.denominator) for c in result.comparisons] == [("draftnas", "reference"),
                                                                          ("hf", "reference_hf")]
    assert loop.interval[0] <= loop.ratio <= loop.interval[1] and loop.verdict in (
        "ahead", "behind", "not separable on this host")
    assert all({r.arm for r in p.runs} == {a.name for a in result.arms} for p in result.prompts)


def test_static_engine_bench_is_lossless_and_times_transformers_beside_it(tiny_pair, caplog):
    target, draft = tiny_pair
    with caplog.at_level(logging.INFO, logger="draftnas"):
        result = run_bench(target, draft, PROMPTS, BenchOptions(gamma=3, max_new_tokens=16, engine="static"))
    said = [r.getMessage() for r in caplog.records if r.name.startswith("draftnas.bench")]
    # what the minutes before the first timed run go to, for a log's heartbeat to name
    assert said[0].startswith("building the static engines (target, draftnas), ")
    assert said[1].startswith("choosing the products' kernels at the ") and "before any timed run" in said[1]
    assert "warming the target arm: 16 tokens of the first prompt, untimed" in said
    own = result.arm("draftnas")
    assert result.engine == "static" and own.engine == "static" and own.lossless is True
    assert own.exact_match_rate == 1.0 and own.divergence_margins == ()
    assert all(p.run("draftnas").first_divergence is None for p in result.prompts)
    assert result.arm("hf_target").tokens_per_s > 0 and result.arm("hf").baseline == "hf_target"
    assert result.choice_timing_s == 0.0  # every product shape the timed runs met was timed beforehand
    from draftnas.core.machine import cpu_identity

    # the host the figures came from, named by what decides its kernels (family, model, ISA)
    assert result.host == cpu_identity().label()
    assert len(result.load_average_before.split()) == 3 or result.load_average_before == "unknown"
    assert result.arm("hf").lossless is True  # HF assisted judged against transformers' own target run
    assert own.predicted_tokens_per_step == pytest.approx(own.tokens_per_step, rel=1e-9)
    # the other tokens/s kept in the JSON: after each run's first step (the prompt's prefill) for the loop
    # and its target alone; none for transformers' generate, which times no such split
    for name in ("target", "draftnas"):
        runs = [p.run(name) for p in result.prompts]
        assert all(0 < r.first_step_seconds < r.seconds and 1 <= r.first_step_tokens <= 4 for r in runs)
        assert result.arm(name).other_tokens_per_s is not None
    assert result.arm("hf").other_tokens_per_s is None and result.arm("hf_target").other_tokens_per_s is None
    hf_engine = run_bench(target, draft, PROMPTS, BenchOptions(gamma=3, max_new_tokens=16, hf_assisted=False))
    assert [p.run("draftnas").steps for p in hf_engine.prompts] == [
        p.run("draftnas").steps for p in result.prompts]  # the same loop


def test_first_divergence_and_its_margin_are_reported():
    from draftnas.bench.stats import first_divergence

    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_bad_device_dtype_or_engine_is_one_message():
    with pytest.raises(InvalidInputError, match="device must be.*dtype must be.*engine must be"):
        BenchOptions(device="tpu", dtype="int4", engine="sglang").validate()


def test_sampling_bench_runs_without_a_lossless_claim(tiny_pair):
    target, draft = tiny_pair
    progress = []
    result = run_bench(target, draft, PROMPTS[:2], BenchOptions(gamma=2, temperature=1.0, max_new_tokens=8,
                                                                hf_assisted=False),
                       progress=lambda done, total: progress.append((done, total)))
    own = result.arm("draftnas")
    assert own.lossless is None and not result.has("hf")
    assert own.predicted_tokens_per_step is not None and 1.0 <= own.predicted_tokens_per_step <= 3.0
    assert progress[0] == (0, 7) and progress[-1] == (7, 7)  # 3 rounds x 2 prompts, then the estimate


def test_other_tokenizer_and_bad_options_are_refused(tiny_pair):
    target, draft = tiny_pair
    other = _loaded(draft.model, "other", TinyTokenizer(shift=1))
    with pytest.raises(InvalidInputError, match="must share one tokenizer"):
        run_bench(target, other, PROMPTS, BenchOptions(max_new_tokens=4))
    with pytest.raises(InvalidInputError, match="gamma must be in"):
        run_bench(target, draft, PROMPTS, BenchOptions(gamma=0))


@pytest.mark.real_model
@pytest.mark.usefixtures("one_thread")
def test_smollm2_bench_is_lossless_and_matches_the_estimate(smollm2):
    drafter = truncated(smollm2.model, 4)
    draft = LoadedModel(drafter, smollm2.tokenizer, ModelSource(spec="first4", kind="folder", location="-"),
                        None, 0.0, True)
    prompts = (Prompt(id="m", domain="math", text="What is 12 times 12?"),)
    result = run_bench(smollm2, draft, prompts, BenchOptions(gamma=3, max_new_tokens=10, hf_assisted=False,
                                                             rounds=1))
    own = result.arm("draftnas")
    assert own.lossless is True
    assert own.predicted_tokens_per_step == pytest.approx(own.tokens_per_step, rel=1e-6)


def test_prompts_the_drafter_was_healed_on_are_left_out_before_the_per_domain_choice(tmp_path):
    import dataclasses
    import json

    from draftnas.bench.run import unseen_prompts
    from draftnas.core.prompts import encode_prompt
    from draftnas.drafter.heal.heal_records import prompt_key

    tok = TinyTokenizer()
    prompts = PROMPTS + (Prompt(id="d", domain="x", text="accept"),)
    trained = [prompt_key(encode_prompt(tok, p.text)) for p in prompts[:1]]  # healed on "a"
    (tmp_path / "draftnas.json").write_text(json.dumps({"heal": {"trained_prompts": trained, "kept": True}}))
    drafter = dataclasses.replace(_loaded(None, "d"), folder=tmp_path)
    kept, ids, left_out = unseen_prompts(prompts, tok, [drafter.folder], per_domain=None)
    assert [p.id for p in kept] == ["b", "c", "d"] and left_out == ("a",)
    assert ids == [encode_prompt(tok, p.text) for p in kept]
    one_each, _, _ = unseen_prompts(prompts, tok, [drafter.folder], per_domain=1)  # among b, c, d: x gets c
    assert [p.id for p in one_each] == ["b", "c"]
    assert unseen_prompts(prompts, tok, [_loaded(None, "no-folder").folder], per_domain=None)[2] == ()
    with pytest.raises(InvalidInputError, match="every one of the 1 given"):
        unseen_prompts(prompts[:1], tok, [drafter.folder], per_domain=None)
    (tmp_path / "draftnas.json").write_text(json.dumps({"heal": {"trained_prompts": trained, "kept": False}}))
    # unhealed weights exported
    assert unseen_prompts(prompts, tok, [drafter.folder], per_domain=None)[2] == ()


def test_an_int8_drafter_runs_int8_in_the_static_engine_and_the_routed_arm_only(tiny_pair):
    target, draft = tiny_pair
    other = _loaded(truncated(target.model, 1), "tiny-reference")
    options = BenchOptions(gamma=3, max_new_tokens=12, engine="static", draft_weights="int8")
    result = run_bench(target, draft, PROMPTS[:2], options, reference=other)
    own, ref = result.arm("draftnas"), result.arm("reference")
    assert own.draft_weights == "int8" and result.arm("hf_routed").draft_weights == "int8"
    assert result.arm("hf").draft_weights == "dense"  # plain transformers runs the weights as loaded
    assert ref.draft_weights == "dense" and result.arm("reference_hf_routed").draft_weights == "dense"
    assert own.lossless is True  # the target decides every token, whatever the drafter's weights
    # the estimate reads the int8 products the loop drafts with (in fp32: the same tokens per step)
    assert own.predicted_tokens_per_step == pytest.approx(own.tokens_per_step, rel=1e-9)
    from draftnas.bench.arms import Drafter

    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.inference_mode():
        dense_logits = draft.model(ids).logits
        with Drafter.of("draftnas", draft, weights="int8").own_products():
            int8_logits = draft.model(ids).logits
        assert not torch.equal(int8_logits, dense_logits)  # int8 products inside
        assert torch.equal(draft.model(ids).logits, dense_logits)  # the weights as loaded after
    assert not any("forward" in vars(m) for m in draft.model.modules())  # the drafter as loaded is untouched
    dense = run_bench(target, draft, PROMPTS[:2], BenchOptions(gamma=3, max_new_tokens=12, engine="static",
                                                               hf_assisted=False))
    assert dense.arm("draftnas").draft_weights == "dense"


def test_int8_weights_outside_the_static_engine_or_on_cuda_are_one_line(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(OptionError, match="draft_weights int8 .* static engine only: set engine static") as e:
        run_bench(target, draft, PROMPTS[:1], BenchOptions(max_new_tokens=4, draft_weights="int8"))
    assert "--draft-weights int8" in e.value.for_flags() and "set --engine static" in e.value.for_flags()
    with pytest.raises(InvalidInputError, match="int8 multiplies on the CPU only"):
        BenchOptions(max_new_tokens=4, device="cuda", engine="static", reference_weights="int8").validate()


def test_the_reference_runs_at_its_own_gamma_in_every_arm(tiny_pair):
    target, _ = tiny_pair
    whole = _loaded(truncated(target.model, target.model.config.num_hidden_layers), "tiny-whole")
    other = _loaded(truncated(target.model, 1), "tiny-reference")
    options = BenchOptions(gamma=4, reference_gamma=1, max_new_tokens=12, engine="static", hf_routed=False)
    result = run_bench(target, whole, PROMPTS[:2], options, reference=other)
    assert result.gamma == 4 and result.arm("draftnas").gamma == 4 and result.arm("hf").gamma == 4
    ref, ref_hf = result.arm("reference"), result.arm("reference_hf")
    assert ref.gamma == 1 and ref_hf.gamma == 1 and ref.lossless is True
    # one draft token a step: at most two tokens a step, measured and estimated, in both loops
    assert ref.tokens_per_step <= 2.0 and ref_hf.tokens_per_step <= 2.0
    assert ref.predicted_tokens_per_step is not None and ref.predicted_tokens_per_step <= 2.0
    assert result.arm("draftnas").tokens_per_step > 2.0  # the target's own layers: every draft accepted
    with pytest.raises(InvalidInputError, match="reference_gamma|reference-gamma"):
        BenchOptions(gamma=2, reference_gamma=3, batch_sizes=(1, 2)).validate()


def test_a_plain_transformers_load_runs_and_reports_the_exports_dense_settings(tiny_pair, tmp_path):
    """A quantized export records the γ and stop priced for it run dense (`plain_gamma`): transformers'
    plain arm loads it so and says so, while draftnas's loop runs the options' (its own kernels')."""
    import json

    target, _ = tiny_pair
    (tmp_path / "draftnas.json").write_text(json.dumps({"plain_gamma": 1, "plain_p_min": 0.0}))
    exported = _loaded(truncated(target.model, 2), "tiny-exported", folder=tmp_path)
    options = BenchOptions(gamma=4, max_new_tokens=12, engine="static", hf_routed=False)
    result = run_bench(target, exported, PROMPTS[:2], options)
    assert result.arm("draftnas").gamma == 4 and result.arm("hf").gamma == 1
    assert result.arm("hf").tokens_per_step <= 2.0  # one draft a step, as the plain load runs it


def test_an_int8_drafter_folder_that_records_bf16_activations_runs_in_bf16_beside_the_benchs_dtype(tmp_path):
    import json

    from draftnas.bench.run import _drafter_dtype

    (tmp_path / "draftnas.json").write_text(json.dumps({"weights": "int8", "dtype": "bf16"}))
    fp32 = BenchOptions(dtype="fp32", engine="static")
    assert _drafter_dtype("draftnas", str(tmp_path), fp32) == "bf16"
    # an exported reference (the search's hand-made best) runs as its folder records, unless told dense
    assert _drafter_dtype("reference2", str(tmp_path), fp32) == "bf16"
    assert _drafter_dtype("reference", str(tmp_path), BenchOptions(reference_weights="dense")) == "fp32"
    assert _drafter_dtype("draftnas", str(tmp_path), BenchOptions(draft_weights="dense")) == "fp32"
    (tmp_path / "draftnas.json").write_text(json.dumps({"weights": "dense", "dtype": "bf16"}))
    assert _drafter_dtype("draftnas", str(tmp_path), fp32) == "fp32"  # a dense drafter: the bench's dtype


def test_several_references_run_in_one_interleaved_run_each_at_its_own_gamma_and_weights(tiny_pair):
    target, draft = tiny_pair
    stock = _loaded(truncated(target.model, 1), "tiny-stock")
    made = _loaded(truncated(target.model, 3), "tiny-hand-made")
    options = BenchOptions(gamma=3, reference_gamma=2, max_new_tokens=10, engine="static", hf_assisted=False,
                           reference_weights="int8")
    result = run_bench(target, draft, PROMPTS[:2], options, references=[stock, made])
    assert result.drafters == {"draftnas": "tiny-draft", "reference": "tiny-stock",
                               "reference2": "tiny-hand-made"}
    assert [a.name for a in result.arms] == ["target", "draftnas", "reference", "reference2"]
    for name in ("reference", "reference2"):
        arm = result.arm(name)
        assert arm.gamma == 2 and arm.draft_weights == "int8" and arm.lossless is True
    assert [(c.numerator, c.denominator) for c in result.comparisons] == [("draftnas", "reference"),
                                                                         ("draftnas", "reference2")]
    assert {p.run("reference2").arm for p in result.prompts} == {"reference2"}  # every prompt, every round


def test_several_references_are_refused_where_a_bench_takes_one():
    from draftnas.bench.request_records import BenchRequest

    with pytest.raises(OptionError, match="takes one drafter with") as e:
        BenchRequest(target="t", draft="d", references=("a", "b"),
                     options=BenchOptions(batch_sizes=(1, 2), engine="static")).validate()
    assert "--reference takes one drafter with --batch-size, not 2" in e.value.for_flags()


def test_the_ablation_table_says_each_links_figures_and_goes_into_the_folders_card(tiny_pair, tmp_path):
    from dataclasses import replace

    from draftnas.bench.ablation import HEADING, AblationLink, table_lines, write_card_section

    target, draft = tiny_pair
    stock = _loaded(truncated(target.model, 1), "tiny-stock")
    options = BenchOptions(gamma=3, max_new_tokens=8, engine="static", hf_assisted=False, rounds=1)
    bench = run_bench(target, draft, PROMPTS[:2], options, references=[stock])
    links = [AblationLink(adds=adds, drafter=spec, trial=trial, arm=arm, gamma=a.gamma,
                          weights=a.draft_weights, tokens_per_s=a.tokens_per_s,
                          tokens_per_s_interval=a.tokens_per_s_interval,
                          speedup=a.speedup, speedup_interval=a.speedup_interval,
                          tokens_per_step=a.tokens_per_step, predicted_tokens_per_s=None)
             for adds, spec, trial, arm in (("stock", "tiny-stock", None, "reference"),
                                            ("+ int8 weights", "drafters/x", 7, "draftnas"))
             for a in (bench.arm(arm),)]
    notes = ["'+ head': none"]
    result = replace(bench, ablation={"links": [link.to_dict() for link in links], "notes": notes})
    lines = table_lines(result)
    # each link over the one before, paired per prompt and round (not a ratio of the two medians)
    from draftnas.bench.stats import compare_arms

    paired = compare_arms(bench.prompts, "draftnas", "reference")
    cell = f"| {paired.ratio:.3f} [{paired.interval[0]:.3f}, {paired.interval[1]:.3f}], {paired.verdict} |"
    assert lines[-3].startswith("| stock | tiny-stock | 3 | dense |") and lines[-3].endswith("| - |")
    assert lines[-2].startswith("| + int8 weights | x (trial 7) |") and lines[-2].endswith(cell)
    assert lines[-1] == "\nNot in the chain: '+ head': none"
    (tmp_path / "README.md").write_text("# card\n\nbody\n")
    write_card_section(tmp_path, lines, result, "draftnas bench --ablation")
    write_card_section(tmp_path, lines, result, "draftnas bench --ablation")  # replaced, not appended
    card = (tmp_path / "README.md").read_text()
    assert card.startswith("# card\n\nbody\n\n" + HEADING) and card.count(HEADING) == 1


def test_the_ablation_card_quotes_the_command_that_made_it():
    from dataclasses import replace

    from draftnas.bench.ablation import ablation_command
    from draftnas.bench.request_records import BenchRequest

    request = BenchRequest(target="t", draft="drafters/w", ablation=True, prompts="code,chat",
                           options=BenchOptions(gamma=4, dtype="bf16", per_domain=3, rounds=2))
    assert ablation_command(request) == ("draftnas bench --target t --draft drafters/w --ablation --gamma 4 "
                                         "--dtype bf16 --prompts code,chat --per-domain 3 --rounds 2")
    with pytest.raises(OptionError, match="ablation benches its own chain"):
        replace(request, references=("r",)).validate()


def test_lookup_arms_run_in_the_loop_lossless_and_are_compared_with_the_drafter(tiny_pair):
    target, draft = tiny_pair
    options = BenchOptions(gamma=3, max_new_tokens=16, rounds=1, engine="static", hf_assisted=False,
                           lookup="lookup:n=1,m=3", hybrid_policy="longer")
    result = run_bench(target, draft, PROMPTS, options)
    assert [a.name for a in result.arms] == ["target", "draftnas", "lookup", "hybrid"]
    lookup, hybrid = result.arm("lookup"), result.arm("hybrid")
    assert lookup.lossless is True and hybrid.lossless is True and lookup.drafter == "lookup:n=1,m=3"
    assert hybrid.drafter.startswith("lookup:n=1,m=3+") and hybrid.drafter.endswith("(longer)")
    assert lookup.gamma == 3 and lookup.speedup is not None and lookup.baseline == "target"
    assert [(c.numerator, c.denominator) for c in result.comparisons] == [("lookup", "draftnas"),
                                                                         ("hybrid", "draftnas")]
    with_hf = run_bench(target, draft, PROMPTS[:2], replace(options, hf_assisted=True, hf_routed=False))
    hf = with_hf.arm("hf_lookup")
    assert hf.lossless is True and hf.baseline == "hf_target" and hf.engine == "hf" and hf.gamma == 3
    assert ("hf_lookup", "hf") in [(c.numerator, c.denominator) for c in with_hf.comparisons]


@pytest.mark.parametrize("change, said", [
    ({"lookup": "lookup:n=40"}, "--lookup setting n=40 is out of range (allowed: 1-32)"),
    ({"lookup": "lookup:n=3", "engine": "llama.cpp"}, "--lookup runs in draftnas's greedy one-sequence loop"),
    ({"lookup": "lookup", "temperature": 0.5}, "--lookup runs in draftnas's greedy one-sequence loop"),
])
def test_lookup_that_cannot_run_as_asked_is_one_line(change, said):
    with pytest.raises(OptionError) as e:
        BenchOptions(**change).validate()
    assert said in e.value.for_flags() and "\n" not in e.value.for_flags()


def test_torch_arms_run_the_same_prompts_through_draftnas_loop_after_llama_cpp(monkeypatch):
    """`bench --engine llama.cpp --torch-arms`: the llama.cpp arms first, then the same prompts, target,
    drafter and references in draftnas's static loop, without transformers' arms or the llama.cpp
    search's predictions; without the flag only the llama.cpp arms run."""
    import draftnas.bench.llama_cpp as llama_cpp
    import draftnas.bench.run as run
    from draftnas.bench.request import bench_from_request
    from draftnas.bench.request_records import BenchRequest

    calls: list[tuple[str, object, object, tuple[str, ...], BenchOptions, tuple[str, ...]]] = []

    def fake(engine):
        def bench(target, draft, prompts, options, references=(), progress=None, **_):
            calls.append((engine, target, draft, tuple(p.id for p in prompts), options, tuple(references)))
            return engine
        return bench

    monkeypatch.setattr(llama_cpp, "run_llama_cpp_bench", fake("llama.cpp"))
    monkeypatch.setattr(run, "run_bench", fake("loop"))
    options = BenchOptions(engine="llama.cpp", torch_arms=True, gamma=3, dtype="bf16", per_domain=1)
    request = BenchRequest(target="qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b",
                           references=("qwen2.5-coder-0.5b",), prompts="chat", options=options)
    assert bench_from_request(request) == ("llama.cpp", "loop")
    (engine, *first), (second_engine, *second) = calls
    assert (engine, second_engine) == ("llama.cpp", "loop")
    assert first[:3] == second[:3] and first[4] == second[4]  # target, drafter, prompts, references
    loop = second[3]
    assert loop.engine == "static" and not loop.hf_assisted and not loop.hf_routed
    assert loop.predictions is None
    assert (loop.gamma, loop.dtype) == (3, "bf16")
    calls.clear()
    alone = replace(request, options=replace(options, torch_arms=False))
    assert bench_from_request(alone) == ("llama.cpp", None)
    assert [c[0] for c in calls] == ["llama.cpp"]


@pytest.mark.parametrize("engine", ["static", "hf"])
def test_a_head_is_benched_in_draftnas_loop_beside_a_reference_and_lookup(tiny_pair, tmp_path, engine):
    """`--draft head:FOLDER` in draftnas's loop: the head's arm (the drafter's arm name) against the target
    alone, a model reference and the lookup beside it (no hybrid: that needs a model), lossless, its drafts
    counted as the loop made them, and compared with the reference in the same rounds."""
    from draftnas.bench.arms import MAIN
    from draftnas.drafter.head.build import head_proposer, new_head
    from draftnas.drafter.head.folder import write_head
    from draftnas.drafter.head.shape import head_shape
    from draftnas.models.speculative import speculate

    target, draft = tiny_pair
    shape = head_shape(target.model.config.to_dict(), "tiny", layers=(1, 2, 3), draft_vocab=96, ffn=48)
    head = new_head(target.model, shape, list(range(16, 112)), seed=1)
    folder = write_head(head, tmp_path / "head")
    options = BenchOptions(gamma=3, max_new_tokens=16, rounds=2, engine=engine, hf_assisted=False,
                           lookup="lookup:n=1,m=2")
    result = run_bench(target, f"head:{folder}", PROMPTS, options, reference=draft)
    assert [a.name for a in result.arms] == ["target", "draftnas", "reference", "lookup"]
    assert result.drafters[MAIN] == f"head:{folder}"
    own = result.arm("draftnas")
    assert own.lossless is True and own.drafter == f"head:{folder}" and own.gamma == 3
    assert own.draft_vocab_size == 96 and own.speedup is not None
    first = [p for p in result.prompts if p.round == 0]
    for p in first:  # the arm's counts are the loop's over the same prompt
        ids = target.tokenizer(PROMPTS[[q.id for q in PROMPTS].index(p.prompt_id)].text)["input_ids"]
        alone = speculate(target.model, head_proposer(head, target.model, 64), ids, gamma=3,
                          max_new_tokens=16)
        run = p.run("draftnas")
        assert (run.drafted, run.accepted, run.new_tokens) == (sum(alone.drafted), sum(alone.accepted),
                                                                len(alone.tokens))
    pairs = {(c.numerator, c.denominator) for c in result.comparisons}
    assert ("draftnas", "reference") in pairs and ("lookup", "draftnas") in pairs
