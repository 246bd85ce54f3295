"""Pruning plans: validation, JSON round-trip, surgery on tiny random models, replay, reload."""

from __future__ import annotations

import dataclasses

import pytest

from draftnas.core.errors import PlanError
from draftnas.core.registry import Architecture, get_architecture
from draftnas.drafter.records import PlanOptions, PruningPlan, load_plan


def _plan(**changes) -> PruningPlan:
    base = dict(base="tiny", base_num_layers=4, layers=(0, 2), layer_selection="explicit",
                num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                importance="magnitude")
    return PruningPlan(**{**base, **changes})


@pytest.fixture()
def tiny_arch(tiny_llama_config) -> Architecture:
    return Architecture.from_hf_config(tiny_llama_config, name="tiny")


@pytest.fixture()
def tiny_model(tiny_llama_config):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_llama_config).eval()


# --------------------------------------------------------------------------- pure plan


def test_plan_round_trips_json(tmp_path):
    plan = _plan(kept_heads=((2, 3), (0, 1)), kept_kv_heads=((1,), (0,)),
                 kept_channels=(tuple(range(0, 64, 2)), tuple(range(32))))
    assert PruningPlan.from_json(plan.to_json()) == plan
    assert load_plan(plan.save(tmp_path / "plan.json")) == plan


def test_architecture_of_smollm2_plan_without_torch():
    base = get_architecture("smollm2-135m")
    plan = PruningPlan(base="smollm2-135m", base_num_layers=30, layers=(0, 1, 24, 29),
                       layer_selection="block_influence", num_attention_heads=6,
                       num_key_value_heads=2, intermediate_size=768)
    arch = plan.architecture(base)
    assert (arch.num_hidden_layers, arch.num_attention_heads, arch.num_key_value_heads,
            arch.intermediate_size, arch.hidden_size, arch.head_dim) == (4, 6, 2, 768, 576, 64)
    assert arch.count_parameters() < base.count_parameters()


@pytest.mark.parametrize("changes,needles", [
    (dict(num_attention_heads=3, num_key_value_heads=2), ["num_attention_heads", "multiples of 2"]),
    (dict(layers=tuple(range(5)), base_num_layers=4), ["layers", "base has 4", "0..3"]),
    (dict(layers=(2, 0)), ["sorted"]),
    (dict(layers=(1, 1)), ["unique"]),
    (dict(num_key_value_heads=3, num_attention_heads=3), ["num_key_value_heads", "1..2"]),
    (dict(num_attention_heads=6, num_key_value_heads=2), ["GQA group", "[2, 4]"]),
    (dict(intermediate_size=65), ["intermediate_size", "1..64"]),
    (dict(layer_selection="random"), ["layer_selection", "block_influence"]),
    (dict(importance="taylor"), ["importance", "activation"]),
    (dict(kept_channels=((1, 2), (3, 4))), ["kept_channels[0]", "exactly 32"]),
])
def test_bad_plans_name_field_and_allowed_values(tiny_arch, changes, needles):
    with pytest.raises(PlanError) as err:
        _plan(**changes).validate(tiny_arch)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_every_problem_reported_at_once(tiny_arch):
    plan = _plan(layers=(9, 3), num_attention_heads=3, num_key_value_heads=2, intermediate_size=0)
    message = str(pytest.raises(PlanError, plan.validate, tiny_arch).value)
    for field in ("layers: indices [9]", "sorted", "num_attention_heads", "intermediate_size"):
        assert field in message


def test_heads_outside_kept_groups_rejected(tiny_arch):
    plan = _plan(kept_heads=((0, 2), (0, 1)), kept_kv_heads=((0,), (0,)))
    with pytest.raises(PlanError, match=r"kept_heads\[0\].*KV group 1"):
        plan.validate(tiny_arch)


def test_malformed_plan_data_one_line():
    with pytest.raises(PlanError, match="lacks field"):
        PruningPlan.from_data({"base": "x"})
    with pytest.raises(PlanError, match="not valid JSON"):
        PruningPlan.from_json("{")


# --------------------------------------------------------------------------- surgery on a tiny model


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_depth_pruning_reindexes_and_generates(tiny_model):
    import torch

    from draftnas.drafter.prune.surgery import apply_plan

    plan = _plan(layers=(1, 3), num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
    before = _weights(tiny_model)
    drafter = apply_plan(tiny_model, plan)
    assert drafter.config.num_hidden_layers == 2
    assert [layer.self_attn.layer_idx for layer in drafter.model.layers] == [0, 1]
    kept, source = drafter.model.layers[0], tiny_model.model.layers[1]
    assert torch.equal(kept.mlp.up_proj.weight, source.mlp.up_proj.weight)
    out = drafter.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 7)
    after = tiny_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # base untouched
    assert tiny_model.config.num_hidden_layers == 4


def test_width_pruning_gqa_matches_sliced_math(tiny_model):
    """One KV group + its two heads, half the channels: the pruned layer equals the base layer's
    computation restricted to the kept heads/channels (checked on the MLP and on shapes)."""
    import torch

    from draftnas.drafter.prune.surgery import apply_plan

    plan = _plan(layers=(0, 1, 2, 3), kept_heads=((2, 3),) * 4, kept_kv_heads=((1,),) * 4,
                 kept_channels=(tuple(range(1, 64, 2)),) * 4)
    drafter = apply_plan(tiny_model, plan)
    cfg = drafter.config
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.head_dim) == (
        2, 1, 32, 8)
    attn = drafter.model.layers[0].self_attn
    assert attn.num_key_value_groups == 2
    base_attn = tiny_model.model.layers[0].self_attn
    assert torch.equal(attn.k_proj.weight, base_attn.k_proj.weight[8:16])
    assert torch.equal(attn.q_proj.weight, base_attn.q_proj.weight[16:32])
    assert torch.equal(attn.o_proj.weight, base_attn.o_proj.weight[:, 16:32])
    x = torch.randn(3, 32)
    base_mlp, mlp = tiny_model.model.layers[0].mlp, drafter.model.layers[0].mlp
    a = base_mlp.act_fn(base_mlp.gate_proj(x)) * base_mlp.up_proj(x)
    mask = torch.zeros(64)
    mask[1::2] = 1
    assert torch.allclose(mlp(x), base_mlp.down_proj(a * mask), atol=1e-6)
    out = drafter.generate(torch.tensor([[5, 6]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 5)


@pytest.mark.parametrize("importance", ["magnitude", "activation"])
def test_plan_pruning_replays_bit_identical_and_reloads(tiny_model, tmp_path, importance):
    import torch
    from transformers import AutoModelForCausalLM

    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan

    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    options = PlanOptions(num_layers=3, layer_selection="block_influence", num_attention_heads=2,
                          num_key_value_heads=1, intermediate_size=40, importance=importance, base="tiny")
    plan = plan_pruning(tiny_model, options, ids)
    assert plan.layer_selection == "block_influence" and len(plan.layers) == 3
    replayed = PruningPlan.from_json(plan.to_json())
    assert replayed == plan
    first, second = apply_plan(tiny_model, plan), apply_plan(tiny_model, replayed)
    s1, s2 = first.state_dict(), second.state_dict()
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)
    first.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.num_hidden_layers == 3 and loaded.config.intermediate_size == 40
    probe = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(loaded(probe).logits, first(probe).logits)


def test_layer_selections(tiny_model):
    """Pruning a Qwen2 keeps each kept head's (and KV group's) bias rows with its weight rows, and the
    static decoder computes the pruned drafter's logits."""
    import torch

    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.stats import block_influence

    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(2))
    assert plan_pruning(tiny_model, PlanOptions(num_layers=2)).layers == (0, 1)
    assert plan_pruning(tiny_model, PlanOptions(num_layers=3, layer_selection="even")).layers == (0, 2, 3)
    scores = block_influence(tiny_model, ids)
    bi = plan_pruning(tiny_model, PlanOptions(num_layers=2, layer_selection="block_influence"), ids)
    top2 = sorted(sorted(range(4), key=lambda i: -scores[i])[:2])
    assert list(bi.layers) == top2
    explicit = plan_pruning(tiny_model, PlanOptions(layers=(1, 3)))
    assert explicit.layers == (1, 3) and explicit.layer_selection == "explicit"
    with pytest.raises(PlanError, match="num_layers"):
        plan_pruning(tiny_model, PlanOptions(num_layers=5))


def test_activation_importance_keeps_the_live_channels(tiny_model):
    """Channels whose down_proj column is zero carry nothing: activation importance drops them."""
    """Pruning a Qwen2 keeps each kept head's (and KV group's) bias rows with its weight rows, and the
    static decoder computes the pruned drafter's logits."""
    import torch

    from draftnas.drafter.prune.plan import plan_pruning

    with torch.no_grad():
        for layer in tiny_model.model.layers:
            layer.mlp.down_proj.weight[:, :32] = 0.0
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(3))
    plan = plan_pruning(tiny_model, PlanOptions(intermediate_size=32, importance="activation"), ids)
    assert plan.kept_channels is not None
    assert all(row == tuple(range(32, 64)) for row in plan.kept_channels)


def test_calibration_needs_ids_or_tokenizer(tiny_model):
    from draftnas.drafter.prune.plan import plan_pruning

    with pytest.raises(PlanError, match="calibration"):
        plan_pruning(tiny_model, PlanOptions(num_layers=2, layer_selection="block_influence"))


def test_plan_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _plan().layers = (0,)  # type: ignore[misc]


@pytest.mark.real_model
def test_smollm2_block_influence_and_gqa_width(smollm2):
    """Real weights: layer 0 is the most influential; 2 of 3 KV groups + half the MLP reloads."""
    import torch

    from draftnas.drafter.prune.plan import calibration_ids, plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan

    ids = calibration_ids(smollm2.tokenizer, sequences=2, seq_len=64)
    plan = plan_pruning(smollm2.model, PlanOptions(
        num_layers=4, layer_selection="block_influence", num_attention_heads=6, num_key_value_heads=2,
        intermediate_size=768, base="smollm2-135m"), ids)
    assert plan.layers[0] == 0 and len(plan.layers) == 4
    drafter = apply_plan(smollm2.model, plan)
    assert drafter.config.num_key_value_heads == 2 and drafter.config.num_attention_heads == 6
    prompt = smollm2.tokenizer("The capital of France is", return_tensors="pt")
    out = drafter.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 4
    assert not torch.isnan(drafter(**prompt).logits).any()


def test_qwen2_width_pruning_slices_the_qkv_biases_with_their_heads_and_groups():
    """Pruning a Qwen2 keeps each kept head's (and KV group's) bias rows with its weight rows, and the
    static decoder computes the pruned drafter's logits."""
    import torch

    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PlanOptions
    from tests.helpers import tiny_qwen2

    base = tiny_qwen2()
    plan = plan_pruning(base, PlanOptions(num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                                          importance="magnitude", base="tiny-qwen2"))
    drafter = apply_plan(base, plan)
    d = 32 // 4
    for j, i in enumerate(plan.layers):
        src, dst = base.model.layers[i].self_attn, drafter.model.layers[j].self_attn
        q_rows = [h * d + r for h in plan.kept_heads[j] for r in range(d)]
        kv_rows = [g * d + r for g in plan.kept_kv_heads[j] for r in range(d)]
        assert torch.equal(dst.q_proj.bias, src.q_proj.bias[q_rows])
        assert torch.equal(dst.k_proj.bias, src.k_proj.bias[kv_rows])
        assert torch.equal(dst.v_proj.bias, src.v_proj.bias[kv_rows])
        assert torch.equal(dst.q_proj.weight, src.q_proj.weight[q_rows])
    assert drafter.config.num_attention_heads == 2 and drafter.config.num_key_value_heads == 1
    ids = torch.tensor([[3, 9, 27, 81]])
    with torch.no_grad():  # the pruned drafter runs, and the static decoder computes what it computes
        from draftnas.models.decoder import StaticDecoder

        expected = drafter(ids).logits
        dec = StaticDecoder.from_hf(drafter)
        got = dec(ids, torch.arange(4), dec.new_cache(1, 4))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(apply_plan(base, plan).model.layers[0].self_attn.q_proj.bias,
                       drafter.model.layers[0].self_attn.q_proj.bias)  # replays bit for bit


def test_a_stats_memo_measures_the_base_once_for_every_plan(tiny_model, monkeypatch):
    """A search plans every trial from one base: the memo's statistics stand for a new measurement (the
    same plans), gathered again only when a plan needs the activations they lack."""
    import torch

    import draftnas.drafter.prune.plan as plan_module
    from draftnas.drafter.prune.stats import StatsMemo

    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(plan_module, "_calibration_tensor", lambda calibration, tokenizer, options: ids)
    calls, real = [], plan_module.collect_stats

    def counted(model, sample, *, width):
        calls.append(width)
        return real(model, sample, width=width)

    monkeypatch.setattr(plan_module, "collect_stats", counted)
    depth = [PlanOptions(num_layers=k, layer_selection="block_influence") for k in (2, 3)]
    width = [PlanOptions(num_layers=k, layer_selection="block_influence", num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=40, importance="activation")
             for k in (2, 3)]
    memo = StatsMemo()
    kept = [plan_module.plan_pruning(tiny_model, o, memo=memo) for o in depth + width]
    assert calls == [False, True]
    fresh = [plan_module.plan_pruning(tiny_model, o, ids) for o in depth + width]
    assert kept == fresh
