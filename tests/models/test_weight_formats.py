"""int4 weights and per-layer weight formats: the quantizer, the packed product, which layers each format
reaches, and speculative decoding with such a drafter staying lossless in fp32."""

from __future__ import annotations

import copy

import pytest
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.models.records import (
    INT4_GROUP,
    format_kinds,
    linear_formats,
    quantized,
    weight_roles,
    weights_name,
    weights_suffix,
)
from draftnas.models.speculative import greedy_generate, speculative_generate
from tests.helpers import tiny_llama, truncated

pytestmark = pytest.mark.usefixtures("one_thread")
PER_LAYER = "attn=int8,mlp=int4,head=int4"
BANDED = "attn=int8/int4,mlp=int4/int8,head=int4"  # by halves of depth


def test_int4_quantization_round_trips_within_half_a_step_per_group():
    from draftnas.models.matmul import dequantize_int4, quantize_int4

    torch.manual_seed(0)
    w = torch.randn(48, 96) * torch.linspace(0.01, 3.0, 96)[None, :]  # groups of very different scales
    values, scales_zeros = quantize_int4(w)
    assert values.dtype == torch.int32 and int(values.min()) == 0 and int(values.max()) == 15
    assert scales_zeros.shape == (96 // INT4_GROUP, 48, 2)
    step = scales_zeros[..., 0].T.repeat_interleave(INT4_GROUP, dim=1)  # [48, 96]: each weight's group step
    assert bool(((dequantize_int4(values, scales_zeros) - w).abs() <= step / 2 + 1e-5).all())


def test_the_packed_int4_product_is_the_product_with_the_dequantized_weight():
    from draftnas.models.matmul import MatmulChooser, dequantize_int4, quantize_int4

    torch.manual_seed(1)
    w = torch.randn(80, 64)
    chooser = MatmulChooser(enabled=True)
    chooser.register(w)
    chooser.quantize(w, "int4")
    expected_w = dequantize_int4(*quantize_int4(w))
    for rows in (1, 3, 40):  # a decode, a verify, a prefill past the small-batch forms
        x = torch.randn(rows, 64)
        torch.testing.assert_close(chooser(x, w), x @ expected_w.T, rtol=1e-4, atol=1e-4)
    with pytest.raises(InvalidInputError, match="multiples of 32, not 40"):
        MatmulChooser(enabled=True).quantize(torch.zeros(8, 40), "int4")
    with pytest.raises(InvalidInputError, match="int4 weights run through draftnas's chosen products"):
        MatmulChooser(enabled=False).quantize(torch.zeros(8, 64), "int4")


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dense_won", [True, False])
def test_a_prompt_by_a_quantized_weight_runs_as_timed_and_multiplies_the_same_weight(kind, dense_won,
                                                                                     monkeypatch):
    from draftnas.models.matmul import MatmulChooser, dequantize_int4, pack_int4, quantize_int4, quantize_int8

    torch.manual_seed(2)
    w = torch.randn(80, 64)
    monkeypatch.setattr(MatmulChooser, "_time_many", lambda self, weights: dense_won)
    chooser = MatmulChooser(enabled=True)
    chooser.register(w)
    chooser.quantize(w, kind)
    assert id(w) in chooser.dequantized  # kept until the choice
    values, scales = quantize_int8(w) if kind == "int8" else quantize_int4(w)
    stands_for = values.float() * scales[:, None] if kind == "int8" else dequantize_int4(values, scales)
    prompt = torch.randn(40, 64)
    torch.testing.assert_close(chooser(prompt, w), prompt @ stands_for.T, rtol=1e-4, atol=1e-4)
    assert chooser.many_rows_dense == {(kind, 80, 64): dense_won}
    assert (id(w) in chooser.dequantized) is dense_won  # the copy is dropped where the kernel won
    one = torch.randn(1, 64)  # a decode runs the quantized kernel whichever way prompts run
    kernel = (torch._weight_int8pack_mm(one, values, scales) if kind == "int8"
              else torch._weight_int4pack_mm_for_cpu(one, pack_int4(w)[0], INT4_GROUP, scales))
    assert torch.equal(chooser(one, w), kernel)


def test_preparing_a_prompt_length_chooses_how_quantized_weights_read_it(monkeypatch):
    from draftnas.models.matmul import MatmulChooser

    timed: list[int] = []
    monkeypatch.setattr(MatmulChooser, "_time_many",
                        lambda self, weights: timed.append(len(weights)) or False)
    chooser = MatmulChooser(enabled=True)
    weights = [torch.randn(32, 64) for _ in range(3)]
    for w in weights:
        chooser.register(w)
        chooser.quantize(w, "int4")
    chooser.prepare([1, 2, 11])  # steps only: no prompt, nothing chosen
    assert chooser.many_rows_dense == {} and len(chooser.dequantized) == 3
    chooser.prepare([1, 44])
    assert timed == [3]  # once for the shape, over its three weights
    assert chooser.many_rows_dense == {("int4", 32, 64): False} and chooser.dequantized == {}


@pytest.mark.parametrize(("weights", "device", "dtype", "problem"), [
    ("int8", "cpu", "fp32", None),
    ("attn=int8,mlp=int4,head=int4", "cpu", "bf16", None),
    ("dense", "cuda", "fp32", None),
    ("Q8_0", "cuda", "bf16", None),  # llama.cpp's block types are not multiplied by torch
    ("int8", "cuda", "bf16", "int8 multiplies on the CPU only; on CUDA draftnas runs int4 or dense"),
    ("attn=dense,mlp=int8,head=int4", "cuda", "bf16", "int8 multiplies on the CPU only"),
    ("int4", "cuda", "fp32", "multiply bf16 activations only, not fp32: use --dtype bf16"),
    ("int4", "mps", "bf16", "on the CPU or CUDA only, not on mps"),
])
def test_where_each_weight_format_multiplies(weights, device, dtype, problem):
    from draftnas.models.records import weights_problem

    found = weights_problem(weights, device, dtype)
    assert (found is None) if problem is None else (problem in (found or ""))


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@needs_cuda
def test_the_cuda_int4_product_is_the_product_with_the_dequantized_weight():
    """`torch._weight_int4pack_mm` multiplies by exactly the weight `quantize_int4` stands for (the two
    values a byte, their order and the tiling right), at the widths the Qwen drafters use."""
    from draftnas.models.matmul import MatmulChooser, dequantize_int4, quantize_int4

    torch.manual_seed(2)
    for out_features, in_features in ((128, 896), (96, 4864), (256, 32), (64, 96)):
        w = (torch.randn(out_features, in_features) * 0.05).to("cuda", torch.bfloat16)
        chooser = MatmulChooser(enabled=False)
        chooser.quantize(w, "int4")
        expected_w = dequantize_int4(*quantize_int4(w)).to("cuda")
        for rows in (1, 4, 11, 40):
            x = torch.randn(rows, in_features, device="cuda").to(torch.bfloat16)
            got = chooser(x, w).float()
            want = x.float() @ expected_w.T
            scale = float(want.abs().max())
            assert float((got - want).abs().max()) <= 0.02 * scale, (out_features, in_features, rows)


@needs_cuda
def test_an_int4_decoder_on_cuda_decodes_as_its_dequantized_weights_and_replays_in_a_graph():
    """A static decoder in int4 on CUDA: its logits are the decoder's with the dequantized weights written
    in (bf16 sums apart), and a captured step replays to the eager one."""
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.matmul import dequantize_int4, quantize_int4
    from draftnas.models.static_step import StaticStep
    from tests.helpers import TINY_ARCH

    arch = TINY_ARCH.with_shape(hidden_size=128, intermediate_size=256, vocab_size=512)
    dec = StaticDecoder(arch, dtype=torch.bfloat16, device="cuda").init_random(seed=0).eval()
    ref = StaticDecoder(arch, dtype=torch.bfloat16, device="cuda").eval()
    ref.load_state_dict(dec.state_dict())
    with torch.no_grad():
        for module in ref.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(dequantize_int4(*quantize_int4(module.weight)).to(module.weight))
    dec.quantize_weights("int4")
    ids = torch.randint(0, arch.vocab_size, (1, 6), device="cuda")
    pos = torch.arange(6, device="cuda")
    with torch.no_grad():
        got = dec(ids, pos, dec.new_cache(1, 16)).float()
        want = ref(ids, pos, ref.new_cache(1, 16)).float()
        assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max())
        assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.8
        cache = dec.new_cache(1, 16)
        eager = StaticStep(dec, cache, ids[:, :3], pos[:3])().clone()
        graph = StaticStep(dec, cache, ids[:, :3], pos[:3], capture=True)
        for _ in range(3):
            torch.testing.assert_close(graph().clone(), eager)


@pytest.mark.parametrize(("text", "roles", "suffix"), [
    ("int4", {"attn": "int4", "mlp": "int4", "head": "int4"}, "-int4"),
    (PER_LAYER, {"attn": "int8", "mlp": "int4", "head": "int4"}, "-a8m4h4"),
    ("head=int4,attn=dense,mlp=int8", {"attn": "dense", "mlp": "int8", "head": "int4"}, "-adm8h4"),
    (BANDED, {"attn": "int8/int4", "mlp": "int4/int8", "head": "int4"}, "-a84m48h4"),
    ("attn=int8/int8,mlp=int4,head=int4", {"attn": "int8", "mlp": "int4", "head": "int4"}, "-a8m4h4"),
])
def test_a_weight_format_names_each_layer_groups_format(text, roles, suffix):
    assert weight_roles(text) == roles
    assert weights_suffix(weights_name(roles)) == suffix and quantized(text)
    assert weights_name({"attn": "int8", "mlp": "int8", "head": "int8"}) == "int8"  # uniform: one word


@pytest.mark.parametrize(("text", "message"), [
    ("int3", "use one of dense, int8, int4"),
    ("attn=int8,mlp=int4", "names attn, mlp: a per-layer format names each of attn, mlp, head"),
    ("attn=int8,attn=int4,head=dense", "use one of"),
    ("attn=int8,mlp=int8,head=int8/int4", "the head one"),
    ("attn=int8/int4/int8/int4/int8,mlp=int8,head=int4", "up to 4"),
])
def test_a_bad_weight_format_says_what_is_allowed(text, message):
    with pytest.raises(ValueError, match=message):
        weight_roles(text)


def test_a_per_layer_decoder_multiplies_each_group_in_its_format(tiny_llama_config):
    from draftnas.models.decoder import StaticDecoder

    decoder = StaticDecoder.from_hf(tiny_llama(tiny_llama_config), max_positions=32)
    decoder.quantize_weights(PER_LAYER)
    kinds = {kind for kind, _ in decoder.matmul.packed.values()}
    layer = decoder.layers[0]
    assert decoder.matmul.packed[id(layer.q_proj.weight)][0] == "int8"
    assert decoder.matmul.packed[id(layer.down_proj.weight)][0] == "int4"
    assert decoder.matmul.packed[id(decoder.lm_head.weight)][0] == "int4" and kinds == {"int8", "int4"}
    dense_head = StaticDecoder.from_hf(tiny_llama(tiny_llama_config), max_positions=32)
    dense_head.quantize_weights("attn=int4,mlp=int4,head=dense")
    assert id(dense_head.lm_head.weight) not in dense_head.matmul.packed


def test_bands_of_depth_split_the_layers_into_equal_parts():
    names = [f"model.layers.{i}.self_attn.q_proj" for i in range(6)]
    names += ["model.layers.5.mlp.up_proj", "lm_head"]
    kinds = linear_formats("attn=int8/dense/int4,mlp=int4/int8,head=dense", names)
    assert [kinds[n] for n in names[:6]] == ["int8", "int8", "dense", "dense", "int4", "int4"]
    assert kinds["model.layers.5.mlp.up_proj"] == "int8" and kinds["lm_head"] == "dense"
    assert format_kinds(BANDED) == {"int8", "int4"} and not quantized("attn=dense/dense,mlp=dense,head=dense")


def test_a_banded_decoder_and_routed_model_multiply_each_layer_in_its_bands_format(tiny_llama_config):
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.linears import route_linears

    model = tiny_llama(tiny_llama_config)  # 4 layers: 0-1 the first band, 2-3 the second
    decoder = StaticDecoder.from_hf(model, max_positions=32).quantize_weights(BANDED)
    routed = route_linears(model, weights=BANDED, own_weights=False, attach=False).chooser.packed
    for packed, layers in ((decoder.matmul.packed, decoder.layers),
                           (routed, [layer.self_attn for layer in model.model.layers])):
        assert [packed[id(layer.q_proj.weight)][0] for layer in layers] == ["int8", "int8", "int4", "int4"]
    assert [decoder.matmul.packed[id(layer.gate_proj.weight)][0] for layer in decoder.layers] == [
        "int4", "int4", "int8", "int8"]


def test_route_linears_gives_each_transformers_layer_its_groups_format(tiny_llama_config):
    from draftnas.models.linears import route_linears

    model = tiny_llama(tiny_llama_config)
    routing = route_linears(model, weights=PER_LAYER, own_weights=False, attach=False)
    packed = routing.chooser.packed
    layer = model.model.layers[1]
    assert packed[id(layer.self_attn.o_proj.weight)][0] == "int8"
    assert packed[id(layer.mlp.gate_proj.weight)][0] == "int4"
    assert packed[id(model.lm_head.weight)][0] == "int4"


@pytest.mark.parametrize("weights", ["int4", PER_LAYER, BANDED])
def test_an_int4_or_per_layer_drafter_stays_lossless_in_fp32(tiny_llama_config, weights):
    """The target decides every token: greedy output with such a drafter is the target's, exactly."""
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.engines import StaticEngine

    target = tiny_llama(tiny_llama_config, initializer_range=0.2)
    drafter = truncated(target, 2)
    t_engine = StaticEngine(StaticDecoder.from_hf(target, max_positions=96), 96)
    d_decoder = StaticDecoder.from_hf(copy.deepcopy(drafter), max_positions=96).quantize_weights(weights)
    d_engine = StaticEngine(d_decoder, 96)
    accepted = 0
    for prompt in ([1, 5, 9, 3, 7], [2, 4, 8, 16, 32, 64], [100, 3]):
        out = speculative_generate(t_engine, d_engine, prompt, gamma=3, max_new_tokens=25)
        assert out.tokens == greedy_generate(target, prompt, max_new_tokens=25)
        accepted += sum(out.accepted)
    assert accepted > 0  # the quantized drafter still drafts tokens the target keeps


@needs_cuda
def test_an_int4_drafter_on_cuda_stays_lossless_beside_an_fp32_target(tiny_llama_config):
    """CUDA's int4 kernel takes bf16 activations, so the drafter runs bf16 beside a target in fp32, both
    replayed from captured graphs: the greedy output is the target's own, exactly."""
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.engines import StaticEngine

    target = tiny_llama(tiny_llama_config, initializer_range=0.2).to("cuda")
    drafter = truncated(target, 2)
    t_engine = StaticEngine(StaticDecoder.from_hf(target, max_positions=96), 96, capture=True)
    d_decoder = StaticDecoder.from_hf(copy.deepcopy(drafter), dtype=torch.bfloat16, max_positions=96)
    d_engine = StaticEngine(d_decoder.quantize_weights("int4"), 96, capture=True)
    accepted = 0
    for prompt in ([1, 5, 9, 3, 7], [2, 4, 8, 16, 32, 64], [1, 5, 9, 3, 7]):  # the last replays its graphs
        out = speculative_generate(t_engine, d_engine, prompt, gamma=3, max_new_tokens=25)
        assert out.tokens == greedy_generate(target, prompt, max_new_tokens=25)
        accepted += sum(out.accepted)
    assert accepted > 0


@needs_cuda
def test_a_transformers_drafter_on_cuda_estimates_with_its_int4_products(tiny_llama_config):
    """`route_linears` on CUDA routes the layers a format quantizes (int4) and leaves the dense ones: the
    logits inside are those of the int4 products, and the model's own weights are as loaded after."""
    from draftnas.models.linears import route_linears
    from draftnas.models.matmul import dequantize_int4, quantize_int4

    model = tiny_llama(tiny_llama_config, initializer_range=0.2).to("cuda", torch.bfloat16)
    ids = torch.tensor([[1, 5, 9, 3]], device="cuda")
    with torch.no_grad():
        dense = model(ids).logits.float()
        reference = copy.deepcopy(model)
        for module in reference.model.layers.modules():
            if isinstance(module, torch.nn.Linear) and module.in_features % INT4_GROUP == 0:
                module.weight.copy_(dequantize_int4(*quantize_int4(module.weight)).to(module.weight))
        routing = route_linears(model, attach=False, own_weights=False,
                                weights="attn=int4,mlp=int4,head=dense")
        assert routing.layers and all(layer.weight.device.type == "cuda" for layer in routing.layers)
        assert model.lm_head not in routing.layers  # dense on CUDA: left as it is
        with routing:
            routed = model(ids).logits.float()
        want = reference(ids).logits.float()
        assert float((routed - want).abs().max()) <= 0.05 * float(want.abs().max())
        torch.testing.assert_close(model(ids).logits.float(), dense)  # unrouted again after
