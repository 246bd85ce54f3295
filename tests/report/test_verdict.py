"""`draftnas verdict`: what pays where, joined from lookup searches and benches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.report.verdict import read_results, workload_verdicts

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "workloads"
EDIT = ["lookup-edit72.json", "bench-llama-edit72.json", "bench-loop-edit.json"]
CHAT = ["lookup-chat.json", "bench-llama-chat.json", "bench-loop-chat.json"]


def _verdicts(names):
    return workload_verdicts(*read_results([str(RESULTS / n) for n in names]))


def test_a_python_caller_gets_the_verdict_through_the_reports_face():
    from draftnas.report import VerdictRequest, verdicts_from_request

    (edit,) = verdicts_from_request(VerdictRequest(results=tuple(str(RESULTS / n) for n in EDIT)))
    assert edit.to_dict() == _verdicts(EDIT)[0].to_dict()
    with pytest.raises(InvalidInputError, match="results"):
        verdicts_from_request(VerdictRequest(results=()))


def test_the_shipped_edit_run_recommends_llama_cpp_lookup_at_its_measured_speed():
    (edit,) = _verdicts(EDIT)
    llama = edit.best("llama.cpp")
    bench = json.loads((RESULTS / "bench-llama-edit72.json").read_text())
    arm = next(a for a in bench["arms"] if a["name"] == "draftnas")
    assert llama.family == "lookup" and llama.settings == "lookup:n=6,m=32"
    assert llama.measured == pytest.approx(arm["speedup"]) and llama.verdict == "pays"
    from draftnas.search.lookup_records import LookupResult

    best = LookupResult.from_dict(json.loads((RESULTS / EDIT[0]).read_text())).best  # what the search priced
    assert llama.predicted == best.speedup > 1.0
    assert llama.predicted_interval == (best.speedup_ci_low, best.speedup_ci_high)
    assert "--spec-ngram-simple-size-m 32" in llama.run_with
    assert edit.recommended.startswith("llama.cpp with lookup lookup:n=6,m=32")
    assert llama.measured_on == "24 held-out prompts x 2 round(s)"
    # draftnas's loop: its fastest arm (the hybrid) over its own target
    loop = edit.best("draftnas's loop (bfloat16)")
    assert loop.family == "hybrid" and loop.measured_on == "8 held-out prompts x 2 round(s)"
    assert "--hybrid-policy fallback" in loop.run_with
    assert edit.best("transformers").run_with == \
        "generate(..., prompt_lookup_num_tokens=32, max_matching_ngram_size=6)"


def test_where_nothing_beats_plain_decoding_it_says_so_and_keeps_every_arm():
    (chat,) = _verdicts(CHAT)
    assert chat.recommended.startswith("llama.cpp alone")
    families = {(r.engine, r.family) for r in chat.routes}
    assert ("llama.cpp", "model drafter") in families and ("llama.cpp", "lookup") in families
    model = next(r for r in chat.routes if r.family == "model drafter" and r.engine == "llama.cpp")
    assert model.verdict == "does not pay" and "--spec-draft-n-max 3" in model.run_with


def test_the_command_prints_the_table_and_each_engines_settings():
    out = subprocess.run([sys.executable, "-m", "draftnas", "verdict",
                          ",".join(str(RESULTS / n) for n in EDIT + CHAT)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "What pays where" in out.stdout
    assert "edit: take llama.cpp with lookup lookup:n=6,m=32" in out.stdout
    assert "chat: take llama.cpp alone" in out.stdout
    assert "llama.cpp: decode plainly" in out.stdout  # chat: lookup not separable, the model drafter slower


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _bench(engine: str, prompts: list[tuple[str, str]], arms: list[dict], **fields) -> str:
    """A bench results file as the bench writes it (its record), with these prompts (id, domain) and arms."""
    from draftnas.bench.records import ArmResult, BenchPrompt, BenchResult

    result = BenchResult(
        target="qwen2.5-coder-1.5b", drafters={}, gamma=3, temperature=0.0, max_new_tokens=16,
        n_prompts=len(prompts), device="cpu", dtype="float32", threads=2, engine=engine,
        arms=tuple(ArmResult(**({"engine": engine} | a)) for a in arms),
        prompts=tuple(BenchPrompt(prompt_id=i, domain=d, prompt_tokens=10, runs=()) for i, d in prompts),
        **fields)
    return json.dumps(result.to_dict())


@pytest.mark.parametrize("content,needle", [
    ('{"prices": [', "not a JSON results file"),
    ('{"workload": "edit"}', "neither a `draftnas lookup` result nor a `draftnas bench` result"),
    ('{"prices": [{"label": "lookup:n=2,m=2"}]}', "a lookup result with missing or malformed fields"),
    ('{"arms": [{"name": "draftnas"}], "prompts": []}', "a bench result with missing or malformed fields"),
    ('{"arms": {}, "prompts": []}', "a bench result without its 'arms' list"),
    (_bench("vllm", [], [{"name": "draftnas", "tokens_per_s": 1.0}]),
     "a bench result without the target-alone arm"),
])
def test_a_bad_results_file_is_one_line_naming_it(tmp_path, content, needle):
    name = _write(tmp_path / "r.json", content)
    with pytest.raises(InvalidInputError, match="r.json") as caught:
        read_results([name])
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_no_lookup_result_and_a_missing_file_are_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="no `draftnas lookup` result given"):
        read_results([str(RESULTS / "bench-llama-chat.json")])
    with pytest.raises(InvalidInputError, match="no such file"):
        read_results([str(tmp_path / "absent")])
    out = subprocess.run([sys.executable, "-m", "draftnas", "verdict", _write(tmp_path / "cut.json", "{")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len([ln for ln in out.stderr.splitlines() if ln.strip()]) == 1


def test_a_vllm_bench_on_the_held_out_prompts_adds_vllms_routes_with_their_config(tmp_path):
    """A vLLM bench of the workload's held-out prompts gives its own routes: each speculative arm measured
    over vLLM's target alone, run with the --speculative-config its family writes."""
    search = json.loads((RESULTS / EDIT[0]).read_text())
    prompts = [(p, "edit") for p in search["heldout_prompts"][:2]]
    arms = [{"name": "target", "tokens_per_s": 2.0},
            {"name": "draftnas", "tokens_per_s": 2.6, "drafter": "qwen2.5-coder-0.5b",
             "gamma": 3, "speedup": 1.3, "speedup_interval": (1.1, 1.4), "exact_match_rate": 1.0},
            {"name": "lookup", "tokens_per_s": 1.9, "drafter": "lookup:n=3,m=4", "gamma": 4,
             "speedup": 0.95, "speedup_interval": (0.9, 1.01), "exact_match_rate": 1.0}]
    bench = tmp_path / "bench-vllm.json"
    bench.write_text(_bench("vllm", prompts, arms, rounds=2))
    (edit,) = workload_verdicts(*read_results([str(RESULTS / EDIT[0]), str(bench)]))
    served = [r for r in edit.routes if r.engine == "vllm"]
    assert [(r.family, r.verdict) for r in served] == [("model drafter", "pays"), ("lookup", "not separable")]
    assert json.loads(served[1].run_with.removeprefix("--speculative-config '").removesuffix("'")) == {
        "method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 3, "num_speculative_tokens": 4}
    assert '"method": "draft_model"' in served[0].run_with and served[0].settings == "qwen2.5-coder-0.5b, γ 3"
    assert edit.best("vllm") is served[0] and served[0].measured_on == "2 held-out prompts x 2 round(s)"


def test_every_stored_predicted_cell_is_the_prediction_its_error_is_computed_from():
    """The bench table prints, beside each error, the prediction that error compares with the measured
    median (it printed the pooled prediction beside the median's error: 27.42 with -8.5%)."""
    from draftnas.bench.records import PredictionCheck

    checked = 0
    for path in sorted(RESULTS.parent.rglob("*.json")):
        data = json.loads(path.read_text())
        for p in (data.get("predictions") or []) if isinstance(data, dict) else []:
            check = PredictionCheck.from_dict(p)
            assert check.compared_tokens_per_s / check.measured_tokens_per_s - 1 == \
                pytest.approx(check.tokens_per_s_error, abs=1e-9), path.name
            checked += 1
    assert checked >= 4


def test_a_vllm_bench_of_held_out_prompts_fills_the_workloads_vllm_column(tmp_path):
    import shutil

    from draftnas.report.tables import workloads_table

    shutil.copy(RESULTS / "lookup-edit72.json", tmp_path)
    held = json.loads((RESULTS / "lookup-edit72.json").read_text())["heldout_prompts"]
    arms = [{"name": "target", "tokens_per_s": 5.0, "tokens_per_s_interval": (4.5, 5.5)},
            {"name": "draftnas", "tokens_per_s": 6.0, "drafter": "/x/drafters/L24", "gamma": 3,
             "speedup": 1.2, "speedup_interval": (1.1, 1.3), "exact_match_rate": 1.0},
            {"name": "reference", "tokens_per_s": 4.5, "drafter": "qwen2.5-coder-0.5b", "gamma": 3,
             "speedup": 0.9, "speedup_interval": (0.8, 1.0), "exact_match_rate": 1.0},
            {"name": "lookup", "tokens_per_s": 7.5, "drafter": "lookup:n=6,m=32", "gamma": 32, "speedup": 1.5,
             "speedup_interval": (1.4, 1.6), "exact_match_rate": 0.5}]
    (tmp_path / "v.json").write_text(_bench("vllm", [(held[0], "edit")], arms, host="h"))
    rows = workloads_table(tmp_path, ["lookup-edit72.json", "v.json"])
    (edit,) = [r for r in rows if r.startswith("| edit")]
    assert edit.endswith("| alone 5.00 [4.50, 5.50]; draftnas's pick L24, γ 3: 1.200x [1.100, 1.300], every "
                         "output the target's; qwen2.5-coder-0.5b, γ 3: 0.900x [0.800, 1.000], every output "
                         "the target's; lookup: 1.500x [1.400, 1.600], 50% of outputs the target's |")
    # a vLLM bench of other prompts is another workload's: the column says so
    (tmp_path / "v.json").write_text(_bench("vllm", [("code-000", "code")], arms, host="h"))
    rows = workloads_table(tmp_path, ["lookup-edit72.json", "v.json"])
    (edit,) = [r for r in rows if r.startswith("| edit")]
    assert edit.endswith("| not benched |")
