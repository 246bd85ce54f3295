"""route_linears: a transformers model's linear layers through the chooser, same outputs, undone cleanly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from draftnas.models.linears import copy_weights, route_linears
from draftnas.models.matmul import LINEAR, TRANSPOSED, WEIGHT_ONCE
from tests.helpers import tiny_llama, truncated


@pytest.fixture(scope="module")
def tiny(tiny_llama_config):
    model = tiny_llama(tiny_llama_config, seed=1, initializer_range=0.2)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _greedy(model, ids, **kw):
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             **kw)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("form", [WEIGHT_ONCE, TRANSPOSED])
def test_routed_model_gives_the_same_logits_and_generation(tiny, form):
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.inference_mode():
        plain = tiny(ids).logits
    expected = _greedy(tiny, ids)
    routing = route_linears(tiny)
    # every small product takes `form` (odd row counts padded by one), whatever this host timed
    routing.chooser._time = lambda rows, weight: (form, rows + rows % 2)  # type: ignore[method-assign]
    try:
        assert all("forward" in vars(layer) for layer in routing.layers)
        with torch.inference_mode():
            torch.testing.assert_close(tiny(ids).logits, plain, rtol=1e-5, atol=1e-5)
        assert _greedy(tiny, ids) == expected
        chosen = routing.chosen()
        assert (5, 64, 32) in chosen and (1, 64, 32) in chosen  # prompt of 5 rows, then one token a step
        assert set(chosen.values()) == {"weight-once" if form == WEIGHT_ONCE else "transposed"}
        assert routing.chooser.padded[(5, 64, 32)] == 6
    finally:
        routing.detach()
    assert not any("forward" in vars(layer) for layer in routing.layers)
    with torch.inference_mode():
        torch.testing.assert_close(tiny(ids).logits, plain, rtol=0, atol=0)


def test_prefill_keeps_f_linear_and_routing_is_a_context(tiny):
    routing = route_linears(tiny, attach=False)
    assert not routing.attached and not any("forward" in vars(layer) for layer in routing.layers)
    with routing, torch.inference_mode():
        assert routing.attached
        tiny(torch.arange(40).unsqueeze(0))  # 40 rows: above the weight-once limit, never timed
    assert not routing.attached and routing.chosen() == {}
    assert route_linears(tiny, attach=False).layers == routing.layers  # nothing left marked


def test_a_row_count_is_timed_on_its_second_product_or_when_prepared(tiny):
    routing = route_linears(tiny)
    try:
        with torch.inference_mode():
            tiny(torch.arange(7).unsqueeze(0))  # a prefill of 7 rows, met once: F.linear, nothing timed
            assert routing.chosen() == {} and routing.chooser.timing_s == 0.0
            tiny(torch.arange(7).unsqueeze(0))  # met again: timed
        assert (7, 64, 32) in routing.chosen() and routing.chooser.timing_s > 0
        routing.prepare([2])
        assert {(2, 64, 32), (2, 32, 32), (2, 32, 64)} <= set(routing.chosen())
    finally:
        routing.detach()


def test_assisted_generation_with_both_models_routed_is_lossless(tiny):
    drafter = truncated(tiny, 2)
    ids = torch.tensor([[5, 6, 7, 8]])
    expected = _greedy(tiny, ids)
    with route_linears(tiny, attach=False) as target_routing, route_linears(drafter, attach=False):
        target_routing.chooser._time = lambda rows, weight: (WEIGHT_ONCE, rows)  # type: ignore[method-assign]
        assert _greedy(tiny, ids, assistant_model=drafter) == expected
        assert any(rows > 1 for rows, _, _ in target_routing.chosen())  # a multi-token verify was routed


def test_a_layer_two_routings_share_stays_with_the_one_that_routed_it():
    shared = nn.Linear(8, 8)
    a, b = nn.Sequential(shared, nn.Linear(8, 8)), nn.Sequential(shared, nn.Linear(8, 4))
    first, second = route_linears(a, attach=False), route_linears(b, attach=False)
    assert shared in first.layers and shared in second.layers
    first.attach()
    second.attach()
    routed_by_first = vars(shared)["forward"]
    second.detach()  # leaves the shared layer to the routing that routed it
    assert vars(shared)["forward"] is routed_by_first and "forward" not in vars(b[1])
    first.detach()
    assert "forward" not in vars(shared)


def test_layers_that_are_not_plain_linears_or_are_routed_already_are_left_alone():
    class Scaled(nn.Linear):
        def forward(self, x):  # a subclass with its own forward (e.g. a quantized layer)
            return 2 * super().forward(x)

    model = nn.Sequential(nn.Linear(8, 8), Scaled(8, 8), nn.Linear(8, 4))
    first = route_linears(model)
    assert first.layers == [model[0], model[2]]
    assert route_linears(model).layers == []  # a second routing does not wrap the first
    first.chooser._time = lambda rows, weight: (LINEAR, rows)  # type: ignore[method-assign]
    x = torch.randn(3, 8)
    routed = model(x)
    first.detach()
    torch.testing.assert_close(routed, model(x), rtol=0, atol=0)


def test_routing_copies_each_weight_once_into_own_memory_and_keeps_ties(tiny_llama_config):
    tiny = tiny_llama(tiny_llama_config, seed=2, initializer_range=0.2)  # its own: this test ties it
    tiny.lm_head.weight = tiny.model.embed_tokens.weight  # tied through one Parameter
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.inference_mode():
        plain = tiny(ids).logits
    q = tiny.model.layers[0].self_attn.q_proj.weight
    before = {"head": tiny.lm_head.weight.data_ptr(), "q": q.data_ptr()}
    kept = route_linears(tiny, own_weights=False)
    assert q.data_ptr() == before["q"]  # asked not to: the weights stay where they were
    kept.detach()
    routing = route_linears(tiny)
    try:
        assert q.data_ptr() != before["q"] and tiny.lm_head.weight.data_ptr() != before["head"]
        assert tiny.lm_head.weight is tiny.model.embed_tokens.weight  # still one Parameter
        with torch.inference_mode():
            torch.testing.assert_close(tiny(ids).logits, plain, rtol=1e-5, atol=1e-5)
    finally:
        routing.detach()
    a, b = nn.Linear(8, 8), nn.Linear(8, 8)
    b.weight = nn.Parameter(a.weight.data)  # two Parameters over one storage share one copy
    copy_weights([a.weight, b.weight])
    assert a.weight.data_ptr() == b.weight.data_ptr()


def test_int8_quantization_round_trips_within_half_a_step_per_row():
    from draftnas.models.matmul import quantize_int8

    torch.manual_seed(0)
    w = torch.randn(48, 32) * torch.linspace(0.01, 3.0, 48)[:, None]  # rows of very different scales
    values, scales = quantize_int8(w)
    assert values.dtype == torch.int8 and scales.shape == (48,)
    assert int(values.abs().max()) == 127  # each row's largest |w| maps to 127
    error = (values.float() * scales[:, None] - w).abs()
    assert bool((error <= scales[:, None] / 2 + 1e-6).all())


def test_int8_routing_multiplies_by_the_quantized_weights_at_any_row_count(tiny):
    from draftnas.models.matmul import quantize_int8

    layer = tiny.model.layers[0].mlp.up_proj
    x = torch.randn(1, 40, layer.in_features)  # 40 rows: past the limit where dense products keep F.linear
    values, scales = quantize_int8(layer.weight)
    expected = x @ (values.float() * scales[:, None]).T
    routing = route_linears(tiny, weights="int8", own_weights=False)
    try:
        with torch.inference_mode():
            got = layer(x)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        assert not torch.equal(got, x @ layer.weight.T)  # not the dense product
        with torch.inference_mode():
            ids = torch.tensor([[3, 14, 15, 92, 65]])
            routed = tiny(ids).logits
        routing.detach()
        with torch.inference_mode():
            dense = tiny(ids).logits
        # int8 weights move the logits a little, not the model
        assert (routed - dense).abs().max() < 0.05 * dense.abs().max()
    finally:
        routing.detach()


def test_int8_is_refused_where_products_are_not_chosen_here():
    from draftnas.core.errors import InvalidInputError
    from draftnas.models.matmul import MatmulChooser

    with pytest.raises(InvalidInputError, match="int8 weights run through draftnas's chosen products"):
        MatmulChooser(enabled=False).quantize(torch.zeros(4, 4))
