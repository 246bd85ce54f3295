"""The head family: a head on the target's hidden states drafts through the one loop losslessly from
either engine, its cached drafting equals reading the whole sequence at once, its folder is vLLM's eagle3
layout and reloads to the same drafts, and a wrong layer, vocabulary or target is one line."""

from __future__ import annotations

import json
import re

import pytest
import torch

from draftnas.core.engine_kinds import HF, LLAMA_CPP, VLLM
from draftnas.core.errors import InvalidInputError
from draftnas.drafter.families import NOT_RUN, parse_drafter
from draftnas.drafter.head.build import head_proposer, new_head, target_hidden
from draftnas.drafter.head.folder import load_head, read_shape, trained_tokens, write_head
from draftnas.drafter.head.shape import default_layers, head_shape, target_key
from draftnas.models.decoder import StaticDecoder
from draftnas.models.engines import StaticEngine
from draftnas.models.speculative import greedy_generate, speculate
from tests.helpers import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[1, 5, 9, 3, 7, 2, 8], [4, 4, 6, 1]]


@pytest.fixture(scope="module")
def target(tiny_llama_config):
    return tiny_llama(tiny_llama_config, initializer_range=0.2)


@pytest.fixture(scope="module")
def shape(target):
    return head_shape(target.config.to_dict(), "tiny", layers=(1, 2, 3), draft_vocab=96, ffn=48)


@pytest.fixture(scope="module")
def head(target, shape):
    """A head whose drafts sometimes match: its output rows are the target's and its attention is random."""
    return new_head(target, shape, list(range(16, 112)), seed=1)


def test_a_head_runs_through_the_loop_losslessly_from_either_engine(target, head):
    for prompt in PROMPTS:
        ref = greedy_generate(target, prompt, max_new_tokens=24)
        out = speculate(target, head_proposer(head, target, 64), prompt, gamma=3, max_new_tokens=24)
        static = speculate(StaticEngine(StaticDecoder.from_hf(target), 64), head_proposer(head, target, 64),
                           prompt, gamma=3, max_new_tokens=24)
        assert out.tokens == static.tokens == ref
        assert out.accepted == static.accepted and sum(out.drafted) > 0


class _Recording:
    """A proposer that keeps what it was asked and what it drafted."""

    def __init__(self, inner):
        self.inner, self.asked = inner, []
        self.hidden_layers, self.drafts_at_prefill = inner.hidden_layers, inner.drafts_at_prefill

    def reset(self, prompt_ids):
        self.inner.reset(prompt_ids)

    def propose(self, seq, limit, **kw):
        proposal = self.inner.propose(seq, limit, **kw)
        self.asked.append((list(seq), proposal.tokens.tolist()))
        return proposal

    def rollback(self, length):
        self.inner.rollback(length)

    def observe(self, hidden):
        self.inner.observe(hidden)


def _uncached_drafts(target, head, seq, count):
    """`count` drafts after `seq` from the head read over the whole sequence at once (no cache): rows
    0..L-2 read the target's features and the next token; each later draft adds one row reading the last
    row's output before the final norm and the previous draft."""
    ids = torch.tensor([seq])
    features = head.fuse(target_hidden(target, ids, head.shape.layers)[0])[:-1]
    table, embed = head.draft_ids(), target.get_input_embeddings().weight
    tokens, drafts = list(seq[1:]), []
    with torch.inference_mode():
        for _ in range(count):
            normed, prenorm = head(embed[torch.tensor(tokens)], features, torch.arange(len(tokens)))
            drafts.append(int(table[head.logits(normed[-1]).argmax()]))
            features, tokens = torch.cat((features, prenorm[-1:])), tokens + drafts[-1:]
    return drafts


def test_cached_drafting_equals_reading_the_sequence_at_once(target, head):
    """What the cache, the positions and the rollbacks must reproduce: each step's drafts are those of the
    head read over the whole sequence so far with the target's hidden states."""
    recording = _Recording(head_proposer(head, target, 64))
    out = speculate(target, recording, PROMPTS[0], gamma=3, max_new_tokens=16)
    assert out.tokens == greedy_generate(target, PROMPTS[0], max_new_tokens=16)
    assert len(recording.asked) == out.steps > 3
    for seq, drafts in recording.asked:
        assert drafts == _uncached_drafts(target, head, seq, len(drafts))


def test_a_sampled_head_step_gives_q_over_its_draft_vocabulary_only(target, head):
    proposer = head_proposer(head, target, 64)
    out = speculate(target, proposer, PROMPTS[1], gamma=3, max_new_tokens=12, temperature=0.8,
                    generator=torch.Generator().manual_seed(0))
    assert len(out.tokens) == 12
    proposer.reset(PROMPTS[1])
    speculate(target, _Recording(proposer), PROMPTS[1], gamma=0, max_new_tokens=2)
    proposal = proposer.propose(PROMPTS[1] + out.tokens[:1], 2, temperature=0.8,
                                generator=torch.Generator().manual_seed(1))
    outside = torch.ones(head.shape.target.vocab_size, dtype=torch.bool)
    outside[head.draft_ids()] = False
    for q in proposal.qs:
        assert q is not None and abs(float(q.sum()) - 1) < 1e-5 and float(q[outside].sum()) == 0


def test_the_folder_is_vllms_eagle3_layout_and_reloads_to_the_same_drafts(target, head, tmp_path):
    folder = write_head(head, tmp_path / "head", trained_tokens=1234)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == 96 and config["vocab_size"] == 128
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # where llama.cpp's converter reads them
    from safetensors.torch import load_file

    names = set(load_file(str(folder / "model.safetensors")))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= names
    assert read_shape(folder) == head.shape and trained_tokens(folder) == 1234
    again = load_head(folder, target_key(target.config.to_dict(), "tiny"))
    a = speculate(target, head_proposer(head, target, 64), PROMPTS[0], gamma=3, max_new_tokens=16)
    b = speculate(target, head_proposer(again, target, 64), PROMPTS[0], gamma=3, max_new_tokens=16)
    assert (a.tokens, a.accepted) == (b.tokens, b.accepted)


def test_the_family_reads_head_specs_and_runs_in_draftnas_vllm_and_llama_cpp():
    spec = parse_drafter("head:out/qwen-head")
    assert (spec.family, spec.model, spec.label) == ("head", "out/qwen-head", "head qwen-head")
    assert spec.settings(VLLM, 4, draft_folder="/x") == {"method": "eagle3", "model": "/x",
                                                          "num_speculative_tokens": 4}
    assert spec.settings(LLAMA_CPP, 4, draft_file="/x/h.gguf", threads=2) == [
        "-md", "/x/h.gguf", "--spec-type", "draft-eagle3", "--spec-draft-n-max", "4",
        "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", "2"]
    with pytest.raises(InvalidInputError, match="runs a head from its eagle3 GGUF"):
        spec.settings(LLAMA_CPP, 4)
    assert spec.settings(HF, 4) is NOT_RUN
    with pytest.raises(InvalidInputError, match="name the head's folder"):
        parse_drafter("head:")


@pytest.mark.parametrize(("changes", "message"), [
    ({"layers": (1, 9)}, "layers 9: outside the target tiny (allowed: 0-4"),
    ({"layers": (3, 1)}, "layers 3,1: need one or more distinct layers in ascending order"),
    ({"draft_vocab": 129}, "draft_vocab 129: more rows than the target tiny's vocabulary (allowed: 1-128)"),
    ({"heads": 3, "kv_heads": 2}, "a multiple of the KV heads"),
])
def test_a_shape_the_target_cannot_have_is_one_line(target, changes, message):
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        head_shape(target.config.to_dict(), "tiny", **changes)


def test_a_head_made_for_another_target_is_one_line(target, head, tmp_path):
    folder = write_head(head, tmp_path / "head")
    other = target_key(target.config.to_dict() | {"hidden_size": 64}, "wider")
    with pytest.raises(InvalidInputError, match=r"the head was made for tiny \(4 layers, width 32, 128 "
                                                r"tokens\), not the target here, wider"):
        load_head(folder, other)
    with pytest.raises(InvalidInputError, match="no readable head config"):
        read_shape(tmp_path / "missing")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(InvalidInputError, match=r"names \['LlamaForCausalLM'\], not a head"):
        read_shape(tmp_path)
    assert default_layers(28) == (2, 14, 25)


def test_the_unrolled_steps_are_the_drafts_chains_at_every_base(target, head):
    """Step j's row b + j is the j-th draft after base b where every earlier draft was the sequence's own
    token: the rows 0..b read at once, then one row a draft, each reading the last's output."""
    seq = greedy_generate(target, PROMPTS[0], max_new_tokens=12)
    ids = torch.tensor([PROMPTS[0] + seq])
    features = head.fuse(target_hidden(target, ids, head.shape.layers)[0])[:-1]  # rows 0..T-2
    embeds = target.get_input_embeddings().weight[ids[0, 1:]]
    with torch.inference_mode():
        steps = head.unrolled(embeds[None], features[None], 3)
        for b in (2, 6, 10):
            hidden, tokens = features[:b + 1], embeds[:b + 1]
            for j in range(3):
                normed, prenorm = head(tokens, hidden, torch.arange(b + 1 + j))
                torch.testing.assert_close(steps[j][0, b + j], normed[-1], atol=1e-5, rtol=1e-4)
                hidden = torch.cat((hidden, prenorm[-1:]))
                tokens = torch.cat((tokens, embeds[b + j + 1:b + j + 2]))
