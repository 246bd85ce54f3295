"""Small helpers shared by tests (not fixtures)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch

from draftnas.acceptance.records import TraceMetadata, TraceRecordInfo
from draftnas.acceptance.traces import TraceRecord, Traces
from draftnas.core.registry import Architecture, get_architecture
from draftnas.core.throughput import expected_tokens_per_step
from draftnas.search.evaluate import Evaluation
from draftnas.search.records import AcceptanceReading, Candidate, StudySettings
from draftnas.search.run_options import SearchOptions
from draftnas.search.spaces import load_search_space


def tiny_config():
    """A 4-layer LLaMA config small enough to build in milliseconds (GQA 4 q / 2 kv heads); the
    `tiny_llama_config` fixture's, for code that runs outside pytest (a torchrun worker)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=256, tie_word_embeddings=True,
    )


def tiny_llama(config, seed=0, **changes):
    """A LLaMA model with random weights (seed `seed`), eval mode, on its own copy of `config` with
    `changes` (e.g. initializer_range=0.2: a model whose layers matter; 0.02 makes every layer
    ~identity). Pruning or a reduced head rewrites a model's config in place, which must not reach
    the session fixture other tests build from."""
    from transformers import LlamaForCausalLM

    own = copy.deepcopy(config)
    for key, value in changes.items():
        setattr(own, key, value)
    torch.manual_seed(seed)
    return LlamaForCausalLM(own).eval()


def truncated(model, k):
    """A copy of a LLaMA-style model with only its first k layers (layer_idx re-indexed, config updated)."""
    small = copy.deepcopy(model)
    small.model.layers = torch.nn.ModuleList(list(small.model.layers)[:k])
    for i, layer in enumerate(small.model.layers):
        layer.self_attn.layer_idx = i
    small.config.num_hidden_layers = k
    return small


class TinyTokenizer:
    """Character-level stand-in: ids are code points mod 128 (no chat template, no end-of-sequence).

    `shift` renames the vocabulary (same ids, other strings): a different tokenizer fingerprint.
    """

    chat_template = None
    eos_token_id = None

    def __init__(self, shift: int = 0) -> None:
        self.shift = shift

    def get_vocab(self):
        return {f"t{(i + self.shift) % 128}": i for i in range(128)}

    def __call__(self, text):
        return {"input_ids": [ord(c) % 128 for c in text]}


class PaddedTinyTokenizer(TinyTokenizer):
    """`TinyTokenizer` with a pad id (transformers' generate needs one to batch or stop)."""

    pad_token_id = 0


def loaded(model, spec, tokenizer=None, folder=None):
    """A `LoadedModel` around an in-memory model (no files), with a padded tiny tokenizer by default."""
    from draftnas.models.records import ModelSource
    from draftnas.models.sources import LoadedModel

    source = ModelSource(spec=spec, kind="folder", location=spec)
    return LoadedModel(model, tokenizer or PaddedTinyTokenizer(), source, folder, 0.0, True)


# --------------------------------------------------------------- acceptance fakes

V = 16


class _Decoder(torch.nn.Module):
    def __init__(self, logits_fn):
        super().__init__()
        self.logits_fn = logits_fn

    def forward(self, input_ids, use_cache=False):
        return SimpleNamespace(last_hidden_state=self.logits_fn(input_ids))


class StubDrafter(torch.nn.Module):
    """A 'model' whose hidden state is its logits (identity head): logits_fn(ids [B, T]) -> [B, T, V_head]."""

    def __init__(self, logits_fn, vocab=V, head_rows=V):
        super().__init__()
        self.config = SimpleNamespace()
        self.embed = torch.nn.Embedding(vocab, 1)
        self.head = torch.nn.Linear(head_rows, head_rows, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(torch.eye(head_rows))
        self.decoder = _Decoder(logits_fn)

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head

    def get_decoder(self):
        return self.decoder


def bigram(ids):
    """Predicts token + 1 (mod V) after every token."""
    return 10.0 * torch.nn.functional.one_hot((ids + 1) % V, V).float()


def make_traces(continuations, *, domains=None, max_new_tokens=12, temperature=0.0, probs=None):
    """Traces with prompt [0] and the given continuations; top-k = the token itself unless `probs`."""
    records = []
    for i, cont in enumerate(continuations):
        c = torch.tensor(cont, dtype=torch.long)
        if probs is None:
            top_ids, top_p = c[:, None], torch.ones(len(cont), 1)
        else:
            top_ids, top_p = probs[i]
        info = TraceRecordInfo(prompt_id=f"p{i}", domain=(domains or ["d"] * len(continuations))[i],
                               language="en", temperature=temperature, prompt_len=1,
                               continuation_len=len(cont), ended_with_eos=False)
        records.append(TraceRecord(info, torch.tensor([0]), c, top_ids, top_p, 1.0 - top_p.sum(-1)))
    meta = TraceMetadata(schema_version=1, target="stub", target_kind="folder", model_type="stub",
                         num_hidden_layers=1, vocab_size=V, tokenizer_fingerprint="f", chat_template=False,
                         prompt_set="x", prompt_set_hash="h", n_prompts=len(records),
                         temperatures=(temperature,), seed=0, top_k=1, max_new_tokens=max_new_tokens,
                         eos_token_ids=())
    return Traces(meta, records)


AGREE = list(range(1, 13))  # prompt [0] then 1..12: the bigram stub agrees everywhere


# --------------------------------------------------------------- search fakes

SMOL = get_architecture("smollm2-135m")


class StubLatency:
    """FIELD-NOTES fit of SmolLM2 on this CPU: 0.3 ms + 0.31 ms/layer + 0.19 ms/M params + LM head."""

    def predict_ms(self, arch, *, batch_size=1, new_tokens=1, context_tokens=128, head_vocab_size=None):
        rows = head_vocab_size or arch.vocab_size
        head = 4.3 * rows * arch.hidden_size / (49152 * 576)
        base = 0.3 + 0.31 * arch.num_hidden_layers + 0.19 * arch.non_embedding_parameters() / 1e6 + head
        return base * (1 + 0.04 * (batch_size * new_tokens - 1))


class FakeMeasured:
    """A 'measuring' evaluator: deeper drafters are accepted more (alpha = 1 - 0.6 / depth^0.5)."""

    measured = True
    builds = False  # True: the search prices the stock drafter's hand-made variants with it too

    def __init__(self, fail_when=None, interrupt_at=None, alpha=None):
        self.alpha = alpha
        self.calls: list[str] = []
        self.fail_when = fail_when
        self.interrupt_at = interrupt_at

    def evaluate(self, candidate: Candidate) -> Evaluation:
        self.calls.append(candidate.key)
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.fail_when is not None and self.fail_when(candidate):
            raise RuntimeError("flaky measurement")
        alpha = self.alpha or 1 - 0.6 / candidate.arch.num_hidden_layers ** 0.5
        tokens = {str(g): expected_tokens_per_step(alpha, g) for g in range(1, 9)}
        return Evaluation(candidate, AcceptanceReading(kind="measured", acceptance_rate=alpha,
                                                        tokens_per_step=tokens))


def smol_options(tmp_path, n_trials=12, sampler="tpe", prior=None, study="t", storage=None, **kw):
    settings = StudySettings(n_trials=n_trials, storage=storage or str(tmp_path / "study.db"),
                             study_name=study, sampler=sampler, run_dir=str(tmp_path),
                             **{k: kw.pop(k) for k in ("timeout_s", "seed") if k in kw})
    return SearchOptions(target="smollm2-135m", target_arch=SMOL, base="smollm2-135m", base_arch=SMOL,
                         space=load_search_space("smollm2-135m"), profile="stub", study=settings,
                         acceptance_prior=prior, **kw)


# --------------------------------------------------------------- Qwen2 fakes


def tiny_qwen2(seed=0, layers=4, tied=False, vocab=128):
    """A tiny random Qwen2 (q/k/v biases, GQA 4 q / 2 kv heads, rope θ 1e6), eval mode; the biases are
    large enough that a pruning that drops or misplaces them changes the logits."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
                         tie_word_embeddings=tied, initializer_range=0.2)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model


TINY_ARCH = Architecture(name="tiny", family="llama", num_hidden_layers=3, hidden_size=64,
                         intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         vocab_size=101, tie_word_embeddings=False)


def hf_llama(arch: Architecture) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
                         intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_hidden_layers,
                         num_attention_heads=arch.num_attention_heads,
                         num_key_value_heads=arch.num_key_value_heads, head_dim=arch.head_dim,
                         tie_word_embeddings=arch.tie_word_embeddings, rms_norm_eps=1e-5, rope_theta=10000.0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norm weights, so a missed norm shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def hf_gemma() -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
                              layer_types=["sliding_attention", "full_attention"] * 2,
                              query_pre_attn_scalar=24, final_logit_softcapping=30.0,
                              max_position_embeddings=512)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)
    return model


def hf_qwen2(tied: bool) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=103, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                         rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
                         tie_word_embeddings=tied, max_position_embeddings=512)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a missed one shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model


class FactoryCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the tensor factories (a tensor made from a Python value, an arange, an empty buffer) and
    device copies dispatched while active: what a CUDA-graph capture of a step must not contain."""

    NAMES = ("arange", "empty", "zeros", "ones", "full", "scalar_tensor", "lift_fresh", "randn", "rand",
             "randint", "normal", "tensor")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name.rstrip("_").split(".")[0] in self.NAMES or name in ("empty_like", "zeros_like", "ones_like"):
            self.seen.append(name)
        if name in ("_to_copy", "copy_") and "device" in kwargs:
            self.seen.append(f"{name} to {kwargs['device']}")
        return func(*args, **kwargs)


def hf_family(family: str) -> torch.nn.Module:
    """A tiny transformers model of `family` (llama, qwen2 or gemma3) with non-trivial norms."""
    builders = {"llama": lambda: hf_llama(TINY_ARCH), "qwen2": lambda: hf_qwen2(False), "gemma3": hf_gemma}
    return builders[family]()


def installed_vllm():
    """The vLLM draftnas finds here (None where none is installed)."""
    from draftnas.models.vllm_engine import VllmError, find_vllm

    try:
        return find_vllm()
    except VllmError:
        return None


def needs_vllm(test):
    """Marks a test that runs vLLM itself: an integration test, skipped where vLLM is not installed (CI
    installs it), saying how to install it."""
    import pytest

    reason = "vLLM is not installed for draftnas here (`draftnas engines --install vllm`)"
    for mark in (pytest.mark.integration, pytest.mark.real_model,
                 pytest.mark.skipif(installed_vllm() is None, reason=reason)):
        test = mark(test)
    return test
