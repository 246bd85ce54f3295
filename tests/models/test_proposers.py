"""The proposer seam: any `Proposer` runs through the one loop losslessly, a proposer that reads the target's
hidden states gets those of the rows the target verified (the same from both engines), and point-mass
drafts (lookup's) keep a sampled run distributed as the target."""

from __future__ import annotations

import pytest
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.models.engines import HFEngine, StaticEngine
from draftnas.models.proposers import Proposal
from draftnas.models.speculative import _accept, greedy_generate, speculate
from tests.helpers import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [1, 5, 9, 3, 7]


class Scripted:
    """Drafts the target's own continuation (from a reference list) with every third draft wrong, and
    records the hidden states it is given."""

    drafts_at_prefill = True

    def __init__(self, reference: list[int], prompt_length: int, layers: tuple[int, ...] = ()) -> None:
        self.reference, self.prompt_length, self.hidden_layers = reference, prompt_length, layers
        self.seen: list[torch.Tensor] = []
        self.rollbacks: list[int] = []

    def reset(self, prompt_ids):
        self.seen, self.rollbacks = [], []

    def propose(self, seq, limit, *, temperature=0.0, generator=None):
        done = len(seq) - self.prompt_length
        drafts = list(self.reference[done:done + limit])
        if len(drafts) >= 3:
            drafts[2] = (drafts[2] + 1) % 128
        return Proposal(torch.tensor(drafts, dtype=torch.long), [None] * len(drafts))

    def rollback(self, length):
        self.rollbacks.append(length)

    def observe(self, hidden):
        self.seen.append(hidden)


@pytest.fixture(scope="module")
def target(tiny_llama_config):
    return tiny_llama(tiny_llama_config, initializer_range=0.2)


def test_a_proposer_runs_through_the_loop_losslessly_and_is_told_what_stood(target):
    ref = greedy_generate(target, PROMPT, max_new_tokens=20)
    proposer = Scripted(ref, len(PROMPT))
    out = speculate(target, proposer, PROMPT, gamma=4, max_new_tokens=20)
    assert out.tokens == ref
    assert 0 < sum(out.accepted) < sum(out.drafted)  # the wrong third draft is rejected every full step
    # after each step the sequence's prompt, earlier tokens and this step's accepted drafts stand
    stood = [len(PROMPT) + sum(out.accepted[:i]) + i + out.accepted[i] for i in range(out.steps)]
    assert proposer.rollbacks == stood


@pytest.mark.parametrize("layers", [(0, 2), (1,)])
def test_hidden_states_reach_the_proposer_for_the_verified_rows_from_either_engine(target, layers):
    from draftnas.models.decoder import StaticDecoder

    ref = greedy_generate(target, PROMPT, max_new_tokens=12)
    hf, static = Scripted(ref, len(PROMPT), layers), Scripted(ref, len(PROMPT), layers)
    out = speculate(HFEngine(target), hf, PROMPT, gamma=3, max_new_tokens=12)
    again = speculate(StaticEngine(StaticDecoder.from_hf(target), 64), static, PROMPT, gamma=3,
                      max_new_tokens=12)
    assert out.tokens == again.tokens == ref
    hidden = target.config.hidden_size
    # every row the target read: the first step reads the prompt and its drafts, later ones the last token
    # and theirs
    rows = [len(PROMPT) + out.drafted[0]] + [d + 1 for d in out.drafted[1:]]
    assert [h.shape for h in hf.seen] == [(len(layers), r, hidden) for r in rows]
    for a, b in zip(hf.seen, static.seen, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # the first step's rows are the prompt and the drafts: the model's own hidden states
    first = hf.propose(list(PROMPT), out.drafted[0]).tokens.tolist()
    ids = torch.tensor([PROMPT + first])
    with torch.no_grad():
        states = target(input_ids=ids, output_hidden_states=True).hidden_states
    want = torch.stack([states[i][0] for i in layers])
    torch.testing.assert_close(hf.seen[0], want, atol=1e-4, rtol=1e-4)


def test_a_layer_outside_the_target_is_one_line(target):
    ref = greedy_generate(target, PROMPT, max_new_tokens=4)
    count = target.config.num_hidden_layers
    with pytest.raises(InvalidInputError, match=f"layer {count + 1} is outside the target"):
        speculate(target, Scripted(ref, len(PROMPT), (count + 1,)), PROMPT, gamma=2, max_new_tokens=4)


def test_point_mass_drafts_keep_a_sampled_token_distributed_as_the_target():
    """A point-mass draft x is accepted with p(x), else the token is drawn from p without x: the token's
    law is p whatever x is (chi-square over 4000 draws)."""
    torch.manual_seed(0)
    logits = torch.tensor([[0.5, 1.5, -0.5, 0.0], [0.0, 0.0, 0.0, 0.0]])
    p = torch.softmax(logits[0], -1)
    generator = torch.Generator().manual_seed(3)
    counts = torch.zeros(4)
    for _ in range(4000):
        k, token = _accept(logits, [1], [None], 1.0, generator)
        counts[1 if k == 1 else token] += 1
    expected = p * counts.sum()
    assert float(((counts - expected) ** 2 / expected).sum()) < 16.27  # df 3 at significance 0.001
