"""benchmarks/main_job_minutes.py reads the stages, set-up, total, memory and ranking off a main job's log."""

from __future__ import annotations

import json

from benchmarks.main_job_minutes import main, read_log

LOG = """ 19:37:05 up 12:07,  0 user,  load average: 0.52, 0.81, 1.02
[setup] done: torch 2.13.0+cpu | transformers 5.25.0
SETUP_S 118
[draftnas 1m01s] working: converting /c/gguf/qwen2.5-coder-0.5b-0.9.0.gguf to safetensors (once)
[draftnas 1m05s] timing the target on this machine: started (420 steps)
[draftnas 6m40s] timing the target on this machine: done, 5m35s
[draftnas 6m58s] trials: started (40 steps)
ranking after 36 of 40 trials:
  1. trial 9 (hand-made) L24bi-h14kv2-i4864-v98304-int8: 4.5 tokens/s, 1.64x predicted
  2. trial 31 L20bi-h14kv2-i4864-v65536-int4: 4.4 tokens/s, 1.61x predicted
[draftnas 14m02s] trials: done, 7m04s
[draftnas 14m20s] finished in 14m20s
best: trial 9 L24bi-h14kv2-i4864-v98304-int8: 4.5 tokens/s, 1.637x plain decoding (2.8 tokens/s)
calibrated on this machine (AMD EPYC (2 cores, 2 threads), 2 threads, fp32, 301 s): target decode 325.1 ms (x)
[draftnas 47s] finished in 47s
TOTAL_S 1020
\tMaximum resident set size (kbytes): 20971520
"""


def test_a_logs_stages_and_ranking_are_read_as_printed(tmp_path, capsys):
    path = tmp_path / "after.log"
    path.write_text(LOG)
    run = read_log(path)
    assert run["load_before"] == "0.52, 0.81, 1.02" and run["setup_s"] == 118 and run["total_s"] == 1020
    assert run["search_and_export_s"] == 902 and run["peak_rss_gb"] == 20.0
    # the export's own "finished" line is not the search's end
    assert run["stage_end_s"] == {"calibration_start": 65, "calibration_end": 400, "trials_start": 418,
                                  "trials_end": 842, "search_end": 860}
    assert run["calibration_timed_s"] == 301 and run["target_decode_ms"] == 325.1
    assert run["best"].startswith("trial 9 L24bi-h14kv2-i4864-v98304-int8")
    assert [(r["trial"], r["kind"], r["speedup"]) for r in run["last_ranking_top3"]] == [
        (9, "hand-made", 1.64), (31, "", 1.61)]
    main([str(path), "--names", "after", "--out", str(tmp_path / "m.json")])
    assert json.loads((tmp_path / "m.json").read_text())["runs"][0]["name"] == "after"
    assert "after: total 1020 s (set-up 118 s)" in capsys.readouterr().out
