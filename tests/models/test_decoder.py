"""The static-cache decoder against transformers' LLaMA, and the step a CUDA graph replays."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.placement import activation_bytes
from draftnas.models.decoder import StaticDecoder
from draftnas.models.hf_head import CACHE_ARG
from draftnas.models.matmul import MatmulChooser
from draftnas.models.row_padding import choose_row_padding
from draftnas.models.static_step import StaticStep
from tests.helpers import TINY_ARCH, FactoryCounter, hf_family, hf_gemma, hf_llama, hf_qwen2


def _hf_logits(model: torch.nn.Module, context_k: torch.Tensor, context_v: torch.Tensor,
               new_ids: torch.Tensor) -> torch.Tensor:
    """transformers' eager step: a DynamicCache holding the context, then the new tokens."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i in range(context_k.shape[0]):
        cache.update(context_k[i].clone(), context_v[i].clone(), i)
    context = context_k.shape[3]
    positions = torch.arange(context, context + new_ids.shape[1])[None]
    with torch.no_grad():
        return model(input_ids=new_ids, position_ids=positions, **{CACHE_ARG: cache}).logits


@pytest.mark.parametrize("tied", [False, True])
def test_static_step_matches_transformers_and_does_not_drift(tied: bool) -> None:
    arch = TINY_ARCH.with_shape(tie_word_embeddings=tied)
    hf = hf_llama(arch)
    dec = StaticDecoder(arch, dtype=torch.float32, device="cpu").load_hf_weights(hf.state_dict()).eval()
    batch, context, new = 2, 7, 3
    gen = torch.Generator().manual_seed(1)
    shape = (arch.num_hidden_layers, batch, arch.num_key_value_heads, context, arch.head_dim)
    ctx_k, ctx_v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    new_ids = torch.randint(0, arch.vocab_size, (batch, new), generator=gen)
    expected = _hf_logits(hf, ctx_k, ctx_v, new_ids)

    cache = dec.new_cache(batch, context + new + 4)  # spare slots past the step stay masked out
    cache.keys[:, :, :, :context] = ctx_k
    cache.values[:, :, :, :context] = ctx_v
    positions = torch.arange(context, context + new)
    with torch.no_grad():
        step = StaticStep(dec, cache, new_ids, positions)
        first_keys = cache.keys.clone()
        for _ in range(5):  # the same step again and again, as timed repeats and graph replays run it
            logits = step().clone()
            torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
            assert torch.equal(cache.keys, first_keys)  # the same slots rewritten with the same values
    assert torch.equal(cache.keys[:, :, :, :context], ctx_k)  # context untouched
    assert torch.count_nonzero(cache.keys[:, :, :, context + new:]) == 0  # nothing written past the step


def test_gemma3_step_matches_transformers_with_sliding_window_and_softcap() -> None:
    hf = hf_gemma()
    dec = StaticDecoder.from_hf(hf)
    assert dec.spec.sliding_layers == (0, 2) and dec.spec.final_softcap == 30.0
    ids = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2, 33, 71]])  # longer than the window of 4
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        cache = dec.new_cache(1, 16)
        prefill = dec(ids[:, :7], torch.arange(7), cache)
        verify = dec(ids[:, 7:], torch.arange(7, 10), cache)
    torch.testing.assert_close(torch.cat([prefill, verify], dim=1), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_qwen2_step_matches_transformers_with_qkv_biases(tied: bool, dtype: torch.dtype, tol: float) -> None:
    hf = hf_qwen2(tied).to(dtype)
    dec = StaticDecoder.from_hf(hf)
    assert dec.spec.arch.family == "qwen2" and dec.spec.rope_theta == 1e6
    assert dec.layers[0].q_proj.bias is not None
    assert (dec.lm_head.weight is dec.embed_tokens.weight) == tied
    ids = torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2]])
    with torch.no_grad():
        expected = hf(input_ids=ids).logits.float()
        cache = dec.new_cache(1, 12)
        prefill = dec(ids[:, :5], torch.arange(5), cache)
        verify = dec(ids[:, 5:], torch.arange(5, 8), cache)
    got = torch.cat([prefill, verify], dim=1).float()
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol * 10)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_from_hf_keeps_a_reduced_draft_head() -> None:
    from draftnas.drafter.records import VocabSubset
    from draftnas.drafter.vocab import apply_vocab_subset

    hf = hf_llama(TINY_ARCH)
    full_logits = hf(input_ids=torch.tensor([[1, 2, 3]])).logits
    kept = (0, 5, 7, 50, 100)
    apply_vocab_subset(hf, VocabSubset(ids=kept, vocab_size=TINY_ARCH.vocab_size))
    dec = StaticDecoder.from_hf(hf)
    assert dec.head_rows == 5 and dec.embed_tokens.weight.shape[0] == TINY_ARCH.vocab_size
    with torch.no_grad():
        logits = dec(torch.tensor([[1, 2, 3]]), torch.arange(3), dec.new_cache(1, 3))
    torch.testing.assert_close(logits, full_logits[..., list(kept)], rtol=1e-4, atol=1e-4)


def test_both_matmul_forms_give_the_same_product_and_the_choice_is_kept() -> None:
    from draftnas.models.matmul import LINEAR, TRANSPOSED, WEIGHT_ONCE

    w, x = torch.randn(300, 40), torch.randn(2, 3, 40)
    expected = torch.nn.functional.linear(x, w)
    for form in (LINEAR, WEIGHT_ONCE, TRANSPOSED):  # each form forced, each the same product
        chooser = MatmulChooser(enabled=True, form={(6, 300, 40): form})
        torch.testing.assert_close(chooser(x, w), expected, rtol=1e-5, atol=1e-5)
        assert (id(w) in chooser.transposed) == (form == TRANSPOSED)
    timed = MatmulChooser(enabled=True, margin=10.0)  # any timing lets the fastest form win
    timed.register(w)
    torch.testing.assert_close(timed(x, w), expected, rtol=1e-5, atol=1e-5)
    assert timed.form[(6, 300, 40)] in (WEIGHT_ONCE, TRANSPOSED)
    assert (id(w) in timed.transposed) == (timed.form[(6, 300, 40)] == TRANSPOSED)  # unused copies dropped
    never = MatmulChooser(enabled=True, margin=0.0)
    never(x, w)
    assert never.form == {(6, 300, 40): LINEAR} and never.transposed == {}
    assert never.padded == {}
    for form in (LINEAR, WEIGHT_ONCE, TRANSPOSED):  # an odd row count computed with one padded row, dropped
        padded = MatmulChooser(enabled=True, form={(3, 300, 40): form}, padded={(3, 300, 40): 4})
        three = torch.randn(1, 3, 40)
        expected3 = torch.nn.functional.linear(three, w)
        torch.testing.assert_close(padded(three, w), expected3, rtol=1e-5, atol=1e-5)
    odd = MatmulChooser(enabled=True, margin=10.0)
    odd(torch.randn(3, 40), w)
    assert odd.padded.get((3, 300, 40), 3) in (3, 4)  # timed: padded or not, never anything else
    chained = torch.mm(torch.randn(40, 40), torch.randn(40, 6)).T.reshape(2, 3, 40)  # a transposed view,
    for form in (WEIGHT_ONCE, TRANSPOSED):  # as a weight-once product returns it, gives the same product
        viewed = MatmulChooser(enabled=True, form={(6, 300, 40): form})
        torch.testing.assert_close(viewed(chained, w), torch.nn.functional.linear(chained, w),
                                   rtol=1e-5, atol=1e-5)
    many = torch.randn(40, 40)  # more rows than the other forms are ever tried for
    torch.testing.assert_close(timed(many, w), torch.nn.functional.linear(many, w))
    assert (40, 300, 40) not in timed.form


def test_a_padded_linear_product_multiplies_two_rows_for_one_and_keeps_the_first() -> None:
    """F.linear over one row ran slower than over two in some processes on the Zen 5 host: the
    chooser may pad a lone row, and must then drop the padding's output."""
    from draftnas.models.matmul import LINEAR

    w, x = torch.randn(300, 40), torch.randn(1, 1, 40)
    real, rows = torch.nn.functional.linear, []

    def counting(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        rows.append(a.shape[0])
        return real(a, b)

    chooser = MatmulChooser(enabled=True, form={(1, 300, 40): LINEAR}, padded={(1, 300, 40): 2})
    with mock.patch("draftnas.models.matmul.F.linear", side_effect=counting):
        out = chooser(x, w)
    assert rows == [2] and out.shape == (1, 1, 300)
    torch.testing.assert_close(out, real(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("padded_cost", "kept"), [(0.01, True), (-0.10, True), (0.05, False)])
def test_row_padding_is_kept_unless_it_costs_more_than_the_tolerance(padded_cost: float, kept: bool) -> None:
    decoder = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cpu", max_positions=64).init_random(0)
    decoder.matmul.margin = 0.0
    clock = [0.0]

    def fake_clock() -> float:  # each reading advances by one step's time, padded or not
        clock[0] += 1.0 + (padded_cost if decoder.matmul.padded else 0.0)
        return clock[0]

    with mock.patch("draftnas.models.row_padding.time.perf_counter", side_effect=fake_clock):
        assert choose_row_padding(decoder, steps=2, rounds=3, tolerance=0.02) is kept
    assert bool(decoder.matmul.padded) is kept


def test_row_padding_is_timed_on_whole_steps_and_changes_no_logit() -> None:
    decoder = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cpu", max_positions=64).init_random(0)
    decoder.matmul.margin = 0.0  # every product stays F.linear, so each one-row product is a candidate
    kept = choose_row_padding(decoder, steps=2, rounds=2)
    singles = decoder.matmul.single_rows()
    assert singles  # the one-row products were chosen while timing, and are the ones it toggles
    assert all((decoder.matmul.padded.get(k) == 2) == kept for k in singles)
    ids, cache = torch.tensor([[3, 1, 4]]), decoder.new_cache(1, 8)
    decoder(ids, torch.arange(3), cache)
    outs = []
    for padded in (False, True):
        decoder.matmul.pad_single_rows(padded)
        outs.append(decoder(torch.tensor([[5]]), torch.tensor([3]), cache))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    on_gpu_or_linear = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cpu", matmul="linear")
    assert choose_row_padding(on_gpu_or_linear) is False  # nothing chosen by timing: nothing to pad
    int8 = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cpu", max_positions=64).init_random(0)
    int8.quantize_weights()
    assert choose_row_padding(int8) is False and int8.matmul.form == {}  # every product int8: not even a step


def test_prepare_times_every_registered_shape_up_front_and_later_products_time_nothing() -> None:
    a, b, c = torch.randn(300, 40), torch.randn(300, 40), torch.randn(40, 300)
    chooser = MatmulChooser(enabled=True)
    for w in (a, b, c):
        chooser.register(w)
    chooser.prepare([2, 1, 2, 0, 17])  # 0 and 17 (above the weight-once limit) are never timed
    assert set(chooser.form) == {(n, *shape) for n in (1, 2) for shape in ((300, 40), (40, 300))}
    spent = chooser.timing_s
    assert spent > 0
    for rows in (1, 2):
        x = torch.randn(rows, 40)
        torch.testing.assert_close(chooser(x, b), torch.nn.functional.linear(x, b), rtol=1e-5, atol=1e-5)
    assert chooser.timing_s == spent  # chosen beforehand: no timing inside these products
    chooser(torch.randn(3, 40), a)  # a new row count is timed on its first product, as before
    assert (3, 300, 40) in chooser.form and chooser.timing_s > spent
    off = MatmulChooser(enabled=False)
    off.register(a)
    off.prepare([1, 2])
    assert off.form == {} and off.timing_s == 0.0


def test_moving_the_decoder_moves_its_rope_tables() -> None:
    """`.to()` carries every tensor a step reads (the rope tables once stayed behind, so a decoder
    built on the CPU and moved to CUDA failed its first forward)."""
    decoder = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cpu", max_positions=16).init_random(0)
    ids, positions = torch.tensor([[1, 2, 3]]), torch.arange(3)
    before = decoder(ids, positions, decoder.new_cache(1, 16))
    moved = decoder.to(torch.float64)
    assert {t.dtype for t in (moved.rope_global_cos, moved.rope_global_sin, moved.rope_local_cos,
                              moved.rope_local_sin)} == {torch.float64}
    after = moved(ids, positions, moved.new_cache(1, 16))
    assert after.dtype == torch.float64 and torch.allclose(after.float(), before, atol=1e-4)
    assert not any(name.startswith("rope_") for name in moved.state_dict())  # not saved with the weights


def test_a_shorter_prefix_of_layers_equals_a_model_of_that_depth() -> None:
    hf = hf_llama(TINY_ARCH)
    full = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cpu").load_hf_weights(hf.state_dict())
    short_arch = TINY_ARCH.with_shape(num_hidden_layers=2)
    state = {k: v for k, v in hf.state_dict().items() if ".layers.2." not in k}
    short = StaticDecoder(short_arch, dtype=torch.float32, device="cpu").load_hf_weights(state)
    ids, pos = torch.tensor([[5, 6]]), torch.tensor([0, 1])
    with torch.no_grad():
        a = full(ids, pos, full.new_cache(1, 4, layers=2), layers=2)
        b = short(ids, pos, short.new_cache(1, 4))
    torch.testing.assert_close(a, b)


def test_decoding_token_by_token_equals_one_verify_pass() -> None:
    dec = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cpu").init_random(seed=3)
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        one_pass = dec(ids, torch.arange(5), dec.new_cache(1, 8))
        cache = dec.new_cache(1, 8)
        stepwise = torch.cat([dec(ids[:, i:i + 1], torch.tensor([i]), cache) for i in range(5)], dim=1)
    torch.testing.assert_close(one_pass, stepwise, rtol=1e-4, atol=1e-5)


def test_weights_of_the_wrong_shape_or_family_are_refused() -> None:
    dec = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cpu")
    state = dict(hf_llama(TINY_ARCH).state_dict())
    state["model.norm.weight"] = torch.ones(3)
    with pytest.raises(InvalidInputError, match="norm.weight: shape"):
        dec.load_hf_weights(state)
    with pytest.raises(InvalidInputError, match="miss"):
        dec.load_hf_weights({})
    with pytest.raises(InvalidInputError, match="static decoder builds llama, qwen2, gemma3"):
        StaticDecoder(TINY_ARCH.with_shape(family="opt"), dtype=torch.float32, device="cpu")


def test_activation_bytes_counts_the_logits_and_grows_with_tokens() -> None:
    small = activation_bytes(TINY_ARCH, 4, 1, 1, slots=16)
    assert small >= TINY_ARCH.vocab_size * 4  # the logits alone
    assert activation_bytes(TINY_ARCH, 4, 4, 5, slots=16) > 19 * small  # 20x the tokens, attention grows too
    assert activation_bytes(TINY_ARCH, 4, 1, 1, slots=16, head_rows=10) < small
    assert activation_bytes(TINY_ARCH, 4, 1, 1, slots=16, gpus=2) < small  # one rank's share


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_step_replays_to_the_eager_logits() -> None:
    dec = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cuda").init_random(seed=0)
    cache = dec.new_cache(2, 12)
    ids = torch.randint(0, TINY_ARCH.vocab_size, (2, 3), device="cuda")
    pos = torch.arange(6, 9, device="cuda")
    with torch.no_grad():
        eager = StaticStep(dec, cache, ids, pos)().clone()
        graph = StaticStep(dec, cache, ids, pos, capture=True)
        for _ in range(5):
            torch.testing.assert_close(graph().clone(), eager)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_a_step_creates_no_tensor_from_python_values_and_copies_nothing_from_the_host(family: str) -> None:
    """The rule CUDA-graph capture needs, checked on the CPU for every family: after the first call
    (which picks the CPU products), a step's forward makes no tensor factory call and no device copy."""
    hf = hf_family(family)
    dec = StaticDecoder.from_hf(hf, matmul="off")
    cache = dec.new_cache(1, 12)
    with torch.no_grad():
        step = StaticStep(dec, cache, torch.tensor([[3, 4, 5]]), torch.arange(4, 7))
        with FactoryCounter() as mode:
            step()
            step()
    assert mode.seen == [], f"{family}: {mode.seen}"


def test_an_int8_decoder_decodes_as_its_dense_twin_within_quantization_error() -> None:
    from tests.helpers import tiny_qwen2

    model = tiny_qwen2(seed=3, layers=3, vocab=96)
    dense = StaticDecoder.from_hf(model, max_positions=64)
    quantized = StaticDecoder.from_hf(model, max_positions=64).quantize_weights()
    assert len(quantized.matmul.packed) == 3 * 7 + 1  # every linear layer and the head
    ids = torch.tensor([[5, 17, 33, 2, 71, 9]])
    positions = torch.arange(6)
    with torch.inference_mode():
        a = dense(ids, positions, dense.new_cache(1, 16))
        b = quantized(ids, positions, quantized.new_cache(1, 16))
    assert not torch.equal(a, b)
    assert (a - b).abs().max() < 0.05 * a.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 5 / 6
    quantized.matmul.prepare([1, 2, 3])
    assert not quantized.matmul.form  # quantized shapes are never timed


def test_a_one_token_batch_with_an_odd_stride_is_multiplied_once_not_per_sequence():
    from draftnas.models.matmul import linear_2d

    weight = torch.randn(64, 32)
    x = torch.randn(1, 8, 32).transpose(0, 1)  # [8, 1, 32], its size-1 dimension's stride 8 x 32
    assert x.stride() == (32, 256, 1) and x.is_contiguous()
    chooser = MatmulChooser(enabled=True)
    chooser.register(weight)
    with torch.profiler.profile() as prof:
        out = chooser(x, weight)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::bmm" not in ops  # F.linear on this input copies the weight once per sequence
    with torch.profiler.profile() as plain:
        torch.nn.functional.linear(x, weight)
    assert "aten::bmm" in {e.key for e in plain.key_averages()}  # what the chooser avoids
    assert out.shape == (8, 1, 64) and torch.allclose(out, x @ weight.T, atol=1e-5)
    assert torch.allclose(linear_2d(x, weight), out)


def test_a_model_built_for_timing_reads_its_weights_in_place_of_their_transposed_copies() -> None:
    """The transposed form of a timing-only model multiplies by the weight's own memory read as [in, out]
    (no copy: the same bytes in the same order); a model whose outputs are read copies the transpose."""
    w = torch.randn(48, 32)
    x = torch.randn(3, 32)
    real, timed = MatmulChooser(enabled=True), MatmulChooser(enabled=True, timing_only=True)
    for chooser in (real, timed):
        chooser.register(w)
        chooser.form[(3, 48, 32)] = 2  # the transposed form, as if it had timed fastest
    torch.testing.assert_close(real(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
    assert real.transposed[id(w)].data_ptr() != w.data_ptr()
    out = timed(x, w)
    assert timed.transposed[id(w)].data_ptr() == w.data_ptr() and out.shape == (3, 48)
    torch.testing.assert_close(out, x @ w.view(32, 48), rtol=1e-5, atol=1e-5)
    decoder = StaticDecoder(TINY_ARCH, dtype=torch.float32, device="cpu", max_positions=16)
    assert decoder.init_random(0, timing_only=True).matmul.timing_only
    assert not decoder.init_random(0).matmul.timing_only


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_model_built_for_timing_quantizes_without_computing_its_values(kind: str) -> None:
    """A timing-only chooser takes a quantized weight's values from its bytes, in the layout the real
    quantization gives (the same kernels run on the same shapes), and multiplies a prompt by the weight
    itself where the real one keeps a dense copy of what its values stand for."""
    import draftnas.models.matmul as matmul

    w = torch.randn(64, 96)
    real, timed = MatmulChooser(enabled=True), MatmulChooser(enabled=True, timing_only=True)
    real.quantize(w, kind)
    with mock.patch.object(matmul, f"quantize_{kind}", side_effect=AssertionError("computed")):
        timed.quantize(w, kind)
    for a, b in zip(real.packed[id(w)][1], timed.packed[id(w)][1], strict=True):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
    assert timed.dequantized[id(w)] is not None and timed.dequantized[id(w)].data_ptr() == w.data_ptr()
    x = torch.randn(1, 96)
    out = timed(x, w)
    assert out.shape == (1, 64) and bool(torch.isfinite(out).all())
