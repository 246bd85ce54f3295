"""Acceptance estimator: step arithmetic with stub drafters of fixed logits, sampling bounds, subsets."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from draftnas.acceptance.estimate import estimate_acceptance
from draftnas.acceptance.steps import expected_steps, greedy_steps
from draftnas.core.errors import InvalidInputError, TraceError
from tests.helpers import AGREE, StubDrafter, V, bigram, make_traces


def test_all_accepted_gives_hand_computed_steps():
    est = estimate_acceptance(StubDrafter(bigram), make_traces([AGREE]), max_gamma=8)
    assert est.top1_agreement == 1.0 and est.n_positions == 12
    # 12 tokens, budget 12: gamma 1 -> 6 steps of 2; gamma 3 -> 4+4+4; gamma 5 -> 6, then
    # min(5, 12-6-1)=5 -> 6; gamma 8 -> 9, then min(8, 12-9-1)=2 -> 3: two steps.
    assert est.tokens_per_step["1"] == pytest.approx(2.0)
    assert est.tokens_per_step["3"] == pytest.approx(4.0)
    assert est.tokens_per_step["5"] == pytest.approx(6.0)
    assert est.tokens_per_step["8"] == pytest.approx(6.0)


def test_none_accepted_gives_one_token_per_step():
    never = StubDrafter(lambda ids: 10.0 * torch.nn.functional.one_hot((ids + 7) % V, V).float())
    est = estimate_acceptance(never, make_traces([AGREE]), max_gamma=4)
    assert est.top1_agreement == 0.0
    assert all(v == pytest.approx(1.0) for v in est.tokens_per_step.values())


def test_mismatch_at_position_k():
    cont = [1, 2, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2]  # position 2 breaks the chain, then it resumes
    est = estimate_acceptance(StubDrafter(bigram), make_traces([cont]), max_gamma=4)
    assert est.top1_agreement == pytest.approx(11 / 12)
    # gamma 4: [1,2]+9 | 10..13 + 14 | min(4, 12-8-1)=3 drafts -> 15,0,1 + 2: 3 steps
    assert est.tokens_per_step["4"] == pytest.approx(12 / 3)
    # gamma 2: [1,2]+9 | 10,11+12 | 13,14+15 | min(2, 2)=2 -> 0,1+2: 4 steps
    assert est.tokens_per_step["2"] == pytest.approx(12 / 4)
    # gamma 1: 12 tokens in 7 steps (1+2 ... the break costs one step)
    assert est.tokens_per_step["1"] == pytest.approx(12 / 7)


def test_per_domain_and_bootstrap_interval():
    cont_bad = [1, 2, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2]
    traces = make_traces([AGREE, AGREE, cont_bad, cont_bad], domains=["good", "good", "bad", "bad"])
    est = estimate_acceptance(StubDrafter(bigram), traces, max_gamma=4)
    assert est.per_domain["good"].tokens_per_step["4"] == pytest.approx(4.0)  # 5+5+2 ... budget rule
    assert est.per_domain["bad"].tokens_per_step["4"] == pytest.approx(4.0)
    assert est.per_domain["good"].tokens_per_step["2"] == pytest.approx(3.0)
    assert est.per_domain["good"].n_prompts == 2 and est.n_prompts == 4
    for g in map(str, range(1, 5)):
        assert est.ci_low[g] <= est.tokens_per_step[g] <= est.ci_high[g]
    assert est.ci_low["1"] < est.ci_high["1"]  # the two domains differ at gamma 1
    assert estimate_acceptance(StubDrafter(bigram), traces, max_gamma=4).to_dict() | {"elapsed_s": 0} == \
        est.to_dict() | {"elapsed_s": 0}  # seeded bootstrap


def test_expected_steps_dp_matches_the_greedy_walk_and_a_simulation():
    rng = np.random.default_rng(0)
    agree = [rng.random(n) < 0.6 for n in (5, 17, 30)]
    lengths = np.array([len(a) for a in agree])
    padded = np.zeros((3, 30))
    for i, a in enumerate(agree):
        padded[i, :len(a)] = a
    for gamma in (1, 3, 8):
        assert np.allclose(expected_steps(padded, lengths, gamma, 30), greedy_steps(agree, gamma, 30))
    # random beta: the DP equals the mean step count of simulated acceptances
    beta = rng.uniform(0.2, 0.9, size=(1, 20))
    sims = []
    for _ in range(4000):
        draws = (rng.random(20) < beta[0]).astype(float)
        sims.append(greedy_steps([draws], 3, 20)[0])
    exact = expected_steps(beta, np.array([20]), 3, 20)[0]
    assert abs(np.mean(sims) - exact) < 4 * np.std(sims) / np.sqrt(len(sims))


def test_sampling_sums_min_p_q_and_brackets_the_truncation():
    # the drafter is uniform over V (q = 1/16); the target's stored top-2 are 0.5 and 0.3, leftover 0.2
    uniform = StubDrafter(lambda ids: torch.zeros(*ids.shape, V))
    probs = [(torch.tensor([[1, 2]] * 3), torch.tensor([[0.5, 0.3]] * 3))]
    traces = make_traces([[1, 2, 1]], temperature=0.7, probs=probs)
    est = estimate_acceptance(uniform, traces, max_gamma=2, temperature=0.7)
    low = 2 / V  # min(0.5, 1/16) + min(0.3, 1/16)
    assert est.acceptance_rate == pytest.approx(low)
    assert est.acceptance_rate_upper == pytest.approx(low + 0.2)  # + min(leftover 0.2, 1 - 2/16)
    assert est.tokens_per_step["1"] < est.tokens_per_step_upper["1"]
    with pytest.raises(TraceError, match="no records at temperature 0"):
        estimate_acceptance(uniform, traces, temperature=0.0)


def test_vocab_subset_rejects_tokens_outside_it():
    subset = [i for i in range(V) if i != 5]
    full = estimate_acceptance(StubDrafter(bigram), make_traces([AGREE]), max_gamma=2)
    restricted = estimate_acceptance(StubDrafter(bigram), make_traces([AGREE]), max_gamma=2,
                                     vocab_subset=subset)
    assert full.top1_agreement == 1.0
    assert restricted.acceptance_rate == pytest.approx(11 / 12)  # token 5 cannot be drafted
    assert restricted.vocab_subset_size == V - 1

    # a head with only the subset's rows: row j is full id subset[j]
    def subset_head(ids):
        nxt = (ids + 1) % V
        index = torch.tensor([subset.index(int(t)) if int(t) in subset else 0 for t in nxt.flatten()])
        return 10.0 * torch.nn.functional.one_hot(index.view(nxt.shape), V - 1).float()

    small = StubDrafter(subset_head, head_rows=V - 1)
    est = estimate_acceptance(small, make_traces([AGREE]), max_gamma=2, vocab_subset=subset)
    assert est.acceptance_rate == pytest.approx(11 / 12)
    with pytest.raises(TraceError, match="LM head has 15 rows"):
        estimate_acceptance(small, make_traces([AGREE]), max_gamma=2)
    with pytest.raises(InvalidInputError, match="repeats"):
        estimate_acceptance(StubDrafter(bigram), make_traces([AGREE]), vocab_subset=[1, 1])


def test_sampling_subset_renormalizes_q():
    uniform = StubDrafter(lambda ids: torch.zeros(*ids.shape, V))
    probs = [(torch.tensor([[1, 2]]), torch.tensor([[0.5, 0.5]]))]
    traces = make_traces([[1]], temperature=1.0, probs=probs)
    est = estimate_acceptance(uniform, traces, max_gamma=1, temperature=1.0, vocab_subset=[1, 2, 3, 4])
    assert est.acceptance_rate == pytest.approx(0.5)  # q = 1/4 on each of 4 ids: min(.5,.25) * 2


def test_drafter_with_another_vocabulary_is_refused():
    wide = StubDrafter(bigram, vocab=2 * V)
    with pytest.raises(TraceError, match="vocabulary of 32 ids"):
        estimate_acceptance(wide, make_traces([AGREE]))

    class Tok:
        def get_vocab(self):
            return {"other": 0}

    loaded = SimpleNamespace(model=StubDrafter(bigram), tokenizer=Tok())
    with pytest.raises(TraceError, match="tokenizer"):
        estimate_acceptance(loaded, make_traces([AGREE]))


def test_a_confidence_stop_walks_fewer_drafts_per_step():
    from draftnas.acceptance.accepts import walk_accepts

    agree, confidence = [1, 1, 1, 1, 0, 1], [0.9, 0.3, 0.9, 0.9, 0.9, 0.9]
    # t=0: the draft at 1 is below 0.5, so 2 drafts, both accepted -> t=3; t=3: budget 6-3-1 = 2 drafts,
    # 1 accepted -> t=5; t=5: no budget left -> 0 drafts
    assert walk_accepts(agree, 4, 6, confidence, 0.5) == ([2, 1, 0], [2, 2, 0])
    assert walk_accepts(agree, 4, 6, confidence, 0.0) == walk_accepts(agree, 4, 6)
    assert walk_accepts(agree, 4, 6, confidence, 0.2) == walk_accepts(agree, 4, 6)


def test_the_estimate_walks_each_stop_on_the_drafters_own_probabilities():
    def unsure_after_even(ids):  # right every time, but sure only after an odd token
        scale = torch.where(ids % 2 == 0, 0.1, 10.0)[..., None]
        return scale * torch.nn.functional.one_hot((ids + 1) % V, V).float()

    est = estimate_acceptance(StubDrafter(unsure_after_even), make_traces([AGREE, AGREE]), max_gamma=4,
                              p_mins=(0.5,))
    for g in range(1, 5):
        assert est.policy(g, 0.0).tokens_per_step == pytest.approx(est.tokens_per_step[str(g)])
    fixed, stopped = est.policy(4, 0.0), est.policy(4, 0.5)
    assert (fixed.tokens_per_step, fixed.drafted_per_step) == (pytest.approx(4.0), pytest.approx(3.0))
    # every even position is unsure: each step drafts one token, accepts it and adds the target's
    assert (stopped.tokens_per_step, stopped.drafted_per_step) == (pytest.approx(2.0), pytest.approx(1.0))
    assert stopped.prompt_tokens_per_step == (2.0, 2.0) and est.policy(4, 0.7) is None
    with pytest.raises(InvalidInputError, match="p_mins"):
        estimate_acceptance(StubDrafter(bigram), make_traces([AGREE]), max_gamma=2, p_mins=(1.0,))
