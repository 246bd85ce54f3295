"""Speculative decoding: greedy equals the target's greedy; the sampling rule is lossless in distribution."""

from __future__ import annotations

import pytest
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.models.engines import crop_cache
from draftnas.models.speculative import _accept, greedy_generate, speculative_generate
from tests.helpers import tiny_llama, truncated

# chi-square critical values at significance 0.001 (df -> value), so a correct rule fails 1 run in 1000
CHI2_CRIT_001 = {3: 16.27, 7: 24.32, 15: 37.70}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: faster on one thread


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.fixture(scope="module")
def pair(tiny_llama_config):
    target = tiny_llama(tiny_llama_config, initializer_range=0.2)
    return target, truncated(target, 2)


PROMPTS = [[1, 5, 9, 3, 7], [2, 4, 8, 16, 32, 64], [100, 3]]


@pytest.mark.parametrize("gamma", [0, 1, 3, 6])
def test_greedy_speculative_equals_target_greedy(pair, gamma):
    target, drafter = pair
    for prompt in PROMPTS:
        ref = greedy_generate(target, prompt, max_new_tokens=25)
        out = speculative_generate(target, drafter, prompt, gamma=gamma, max_new_tokens=25)
        assert out.tokens == ref
        assert len(out.tokens) == sum(out.accepted) + out.steps  # k accepted + 1 target token per step
        assert all(0 <= a <= d <= gamma for a, d in zip(out.accepted, out.drafted, strict=True))


def test_greedy_with_some_rejections_and_a_perfect_drafter(pair):
    target, drafter = pair
    out = speculative_generate(target, drafter, PROMPTS[0], gamma=3, max_new_tokens=25)
    assert 0 < sum(out.accepted) < sum(out.drafted)  # the test exercises rollback
    same = speculative_generate(target, target, PROMPTS[0], gamma=3, max_new_tokens=25)
    assert same.tokens == out.tokens and sum(same.accepted) == sum(same.drafted)
    assert same.tokens_per_step > out.tokens_per_step


def test_eos_stops_and_is_kept(pair):
    target, drafter = pair
    ref = greedy_generate(target, PROMPTS[1], max_new_tokens=25)
    eos = ref[10]
    first = ref.index(eos)
    out = speculative_generate(target, drafter, PROMPTS[1], gamma=4, max_new_tokens=25, eos_token_ids=[eos])
    assert out.tokens == ref[:first + 1]
    assert greedy_generate(target, PROMPTS[1], max_new_tokens=25, eos_token_ids=[eos]) == out.tokens


def test_vocab_subset_drafter_stays_lossless(pair):
    target, drafter = pair
    ref = greedy_generate(target, PROMPTS[0], max_new_tokens=20)
    subset = sorted(set(range(0, 128, 2)) | set(ref[:5]))
    out = speculative_generate(target, drafter, PROMPTS[0], gamma=3, max_new_tokens=20, vocab_subset=subset)
    assert out.tokens == ref
    hopeless = speculative_generate(target, drafter, PROMPTS[0], gamma=3, max_new_tokens=20,
                                      vocab_subset=[t for t in range(128) if t not in set(ref)])
    assert hopeless.tokens == ref and sum(hopeless.accepted) == 0  # nothing it can draft is right


def test_crop_cache_drops_the_tail():
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 7, 4), torch.zeros(1, 2, 7, 4), 0)
    crop_cache(cache, 4)
    assert cache.get_seq_length() == 4
    crop_cache(cache, 9)
    assert cache.get_seq_length() == 4


def test_rejection_rule_emits_the_target_distribution():
    """One step's first emitted token is distributed as p, whatever q is (a test that can fail)."""
    gen = torch.Generator().manual_seed(1234)
    p = torch.tensor([0.5, 0.25, 0.15, 0.10])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = torch.log(torch.stack([p, p]))  # target logits at temperature 1 for [draft, bonus]
    counts = torch.zeros(4)
    drafted = torch.zeros(4)
    for _ in range(2500):
        x = int(torch.multinomial(q, 1, generator=gen))
        drafted[x] += 1
        k, nxt = _accept(logits, [x], [q], 1.0, gen)
        counts[x if k == 1 else nxt] += 1
    assert chi_square(counts, p) < CHI2_CRIT_001[3]
    assert chi_square(drafted, p) > CHI2_CRIT_001[3]  # the statistic has the power to see q != p


def test_speculative_sampling_matches_the_targets_joint_distribution():
    """The first two tokens of the full loop (gamma 2, vocab 4) follow the target's p(x1) and p(x2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=4, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         max_position_embeddings=32, initializer_range=0.5, tie_word_embeddings=True)
    torch.manual_seed(3)
    target = LlamaForCausalLM(config).eval()
    drafter = truncated(target, 1)
    prompt = [1, 2]
    with torch.inference_mode():
        p1 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1], -1)
        p2 = torch.stack([torch.softmax(target(torch.tensor([prompt + [x]])).logits[0, -1], -1)
                          for x in range(4)])
        q1 = torch.softmax(drafter(torch.tensor([prompt])).logits[0, -1], -1)
    second = (p1[:, None] * p2).sum(0)  # marginal of x2: sum over x1 of p(x1) p(x2 | x1)
    assert (p1 - q1).abs().max() > 0.05  # the drafter really differs from the target
    gen = torch.Generator().manual_seed(7)
    first, then = torch.zeros(4), torch.zeros(4)
    for _ in range(800):
        out = speculative_generate(target, drafter, prompt, gamma=2, max_new_tokens=3, temperature=1.0,
                                   generator=gen)
        first[out.tokens[0]] += 1
        then[out.tokens[1]] += 1
    assert chi_square(first, p1) < CHI2_CRIT_001[3]
    assert chi_square(then, second) < CHI2_CRIT_001[3]
    assert chi_square(first, q1) > CHI2_CRIT_001[3]  # the drafter's own distribution is told apart


def _static(model, slots: int = 64, capture: bool = False):
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.engines import StaticEngine

    return StaticEngine(StaticDecoder.from_hf(model), slots, capture=capture)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_the_static_engine_loop_equals_the_target_greedy_and_the_hf_loop(pair, gamma):
    target, drafter = pair
    t_engine, d_engine = _static(target), _static(drafter)
    for prompt in PROMPTS:  # one engine pair reused across prompts, as bench does
        ref = greedy_generate(target, prompt, max_new_tokens=25)
        hf = speculative_generate(target, drafter, prompt, gamma=gamma, max_new_tokens=25)
        out = speculative_generate(t_engine, d_engine, prompt, gamma=gamma, max_new_tokens=25)
        assert out.tokens == ref == greedy_generate(t_engine, prompt, max_new_tokens=25)
        assert out.accepted == hf.accepted and out.drafted == hf.drafted  # same drafts, same verdicts


def test_the_static_engine_keeps_a_reduced_draft_head_lossless(pair):
    from draftnas.drafter.records import VocabSubset
    from draftnas.drafter.vocab import apply_vocab_subset
    from tests.helpers import truncated

    target, drafter = pair
    ref = greedy_generate(target, PROMPTS[0], max_new_tokens=20)
    subset = sorted(set(range(0, 128, 2)) | set(ref[:5]))
    small = apply_vocab_subset(truncated(drafter, 2), VocabSubset(ids=tuple(subset), vocab_size=128))
    engine = _static(small)
    assert engine.decoder.head_rows == len(subset)
    out = speculative_generate(_static(target), engine, PROMPTS[0], gamma=3, max_new_tokens=20,
                               vocab_subset=subset)
    hf = speculative_generate(target, drafter, PROMPTS[0], gamma=3, max_new_tokens=20, vocab_subset=subset)
    assert out.tokens == ref and out.accepted == hf.accepted


def test_sampling_through_static_engines_matches_the_hf_loop_draw_for_draw(pair):
    target, drafter = pair
    hf = speculative_generate(target, drafter, PROMPTS[1], gamma=3, max_new_tokens=20, temperature=0.8,
                              generator=torch.Generator().manual_seed(5))
    out = speculative_generate(_static(target), _static(drafter), PROMPTS[1], gamma=3, max_new_tokens=20,
                               temperature=0.8, generator=torch.Generator().manual_seed(5))
    assert out.tokens == hf.tokens and out.accepted == hf.accepted


def test_greedy_decode_reports_margins_and_a_too_long_sequence_is_refused(pair):
    from draftnas.core.errors import InvalidInputError
    from draftnas.models.speculative import greedy_decode

    target, _ = pair
    out = greedy_decode(target, PROMPTS[0], max_new_tokens=10)
    assert len(out.margins) == len(out.tokens) == 10 and all(m >= 0 for m in out.margins)
    with pytest.raises(InvalidInputError, match="longer than the engine's cache"):
        greedy_decode(_static(target, slots=8), PROMPTS[0], max_new_tokens=10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_engines_on_cuda_equal_eager_ones(pair):
    import copy

    target, drafter = (copy.deepcopy(m).to("cuda") for m in pair)
    eager = speculative_generate(_static(target), _static(drafter), PROMPTS[0], gamma=3, max_new_tokens=25)
    t_graph, d_graph = _static(target, capture=True), _static(drafter, capture=True)
    for prompt in (PROMPTS[0], PROMPTS[1], PROMPTS[0]):  # later runs replay graphs captured earlier
        graph = speculative_generate(t_graph, d_graph, prompt, gamma=3, max_new_tokens=25)
        assert graph.tokens == greedy_generate(target, prompt, max_new_tokens=25)
    assert graph.tokens == eager.tokens and graph.accepted == eager.accepted
    assert set(t_graph.steps) >= {4} and set(d_graph.steps) >= {1}


class _ScalarReads:
    """Counts the host reading a device scalar (`int(t)`, `t.item()`) inside the block."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default):
                    outer.count += 1
                return func(*args, **(kwargs or {}))

        self.count, self.mode = 0, Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


@pytest.mark.parametrize("engines", ["hf", "static"])
def test_a_greedy_step_is_read_by_the_host_once(pair, engines):
    """Drafts, verify input and acceptance stay on the device: one tensor read per step, no scalar read."""
    target, drafter = pair if engines == "hf" else (_static(m) for m in pair)
    subset = list(range(0, 128, 2))
    with _ScalarReads() as reads:
        out = speculative_generate(target, drafter, PROMPTS[0], gamma=3, max_new_tokens=25,
                                   vocab_subset=subset)
    assert out.host_reads == out.steps > 1 and reads.count == 0
    assert out.tokens == greedy_generate(pair[0], PROMPTS[0], max_new_tokens=25)
    with _ScalarReads() as reads:  # the counter sees scalar reads where there are some: sampling's draws
        sampled = speculative_generate(target, drafter, PROMPTS[0], gamma=3, max_new_tokens=8,
                                       temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert reads.count >= sampled.steps and sampled.host_reads > sampled.steps


def test_an_int8_drafter_with_bf16_activations_beside_an_fp32_target_stays_lossless(pair):
    """The mix an AVX2 host needs (int8 products are fast there with bf16 activations only): the
    drafter's dtype is its own, the target verifies in fp32, greedy output is the target's."""
    import copy

    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.engines import StaticEngine

    target, drafter = pair
    t_engine = _static(target)
    d_decoder = StaticDecoder.from_hf(copy.deepcopy(drafter).to(torch.bfloat16), max_positions=96)
    d_decoder.quantize_weights()
    d_engine = StaticEngine(d_decoder, 96)
    assert d_decoder.dtype == torch.bfloat16 and t_engine.decoder.dtype == torch.float32
    for prompt in PROMPTS:
        out = speculative_generate(t_engine, d_engine, prompt, gamma=3, max_new_tokens=25)
        assert out.tokens == greedy_generate(target, prompt, max_new_tokens=25)


@pytest.mark.parametrize("engines", ["hf", "static"])
def test_a_confidence_stop_drafts_fewer_tokens_and_stays_lossless(pair, engines):
    """With p_min a step stops after the first draft the drafter gives less than p_min (that draft still
    goes to the verify): fewer drafts than gamma where the drafter is unsure, the target's output as is,
    and the stop is where the drafter's own probabilities say."""
    target, drafter = pair if engines == "hf" else (_static(m) for m in pair)
    ref = greedy_generate(pair[0], PROMPTS[0], max_new_tokens=25)
    fixed = speculative_generate(target, drafter, PROMPTS[0], gamma=6, max_new_tokens=25)
    stopped = speculative_generate(target, drafter, PROMPTS[0], gamma=6, max_new_tokens=25, p_min=0.999)
    assert fixed.tokens == stopped.tokens == ref
    assert all(1 <= d <= 6 for d in stopped.drafted[:-1])
    assert sum(stopped.drafted) < sum(fixed.drafted)
    assert stopped.host_reads == stopped.steps + sum(stopped.drafted)  # one read per draft for the stop
    # the first step's drafts: greedy from the prompt, stopping after the first below p_min
    with torch.inference_mode():
        seq, expected = list(PROMPTS[0]), 0
        for _ in range(6):
            probs = torch.softmax(pair[1](torch.tensor([seq])).logits[0, -1].float(), -1)
            expected += 1
            if float(probs.max()) < 0.999:
                break
            seq.append(int(probs.argmax()))
    assert stopped.drafted[0] == expected


def test_a_confidence_stop_is_greedy_and_below_one(pair):
    target, drafter = pair
    with pytest.raises(InvalidInputError, match="p_min"):
        speculative_generate(target, drafter, PROMPTS[0], gamma=3, max_new_tokens=5, p_min=0.5,
                             temperature=1.0)
    with pytest.raises(InvalidInputError, match="p_min"):
        speculative_generate(target, drafter, PROMPTS[0], gamma=3, max_new_tokens=5, p_min=1.0)
