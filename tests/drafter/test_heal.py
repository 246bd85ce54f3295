"""Healing: losses, greedy replay, training on tiny models (live and trace teachers), resume."""

from __future__ import annotations

from dataclasses import replace

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.heal.heal_data import HealData, HealSequence
from draftnas.drafter.heal.heal_records import HealOptions


def test_greedy_replay_healing_uses_is_hand_computed():
    """Healing's readings replay continuations with acceptance.greedy_steps (one replay)."""
    import numpy as np

    from draftnas.acceptance.steps import greedy_steps

    def steps(matches: list[bool], gamma: int) -> int:
        return int(greedy_steps([np.asarray(matches, dtype=float)], gamma, len(matches))[0])

    # all agree, gamma 4, 10 tokens: steps advance 5, 5 -> 2 steps
    assert steps([True] * 10, 4) == 2
    # none agree: one token per step
    assert steps([False] * 3, 4) == 3
    # T T F T: step 1 accepts 2 and the target's token at position 2 -> pos 3; step 2 the last token
    assert steps([True, True, False, True], 4) == 2


def test_kl_losses_match_definitions():
    import torch

    from draftnas.drafter.heal.losses import kl_to_logits, kl_to_topk

    torch.manual_seed(0)
    d, t = torch.randn(5, 11), torch.randn(5, 11)
    assert float(kl_to_logits(t, t)) == pytest.approx(0.0, abs=1e-6)
    ref = torch.nn.functional.kl_div(torch.log_softmax(d, -1), torch.log_softmax(t, -1),
                                     log_target=True, reduction="batchmean")
    assert float(kl_to_logits(d, t)) == pytest.approx(float(ref), rel=1e-5)
    # top-k with k = V and no leftover is the full KL
    p = torch.softmax(t, -1)
    probs, ids = p.sort(-1, descending=True)
    full = kl_to_topk(d, ids, probs, torch.zeros(5))
    assert float(full) == pytest.approx(float(ref), rel=1e-4)
    # a drafter equal to the target scores ~0 on a truncated top-3 + leftover too
    left = 1 - probs[:, :3].sum(-1)
    assert float(kl_to_topk(t, ids[:, :3], probs[:, :3], left)) == pytest.approx(0.0, abs=1e-5)


def test_options_validate_every_problem():
    with pytest.raises(InvalidInputError) as err:
        HealOptions(steps=0, lr=2.0, train="some").validate()
    message = str(err.value)
    assert "steps" in message and "lr" in message and "train" in message


# --------------------------------------------------------------------------- tiny models


def _models(config):
    import copy

    import torch
    from transformers import LlamaForCausalLM

    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PruningPlan

    config = copy.deepcopy(config)
    config.initializer_range = 0.2  # a target whose layers matter (0.02 makes every layer ~identity)
    torch.manual_seed(0)
    target = LlamaForCausalLM(config).eval()
    plan = PruningPlan(base="tiny", base_num_layers=4, layers=(0,), layer_selection="first",
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
    return target, apply_plan(target, plan)


def _data(target, n_train=12, n_held=4, prompt_len=4, seq_len=16, top_k=None, memorize=False) -> HealData:
    """Random token sequences labelled by the target's own top-1 (and top-k) at each position
    after the prompt. `memorize`: the held-out set is the training set (tests the machinery)."""
    import torch

    ids = torch.randint(3, 128, (n_train + n_held, seq_len), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = target(ids).logits[:, prompt_len - 1:-1]  # [N, C, V]
    probs = torch.softmax(logits, -1)
    seqs = []
    for i in range(len(ids)):
        seq = HealSequence(ids[i].tolist(), prompt_len, logits[i].argmax(-1).tolist())
        if top_k:
            vals, top = probs[i].topk(top_k, -1)
            seq.topk_ids, seq.topk_probs, seq.leftover = top, vals, 1 - vals.sum(-1)
        seqs.append(seq)
    train = seqs[:n_train]
    return HealData(train=train, heldout=train if memorize else seqs[n_train:], source="test")


def test_heal_live_teacher_raises_agreement(tiny_llama_config):
    from draftnas.drafter.heal.heal import heal

    target, drafter = _models(tiny_llama_config)
    data = _data(target, memorize=True)
    options = HealOptions(steps=40, batch_size=4, lr=1e-2, eval_every=20, train="all", seed=0)
    seen = []
    result = heal(drafter, target, options, data=data, progress=lambda d, t: seen.append((d, t)))
    assert result.teacher == "live" and result.steps == 40
    assert result.top1_after > result.top1_before
    assert [r.step for r in result.readings] == [0, 20, 40]
    assert seen[-1] == (40, 40)
    assert result.readings[-1].loss is not None and result.readings[-1].loss < 5


def test_heal_trains_only_layers_by_default(tiny_llama_config):
    import torch

    from draftnas.drafter.heal.heal import heal

    target, drafter = _models(tiny_llama_config)
    embed = drafter.get_input_embeddings().weight.clone()
    layer = drafter.model.layers[0].mlp.up_proj.weight.clone()
    result = heal(drafter, target, HealOptions(steps=3, batch_size=2, eval_every=0), data=_data(target, 4, 2))
    assert torch.equal(drafter.get_input_embeddings().weight, embed)
    assert not torch.equal(drafter.model.layers[0].mlp.up_proj.weight, layer)
    per_layer = sum(p.numel() for p in drafter.model.layers.parameters())
    assert result.trainable_parameters == per_layer + drafter.model.norm.weight.numel()


def test_healing_within_a_budget_trains_only_the_layers_next_to_a_cut(tiny_llama_config):
    import torch

    from draftnas.drafter.heal.heal import heal
    from draftnas.drafter.records import PruningPlan

    plan = PruningPlan(base="b", base_num_layers=8, layers=(0, 1, 2, 5, 6), layer_selection="block_influence",
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
    assert plan.cut_neighbours() == (2, 3, 4)  # layers 2, 5 and 6 border the dropped 3, 4 and 7
    assert replace(plan, layers=tuple(range(8))).cut_neighbours() == ()  # nothing cut
    assert replace(plan, kept_channels=((0,),) * 5).cut_neighbours() == (0, 1, 2, 3, 4)  # widths: every layer

    from draftnas.drafter.prune.surgery import apply_plan

    target, _ = _models(tiny_llama_config)  # a 2-layer drafter (its layer 1 borders a cut): train it only
    drafter = apply_plan(target, replace(plan, base="tiny", base_num_layers=4, layers=(0, 2)))
    first = drafter.model.layers[0].mlp.up_proj.weight.clone()
    second = drafter.model.layers[1].mlp.up_proj.weight.clone()
    result = heal(drafter, target, HealOptions(steps=3, batch_size=2, eval_every=0, only_layers=(1,)),
                  data=_data(target, 4, 2))
    assert torch.equal(drafter.model.layers[0].mlp.up_proj.weight, first)
    assert not torch.equal(drafter.model.layers[1].mlp.up_proj.weight, second)
    one_layer = sum(p.numel() for p in drafter.model.layers[1].parameters())
    assert result.trainable_parameters == one_layer + drafter.model.norm.weight.numel()


def test_heal_topk_teacher(tiny_llama_config):
    from draftnas.drafter.heal.heal import heal

    target, drafter = _models(tiny_llama_config)
    data = _data(target, top_k=8, memorize=True)
    traces_like = type("T", (), {"records": [], "metadata": None})()
    result = heal(drafter, traces_like, HealOptions(steps=40, batch_size=4, lr=1e-2, eval_every=0,
                                                    train="all"), data=data)
    assert result.teacher == "traces"
    assert result.top1_after > result.top1_before


def test_a_live_target_with_teacher_topk_is_never_run_while_training(tiny_llama_config):
    """teacher_topk: the target's top-k kept with the data is the teacher; the target is not called."""
    from draftnas.drafter.heal.heal import heal

    target, drafter = _models(tiny_llama_config)
    data, plain = _data(target, top_k=8, memorize=True), _data(target)
    calls = []
    target.register_forward_hook(lambda *_: calls.append(1))
    options = HealOptions(steps=40, batch_size=4, lr=1e-2, eval_every=0, train="all", teacher_topk=8)
    result = heal(drafter, target, options, data=data)
    assert not calls and result.teacher == "target top-8"
    assert result.top1_after > result.top1_before
    with pytest.raises(InvalidInputError, match="carries the target's top-k"):
        heal(drafter, target, options, data=plain)


def test_low_rank_healing_trains_adapters_over_the_stack_and_merges_them(tiny_llama_config):
    import torch

    from draftnas.drafter.heal.heal import heal

    target, drafter = _models(tiny_llama_config)
    data = _data(target, memorize=True)
    shapes = {n: p.shape for n, p in drafter.named_parameters()}
    embed = drafter.get_input_embeddings().weight.clone()
    q = drafter.model.layers[0].self_attn.q_proj.weight.clone()
    options = HealOptions(steps=40, batch_size=4, lr=1e-2, eval_every=0, train="lowrank", rank=2, seed=0)
    result = heal(drafter, target, options, data=data)
    assert {n: p.shape for n, p in drafter.named_parameters()} == shapes  # merged: the drafter's own shape
    assert torch.equal(drafter.get_input_embeddings().weight, embed)
    delta = drafter.model.layers[0].self_attn.q_proj.weight - q
    assert 0 < int(torch.linalg.matrix_rank(delta.float())) <= 2  # the update is of rank 2 at most
    linears = [m for m in drafter.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    adapters = sum(2 * (m.in_features + m.out_features) for m in linears)
    assert result.trainable_parameters == adapters + drafter.model.norm.weight.numel()
    assert result.top1_after > result.top1_before


@pytest.mark.parametrize("train", ["layers", "lowrank"])
def test_interrupted_heal_resumes_to_the_same_weights(tiny_llama_config, tmp_path, train):
    import torch

    from draftnas.drafter.heal.heal import heal

    target, _ = _models(tiny_llama_config)
    data = _data(target, 6, 2)
    options = HealOptions(steps=8, batch_size=2, lr=5e-3, eval_every=0, checkpoint_every=2, train=train)

    _, straight = _models(tiny_llama_config)
    heal(straight, target, options, data=data)

    class Stop(Exception):
        pass

    def interrupt(done: int, total: int) -> None:
        if done == 5:
            raise Stop

    _, first = _models(tiny_llama_config)
    with pytest.raises(Stop):
        heal(first, target, options, data=data, checkpoint_dir=tmp_path, progress=interrupt)
    _, second = _models(tiny_llama_config)  # a fresh process: un-healed weights, state from disk
    result = heal(second, target, options, data=data, checkpoint_dir=tmp_path)
    assert result.resumed_from_step == 4 and result.steps == 8
    for a, b in zip(straight.parameters(), second.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_checkpoint_of_other_options_refused(tiny_llama_config, tmp_path):
    from draftnas.drafter.heal.heal import heal

    target, drafter = _models(tiny_llama_config)
    data = _data(target, 4, 2)
    heal(drafter, target, HealOptions(steps=2, batch_size=2, eval_every=0), data=data,
         checkpoint_dir=tmp_path)
    with pytest.raises(InvalidInputError, match="belongs to another drafter"):
        heal(drafter, target, HealOptions(steps=3, batch_size=2, eval_every=0), data=data,
             checkpoint_dir=tmp_path)


def test_data_from_traces_splits_and_keeps_topk():
    import torch

    from draftnas.drafter.heal.heal_data import data_from_traces

    class Info:
        def __init__(self, n):
            self.continuation_len, self.prompt_len = n, 3

    class Rec:
        def __init__(self, i):
            self.info = Info(4)
            self.input_ids = torch.arange(7) + i
            self.topk_ids = torch.arange(8).repeat(4, 1)
            self.topk_probs = torch.full((4, 8), 0.1)
            self.leftover = torch.full((4,), 0.2)

    traces = type("T", (), {"records": [Rec(i) for i in range(10)], "metadata": None})()
    data = data_from_traces(traces, HealOptions(heldout_every=5))
    assert len(data.heldout) == 2 and len(data.train) == 8
    assert data.train[0].top1 == [0, 0, 0, 0] and data.train[0].prompt_len == 3


@pytest.mark.real_model
def test_smollm2_first2_heals_on_live_target(smollm2):
    """Real weights, a few steps on two short self-distilled continuations: agreement rises."""
    from draftnas.drafter.heal.heal import heal
    from draftnas.drafter.heal.heal_data import generate_heal_data
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PruningPlan

    plan = PruningPlan(base="smollm2-135m", base_num_layers=30, layers=(0, 1), layer_selection="first",
                       num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536)
    drafter = apply_plan(smollm2.model, plan)
    options = HealOptions(steps=12, batch_size=2, lr=3e-3, eval_every=0, prompts="chat",
                          prompts_per_domain=6, max_new_tokens=24, heldout_every=3)
    data = generate_heal_data(smollm2.model, smollm2.tokenizer, options)
    result = heal(drafter, smollm2.model, options, tokenizer=smollm2.tokenizer, data=data)
    assert result.n_heldout_sequences == 2 and result.top1_after > result.top1_before


def test_written_prompts_need_a_chat_template():
    from draftnas.core.prompts import user_turn_opening

    with pytest.raises(InvalidInputError, match="no chat template"):
        user_turn_opening(object(), "Explain the")


@pytest.mark.real_model
def test_the_target_writes_training_prompts_that_open_like_the_set(smollm2):
    """Written prompts open with a training prompt's first words, are answered by the target and join
    the training sequences only: the held-out sequences are the same as without them."""
    from draftnas.core.prompts import load_prompts, user_turn_opening
    from draftnas.drafter.heal.heal_data import WRITTEN_OPENING_WORDS, generate_heal_data, written_prompts

    tok = smollm2.tokenizer
    opening = user_turn_opening(tok, "Explain the")
    assert tok.decode(opening).endswith("user\nExplain the")
    openings = [p.text for p in load_prompts("chat", per_domain=3)]
    texts = written_prompts(smollm2.model, tok, openings, 6, seed=1)
    assert texts and len(set(texts)) == len(texts)
    heads = {" ".join(o.split()[:WRITTEN_OPENING_WORDS]) for o in openings}
    assert all(any(t.startswith(h) and len(t) > len(h) for h in heads) for t in texts)
    assert not set(texts) & set(openings)

    options = HealOptions(prompts="chat", prompts_per_domain=6, max_new_tokens=6, heldout_every=3)
    plain = generate_heal_data(smollm2.model, tok, options)
    more = generate_heal_data(smollm2.model, tok, replace(options, written_prompts=6))
    assert [s.input_ids for s in more.heldout] == [s.input_ids for s in plain.heldout]
    assert more.train[:len(plain.train)] == plain.train
    assert more.n_written == len(more.train) - len(plain.train) > 0 and plain.n_written == 0


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("teacher", ["live", "topk"])
def test_heal_on_cuda_moves_the_drafter_and_teaches_it(tiny_llama_config, teacher):
    from draftnas.drafter.heal.heal import heal
    from draftnas.drafter.records import VocabSubset
    from draftnas.drafter.vocab import apply_vocab_subset

    target, drafter = _models(tiny_llama_config)
    apply_vocab_subset(drafter, VocabSubset(ids=tuple(range(0, 128, 2)), vocab_size=128))  # reduced head too
    data = _data(target, top_k=8 if teacher == "topk" else None, memorize=True)
    source = target if teacher == "live" else type("T", (), {"records": [], "metadata": None})()
    result = heal(drafter, source, HealOptions(steps=30, batch_size=4, lr=1e-2, eval_every=0, train="all",
                                               device="cuda"), data=data)
    assert next(drafter.parameters()).device.type == "cuda"
    assert result.top1_after > result.top1_before
