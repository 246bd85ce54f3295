"""Search spaces: shipped files load, and validation reports every problem at once."""

from __future__ import annotations

import pytest
import yaml

from draftnas.core.errors import SearchSpaceError
from draftnas.core.registry import get_architecture
from draftnas.search.space_file import parse_search_space
from draftnas.search.spaces import default_space_for, load_search_space, shipped_spaces

GOOD = {
    "schema_version": 1, "name": "t", "target": "smollm2-135m", "base": "smollm2-135m",
    "depth": {"min": 1, "max": 4},
    "layer_selection": ["first", "even"],
    "width": {"kv_head_ratios": [1.0, 0.67], "mlp_ratios": [1.0, 0.5]},
    "gamma": {"min": 0, "max": 6},
    "workload": {"batch_sizes": {1: 3, 8: 1}, "temperature": 0.0},
}


def test_shipped_spaces_load_and_have_the_documented_shape():
    assert {"smollm2-135m", "llama-65b-from-llama-7b"} <= set(shipped_spaces())
    llama = load_search_space("llama-65b-from-llama-7b")
    assert (llama.target, llama.base, llama.latency_only) == ("llama-65b", "llama-7b", True)
    assert (llama.depth.min, llama.depth.max) == (1, 32)
    assert llama.problems_for_base(get_architecture("llama-7b")) == []
    small = load_search_space("smollm2-135m")
    assert not small.latency_only and small.heal.steps > 0
    assert small.problems_for_base(get_architecture("smollm2-135m")) == []


def test_default_space_is_found_by_target():
    assert default_space_for("llama-65b").name == "llama-65b-from-llama-7b"
    assert default_space_for("gemma-3-270m").name == "gemma-3-270m"  # not gemma-3-270m-shallow
    shallow = load_search_space("gemma-3-270m-shallow")
    assert (shallow.target, shallow.depth.max, shallow.heal.learning_rate) == ("gemma-3-270m", 6, 3e-4)
    assert shallow.heal.steps > 0 == load_search_space("gemma-3-270m").heal.steps
    with pytest.raises(SearchSpaceError, match="no shipped search space targets 'opt-125m'"):
        default_space_for("opt-125m")


def test_batch_weights_are_normalized_shares():
    space = parse_search_space(GOOD)
    assert space.workload.batch_sizes == (1, 8)
    assert space.workload.batch_weights == pytest.approx((0.75, 0.25))
    assert space.workload.primary_batch_size == 1
    assert space.size() == 4 * 2 * 2 * 1 * 2 * 1


def test_three_mistakes_are_all_reported():
    bad = {**GOOD, "depth": {"min": 0, "max": 4}, "gamma": {"min": 0, "max": 40},
           "width": {"mlp_ratios": [1.0, 1.5]}}
    with pytest.raises(SearchSpaceError) as info:
        parse_search_space(bad, source="bad.yaml")
    msg = str(info.value)
    assert "bad.yaml has 3 problems" in msg
    assert "depth.min: 0 is out of range (allowed: an integer >= 1)" in msg
    assert "gamma.max: 40 is out of range (allowed: an integer in 1..16)" in msg
    assert "width.mlp_ratios[1]: 1.5 is out of range (allowed: a number in (0, 1])" in msg
    assert "\n" not in msg


def test_unknown_fields_and_bad_choices_name_the_allowed_values():
    bad = {**GOOD, "dpeth": 3, "layer_selection": ["first", "random"], "schema_version": 2}
    with pytest.raises(SearchSpaceError) as info:
        parse_search_space(bad)
    msg = str(info.value)
    assert "dpeth: unknown field (allowed: schema_version, name" in msg
    assert "layer_selection[1]: 'random' is not allowed (allowed: first, even, block_influence)" in msg
    assert "schema_version: 2 is not supported (allowed: 1)" in msg


def test_hidden_size_pruning_needs_a_latency_only_space():
    bad = {**GOOD, "width": {"hidden_ratios": [1.0, 0.5]}}
    with pytest.raises(SearchSpaceError, match="latency_only: true"):
        parse_search_space(bad)
    assert parse_search_space({**bad, "latency_only": True}).width.hidden_ratios == (1.0, 0.5)


def test_missing_required_fields_and_non_mapping(tmp_path):
    with pytest.raises(SearchSpaceError) as info:
        parse_search_space({"schema_version": 1})
    for field in ("name: is required", "target: is required", "base: is required", "depth: is required"):
        assert field in str(info.value)
    with pytest.raises(SearchSpaceError, match="must be a YAML mapping"):
        parse_search_space([1, 2])
    path = tmp_path / "broken.yaml"
    path.write_text("depth: [1, 2\nname: x\n")
    with pytest.raises(SearchSpaceError, match="not valid YAML at line"):
        load_search_space(path)


def test_space_file_round_trip(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    space = load_search_space(path)
    assert space.source == str(path)
    assert type(space).from_dict(space.to_dict()) == space
    with pytest.raises(SearchSpaceError, match="no file and no shipped space"):
        load_search_space(tmp_path / "nope.yaml")


def test_depth_beyond_the_base_is_a_problem():
    space = parse_search_space({**GOOD, "depth": {"min": 1, "max": 40}})
    problems = space.problems_for_base(get_architecture("smollm2-135m"))
    assert problems == ["depth.max: 40 but base smollm2-135m has 30 layers (allowed: 1..30)"]


def test_weight_formats_are_a_searched_choice_with_the_allowed_values_named():
    from draftnas.search.loop import distributions

    assert parse_search_space(GOOD).weights == ("dense",)  # dense unless the space says more
    space = parse_search_space({**GOOD, "weights": ["dense", "int8"]})
    assert space.weights == ("dense", "int8") and space.size() == 2 * parse_search_space(GOOD).size()
    assert list(distributions(space)["weights"].choices) == ["dense", "int8"]
    refused = (r"weights\[0\]: 'int3' is not allowed \(allowed: dense, int8, int4, Q8_0, Q4_0, or per layer "
               r"group \[attn, mlp, head\] with each one of dense, int8, int4, attn and mlp maybe one per "
               r"band of depth: int8/int4\)")
    with pytest.raises(SearchSpaceError, match=refused):
        parse_search_space({**GOOD, "weights": ["int3"]})
    # a per-layer format, as a list or as text, is one choice spelled one way; a uniform one is one word
    mixed = parse_search_space({**GOOD, "weights": [["int8", "int8", "int4"], "attn=int8,mlp=int8,head=int4",
                                                    ["int4", "int4", "int4"]]})
    assert mixed.weights == ("attn=int8,mlp=int8,head=int4", "int4")
    banded = parse_search_space({**GOOD, "weights": [["int8/int4", "int8/int4", "int4"], "int4"]})
    assert banded.weights == ("attn=int8/int4,mlp=int8/int4,head=int4", "int4")  # bands of depth: halves
    assert "int8" in load_search_space("qwen2.5-coder-1.5b").weights


def test_the_search_names_each_edge_of_the_space_its_best_sits_on():
    from draftnas.search.explain import space_edges
    from draftnas.search.records import CandidateChoice

    space = load_search_space("qwen2.5-coder-1.5b")  # depth 16-24, heads 4,096-98,304 and full, γ 1-10
    base = get_architecture("qwen2.5-coder-0.5b")
    inside = CandidateChoice(depth=20, vocab_size=32768, mlp_ratio=1.0, weights="int8")
    assert space_edges(space, inside, 4, base) == []
    assert space_edges(space, CandidateChoice(depth=24, vocab_size=0), 3, base) == []  # the base's own edges
    edges = space_edges(space, CandidateChoice(depth=16, vocab_size=98304, mlp_ratio=0.75), 10, base)
    assert edges == ["depth 16 is the least offered",
                     "head 98,304 rows is the largest reduced head offered, below the full 151,936",
                     "MLP ratio 0.75 is the lowest offered", "γ 10 is the most considered"]
    assert space_edges(space, CandidateChoice(depth=20, vocab_size=4096), 2, base) == [
        "head 4,096 rows is the smallest offered"]


def test_int4_needs_widths_its_groups_divide_and_a_head_fits_the_vocabulary():
    odd = get_architecture("smollm2-135m").with_shape(hidden_size=584)
    space = parse_search_space({**GOOD, "weights": ["dense", ["int8", "int8", "int4"]],
                                "vocab": {"sizes": ["full", 4096, 49152]}})
    assert space.weights == ("dense", "attn=int8,mlp=int8,head=int4")
    problems = space.problems_for_base(odd)
    assert any("weights: attn=int8,mlp=int8,head=int4 needs layer widths in multiples of 32" in p
               for p in problems)
    assert any("vocab.sizes: 49152 rows but base smollm2-135m's vocabulary has 49152" in p for p in problems)


def test_confidence_stops_are_read_with_no_stop_always_among_them_and_bad_ones_named():
    assert parse_search_space(GOOD).gamma.p_min == (0.0,)
    space = parse_search_space({**GOOD, "gamma": {"min": 1, "max": 6, "p_min": [0.7, 0.5]}})
    assert space.gamma.p_min == (0.0, 0.5, 0.7)
    with pytest.raises(SearchSpaceError, match=r"gamma.p_min\[1\]: 1.5 is out of range \(allowed: a number "
                                               r"in \[0, 0.99\]\)"):
        parse_search_space({**GOOD, "gamma": {"min": 1, "max": 6, "p_min": [0.5, 1.5]}})
    with pytest.raises(SearchSpaceError, match="gamma.p_min: 0.5 is not a list of confidence stops"):
        parse_search_space({**GOOD, "gamma": {"min": 1, "max": 6, "p_min": 0.5}})
