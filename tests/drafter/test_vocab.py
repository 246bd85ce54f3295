"""Reduced-vocabulary draft heads: ids, selection, lossless decoding, healing, export; Gemma-3 pruning."""

from __future__ import annotations

import json

import pytest
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.records import VocabSubset, load_vocab_subset
from draftnas.drafter.vocab import (
    apply_vocab_subset,
    expand_head,
    head_row_table,
    kept_ids,
    maybe_apply_saved_subset,
    model_subset,
    select_subset,
    special_token_ids,
)
from draftnas.export.folder import load_drafter
from tests.helpers import tiny_llama

V = 128


def test_ids_round_trip_and_out_of_subset_is_minus_one():
    s = VocabSubset(ids=(2, 5, 9, 100), vocab_size=V)
    assert s.size == 4
    assert s.to_full(s.to_head([2, 5, 9, 100])) == [2, 5, 9, 100]
    assert s.to_head([3, 9]) == [-1, 2]
    f2h, h2f = head_row_table(s), kept_ids(s)
    assert torch.equal(h2f[f2h[h2f]], h2f)
    assert int((f2h >= 0).sum()) == 4 and int(f2h[7]) == -1
    assert len(s.fingerprint) == 16 and s.fingerprint != VocabSubset(ids=(2, 5, 9), vocab_size=V).fingerprint


@pytest.mark.parametrize("ids", [(), (3, 2), (1, 1), (V,), (-1,)])
def test_bad_subsets_are_refused(ids):
    with pytest.raises(InvalidInputError):
        VocabSubset(ids=ids, vocab_size=V)


def test_selection_keeps_specials_then_most_frequent():
    seqs = [[5, 5, 5, 7, 7, 9], [5, 7, 11]]
    s = select_subset(seqs, 3, V, required=[0])
    assert s.ids == (0, 5, 7)  # special 0, then 5 (4x), 7 (3x)
    assert s.coverage == pytest.approx(7 / 9)
    filled = select_subset([[4]], 4, V, fallback_sequences=[[50, 50, 60]])
    assert filled.ids == (0, 4, 50, 60)  # 4 ranked, then the fallback 50, 60, then the lowest id
    with pytest.raises(InvalidInputError):
        select_subset(seqs, 1, V, required=[0, 1])


def test_special_tokens_include_eos_and_template_tokens():
    class Tok:
        eos_token_id, bos_token_id, pad_token_id, unk_token_id = 2, 1, None, None
        all_special_ids = [1, 2, 3]
        chat_template = "{{ '<|im_start|>' }}"

        def get_added_vocab(self):
            return {"<|im_start|>": 7, "<unused>": 8}

    assert special_token_ids(Tok()) == [1, 2, 3, 7]


def test_save_load_and_head_slicing(tmp_path, tiny_llama_config):
    model = tiny_llama(tiny_llama_config)
    full_logits = model(torch.tensor([[1, 2, 3]])).logits[0, -1]
    s = VocabSubset(ids=tuple(range(0, V, 4)), vocab_size=V, source="x")
    apply_vocab_subset(model, s)
    assert model.get_output_embeddings().weight.shape[0] == s.size
    assert model.get_input_embeddings().weight.shape[0] == V  # reads any target token
    reduced = model(torch.tensor([[1, 2, 3]])).logits[0, -1]
    assert torch.allclose(reduced, full_logits[kept_ids(s)], atol=1e-5)
    s.save(tmp_path)
    assert load_vocab_subset(tmp_path) == s
    assert json.loads((tmp_path / "draft_vocab.json").read_text())["size"] == s.size
    expand_head(model, s)
    assert model.get_output_embeddings().weight.shape[0] == V
    assert maybe_apply_saved_subset(model, tmp_path) == s
    assert model.get_output_embeddings().weight.shape[0] == s.size


def test_sampled_q_over_a_subset_is_a_distribution():
    from draftnas.models.proposers import ModelProposer, token_probs

    s = VocabSubset(ids=(1, 4, 9, 30), vocab_size=V)
    drafter = ModelProposer.__new__(ModelProposer)
    drafter.vocab_size, drafter.subset = V, kept_ids(s)
    q = drafter.full_probs(token_probs(torch.tensor([0.3, -1.0, 2.0, 0.0]), 0.7))
    assert q.shape == (V,) and float(q.sum()) == pytest.approx(1.0)
    outside = torch.ones(V, dtype=torch.bool)
    outside[kept_ids(s)] = False
    assert float(q[outside].sum()) == 0.0
    # the acceptance probability sum_x min(p, q) is a probability, and a target token outside the
    # subset is never drafted: its p mass can only be reached through the residual
    p = torch.softmax(torch.randn(V), -1)
    beta = float(torch.minimum(p, q).sum())
    assert 0.0 <= beta <= 1.0
    residual = (p - q).clamp(min=0)
    assert float((residual / residual.sum()).sum()) == pytest.approx(1.0)


def test_estimator_counts_out_of_subset_tokens_as_rejections():
    from draftnas.acceptance.estimate import estimate_acceptance
    from tests.helpers import AGREE, StubDrafter, bigram, make_traces

    full = estimate_acceptance(StubDrafter(bigram), make_traces([AGREE]), max_gamma=1)
    subset = VocabSubset(ids=tuple(t for t in range(16) if t != 5), vocab_size=16)
    cut = estimate_acceptance(StubDrafter(bigram), make_traces([AGREE]), max_gamma=1, vocab_subset=subset)
    assert full.top1_agreement == 1.0 and cut.top1_agreement == pytest.approx(11 / 12)


def test_reduced_head_drafter_is_lossless_in_the_loop(tiny_llama_config):
    from draftnas.models.speculative import greedy_generate, speculative_generate

    target = tiny_llama(tiny_llama_config, seed=0)
    drafter = tiny_llama(tiny_llama_config, seed=0)
    prompt = [3, 17, 42, 5]
    ref = greedy_generate(target, prompt, max_new_tokens=24)
    # a subset that holds some of the target's tokens and misses others
    s = VocabSubset(ids=tuple(sorted(set(ref[::2]) | {0, 1})), vocab_size=V)
    apply_vocab_subset(drafter, s)
    out = speculative_generate(target, drafter, prompt, gamma=3, max_new_tokens=24)  # subset from the model
    assert out.tokens == ref
    assert out.draft_s > 0 and sum(out.accepted) > 0
    gen = torch.Generator().manual_seed(0)
    sampled = speculative_generate(target, drafter, prompt, gamma=2, max_new_tokens=16, temperature=1.0,
                                   generator=gen)
    assert len(sampled.tokens) == 16


def test_healing_a_reduced_head_trains_the_head(tiny_llama_config):
    from draftnas.acceptance.records import TraceMetadata, TraceRecordInfo
    from draftnas.acceptance.traces import TraceRecord, Traces
    from draftnas.drafter.heal.heal import heal
    from draftnas.drafter.heal.heal_records import HealOptions
    from draftnas.models.speculative import greedy_generate

    # untied heads: tied random models just repeat their input token, so a drafter would agree
    # with the target before any healing (this test relied on an earlier test untying the shared
    # config, which only held when the files ran in one order)
    target = tiny_llama(tiny_llama_config, seed=0, tie_word_embeddings=False)
    records = []
    for i in range(6):
        prompt = [i + 1, 2 * i + 3]
        cont = torch.tensor(greedy_generate(target, prompt, max_new_tokens=16))
        top_ids = torch.stack([cont, (cont + 1) % V], -1)
        top_p = torch.tensor([[0.7, 0.2]]).expand(len(cont), 2).contiguous()
        info = TraceRecordInfo(prompt_id=f"p{i}", domain="d", language="en", temperature=0.0,
                               prompt_len=2, continuation_len=len(cont), ended_with_eos=False)
        records.append(TraceRecord(info, torch.tensor(prompt), cont, top_ids, top_p, 1 - top_p.sum(-1)))
    meta = TraceMetadata(schema_version=1, target="t", target_kind="folder", model_type="llama",
                         num_hidden_layers=4, vocab_size=V, tokenizer_fingerprint="f", chat_template=False,
                         prompt_set="x", prompt_set_hash="h", n_prompts=6, temperatures=(0.0,), seed=0,
                         top_k=2, max_new_tokens=16, eos_token_ids=())
    traces = Traces(meta, records)
    drafter = tiny_llama(tiny_llama_config, seed=1, tie_word_embeddings=False)
    drafter.model.layers = drafter.model.layers[:1]
    drafter.config.num_hidden_layers = 1
    cont_ids = [r.continuation_ids.tolist() for r in records]
    s = select_subset(cont_ids, 24, V)
    apply_vocab_subset(drafter, s)
    head_before = drafter.get_output_embeddings().weight.detach().clone()
    result = heal(drafter, traces, HealOptions(steps=30, batch_size=2, lr=1e-2, eval_every=0, heldout_every=3,
                                               checkpoint_every=100))
    assert not torch.equal(head_before, drafter.get_output_embeddings().weight)
    assert result.top1_after >= result.top1_before


def _exported_reduced(tmp_path, tiny_llama_config, model=None, full_head=True):
    from draftnas.export.folder import export_drafter
    from draftnas.export.records import ExportInfo

    model = tiny_llama(tiny_llama_config) if model is None else model
    s = VocabSubset(ids=tuple(range(0, V, 2)), vocab_size=V)
    apply_vocab_subset(model, s)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(1.5)  # as if healed: differs from the embedding
    out = export_drafter(model, None, tmp_path / "d", ExportInfo(base="tiny", target="tiny"),
                         full_head=full_head)
    return model, s, out


def test_export_of_a_reduced_head_keeps_it_reduced_and_writes_a_plain_full_head_beside_it(
        tmp_path, tiny_llama_config):
    import json

    from transformers import AutoModelForCausalLM

    from draftnas.export.folder import FULL_HEAD_DIR, HEAD_MODULE_FILE

    model, s, out = _exported_reduced(tmp_path, tiny_llama_config)
    ids = torch.tensor([[4, 8, 15]])
    want = model(ids).logits[0, -1]
    assert model.get_output_embeddings().weight.shape[0] == s.size  # the live model keeps its head
    assert load_vocab_subset(out) == s and (out / HEAD_MODULE_FILE).is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == s.size and config["auto_map"]["AutoModelForCausalLM"].startswith(
        "modeling_draftnas_head.")
    # plain transformers with the shipped class: a small head, full-width logits, -inf elsewhere
    reduced = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert reduced.get_output_embeddings().weight.shape[0] == s.size
    logits = reduced(ids).logits[0, -1]
    assert logits.shape[-1] == V and torch.allclose(logits[kept_ids(s)], want, atol=1e-5)
    dropped = torch.ones(V, dtype=torch.bool)
    dropped[kept_ids(s)] = False
    assert torch.isneginf(logits[dropped]).all()
    # the full-head variant loads with no remote code
    full = AutoModelForCausalLM.from_pretrained(out / FULL_HEAD_DIR).eval()
    assert full.get_output_embeddings().weight.shape[0] == V
    assert torch.allclose(full(ids).logits[0, -1][kept_ids(s)], want, atol=1e-5)
    meta = json.loads((out / "draftnas.json").read_text())
    assert meta["parameters"] < meta["full_head_parameters"]
    card = (out / "README.md").read_text()
    assert "trust_remote_code=True" in card and FULL_HEAD_DIR in card and "-row LM head" in card


def test_no_full_head_leaves_the_plain_copy_out(tmp_path, tiny_llama_config):
    import json

    from draftnas.export.folder import FULL_HEAD_DIR

    _, _, out = _exported_reduced(tmp_path, tiny_llama_config, full_head=False)
    assert not (out / FULL_HEAD_DIR).exists() and (out / "model.safetensors").is_file()
    assert "full_head_parameters" not in json.loads((out / "draftnas.json").read_text())
    assert "export with `--full-head`" in (out / "README.md").read_text()


def test_draftnas_loads_its_own_reduced_head_class_and_refuses_an_altered_folder(tmp_path, tiny_llama_config,
                                                                                  caplog):
    import hashlib
    import logging

    from draftnas.core.errors import ModelSourceError
    from draftnas.export.folder import EARLIER_HEAD_COPIES, HEAD_MODULE_FILE
    from draftnas.models.hf_head import DraftnasLlamaReducedHead
    from tests.helpers import TinyTokenizer

    model, s, out = _exported_reduced(tmp_path, tiny_llama_config)
    with pytest.MonkeyPatch.context() as mp:  # the tiny folder has no tokenizer files
        mp.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: TinyTokenizer())
        loaded = load_drafter(str(out)).model
        assert type(loaded) is DraftnasLlamaReducedHead and model_subset(loaded) == s
        shipped = out / HEAD_MODULE_FILE
        shipped.write_text(shipped.read_text() + "\nimport os  # a change\n")
        with pytest.raises(ModelSourceError, match="not the file this draftnas ships"):
            load_drafter(str(out))
        # a copy an earlier draftnas shipped still loads, with draftnas's own class and a warning
        digest = hashlib.sha256(shipped.read_bytes()).hexdigest()
        mp.setitem(EARLIER_HEAD_COPIES, digest, "it differs")
        with caplog.at_level(logging.WARNING, logger="draftnas.sources"):
            assert type(load_drafter(str(out)).model) is DraftnasLlamaReducedHead
        assert "earlier draftnas copy" in caplog.text and "it differs" in caplog.text
        shipped.unlink()
        with pytest.raises(ModelSourceError, match="is missing"):
            load_drafter(str(out))
        _, _, again = _exported_reduced(tmp_path / "b", tiny_llama_config)
        VocabSubset(ids=tuple(range(1, V, 2)), vocab_size=V).save(again)  # same size, other ids
        with pytest.raises(ModelSourceError, match="does not match the model's head"):
            load_drafter(str(again))


def test_the_exported_reduced_head_is_a_lossless_assistant_in_transformers(tmp_path, tiny_llama_config):
    from transformers import AutoModelForCausalLM

    target = tiny_llama(tiny_llama_config)
    target.generation_config.pad_token_id = 0
    _, _, out = _exported_reduced(tmp_path, tiny_llama_config)
    drafter = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    fed: list[int] = []  # tokens the drafter gets per call
    drafter.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True)
    plain = target.generate(ids, max_new_tokens=12, do_sample=False)
    assisted = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=drafter)
    assert torch.equal(plain, assisted)
    # after its prefill the drafter is fed only the new tokens (its cache reused): with a forward
    # of bare **kwargs, generate fed it the whole sequence at every call
    assert fed[0] == ids.shape[1] and len(fed) > 2
    assert max(fed[1:]) <= drafter.generation_config.num_assistant_tokens + 1


def _candidates_both_ways(target, drafter, ids, monkeypatch, **generate):
    """Assisted greedy generation with the drafter's own candidate loop and with transformers'
    generate: (outputs, candidates per step, scores per step, calls the own loop answered) each."""
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    original = AssistedCandidateGenerator._generate_candidates
    steps: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

    def record(self, args):
        candidates, logits = original(self, args)
        steps[-1].append((candidates.clone(), logits.clone()))
        return candidates, logits

    monkeypatch.setattr(AssistedCandidateGenerator, "_generate_candidates", record)
    own = type(drafter)._propose
    answered = [0]

    def counted(*a, **kw):
        answered[0] += 1
        return own(drafter, *a, **kw)

    monkeypatch.setattr(drafter, "_propose", counted)
    outs = []
    for fast in (True, False):
        drafter.fast_assistant = fast
        steps.append([])
        outs.append(target.generate(ids, do_sample=False, assistant_model=drafter, **generate))
    return outs, steps, answered[0]


@pytest.mark.parametrize("gamma,threshold,stop_early,penalty", [
    (3, 0.0, False, 1.0), (3, 0.3, False, 1.0), (1, 0.0, False, 1.0), (3, 0.0, True, 1.0),
    (3, 0.0, False, 1.3)])
def test_the_reduced_head_answers_assisted_generation_with_the_candidates_generate_gives(
        tmp_path, tiny_llama_config, monkeypatch, gamma, threshold, stop_early, penalty):
    from transformers import AutoModelForCausalLM

    # a target whose greedy tokens mix even and odd ids; the drafter is the same model with the
    # even ids kept: its candidates are accepted, then rejected, then accepted again
    target = tiny_llama(tiny_llama_config, seed=1, initializer_range=0.2)
    target.generation_config.pad_token_id = 0
    _, _, out = _exported_reduced(tmp_path, tiny_llama_config,
                                  model=tiny_llama(tiny_llama_config, seed=1, initializer_range=0.2))
    drafter = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    drafter.generation_config.num_assistant_tokens = gamma
    drafter.generation_config.assistant_confidence_threshold = threshold
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    target.generation_config.repetition_penalty = penalty  # a logits processor the drafter applies too
    plain = target.generate(ids, max_new_tokens=16, do_sample=False)
    if stop_early:  # an end-of-sequence token the drafter can draft (a kept id), met mid-way
        eos = next(t for t in plain[0, ids.shape[1] + 3:].tolist() if t % 2 == 0)
        target.generation_config.eos_token_id = eos
        plain = target.generate(ids, max_new_tokens=16, do_sample=False)
        assert plain.shape[1] < ids.shape[1] + 16
    (fast, stock), (ours, theirs), answered = _candidates_both_ways(target, drafter, ids, monkeypatch,
                                                                     max_new_tokens=16)
    assert torch.equal(fast, plain) and torch.equal(stock, plain)
    assert answered == len(ours) == len(theirs) > 2  # every step answered by the own loop, then none
    new = plain[0, ids.shape[1]:].tolist()  # the drafter drafts even ids only: some accepted, some not
    assert any(t % 2 == 0 for t in new) and any(t % 2 for t in new)
    for (a, a_logits), (b, b_logits) in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
        assert torch.allclose(a_logits, b_logits)


def test_a_gemma3_reduced_head_answers_assisted_generation_as_generate_would(
        tmp_path, tiny_gemma, monkeypatch):
    import copy

    from transformers import AutoModelForCausalLM

    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PlanOptions

    drafter = apply_plan(tiny_gemma, plan_pruning(tiny_gemma, PlanOptions(layers=(0, 2))))
    _, _, out = _exported_reduced(tmp_path, None, model=drafter)
    drafter = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    drafter.generation_config.num_assistant_tokens = 2
    target = copy.deepcopy(tiny_gemma)
    target.generation_config.pad_token_id = 0
    ids = torch.tensor([[5, 9, 2, 77, 31, 8, 64, 12, 3, 99]])  # past the sliding window while decoding
    plain = target.generate(ids, max_new_tokens=12, do_sample=False)
    drafter.fast_assistant = False
    try:  # transformers 5.17's own path fails here (its sliding cache layers return more than the mask)
        target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=drafter)
    except RuntimeError as error:
        import transformers
        pytest.skip(f"transformers {transformers.__version__}'s own assisted generation fails past a "
                    f"sliding window: {error}")
    (fast, stock), (ours, theirs), answered = _candidates_both_ways(target, drafter, ids, monkeypatch,
                                                                     max_new_tokens=12)
    assert torch.equal(fast, plain) and torch.equal(stock, plain)
    assert answered == len(ours) == len(theirs) > 2
    for (a, a_logits), (b, b_logits) in zip(ours, theirs, strict=True):
        assert torch.equal(a, b) and torch.allclose(a_logits, b_logits)


def test_other_generate_calls_on_a_reduced_head_go_to_transformers(tmp_path, tiny_llama_config, monkeypatch):
    from transformers import AutoModelForCausalLM

    target = tiny_llama(tiny_llama_config)
    target.generation_config.pad_token_id = 0
    _, _, out = _exported_reduced(tmp_path, tiny_llama_config)
    drafter = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    monkeypatch.setattr(drafter, "_propose", lambda **kw: pytest.fail("not an assisted greedy call"))
    alone = drafter.generate(ids, max_new_tokens=4, do_sample=False)  # the drafter on its own
    assert alone.shape[1] == ids.shape[1] + 4
    torch.manual_seed(0)  # sampled assisted generation keeps transformers' path
    target.generate(ids, max_new_tokens=4, do_sample=True, assistant_model=drafter)


# --------------------------------------------------------------------------- Gemma-3


@pytest.fixture(scope="module")
def tiny_gemma():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=256, sliding_window=8,
        layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2
        + ["full_attention"], tie_word_embeddings=True, query_pre_attn_scalar=16,
    )
    torch.manual_seed(0)
    return Gemma3ForCausalLM(config).eval()


def test_gemma3_depth_and_width_pruning_reloads(tmp_path, tiny_gemma):
    from transformers import AutoModelForCausalLM

    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PlanOptions

    calib = torch.randint(0, V, (2, 24))
    options = PlanOptions(layers=(0, 2, 4), num_attention_heads=2, intermediate_size=32)
    plan = plan_pruning(tiny_gemma, options, calib)
    drafter = apply_plan(tiny_gemma, plan)
    cfg = drafter.config
    assert cfg.num_hidden_layers == 3 and cfg.num_attention_heads == 2 and cfg.num_key_value_heads == 1
    assert list(cfg.layer_types) == ["sliding_attention", "full_attention", "sliding_attention"]
    assert [layer.self_attn.is_sliding for layer in drafter.model.layers] == [True, False, True]
    ids = torch.randint(0, V, (1, 20))  # longer than the sliding window
    want = drafter(ids).logits
    drafter.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert list(loaded.config.layer_types) == list(cfg.layer_types)
    assert loaded.config.sliding_window == 8
    assert torch.allclose(loaded(ids).logits, want, atol=1e-5)
    assert len(tiny_gemma.model.layers) == 6  # the base is untouched


def test_gemma3_reduced_head_drafter_is_lossless(tiny_gemma):
    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PlanOptions
    from draftnas.models.speculative import greedy_generate, speculative_generate

    drafter = apply_plan(tiny_gemma, plan_pruning(tiny_gemma, PlanOptions(layers=(0, 1, 2, 3, 4, 5))))
    prompt = [5, 9, 2, 77, 31, 8, 64, 12, 3, 99]  # past the sliding window while decoding
    ref = greedy_generate(tiny_gemma, prompt, max_new_tokens=20)
    apply_vocab_subset(drafter, VocabSubset(ids=tuple(sorted(set(ref) | {0})), vocab_size=V))
    out = speculative_generate(tiny_gemma, drafter, prompt, gamma=2, max_new_tokens=20)
    assert out.tokens == ref
    assert sum(out.accepted) > 0


# --------------------------------------------------------------------------- search dimension


def test_vocab_size_is_a_search_dimension():
    from draftnas.core.errors import SearchSpaceError
    from draftnas.core.registry import get_architecture
    from draftnas.search.candidate import build_candidate
    from draftnas.search.loop import distributions
    from draftnas.search.records import CandidateChoice
    from draftnas.search.space_file import parse_search_space
    from draftnas.search.spaces import load_search_space

    space = load_search_space("gemma-3-270m")
    assert space.vocab_sizes[0] == 0 and 4096 in space.vocab_sizes
    assert "vocab_size" in distributions(space)
    base = get_architecture("gemma-3-270m")
    full = build_candidate(space, base, "gemma-3-270m", CandidateChoice(depth=18, layer_selection="first"),
                           target=None)
    cut = build_candidate(space, base, "gemma-3-270m",
                          CandidateChoice(depth=18, layer_selection="first", vocab_size=4096), target=base)
    assert full.head_vocab_size is None and cut.head_vocab_size == 4096
    assert full.key != cut.key and cut.name.endswith("-v4096")
    assert CandidateChoice.from_params({"vocab_size": 8192}, space).vocab_size == 8192
    data = {"schema_version": 1, "name": "x", "target": "t", "base": "b", "depth": {"min": 1, "max": 2}}
    with pytest.raises(SearchSpaceError, match=r"vocab.sizes\[1\]"):
        parse_search_space({**data, "vocab": {"sizes": ["full", -3]}})
    assert parse_search_space(data).vocab_sizes == (0,)


def test_latency_reading_charges_the_reduced_head():
    from draftnas.core.registry import get_architecture
    from draftnas.latency.files import default_profile
    from draftnas.latency.model import LatencyModel
    from draftnas.search.records import TargetLatency
    from draftnas.search.scoring import read_latency
    from draftnas.search.spaces import load_search_space

    space = load_search_space("gemma-3-270m")
    model = LatencyModel.from_profile(default_profile("cpu-intel-xeon"))
    arch = get_architecture("gemma-3-270m").with_shape(num_hidden_layers=4)
    target = TargetLatency(decode_ms=(30.0,), verify_ms=((30.0, 35.0, 40.0, 45.0, 50.0),))
    full = read_latency(model, "cpu", arch, space.workload, target)
    cut = read_latency(model, "cpu", arch, space.workload, target, head_vocab_size=4096)
    assert cut.draft_ms[0] < full.draft_ms[0] / 2


def test_bench_runs_a_reduced_head_folder_in_its_own_loop(tmp_path, tiny_llama_config):
    from draftnas.bench.request_records import BenchOptions
    from draftnas.bench.run import run_bench
    from draftnas.core.prompts import Prompt
    from tests.helpers import loaded, truncated

    target = tiny_llama(tiny_llama_config, initializer_range=0.2)
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    drafter = truncated(target, 2)
    VocabSubset(ids=tuple(range(0, V, 2)), vocab_size=V).save(tmp_path)  # the folder's draft_vocab.json

    prompts = (Prompt(id="a", domain="x", text="speculate "), Prompt(id="b", domain="y", text="verify"))
    result = run_bench(loaded(target, "t"), loaded(drafter, "d", folder=tmp_path), prompts,
                       BenchOptions(gamma=2, max_new_tokens=10))
    own = result.arm("draftnas")
    assert own.draft_vocab_size == V // 2 and own.lossless and result.arm("hf").lossless
    assert own.draft_ms_per_token is not None and own.draft_ms_per_token > 0
    assert drafter.get_output_embeddings().weight.shape[0] == V // 2  # draftnas's loop kept the small head


def test_gemma3_reduced_head_heals_from_traces(tiny_gemma):
    from draftnas.acceptance.records import TraceMetadata, TraceRecordInfo
    from draftnas.acceptance.traces import TraceRecord, Traces
    from draftnas.drafter.heal.heal import heal
    from draftnas.drafter.heal.heal_records import HealOptions
    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PlanOptions
    from draftnas.models.speculative import greedy_generate

    records = []
    for i in range(4):  # one prompt, so the held-out records continue as the trained ones do: learnable
        prompt = [3, 5, 7]
        cont = torch.tensor(greedy_generate(tiny_gemma, prompt, max_new_tokens=12))
        info = TraceRecordInfo(prompt_id=f"p{i}", domain="d", language="en", temperature=0.0,
                               prompt_len=3, continuation_len=len(cont), ended_with_eos=False)
        records.append(TraceRecord(info, torch.tensor(prompt), cont, cont[:, None], torch.ones(len(cont), 1),
                                   torch.zeros(len(cont))))
    meta = TraceMetadata(schema_version=1, target="g", target_kind="folder", model_type="gemma3_text",
                         num_hidden_layers=6, vocab_size=V, tokenizer_fingerprint="f", chat_template=False,
                         prompt_set="x", prompt_set_hash="h", n_prompts=4, temperatures=(0.0,), seed=0,
                         top_k=1, max_new_tokens=12, eos_token_ids=())
    drafter = apply_plan(tiny_gemma, plan_pruning(tiny_gemma, PlanOptions(num_layers=2)))
    apply_vocab_subset(drafter, select_subset([r.continuation_ids.tolist() for r in records], 16, V))
    result = heal(drafter, Traces(meta, records), HealOptions(steps=40, batch_size=2, eval_every=0,
                                                               heldout_every=2, checkpoint_every=100))
    # the reduced head's drafter learns its target's continuations: held-out agreement rises
    assert result.steps == 40 and result.n_heldout_positions > 0
    assert result.top1_after > result.top1_before or result.top1_after == 1.0


def test_a_qwen2_drafter_exports_a_reduced_head_that_is_a_lossless_assistant(tmp_path):
    from transformers import AutoModelForCausalLM

    from draftnas.drafter.prune.plan import plan_pruning
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.drafter.records import PlanOptions
    from draftnas.export.folder import export_drafter, load_drafter
    from draftnas.export.records import ExportInfo
    from draftnas.models.hf_head import DraftnasQwen2ReducedHead
    from tests.helpers import tiny_qwen2

    target = tiny_qwen2(seed=1, layers=4)
    target.generation_config.pad_token_id = 0
    drafter = apply_plan(target, plan_pruning(target, PlanOptions(layers=(0, 3), base="t")))
    s = VocabSubset(ids=tuple(range(0, 128, 2)), vocab_size=128)
    apply_vocab_subset(drafter, s)
    out = export_drafter(drafter, None, tmp_path / "q", ExportInfo(base="t", target="t"))
    loaded = load_drafter(str(out)).model
    assert type(loaded) is DraftnasQwen2ReducedHead and loaded.lm_head.weight.shape[0] == 64
    remote = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    plain = target.generate(ids, max_new_tokens=12, do_sample=False)
    assisted = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=remote)
    assert torch.equal(assisted, plain)
