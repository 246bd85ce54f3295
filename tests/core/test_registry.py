from __future__ import annotations

import pytest

from draftnas.core.errors import UnknownTargetError
from draftnas.core.registry import Architecture, get_architecture, load_registry


def test_llama_65b_shape_and_params():
    a = get_architecture("llama-65b")
    assert (a.num_hidden_layers, a.hidden_size, a.num_attention_heads) == (80, 8192, 64)
    # 80 * (4*8192^2 + 3*8192*22016 + 2*8192) + 2*32000*8192 + 8192
    assert a.count_parameters() == 80 * (4 * 8192**2 + 3 * 8192 * 22016 + 2 * 8192) \
        + 2 * 32000 * 8192 + 8192
    assert 65.2e9 < a.count_parameters() < 65.3e9


@pytest.mark.parametrize("name,expected,tol", [
    ("llama-7b", 6.74e9, 0.01), ("smollm2-135m", 134.5e6, 0.01), ("opt-125m", 125.2e6, 0.01),
    ("qwen2.5-0.5b", 494e6, 0.01), ("gemma-3-270m", 268e6, 0.01), ("mistral-7b", 7.24e9, 0.01),
])
def test_parameter_counts_match_published(name, expected, tol):
    assert get_architecture(name).count_parameters() == pytest.approx(expected, rel=tol)


def test_registry_covers_issue_list():
    names = set(load_registry())
    for n in ["llama-13b", "llama-33b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b",
              "opt-66b", "vicuna-33b", "qwen2.5-72b", "smollm2-1.7b", "gemma-3-27b",
              "wide-sheared-llama-1l", "wide-sheared-llama-3l", "wide-sheared-llama-5l"]:
        assert n in names
    for a in load_registry().values():
        assert a.problems() == [], a.name


def test_unknown_name_suggests():
    with pytest.raises(UnknownTargetError, match="llama-65b"):
        get_architecture("llama-65")


def test_round_trip_and_hf_config(tiny_llama_config):
    a = get_architecture("llama-2-70b")
    assert Architecture.from_dict(a.to_dict()) == a
    t = Architecture.from_hf_config(tiny_llama_config, name="tiny")
    assert (t.num_key_value_heads, t.head_dim, t.tie_word_embeddings) == (2, 8, True)


def test_matches_real_module_parameter_count(tiny_llama_config):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_llama_config)
    arch = Architecture.from_hf_config(tiny_llama_config)
    assert arch.count_parameters() == sum(p.numel() for p in model.parameters())


def test_parameters_with_a_reduced_draft_head():
    """A reduced head is untied from the full input embedding: a tied base gains its rows, an untied
    base swaps its full head for them."""
    from dataclasses import replace

    from draftnas.core.registry import get_architecture

    smol = get_architecture("smollm2-135m")
    assert smol.tie_word_embeddings
    assert smol.parameters_with_head(None) == smol.count_parameters()
    assert smol.parameters_with_head(4096) == smol.count_parameters() + 4096 * 576
    untied = replace(smol, tie_word_embeddings=False)
    assert untied.parameters_with_head(4096) == untied.count_parameters() - (49152 - 4096) * 576
