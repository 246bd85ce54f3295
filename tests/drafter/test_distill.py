"""Self-distillation at a token budget: the data store, packed rows, the budget, resume, the curve fit,
and one-line errors for a user's mistakes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import OptionError
from draftnas.drafter.training.distill_records import (
    DATA_FORMAT,
    DataManifest,
    DistillDataRequest,
    DistillTrainRequest,
    DistillTrainResult,
    TrainReading,
)
from draftnas.drafter.training.distill_store import (
    DistillSequence,
    append_shard,
    iter_sequences,
    read_manifest,
)
from tests.helpers import tiny_llama

K = 4
VOCAB = 128


def _seq(rng: torch.Generator, n: int, prompt_len: int, domain: str) -> DistillSequence:
    ids = torch.randint(0, VOCAB, (n,), generator=rng).tolist()
    probs = torch.rand(n - prompt_len, K, generator=rng)
    probs = (probs / probs.sum(-1, keepdim=True) * 0.9).sort(-1, descending=True).values
    top = torch.stack([torch.randperm(VOCAB, generator=rng)[:K] for _ in range(n - prompt_len)])
    return DistillSequence(ids, prompt_len, domain, top, probs)


def _manifest(**changes) -> DataManifest:
    m = DataManifest(format=DATA_FORMAT, target="tiny", vocab_size=VOCAB, tokenizer_fingerprint="f", top_k=K,
                     dtype="fp32", heldout_every=3, heldout_prompts=())
    return replace(m, **changes)


def _data(folder: Path, n_units: int = 3) -> DataManifest:
    rng = torch.Generator().manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = _manifest()
    for u in range(n_units):
        seqs = [_seq(rng, 20 + 3 * j, 1 if u % 2 else 5, "chat" if j % 2 else "code") for j in range(6)]
        manifest = append_shard(folder, manifest, f"unit:{u}", "generated", seqs)
    return manifest


def test_store_round_trips_and_checks_hashes(tmp_path):
    manifest = _data(tmp_path)
    again = read_manifest(tmp_path)
    assert again == manifest and len(again.shards) == 3
    seqs = list(iter_sequences(tmp_path, again))
    assert len(seqs) == 18
    assert sum(s.positions for s in seqs) == again.positions()
    assert again.positions(domain="chat") + again.positions(domain="code") == again.positions()
    chat = list(iter_sequences(tmp_path, again, domain="chat"))
    assert chat and all(s.domain == "chat" for s in chat)
    assert seqs[0].topk_probs.dtype == torch.float16 and seqs[0].topk_ids.shape == (seqs[0].positions, K)
    shard = tmp_path / again.shards[1].file
    shard.write_bytes(shard.read_bytes()[:-10])  # truncated
    with pytest.raises(InvalidInputError, match="sha256"):
        list(iter_sequences(tmp_path, again))
    (tmp_path / "manifest.json").write_text('{"format": 1')
    with pytest.raises(InvalidInputError, match="manifest"):
        read_manifest(tmp_path)


def test_packed_rows_teach_each_position_once_per_epoch(tmp_path):
    from draftnas.drafter.training.packing import build_stream, epoch_rows, row_batch

    manifest = _data(tmp_path)
    stream = build_stream(list(iter_sequences(tmp_path, manifest)))
    ids, teach = epoch_rows(stream, 16, seed=0, epoch=0)
    taught = teach[teach >= 0]
    # every taught position but those cut with the trailing partial row appears once
    assert len(set(taught.tolist())) == len(taught)
    assert len(taught) >= manifest.positions() - 16
    # teach[r, i] belongs to token i + 1 of the row: the top-k row points at that very token's position
    ids2, teach2 = epoch_rows(stream, 16, seed=0, epoch=1)
    assert not torch.equal(ids, ids2)  # another epoch, another order
    assert torch.equal(epoch_rows(stream, 16, seed=0, epoch=0)[0], ids)  # the same epoch, the same rows
    batch = row_batch(stream, ids[:2], teach[:2], limit=5)
    assert batch.positions.shape == (5, 2) and batch.topk_ids.shape == (5, K)
    assert torch.allclose(batch.leftover + batch.topk_probs.sum(-1), torch.ones(5), atol=1e-3)


def test_reading_budgets_are_log_spaced_and_end_at_the_budget():
    from draftnas.drafter.training.train import reading_budgets

    b = reading_budgets(1_000_000, 4, first=1_000)
    assert b == [1_000, 10_000, 100_000, 1_000_000]
    assert reading_budgets(500, 3) == [5, 50, 500]
    assert reading_budgets(500, 1) == [500]


def _train_request(tmp_path: Path, **kw) -> DistillTrainRequest:
    base = dict(data=str(tmp_path / "data"), out=str(tmp_path / "run"), tokens=600, finetune_domain="chat",
                finetune_tokens=200, seq_len=16, batch_rows=2, readings=3, head_rows=0, warmup_tokens=100,
                lr=5e-3, dtype="fp32", checkpoint_minutes=1000.0)
    base.update(kw)
    return DistillTrainRequest(**base)


def _run(request: DistillTrainRequest, manifest: DataManifest, config) -> tuple[dict, object]:
    from draftnas.drafter.heal.heal_data import HealSequence
    from draftnas.drafter.training.train import train_drafter

    drafter = tiny_llama(config, seed=3)
    held = [HealSequence(list(range(10, 30)), 8, list(range(18, 30))),
            HealSequence(list(range(40, 52)), 4, list(range(44, 52)))]
    folder = Path(request.out)
    folder.mkdir(parents=True, exist_ok=True)
    trainer, _, finished = train_drafter(request, drafter, held, 0, manifest, folder, "key", None)
    return {n: p.detach().clone() for n, p in drafter.named_parameters()}, (trainer, finished)


def test_budget_is_honoured_and_resume_gives_the_same_weights(tmp_path, tiny_llama_config, one_thread):
    manifest = _data(tmp_path / "data")
    whole, (trainer, finished) = _run(_train_request(tmp_path, out=str(tmp_path / "a")), manifest,
                                      tiny_llama_config)
    assert finished and trainer.state.tokens == 800  # pretrain 600 + finetune 200, exactly
    phases = [r.phase for r in trainer.state.readings]
    assert phases[0] == "untrained" and "pretrain" in phases and phases[-1] == "finetune"
    assert [r.tokens for r in trainer.state.readings if r.phase == "pretrain"][-1] == 600  # its end
    # an interruption at 300 tokens, then the same call again: the same weights, bit for bit
    _, (cut, done) = _run(_train_request(tmp_path, out=str(tmp_path / "b"), stop_after_tokens=300), manifest,
                          tiny_llama_config)
    assert not done and 300 <= cut.state.tokens < 800
    resumed, (trainer_b, finished_b) = _run(_train_request(tmp_path, out=str(tmp_path / "b")), manifest,
                                            tiny_llama_config)
    assert finished_b and trainer_b.state.tokens == 800
    assert all(torch.equal(whole[n], resumed[n]) for n in whole)
    # and training moved the weights
    fresh = dict(tiny_llama(tiny_llama_config, seed=3).named_parameters())
    assert any(not torch.equal(whole[n], fresh[n].detach()) for n in whole)


def test_resume_against_another_run_is_refused(tmp_path, tiny_llama_config):
    from draftnas.drafter.heal.heal_data import HealSequence
    from draftnas.drafter.training.train import train_drafter

    manifest = _data(tmp_path / "data")
    request = _train_request(tmp_path, stop_after_tokens=100)
    _run(request, manifest, tiny_llama_config)
    held = [HealSequence(list(range(10, 30)), 8, list(range(18, 30)))]
    with pytest.raises(InvalidInputError, match="another shape"):
        train_drafter(request, tiny_llama(tiny_llama_config), held, 0, manifest, Path(request.out),
                      "changed", None)


def _result(points: list[tuple[int, float]]) -> DistillTrainResult:
    readings = tuple(TrainReading(tokens=t, phase="pretrain" if t else "untrained", train_s=0.0, loss=None,
                                  top1_agreement=0.1, tokens_per_step=y) for t, y in points)
    readings += (TrainReading(tokens=points[-1][0] * 2, phase="finetune", train_s=0.0, loss=None,
                              top1_agreement=0.5, tokens_per_step=3.0),)  # not on the curve
    return DistillTrainResult(out="r", base="b", target="t", label="L1", layers=(0,), head_rows=0,
                              train="layers",
                              trained_tokens=points[-1][0], budget_tokens=points[-1][0], train_s=1.0,
                              trainable_parameters=1, readings=readings, delta_file="", delta_sha256="",
                              kept="trained", command="", gamma=3)


def test_curve_fit_is_the_least_squares_log_line_and_checks_the_last_budget():
    from draftnas.drafter.training.curve_fit import fit_curve, fit_log_line

    a, b = fit_log_line([(math.e, 1.0), (math.e ** 3, 2.0)])
    assert a == pytest.approx(0.5) and b == pytest.approx(0.5)
    pts = [(0, 1.05)] + [(t, 1.2 + 0.05 * math.log(t)) for t in (1e3, 1e4, 1e5)] + [(1e6, 1.8)]
    curve = fit_curve(_result([(int(t), y) for t, y in pts]), min_tokens=1_000)
    assert curve.gamma == 3 and curve.untrained == 1.05
    # the check fits 1e3..1e5 (an exact line) and predicts 1e6 from it
    assert curve.check.predicted == pytest.approx(1.2 + 0.05 * math.log(1e6))
    assert curve.check.measured == 1.8
    # the error is on the gain over one token per step (near 1.0 an error on tokens per step says little)
    assert curve.check.error == pytest.approx((curve.check.predicted - 1) / 0.8 - 1)
    # the points fitted (1e3..1e6) lie near a line: its slope's interval excludes 0
    low, high = curve.slope_interval()
    assert 0 < low < curve.slope < high and curve.measurable_slope
    # predictions stay within [untrained, gamma + 1]; tokens_for inverts predict
    assert curve.predict(0) == 1.05 and curve.predict(1e300) == 4.0
    target = curve.predict(3e5)
    assert curve.tokens_for(target) == pytest.approx(3e5, rel=1e-6)
    assert curve.tokens_for(5.0) is None
    with pytest.raises(InvalidInputError, match="3 at least"):
        fit_curve(_result([(0, 1.0), (1000, 1.1), (2000, 1.2)]), min_tokens=1_500)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "draftnas", *args], capture_output=True, text=True)


@pytest.mark.parametrize("args, needle", [
    (("distill", "train", "{data}", "--out", "{out}", "--tokens", "0"), "--tokens"),
    (("distill", "data", "{out}", "--minutes", "0"), "--minutes"),
    (("distill", "data", "{out}", "--temperatures", "0,5"), "--temperatures"),
    (("distill", "train", "{data}", "--out", "{out}", "--finetune-tokens", "10"), "--finetune-domain"),
])
def test_bad_budgets_are_one_line_exit_2_and_write_nothing(tmp_path, args, needle):
    data, out = tmp_path / "data", tmp_path / "out"
    _data(data)
    done = run_cli(*(a.format(data=data, out=out) for a in args))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and needle in lines[0], done.stderr
    assert not out.exists()


def test_data_request_needs_a_budget(tmp_path):
    from draftnas.drafter.training.distill_data import make_distill_data

    with pytest.raises(InvalidInputError, match="budget"):
        make_distill_data(DistillDataRequest(out=str(tmp_path / "d")))
    assert not (tmp_path / "d").exists()


def test_prompt_split_holds_out_every_third_of_each_domain():
    from draftnas.core.prompts import load_prompts
    from draftnas.drafter.training.distill_data import split_prompts

    prompts = load_prompts("chat,code")
    train, held = split_prompts(prompts, 3)
    assert not {p.id for p in train} & {p.id for p in held}
    chat = [p for p in prompts if p.domain == "chat"]
    assert [p.id for p in held if p.domain == "chat"] == [p.id for i, p in enumerate(chat) if i % 3 == 0]


@pytest.mark.real_model
def test_train_refuses_another_tokenizer_and_a_wider_shape_before_training(tmp_path):
    from draftnas.drafter.training.train import train_from_request

    data = tmp_path / "data"
    _data(data)
    manifest = read_manifest(data)
    (data / "manifest.json").write_text(json.dumps(replace(manifest, target="smollm2-135m").to_dict()))
    request = DistillTrainRequest(data=str(data), out=str(tmp_path / "out"), layers=(0, 30), head_rows=60_000)
    with pytest.raises(OptionError) as err:
        train_from_request(request)
    text = err.value.for_flags()  # the command line's names; str() gives the request's (layers 30)
    assert "tokenizer" in text and "--layers 30" in text and "--head-rows 60000" in text
    assert "layers 30" in str(err.value) and "--layers" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_finetune_may_read_another_folder_but_a_resumed_one_reads_the_same(tmp_path, tiny_llama_config):
    from draftnas.drafter.heal.heal_data import HealSequence
    from draftnas.drafter.training.train import train_drafter

    manifest = _data(tmp_path / "data")
    other = _data(tmp_path / "other", n_units=2)
    held = [HealSequence(list(range(10, 30)), 8, list(range(18, 30)))]
    # stopped inside the finetune (pretrain 600, finetune 200: stop at 700)
    request = _train_request(tmp_path, stop_after_tokens=700)
    folder = Path(request.out)
    folder.mkdir(parents=True)
    trainer, _, done = train_drafter(request, tiny_llama(tiny_llama_config, seed=3), held, 0, manifest,
                                     folder, "key", None, other)
    assert not done and 700 <= trainer.state.tokens < 800 and trainer.state.fine_key is not None
    with pytest.raises(InvalidInputError, match="finetuned on other data"):
        train_drafter(_train_request(tmp_path), tiny_llama(tiny_llama_config, seed=3), held, 0, manifest,
                      folder, "key", None, manifest)
    trainer, _, done = train_drafter(_train_request(tmp_path), tiny_llama(tiny_llama_config, seed=3), held, 0,
                                     manifest, folder, "key", None, other)
    assert done and trainer.state.tokens == 800


def test_a_training_request_the_data_or_base_cannot_serve_names_each_flag(monkeypatch):
    """Every mistake at once, each under the name its caller gave it: the request's field for a Python
    caller, the flag (or the positional DATA) on the command line."""
    from types import SimpleNamespace

    from draftnas.drafter.training import train_setup
    from draftnas.drafter.training.distill_records import DataManifest, DistillTrainRequest

    monkeypatch.setattr(train_setup, "tokenizer_fingerprint", lambda tokenizer: "other")
    manifest = DataManifest(format=1, target="smollm2-135m", vocab_size=49152, tokenizer_fingerprint="mine",
                            top_k=8, dtype="fp32", heldout_every=3, heldout_prompts=())
    embeddings = SimpleNamespace(weight=SimpleNamespace(shape=(100, 8)))
    config = SimpleNamespace(num_hidden_layers=4)
    base = SimpleNamespace(config=config, get_input_embeddings=lambda: embeddings)
    request = DistillTrainRequest(data="d", out="o", layers=(0, 7), head_rows=200, finetune_domain="chat")
    with pytest.raises(OptionError) as caught:
        train_setup.check_request(request, manifest, base, tokenizer=None)
    said = caught.value.for_flags()
    assert said.startswith("DATA d was made with smollm2-135m's tokenizer")
    assert "; --layers 7: the base has layers 0..3" in said
    assert "; --head-rows 200: wider than the base's 100-row head" in said
    assert "; --finetune-domain chat: the data has " in said
    assert "layers 7: the base has" in str(caught.value) and "--" not in str(caught.value)


def test_library_errors_name_the_parameter_and_the_command_line_its_flag(tmp_path):
    """A Python caller reads the request's names, the CLI its flags: the fine-tune's domain, the data
    budget and a row longer than the data."""
    from draftnas.drafter.training.distill_data import make_distill_data
    from draftnas.drafter.training.distill_records import DistillDataRequest, DistillTrainRequest
    from draftnas.drafter.training.packing import Stream, epoch_rows

    with pytest.raises(OptionError) as caught:
        DistillTrainRequest(data="d", out="o", finetune_tokens=100).validate()
    assert str(caught.value) == "finetune_domain must name a domain when finetune_tokens is above 0"
    said = caught.value.for_flags()
    assert said == "--finetune-domain must name a domain when --finetune-tokens is above 0"
    with pytest.raises(OptionError) as caught:
        make_distill_data(DistillDataRequest(target="smollm2-135m", out=str(tmp_path / "d")))
    assert caught.value.for_flags() == "--minutes and --tokens are both unset: give a budget (one or both)"
    assert not (tmp_path / "d").exists()
    stream = Stream(torch.arange(10), torch.arange(10), torch.zeros(10, 2), torch.zeros(10, 2), [(0, 10)])
    assert epoch_rows(stream, 4, seed=0, epoch=0)[0].shape == (2, 4)
    with pytest.raises(OptionError) as caught:
        epoch_rows(stream, 16, seed=0, epoch=0)
    assert str(caught.value) == ("seq_len is 16: the data's 10 tokens make no row that long; lower it or "
                                 "make more data")


def test_a_heads_run_gives_a_head_curve_with_its_shape_and_check(tmp_path):
    """`distill curve` reads a `distill head` folder (head.json): every reading of the run is on the curve,
    and the curve carries the head's shape (the layers it reads, its draft vocabulary, its FFN width)."""
    from draftnas.drafter.head.records import RESULT_FILE, HeadTrainResult
    from draftnas.drafter.head.shape import HeadShape, TargetKey
    from draftnas.drafter.training.curve_fit import fit_curve, read_curve_run

    shape = HeadShape(target=TargetKey("t", 30, 576, 49152), layers=(2, 15, 27), draft_vocab=4096, ffn=768,
                      heads=9, kv_heads=3, head_dim=64, rope_theta=1e5, rms_norm_eps=1e-5, max_positions=2048)
    points = [(0, 1.0)] + [(t, 0.5 + 0.06 * math.log(t) + (0.004 if i % 2 else -0.004))
                           for i, t in enumerate((10_000, 30_000, 90_000, 270_000))]
    readings = tuple(TrainReading(tokens=t, phase="train" if t else "untrained", train_s=0.0, loss=None,
                                  top1_agreement=0.1, tokens_per_step=y) for t, y in points)
    result = HeadTrainResult(out=str(tmp_path), head=str(tmp_path / "head"), target="t", label=shape.label(),
                             parameters=shape.parameters(), trained_tokens=270_000, budget_tokens=270_000,
                             train_s=1.0, features_s=0.5, readings=readings, kept="trained", command="c",
                             shape=shape)
    (tmp_path / RESULT_FILE).write_text(json.dumps(result.to_dict()))
    curve = fit_curve(read_curve_run(tmp_path), min_tokens=10_000)
    assert (curve.family, curve.layers, curve.head_rows, curve.ffn, curve.base) == ("head", (2, 15, 27), 4096,
                                                                                    768, "t")
    assert len(curve.points) == 4 and curve.check.tokens == 270_000
    assert curve.slope == pytest.approx(0.06, abs=0.01) and curve.measurable_slope
    assert curve.delta_sha256 == ""  # no head folder here to hash
    (tmp_path / RESULT_FILE).unlink()
    with pytest.raises(InvalidInputError, match="no train.json or head.json"):
        read_curve_run(tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
@pytest.mark.parametrize("command", ["data", "head"])
def test_cuda_asked_for_without_one_is_one_line_and_writes_nothing(tmp_path, command):
    out = tmp_path / "out"
    args = (["distill", "data", str(out), "--minutes", "1"] if command == "data" else
            ["distill", "head", str(tmp_path), "--out", str(out)])
    if command == "head":
        _data(tmp_path)
    done = run_cli(*args, "--device", "cuda")
    assert done.returncode == 2 and "--device cuda" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
