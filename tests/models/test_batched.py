"""The batched loop: sequences of different lengths decoded together, each equal to its own greedy output."""

from __future__ import annotations

import pytest
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.models.batched import BatchedStatic, batched_greedy, batched_speculative_generate, engines_for
from draftnas.models.decoder import StaticDecoder
from draftnas.models.engines import StaticEngine
from draftnas.models.speculative import greedy_generate, speculative_generate
from tests.helpers import FactoryCounter, hf_family, tiny_llama, truncated

PROMPTS = [[1, 5, 9, 3, 7], [2, 4, 8, 16, 32, 64, 11, 12, 13], [100, 3, 17], [40, 41, 42, 43]]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: faster on one thread


@pytest.fixture(scope="module")
def decoders(tiny_llama_config):
    target = tiny_llama(tiny_llama_config, initializer_range=0.2)
    return StaticDecoder.from_hf(target), StaticDecoder.from_hf(truncated(target, 1))


def _greedy(decoder: StaticDecoder, prompt: list[int], n: int, eos: tuple[int, ...] = ()) -> list[int]:
    return greedy_generate(StaticEngine(decoder, 64), prompt, max_new_tokens=n, eos_token_ids=eos)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_a_row_of_positions_per_sequence_equals_each_sequence_alone(family: str) -> None:
    hf = hf_family(family)
    dec = StaticDecoder.from_hf(hf, matmul="off")
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, dec.arch.vocab_size, (2, 3), generator=gen)
    starts = (2, 9)  # gemma3's tiny window is shorter than the second row's context
    context = [torch.randint(0, dec.arch.vocab_size, (1, s), generator=gen) for s in starts]
    together = dec.new_cache(2, 16)
    alone = [dec.new_cache(1, 16) for _ in starts]
    with torch.no_grad():
        for row, (ctx, cache) in enumerate(zip(context, alone, strict=True)):
            view = type(together)(together.keys[:, row:row + 1], together.values[:, row:row + 1])
            for c in (view, cache):
                dec(ctx, torch.arange(ctx.shape[1]), c)
        positions = torch.stack([torch.arange(s, s + 3) for s in starts])
        batched = dec(ids, positions, together)
        for row, (s, cache) in enumerate(zip(starts, alone, strict=True)):
            own = dec(ids[row:row + 1], torch.arange(s, s + 3), cache)[0]
            torch.testing.assert_close(batched[row], own, rtol=1e-5, atol=1e-5)
    with torch.no_grad(), FactoryCounter() as mode:  # the capture rule holds with a row per sequence too
        dec(ids, positions, together)
    assert mode.seen == []


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_each_sequence_equals_its_own_greedy_output(decoders, gamma):
    target, drafter = decoders
    expected = [_greedy(target, p, 20) for p in PROMPTS]
    t, d = engines_for(target, drafter, PROMPTS, 20, gamma)
    out = batched_speculative_generate(t, d, PROMPTS, gamma=gamma, max_new_tokens=20)
    assert out.tokens == expected
    assert out.host_reads == out.steps  # one read of the device per step
    accepted = [a for row in out.accepted for a in row]
    assert 0 < sum(accepted) < gamma * len(accepted), "the pair should accept some drafts and reject some"
    # one sequence alone through the one-sequence loop: the same drafts accepted step by step
    single = speculative_generate(StaticEngine(target, 64), StaticEngine(drafter, 64), PROMPTS[1],
                                  gamma=gamma, max_new_tokens=20)
    assert single.tokens == expected[1]
    plain = batched_greedy(BatchedStatic(target, len(PROMPTS), 64), PROMPTS, max_new_tokens=20)
    assert plain.tokens == expected and plain.steps == 20


def test_end_of_sequence_and_a_reduced_head_keep_each_sequence_lossless(decoders, tiny_llama_config):
    target, _ = decoders
    expected = [_greedy(target, p, 16) for p in PROMPTS]
    cut = next(i for i, tok in enumerate(expected[0]) if i >= 4 and tok not in expected[0][:i])
    eos = expected[0][cut]  # ends the first sequence early (and any other that meets it)
    with_eos = [_greedy(target, p, 16, (eos,)) for p in PROMPTS]
    assert len(with_eos[0]) == cut + 1 < 16 and with_eos[0][-1] == eos
    # a drafter whose head holds only some rows, mapped back to full ids on the device
    hf = tiny_llama(tiny_llama_config, initializer_range=0.2)
    rows = sorted(set(range(0, 128, 3)) | set(expected[1][:4]))
    small = StaticDecoder.from_hf(truncated(hf, 2))
    small.lm_head.weight = torch.nn.Parameter(small.lm_head.weight[rows].clone())
    t, d = engines_for(target, small, PROMPTS, 16, 3)
    out = batched_speculative_generate(t, d, PROMPTS, gamma=3, max_new_tokens=16, eos_token_ids=(eos,),
                                       head_ids=torch.tensor(rows))
    assert out.tokens == with_eos
    assert sum(sum(a) for a in out.accepted) > 0


def test_bad_batches_are_refused_in_one_line(decoders):
    target, drafter = decoders
    t, d = engines_for(target, drafter, PROMPTS, 8, 2)
    with pytest.raises(InvalidInputError, match="fewer than 3 tokens"):
        batched_speculative_generate(t, d, [[1, 2]] * 4, gamma=2, max_new_tokens=8)
    with pytest.raises(InvalidInputError, match="4 prompts for an engine of batch 2"):
        batched_speculative_generate(BatchedStatic(target, 2, 64), d, PROMPTS, gamma=2, max_new_tokens=8)
    with pytest.raises(InvalidInputError, match="longer than the engine's cache"):
        batched_speculative_generate(t, d, PROMPTS, gamma=2, max_new_tokens=40)
    with pytest.raises(InvalidInputError, match="gamma must be >= 1"):
        batched_speculative_generate(t, d, PROMPTS, gamma=0, max_new_tokens=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_batched_steps_on_cuda_equal_eager_ones(decoders):
    import copy

    target, drafter = (copy.deepcopy(m).to("cuda") for m in decoders)
    eager = batched_speculative_generate(*engines_for(target, drafter, PROMPTS, 20, 3), PROMPTS, gamma=3,
                                         max_new_tokens=20)
    graph = batched_speculative_generate(*engines_for(target, drafter, PROMPTS, 20, 3, capture=True), PROMPTS,
                                         gamma=3, max_new_tokens=20)
    assert graph.tokens == eager.tokens
