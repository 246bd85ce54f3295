"""Candidates: width ratios become shapes in whole GQA groups; infeasible points are refused."""

from __future__ import annotations

from dataclasses import replace

import pytest

from draftnas.core.errors import InfeasibleCandidateError
from draftnas.core.registry import get_architecture
from draftnas.drafter.records import PruningPlan
from draftnas.search.candidate import build_candidate, drafter_shape
from draftnas.search.records import Candidate, CandidateChoice
from draftnas.search.spaces import load_search_space

SMOL = get_architecture("smollm2-135m")  # 9 q heads, 3 KV heads (groups of 3), MLP 1536
LLAMA7 = get_architecture("llama-7b")  # 32 heads, multi-head (32 KV heads), MLP 11008


def test_smollm2_ratios_keep_whole_gqa_groups():
    a = drafter_shape(SMOL, CandidateChoice(depth=4, kv_head_ratio=0.67, query_head_ratio=0.67,
                                            mlp_ratio=0.5))
    assert (a.num_hidden_layers, a.num_key_value_heads, a.num_attention_heads) == (4, 2, 4)
    assert a.intermediate_size == 768 and a.hidden_size == 576 and a.head_dim == 64
    assert a.num_attention_heads % a.num_key_value_heads == 0


def test_llama_multi_head_and_hidden_rounding():
    a = drafter_shape(LLAMA7, CandidateChoice(depth=3, kv_head_ratio=0.25, mlp_ratio=0.25,
                                              hidden_ratio=0.75))
    assert (a.num_attention_heads, a.num_key_value_heads) == (8, 8)
    assert a.intermediate_size == 2752 and a.hidden_size == 3072
    assert a.hidden_size % a.head_dim == 0


def test_shape_plan_is_a_valid_pruning_plan_of_the_same_shape():
    space = load_search_space("smollm2-135m")
    for sel in ("first", "even"):
        choice = CandidateChoice(depth=5, layer_selection=sel, kv_head_ratio=0.67, mlp_ratio=0.5)
        cand = build_candidate(space, SMOL, "smollm2-135m", choice, target=SMOL)
        assert cand.plan is not None
        plan = cand.plan
        shaped = plan.architecture(SMOL)
        assert shaped.with_shape(name="") == cand.arch.with_shape(name="")
    assert cand.plan.layers == (0, 7, 14, 22, 29)


def test_hidden_pruned_candidate_has_no_plan():
    space = load_search_space("llama-65b-from-llama-7b")
    cand = build_candidate(space, LLAMA7, "llama-7b", CandidateChoice(depth=2, hidden_ratio=0.5),
                           target=get_architecture("llama-65b"))
    assert cand.plan is None and cand.arch.hidden_size == 2048


def test_infeasible_points_say_why():
    space = load_search_space("smollm2-135m")
    with pytest.raises(InfeasibleCandidateError, match="depth 31 outside 1..30"):
        build_candidate(space, SMOL, "smollm2-135m", CandidateChoice(depth=31), target=SMOL)
    with pytest.raises(InfeasibleCandidateError, match="not fewer than the target's"):
        build_candidate(space, SMOL, "smollm2-135m", CandidateChoice(depth=30), target=SMOL)


def test_from_params_fills_single_valued_knobs_and_round_trips():
    space = load_search_space("llama-65b-from-llama-7b")
    choice = CandidateChoice.from_params({"depth": 3, "mlp_ratio": 0.5}, space)
    assert choice == CandidateChoice(depth=3, layer_selection="first", kv_head_ratio=1.0,
                                     query_head_ratio=1.0, mlp_ratio=0.5, hidden_ratio=1.0)
    cand = build_candidate(space, LLAMA7, "llama-7b", choice)
    again = Candidate.from_dict(cand.to_dict())
    assert again == cand and again.key == cand.key
    assert cand.shape_label() == "3 x 4096 (q32/kv32, mlp 5504)"


def test_a_drafter_has_one_name_in_the_search_and_in_its_export():
    from draftnas.export.folder import drafter_name
    from draftnas.export.records import ExportInfo

    space = load_search_space("smollm2-135m")
    choice = CandidateChoice(depth=1, layer_selection="block_influence", vocab_size=4096)
    cand = build_candidate(space, SMOL, "smollm2-135m", choice, target=SMOL)
    assert cand.name == "L1bi-h9kv3-i1536-v4096"  # was L1bi-h9kv3-m1-v4096 here, -i1536 at export
    from draftnas.drafter.records import VocabSubset

    plan = PruningPlan(base="smollm2-135m", base_num_layers=30, layers=(0,),
                       layer_selection="block_influence", num_attention_heads=9, num_key_value_heads=3,
                       intermediate_size=1536, vocab=VocabSubset(ids=tuple(range(4096)), vocab_size=49152))
    assert drafter_name(ExportInfo(base="smollm2-135m", target="t", plan=plan)) == "smollm2-135m-" + cand.name
    narrow = build_candidate(space, SMOL, "smollm2-135m", CandidateChoice(depth=4, mlp_ratio=0.5),
                             target=SMOL)
    assert narrow.name == "L4f-h9kv3-i768" == narrow.plan.label()


def test_the_same_kept_layers_are_one_drafter_whichever_rule_picked_them():
    space = load_search_space("smollm2-135m")
    first = build_candidate(space, SMOL, "smollm2-135m", CandidateChoice(depth=1), target=SMOL)
    bi = build_candidate(space, SMOL, "smollm2-135m",
                         CandidateChoice(depth=1, layer_selection="block_influence"), target=SMOL)
    assert first.key != bi.key  # a proposal: block influence has not picked its layer yet
    assert first.plan is not None
    chosen = replace(first.plan, layer_selection="block_influence")
    planned = bi.with_plan(chosen)
    assert planned.built_key == first.built_key  # both keep layer 0: one row in the ranking
    other = planned.with_plan(replace(first.plan, layers=(29,)))
    assert other.built_key != first.built_key


def test_an_int8_drafter_is_its_own_candidate_with_one_name_in_the_search_and_its_export():
    from draftnas.export.folder import drafter_name
    from draftnas.export.records import ExportInfo

    space = load_search_space("smollm2-135m")
    dense = build_candidate(space, SMOL, "smollm2-135m", CandidateChoice(depth=4), target=SMOL)
    int8 = build_candidate(space, SMOL, "smollm2-135m", CandidateChoice(depth=4, weights="int8"), target=SMOL)
    assert int8.name == dense.name + "-int8" == "L4f-h9kv3-i1536-int8"
    assert int8.key != dense.key and int8.built_key != dense.built_key  # priced and ranked apart
    assert int8.plan == dense.plan  # the same pruning: only how its products run differs
    info = ExportInfo(base="smollm2-135m", target="t", plan=int8.plan, weights="int8")
    assert drafter_name(info) == "smollm2-135m-" + int8.name
    assert Candidate.from_dict(int8.to_dict()) == int8
