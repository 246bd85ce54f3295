"""Training a head: the budget is honoured exactly, an interrupted run resumes to the same weights, the
held-out reading is the acceptance the speculative loop gets on those continuations, and a shape the data's
target cannot have is one line naming its flag, before anything is written."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftnas.core.options import OptionError
from draftnas.drafter.head.build import head_proposer, new_head, target_hidden
from draftnas.drafter.head.records import HeadTrainRequest
from draftnas.drafter.head.shape import head_shape
from draftnas.drafter.head.train import STATE_FILE, HeadTrainer, Heldout, check_head_request, exact_acceptance
from draftnas.drafter.training.distill_store import iter_sequences
from draftnas.drafter.training.packing import build_stream
from draftnas.models.speculative import greedy_generate, speculate
from tests.drafter.test_distill import _data, _manifest
from tests.helpers import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(tiny_llama_config):
    return tiny_llama(tiny_llama_config, initializer_range=0.2).requires_grad_(False)


def _head(target, seed=1):
    shape = head_shape(target.config.to_dict(), "tiny", layers=(1, 2, 3), draft_vocab=96, ffn=48)
    return new_head(target, shape, list(range(16, 112)), seed=seed)


def _held(target, head, prompts=((1, 5, 9, 3, 7, 2, 8), (4, 4, 6, 1)), new=20):
    out = []
    for p in prompts:
        ids = torch.tensor(list(p) + greedy_generate(target, list(p), max_new_tokens=new))
        out.append(Heldout(ids, len(p), target_hidden(target, ids[None], head.shape.layers)[0]))
    return out


def _train_run(tmp_path: Path, target, name: str, **kw):
    manifest = _data(tmp_path / "data")
    request = HeadTrainRequest(data=str(tmp_path / "data"), out=str(tmp_path / name), tokens=500, seq_len=16,
                               batch_rows=2, readings=3, warmup_tokens=50, lr=5e-3, unroll=2,
                               checkpoint_minutes=1000.0, **kw)
    head = _head(target)
    folder = Path(request.out)
    folder.mkdir(parents=True, exist_ok=True)
    trainer = HeadTrainer(request, head, target, _held(target, head), folder, "key", None)
    trainer.load()
    stream = build_stream(list(iter_sequences(request.data, manifest)))
    finished = trainer.train(stream)
    trainer.save()
    return trainer, finished


@pytest.mark.parametrize("features", ["compute", "store"])
def test_the_budget_is_honoured_and_a_resumed_run_ends_with_the_same_weights(tmp_path, target, features):
    _train = functools.partial(_train_run, features=features)
    whole, finished = _train(tmp_path, target, "a")
    assert finished and whole.state.tokens == 500
    # a reading after the step that reaches each log-spaced budget (5, 50, 500), the last at the budget
    read = [r.tokens for r in whole.state.readings]
    assert len(read) == 3 and read == sorted(read) and read[0] >= 5 and read[1] >= 50 and read[-1] == 500
    cut, done = _train(tmp_path, target, "b", stop_after_tokens=200)
    assert not done and 200 <= cut.state.tokens < 500
    resumed, finished = _train(tmp_path, target, "b")
    assert finished and resumed.state.tokens == 500
    a, b = whole.head.state_dict(), resumed.head.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    fresh = _head(target).state_dict()
    assert any(not torch.equal(a[k], fresh[k]) for k in a)  # training moved the weights


@pytest.mark.parametrize("gamma", [1, 3])
def test_the_reading_is_the_acceptance_the_loop_gets(target, gamma):
    """Exact greedy acceptance: on the target's own greedy continuation the unrolled steps make the same
    accept counts as the head drafting in the speculative loop."""
    head = _head(target, seed=4)
    held = _held(target, head)
    embeddings = target.get_input_embeddings().weight
    top1, per_step = exact_acceptance(head, embeddings, held, gamma)
    emitted = steps = 0
    for h in held:
        prompt = h.ids[:h.prompt_len].tolist()
        out = speculate(target, head_proposer(head, target, 64), prompt, gamma=gamma,
                        max_new_tokens=len(h.ids) - h.prompt_len)
        assert out.tokens == h.ids[h.prompt_len:].tolist()
        emitted, steps = emitted + len(out.tokens) - 1, steps + out.steps  # the first token is the prefill's
    assert per_step == pytest.approx(emitted / steps) and 0 <= top1 <= 1
    assert sum(1 for _ in held) == 2


@pytest.mark.parametrize(("field", "value", "flag"), [
    ("layers", (1, 9), "--layers"), ("draft_vocab", 999, "--draft-vocab")])
def test_a_shape_the_target_cannot_have_names_its_flag(target, field, value, flag):
    request = HeadTrainRequest(data="d", out="o", **{field: value})
    with pytest.raises(OptionError, match=f"^{field} ") as caught:
        check_head_request(request, _manifest(), target.config.to_dict())
    assert caught.value.for_flags().startswith(f"{flag} ")


def test_the_cli_refuses_a_draft_vocabulary_larger_than_the_targets_before_writing(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    manifest = _manifest(target="smollm2-135m", vocab_size=49152)
    (data / "manifest.json").write_text(json.dumps(manifest.to_dict()))
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "draftnas", "distill", "head", str(data), "--out", str(out),
                           "--draft-vocab", "60000"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--draft-vocab" in done.stderr and "49,152" in done.stderr
    assert not out.exists()


def test_the_reproducing_command_names_only_the_options_given_a_value():
    from draftnas.drafter.head.train import _command

    said = _command(HeadTrainRequest(data="runs/data", out="runs/head", tokens=1000))
    assert said.startswith("draftnas distill head runs/data --out runs/head") and "--layers" not in said
    assert "--tokens 1000" in said


def test_a_walk_to_a_budget_stops_where_the_answer_ended_first():
    """vLLM stops a request at its end-of-sequence token: a replay to a budget past the answer's end takes
    no steps there (they would count drafts vLLM never made); draftnas's loop cuts drafts at the end."""
    from draftnas.bench.vllm_replay import drafts_chain
    from draftnas.drafter.head.train import head_walk

    ids = torch.tensor([5, 6, 7, 1, 2, 3, 4])  # a 3-token prompt, a 4-token answer ending the request
    drafts = [torch.tensor([0, 0, 2, 0, 4, 0]), torch.zeros(6, dtype=torch.long)]  # step j's draft at row p
    listed = [d.tolist() for d in drafts]
    assert drafts_chain(listed, ids.tolist(), 3, 2, budget=64).walk(2) == [(1, 2), (1, 2)]
    assert drafts_chain(listed, ids.tolist(), 3, 2, budget=2).walk(2) == [(1, 2)]  # its step drafts γ still
    assert head_walk(drafts, ids, 3, 2) == [(1, 2), (0, 0)]


def test_stored_features_are_each_sequences_own_and_train_as_the_rows_computed_would(target):
    """`--features store`: the target reads each sequence alone once; a row gathers them by stream position.
    Where each row is one whole sequence (no neighbour to attend to), the loss equals the computed rows'
    up to the fp16 the store keeps."""
    from draftnas.drafter.training.distill_store import DistillSequence
    from draftnas.drafter.training.packing import epoch_index

    gen = torch.Generator().manual_seed(3)
    seqs = []
    for _ in range(5):
        ids = torch.randint(16, 112, (16,), generator=gen).tolist()
        probs = torch.softmax(torch.randn(12, 4, generator=gen), -1)
        seqs.append(DistillSequence(ids, 4, "chat", torch.randint(16, 112, (12, 4), generator=gen), probs))
    stream = build_stream(seqs)
    head = _head(target)
    request = HeadTrainRequest(data="d", out="o", tokens=100, seq_len=16, batch_rows=2, unroll=2)
    store = HeadTrainer(request, head, target, [], Path("."), "k", None)
    store.store_features(stream)
    start, n = stream.sequences[2]
    alone = target_hidden(target, stream.ids[start:start + n].long()[None], head.shape.layers)[0]
    assert torch.allclose(store.store[start:start + n].float(), alone.transpose(0, 1), rtol=1e-2, atol=1e-2)
    computed = HeadTrainer(request, head, target, [], Path("."), "k", None)
    index, teach = epoch_index(stream, 16, 0, 0)
    assert all(int(row[0]) % 16 == 0 for row in index)  # each row one whole sequence
    with torch.no_grad():
        a, n_a = store.loss(index[:2], teach[:2], stream, 100)
        b, n_b = computed.loss(index[:2], teach[:2], stream, 100)
    assert n_a == n_b > 0 and float(a) == pytest.approx(float(b), rel=1e-3) and float(a) != float(b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_head_trains_on_cuda_to_its_budget_from_stored_features(tmp_path, tiny_llama_config):
    cuda_target = tiny_llama(tiny_llama_config, initializer_range=0.2).requires_grad_(False).to("cuda")
    trainer, finished = _train_run(tmp_path, cuda_target, "gpu", features="store")
    assert finished and trainer.state.tokens == 500 and trainer.store is not None
    assert next(trainer.head.parameters()).device.type == "cuda"
    assert trainer.state.readings[-1].tokens_per_step > 0


@pytest.mark.parametrize("features", ["compute", "store"])
def test_two_processes_under_torchrun_train_one_head_to_the_budget(tmp_path, target, features):
    """torch's own launcher starts two CPU processes (gloo): the tokens they taught together meet the budget
    exactly, every process ends with the same weights and the same stored states, the checkpoint holds them,
    and the head trained (its weights moved from the untrained head's)."""
    import os

    _data(tmp_path / "data")
    root = Path(__file__).resolve().parents[2]
    # torchrun's own temporary folders go under the test's, not /tmp
    env = os.environ | {"PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(root / "tests" / "drafter" / "head_ranks_worker.py"), str(tmp_path / "data"),
         str(tmp_path / "out"), features],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = (torch.load(tmp_path / "out" / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert a["world"] == b["world"] == 2 and a["finished"] and b["finished"]
    assert a["tokens"] == b["tokens"] == 500
    assert all(torch.equal(a["head"][k], b["head"][k]) for k in a["head"])
    assert a["readings"] == b["readings"] and len(a["readings"]) >= 2  # every process read alike
    if features == "store":
        assert torch.equal(a["store"], b["store"]) and bool((a["store"] != 0).any(-1).any(-1).all())
    fresh = _head(target).state_dict()
    assert any(not torch.equal(a["head"][k], fresh[k]) for k in fresh)
    saved = torch.load(tmp_path / "out" / STATE_FILE, weights_only=False)  # the first process's checkpoint
    assert saved["tokens"] == 500 and all(torch.equal(saved["head"][k], a["head"][k]) for k in fresh)
