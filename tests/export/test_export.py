"""Export: folder contents, atomic writes, --force, reload, study trials, hub offline, lossless use."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from draftnas.core.errors import ExportError, InvalidInputError
from draftnas.core.options import OptionError
from draftnas.drafter.records import PruningPlan
from draftnas.export.records import ExportInfo


def _plan(base: str = "tiny") -> PruningPlan:
    return PruningPlan(base=base, base_num_layers=4, layers=(0, 3), layer_selection="explicit",
                       num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                       importance="magnitude")


@pytest.fixture()
def tiny_base(tiny_llama_config, tmp_path):
    """A tiny random LLaMA with a word-level tokenizer, saved as a HF folder: (folder, model, tokenizer)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config).eval()
    vocab = {f"w{i}": i for i in range(128)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w1", pad_token="w2")
    folder = tmp_path / "base"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer


def _export(tiny_base, out, **info):
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.export.folder import export_drafter

    _, model, tokenizer = tiny_base
    drafter = apply_plan(model, _plan())
    defaults = dict(base="tiny", target="tiny-target", plan=_plan(), gamma=3)
    return drafter, export_drafter(drafter, tokenizer, out, ExportInfo(**{**defaults, **info}))


def test_export_writes_a_loadable_folder(tiny_base, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    drafter, out = _export(tiny_base, tmp_path / "drafter", trial=_trial(0, 130.0))
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md",
            "draftnas.json", "tokenizer.json"} <= names
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"],
            config["intermediate_size"], config["head_dim"]) == (2, 2, 1, 32, 8)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["num_assistant_tokens"] == 3 and gen["num_assistant_tokens_schedule"] == "constant"
    meta = json.loads((out / "draftnas.json").read_text())
    assert PruningPlan.from_data(meta["plan"]) == _plan()
    assert meta["architecture"]["num_hidden_layers"] == 2 and "transformers" in meta["versions"]
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and 'base_model: "tiny"' in card
    assert "- speculative-decoding" in card and "- draft-model" in card and "assistant_model=" in card
    assert '"num_speculative_tokens": 3' in card and "| latency.draft_ms | 1, 1 |" in card
    # the shipped text names no host: a user's card speaks of their machine, not ours
    assert not any(host in card for host in ("EPYC", "Xeon", "Zen", "2-core", "H100", "H200"))
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    probe = torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(loaded(probe).logits, drafter(probe).logits)
    assert AutoTokenizer.from_pretrained(out)("w5 w6")["input_ids"] == [5, 6]


def test_the_card_shows_every_figure_whole_however_large_the_records(tiny_base, tmp_path):
    from draftnas.search.records import WorkloadPrediction

    one = WorkloadPrediction.from_dict(_prediction(1.0 / 3))
    big = dataclasses.replace(one, per_batch=one.per_batch * 30, batch_weights=(1.0 / 60,) * 60)
    _, out = _export(tiny_base, tmp_path / "d", trial=dataclasses.replace(_trial(0, 1.0), throughput=big))
    card = (out / "README.md").read_text()
    assert "```json" not in card  # no JSON block to cut mid-object
    assert "| latency.profile | cpu-default |" in card
    assert "more in `draftnas.json`" in card
    meta = json.loads((out / "draftnas.json").read_text())
    assert len(meta["trial"]["throughput"]["per_batch"]) == 60  # the whole record is there


def test_non_empty_folder_refused_without_force(tiny_base, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OptionError, match="not empty; set force to replace it") as caught:
        _export(tiny_base, out)
    assert "--out " in caught.value.for_flags() and "set --force to replace it" in caught.value.for_flags()
    assert (out / "keep.txt").read_text() == "mine"
    from draftnas.export.folder import export_drafter

    _, model, tokenizer = tiny_base
    export_drafter(model, tokenizer, out, ExportInfo(base="tiny", target="tiny"), force=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "busy"]


def test_failed_export_leaves_nothing_behind(tiny_base, tmp_path, monkeypatch):
    import draftnas.export.folder as export

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "model_card", boom)
    with pytest.raises(RuntimeError):
        _export(tiny_base, tmp_path / "drafter")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]


def test_push_to_hub_offline_says_so(tmp_path, monkeypatch):
    from draftnas.export.hub import push_to_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ExportError, match="unreachable.*offline.*saved at"):
        push_to_hub(tmp_path, "me/drafter")


# --------------------------------------------------------------------------- from a study


def _prediction(tokens_per_s: float) -> dict:
    """A stored prediction as the search writes it: best gamma 5 at batch 1 (70% of tokens),
    gamma 2 at batch 8."""
    from draftnas.core.throughput import ThroughputEstimate
    from draftnas.search.records import WorkloadPrediction

    def at(batch: int, gamma: int) -> ThroughputEstimate:
        return ThroughputEstimate(batch_size=batch, gamma=gamma, acceptance_rate=0.5, tokens_per_step=2.0,
                                  draft_ms=1.0, verify_ms=5.0, target_ms=4.0, step_ms=10.0,
                                  tokens_per_s=tokens_per_s, baseline_tokens_per_s=100.0, speedup=1.2)

    return WorkloadPrediction(per_batch=(at(1, 5), at(8, 2)), batch_weights=(0.7, 0.3),
                              tokens_per_s=tokens_per_s, baseline_tokens_per_s=100.0, speedup=1.2,
                              acceptance_assumed=False).to_dict()


def _trial(number: int, tokens_per_s: float, base: str = "tiny", with_plan: bool = True):
    """A completed trial's records as the search stores them: the tiny plan, priced at `tokens_per_s`."""
    from draftnas.core.registry import get_architecture
    from draftnas.search.records import (
        Candidate,
        CandidateChoice,
        LatencyReading,
        RankedTrial,
        WorkloadPrediction,
    )
    from draftnas.search.scoring import assumed_acceptance

    arch = get_architecture("smollm2-135m").with_shape(num_hidden_layers=2)
    candidate = Candidate(name=f"c{number}", base=base, arch=arch, choice=CandidateChoice(depth=2),
                          plan=_plan(base) if with_plan else None)
    latency = LatencyReading(profile="cpu-default", batch_sizes=(1, 8), context_tokens=64,
                             draft_ms=(1.0, 1.0), target_ms=(4.0, 4.0), verify_ms=((4.0,) * 9, (4.0,) * 9))
    return RankedTrial(number=number, candidate=candidate, latency=latency,
                       acceptance=assumed_acceptance(0.7),
                       throughput=WorkloadPrediction.from_dict(_prediction(tokens_per_s)))


def _info(base="tiny", traces=None):
    """What the fake studies were made for: acceptance assumed, or (`traces`) measured on those."""
    from draftnas.core.registry import get_architecture
    from draftnas.search.records import StudyInfo
    from draftnas.search.spaces import load_search_space

    smol = get_architecture("smollm2-135m")
    space = load_search_space("smollm2-135m")  # its workload at the trials' batch sizes (1 and 8)
    space = dataclasses.replace(space, workload=dataclasses.replace(space.workload, batch_sizes=(1, 8),
                                                                    batch_weights=(0.7, 0.3)))
    return StudyInfo(schema=1, target="tiny-target", base=base, space=space,
                     objectives="throughput", acceptance_assumed=traces is None,
                     acceptance_prior=None if traces else 0.7, profile="cpu-default", target_arch=smol,
                     base_arch=smol, traces=traces)


def _study(storage: str, *, directions=("maximize",), with_plan=True, base="tiny", traces=None):
    """Three trials; acceptance assumed, or (`traces`) measured on those traces."""
    import optuna

    info = _info(base, traces)
    study = optuna.create_study(study_name="s", storage=storage, directions=list(directions))
    study.set_user_attr("draftnas", info.to_dict())
    for i, value in enumerate((10.0, 30.0, 20.0)):
        trial = study.ask()
        record = _trial(i, value, base, with_plan)
        for key in ("candidate", "latency", "acceptance", "throughput"):
            trial.set_user_attr(key, getattr(record, key).to_dict())
        study.tell(trial, [value] * len(directions))
    return study


def test_load_trial_best_and_numbered(tmp_path):
    from draftnas.search.storage import load_trial

    storage = f"sqlite:///{tmp_path / 's.db'}"
    _study(storage)
    info, best = load_trial("s", storage)
    assert best.number == 1 and best.candidate.plan == _plan() and best.candidate.name == "c1"
    assert info.target == "tiny-target" and best.primary.gamma == 5
    assert load_trial("s", storage, 2)[1].candidate.name == "c2"
    with pytest.raises(InvalidInputError, match="trial 7 of study 's' is absent"):
        load_trial("s", storage, 7)
    with pytest.raises(InvalidInputError, match="no study 'other'"):
        load_trial("other", storage)


def test_a_trial_without_a_plan_is_refused(tiny_base, tmp_path):
    from draftnas.export.records import ExportRequest
    from draftnas.export.request import export_from_request

    bare = f"sqlite:///{tmp_path / 'b.db'}"
    _study(bare, with_plan=False)
    with pytest.raises(ExportError, match="holds no pruning plan"):
        export_from_request(ExportRequest(out_dir=str(tmp_path / "out"), study="s", storage=bare))
    assert not (tmp_path / "out").exists()


def test_export_from_study_end_to_end(tiny_base, tmp_path):
    from transformers import AutoModelForCausalLM

    from draftnas.export.records import ExportRequest
    from draftnas.export.request import export_from_request

    folder, _, _ = tiny_base
    storage = f"sqlite:///{tmp_path / 's.db'}"
    _study(storage, base=str(folder))
    out = tmp_path / "from-study"
    result = export_from_request(ExportRequest(out_dir=str(out), study="s", storage=storage, heal_steps=0))
    assert result.source == "study s trial 1" and result.plan == _plan(str(folder))
    meta = json.loads((out / "draftnas.json").read_text())
    assert meta["target"] == "tiny-target" and meta["gamma"] == 5
    assert meta["trial"]["candidate"]["name"] == "c1"
    assert json.loads((out / "generation_config.json").read_text())["num_assistant_tokens"] == 5
    assert meta["profile"] == "cpu-default"
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2


def test_exported_gamma_is_the_best_for_the_drafter_as_exported_else_the_searched_one():
    from draftnas.export.records import ExportRequest
    from draftnas.export.request import _drafting
    from draftnas.search.records import WorkloadPrediction

    request = ExportRequest(out_dir="x", study="s")
    trial = _trial(0, 1.0)
    assert _drafting(request, trial, None)[0] == 5
    one = _prediction(1.0)
    one["batch_weights"] = [0.2, 0.8]  # batch 8 now carries most tokens
    heavy = dataclasses.replace(trial, throughput=WorkloadPrediction.from_dict(one))
    assert _drafting(request, heavy, None)[0] == 2
    assert _drafting(ExportRequest(out_dir="x", study="s", gamma=3), heavy, None)[0] == 3  # --gamma wins
    assert _drafting(request, None, None)[0] == 4
    rescored = _prediction(1.0)
    rescored["per_batch"][0]["gamma"] = 1  # priced again at the exported drafter's acceptance
    assert _drafting(request, trial, WorkloadPrediction.from_dict(rescored))[0] == 1
    rescored["per_batch"][0]["gamma"] = 0  # "do not speculate": a folder still says the search's gamma
    assert _drafting(request, trial, WorkloadPrediction.from_dict(rescored))[0] == 5
    stopped = _prediction(1.0)
    stopped["per_batch"][0].update(gamma=9, p_min=0.6)  # its stop goes with its gamma
    assert _drafting(request, trial, WorkloadPrediction.from_dict(stopped)) == (9, 0.6)
    by_hand = ExportRequest(out_dir="x", study="s", gamma=3)  # --gamma drafts that many every step
    assert _drafting(by_hand, trial, WorkloadPrediction.from_dict(stopped)) == (3, 0.0)


def test_an_export_from_a_measuring_study_is_priced_on_records_its_healing_never_saw(tiny_base, tmp_path):
    from draftnas.acceptance.records import TraceOptions, held_out
    from draftnas.acceptance.tracing import build_traces
    from draftnas.core.prompts import load_prompts
    from draftnas.drafter.heal.heal_records import HealOptions
    from draftnas.export.records import ExportRequest
    from draftnas.export.request import export_from_request
    from draftnas.models.sources import load_model

    folder, _, _ = tiny_base
    traces = build_traces(load_model(str(folder)), list(load_prompts("chat", per_domain=6)),
                          TraceOptions(max_new_tokens=6, batch_size=6), tmp_path / "t.safetensors",
                          prompt_set="chat")
    storage = f"sqlite:///{tmp_path / 's.db'}"
    _study(storage, base=str(folder), traces=str(traces))
    unhealed = export_from_request(ExportRequest(out_dir=str(tmp_path / "a"), study="s", storage=storage,
                                                 heal_steps=0))
    assert unhealed.acceptance is not None  # on the records the search scored: every 3rd of 6
    assert unhealed.acceptance.n_prompts == sum(held_out(i) for i in range(6)) == 2
    p = unhealed.prediction
    assert p is not None and unhealed.gamma == p.primary().gamma >= 1
    measured = unhealed.acceptance.tokens_per_step[str(unhealed.gamma)]
    assert p.primary().tokens_per_step == pytest.approx(measured)
    meta = json.loads((tmp_path / "a" / "draftnas.json").read_text())
    assert meta["prediction"]["tokens_per_s"] == pytest.approx(p.tokens_per_s)
    assert meta["gamma"] == unhealed.gamma
    card = (tmp_path / "a" / "README.md").read_text()
    assert "Predicted, not measured, for this drafter as exported" in card
    heal = HealOptions(heldout_every=2, eval_every=0, batch_size=2)  # trains on records 1, 3, 5
    healed = export_from_request(ExportRequest(out_dir=str(tmp_path / "b"), study="s", storage=storage,
                                               traces=str(traces), heal_steps=2, heal=heal))
    assert healed.heal is not None and len(healed.heal.trained_prompts) == 3
    assert healed.acceptance is not None and healed.acceptance.n_prompts == 1  # record 3 left out, 0 kept


def test_an_export_from_a_study_heals_on_its_workload_prompt_set():
    from draftnas.drafter.heal.heal_records import HealOptions
    from draftnas.export.records import EXPORT_TEACHER_TOPK, EXPORT_WRITTEN_PROMPTS
    from draftnas.export.request import workload_heal_options

    info = _info()  # the SmolLM2 space: chat workload
    chat = workload_heal_options(info)
    assert (chat.prompts, chat.prompts_per_domain) == ("chat", 40)
    assert chat.lr == info.space.heal.learning_rate
    every = dataclasses.replace(info, space=dataclasses.replace(
        info.space, workload=dataclasses.replace(info.space.workload, prompt_set="all"),
        heal=dataclasses.replace(info.space.heal, learning_rate=3e-4)))
    assert workload_heal_options(None) == HealOptions(written_prompts=EXPORT_WRITTEN_PROMPTS,
                                                      teacher_topk=EXPORT_TEACHER_TOPK)
    assert workload_heal_options(every) == dataclasses.replace(workload_heal_options(None), lr=3e-4)
    assert (chat.written_prompts, chat.teacher_topk) == (EXPORT_WRITTEN_PROMPTS, EXPORT_TEACHER_TOPK)
    assert EXPORT_WRITTEN_PROMPTS > 0 and EXPORT_TEACHER_TOPK > 0


def test_export_from_plan_file_with_healing(tiny_base, tmp_path):
    """--plan + --base + --heal-steps: heals toward the (live) base on self-distilled text."""
    from draftnas.core.prompts import load_prompts
    from draftnas.drafter.heal.heal_records import HealOptions
    from draftnas.export.records import ExportRequest
    from draftnas.export.request import export_from_request

    folder, _, _ = tiny_base
    plan_file = _plan(str(folder)).save(tmp_path / "plan.json")
    heal = HealOptions(prompts="chat", prompts_per_domain=4, max_new_tokens=4, heldout_every=2, eval_every=0,
                       batch_size=2)
    result = export_from_request(ExportRequest(out_dir=str(tmp_path / "healed"), plan_file=str(plan_file),
                                               heal_steps=2, heal=heal))
    assert result.heal is not None and result.heal.steps == 2 and result.heal.teacher == "live"
    meta = json.loads((tmp_path / "healed" / "draftnas.json").read_text())
    after = meta["measured"]["top1_agreement_after_healing"]
    assert meta["heal"]["steps"] == 2 and after == result.heal.top1_after and 0 <= after <= 1
    assert not (tmp_path / "healed.heal-checkpoint").exists()
    assert (result.heal.n_train_sequences, result.heal.n_heldout_sequences) == (2, 2)  # 4 prompts, 2 held
    second = load_prompts("chat", per_domain=4)[1].id
    without = export_from_request(ExportRequest(
        out_dir=str(tmp_path / "without"), plan_file=str(plan_file), heal_steps=2,
        heal=dataclasses.replace(heal, exclude_prompts=(second,))))
    assert without.heal is not None  # that prompt is in neither part of the data: 3 prompts left
    assert (without.heal.n_train_sequences, without.heal.n_heldout_sequences) == (1, 2)
    card = (tmp_path / "healed" / "README.md").read_text()
    assert "on 2 of the target's continuations of prompt set chat." in card


def test_cli_refuses_busy_folder_in_one_line(tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "x").write_text("x")
    plan_file = _plan().save(tmp_path / "plan.json")
    proc = subprocess.run([sys.executable, "-m", "draftnas", "export", "--plan", str(plan_file),
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--force" in lines[0]


# --------------------------------------------------------------------------- the real thing


@pytest.mark.real_model
def test_exported_smollm2_drafter_is_a_lossless_assistant(smollm2, tmp_path):
    """Export a 2-layer drafter, reload it with from_pretrained, and use it as assistant_model:
    the target's greedy output is unchanged."""
    import torch
    from transformers import AutoModelForCausalLM

    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.export.folder import export_drafter

    plan = PruningPlan(base="smollm2-135m", base_num_layers=30, layers=(0, 1), layer_selection="first",
                       num_attention_heads=6, num_key_value_heads=2, intermediate_size=768)
    drafter = apply_plan(smollm2.model, plan)
    out = export_drafter(drafter, smollm2.tokenizer, tmp_path / "d",
                         ExportInfo(base="smollm2-135m", target="smollm2-135m", plan=plan, gamma=3))
    assistant = AutoModelForCausalLM.from_pretrained(out).eval()
    assert assistant.config.num_hidden_layers == 2 and assistant.config.num_key_value_heads == 2
    inputs = smollm2.tokenizer("The three primary colours are", return_tensors="pt")
    with torch.no_grad():
        plain = smollm2.model.generate(**inputs, max_new_tokens=12, do_sample=False)
        assisted = smollm2.model.generate(**inputs, assistant_model=assistant, max_new_tokens=12,
                                          do_sample=False)
    assert torch.equal(plain, assisted)


def test_heal_cli_json_and_out(tiny_base, tmp_path):
    """`draftnas heal --plan ... --json --out DIR`: heals toward the live base, exports the result."""
    folder, _, _ = tiny_base
    plan_file = _plan(str(folder)).save(tmp_path / "plan.json")
    out = tmp_path / "healed"
    proc = subprocess.run([sys.executable, "-m", "draftnas", "heal", "--plan", str(plan_file), "--steps", "2",
                           "--batch-size", "2", "--prompts", "chat", "--per-domain", "4",
                           "--max-new-tokens", "4", "--eval-every", "0", "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["steps"] == 2 and result["teacher"] == "live" and len(result["readings"]) == 2
    assert json.loads((out / "draftnas.json").read_text())["heal"]["steps"] == 2


def test_the_cli_heals_by_default_with_the_stated_budget_unless_the_space_heals_none():
    import dataclasses

    from draftnas.export.records import DEFAULT_EXPORT_HEAL_STEPS, ExportRequest
    from draftnas.export.request import default_heal_steps
    from draftnas.search.spaces import load_search_space as load_space

    fields = {f.name: f for f in dataclasses.fields(ExportRequest)}
    assert fields["heal_steps"].default is None  # resolved per source
    assert default_heal_steps(None)[0] == DEFAULT_EXPORT_HEAL_STEPS > 0  # a plan file
    assert default_heal_steps(load_space("smollm2-135m"))[0] == DEFAULT_EXPORT_HEAL_STEPS
    steps, why = default_heal_steps(load_space("gemma-3-270m"))
    assert steps == 0 and "heal.steps: 0" in why


@pytest.mark.parametrize("kwargs,needle", [({"gamma": 0}, "gamma must be in \\[1, 32\\], got 0"),
                                           ({"gamma": 40}, "got 40"),
                                           ({"heal_steps": -1}, "heal_steps must be >= 0")])
def test_bad_export_values_are_refused_before_anything_is_written(tmp_path, kwargs, needle):
    from draftnas.export.records import ExportRequest
    from draftnas.export.request import export_from_request

    out = tmp_path / "never"
    with pytest.raises(InvalidInputError, match=needle):
        export_from_request(ExportRequest(out_dir=str(out), plan_file=str(tmp_path / "p.json"), **kwargs))
    assert not out.exists()


def test_cli_gamma_out_of_range_is_one_line_exit_2(tmp_path):
    plan_file = _plan().save(tmp_path / "plan.json")
    proc = subprocess.run([sys.executable, "-m", "draftnas", "export", "--plan", str(plan_file),
                           "--gamma", "0", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "gamma must be in" in lines[0]
    assert not (tmp_path / "o").exists()


def test_heal_takes_a_plan_or_a_drafter_folder_not_both_nor_neither():
    from draftnas.export.records import HealRequest

    with pytest.raises(OptionError, match="plan_file or drafter must name the drafter to heal"):
        HealRequest().validate()
    with pytest.raises(OptionError, match="plan_file and drafter exclude each other") as caught:
        HealRequest(plan_file="p.json", drafter="folder").validate()
    assert caught.value.for_flags() == "--plan and --drafter exclude each other: give one"


def test_a_quantized_drafter_carries_its_dense_settings_for_a_plain_load():
    """A drafter searched with int4 kernels drafts long runs cheaply there; loaded plainly it runs dense,
    where each draft costs more: the export prices the dense reading for the plain route."""
    from draftnas.export.card import _settings_lines
    from draftnas.export.records import ExportInfo, ExportRequest
    from draftnas.export.request import plain_drafting
    from draftnas.search.scoring import assumed_acceptance

    info = _info()
    info = dataclasses.replace(info, space=dataclasses.replace(
        info.space, workload=dataclasses.replace(info.space.workload, batch_sizes=(1,), batch_weights=(1.0,)),
        gamma=dataclasses.replace(info.space.gamma, min=0, max=10, p_min=(0.0,))))
    cheap = _trial(0, 1.0).latency
    cheap = dataclasses.replace(cheap, batch_sizes=(1,), draft_ms=(0.2,), target_ms=(4.0,),
                                verify_ms=(tuple(4.0 + 0.1 * g for g in range(11)),))
    dense = dataclasses.replace(cheap, draft_ms=(1.6,))  # the same drafter run dense: 8x the draft cost
    trial = dataclasses.replace(_trial(0, 1.0), latency=cheap, acceptance=assumed_acceptance(0.8),
                                dense_latency=dense)
    request = ExportRequest(out_dir="x", study="s")
    plain_gamma, _ = plain_drafting(request, trial, info, None)
    from draftnas.search.scoring import predict_workload

    own = predict_workload(cheap, trial.acceptance, info.space.workload, info.space.gamma).primary().gamma
    assert 1 <= plain_gamma < own  # dearer drafts: fewer of them
    assert plain_drafting(request, dataclasses.replace(trial, dense_latency=None), info, None) is None
    assert plain_drafting(ExportRequest(out_dir="x", study="s", gamma=3), trial, info, None) is None
    card = " ".join(_settings_lines(ExportInfo(base="b", target="t", gamma=own, weights="int4",
                                               plain_gamma=plain_gamma)))
    assert f"num_assistant_tokens={plain_gamma}`" in card and f"num_assistant_tokens={own}," in card
    assert "route_linears" in card
