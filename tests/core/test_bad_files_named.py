"""Every reader of a file a user names fails on a file cut short and on one missing its fields with one line
naming the file (no traceback: a `DraftnasError`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftnas.core.errors import DraftnasError


def _readers():
    from draftnas.acceptance.accepts import read_accepts
    from draftnas.drafter.records import load_plan
    from draftnas.drafter.training.curve_fit import load_curves
    from draftnas.latency.calibration_store import read_calibration
    from draftnas.latency.files import load_profile
    from draftnas.report.verdict import read_results
    from draftnas.search.alpha import load_alpha_model
    from draftnas.search.predictions import read_predictions
    from draftnas.search.spaces import load_search_space

    return {"accepts": read_accepts, "curves": load_curves, "plan": load_plan,
            "calibration": lambda p: read_calibration(Path(p)), "profile": load_profile,
            "results": lambda p: read_results([str(p)]), "alpha model": load_alpha_model,
            "predictions": read_predictions, "space": load_search_space}


READERS = sorted(_readers())


@pytest.mark.parametrize("kind", READERS)
@pytest.mark.parametrize("content", ['{"schema_version": 1, "na', '{"schema_version": 1}'],
                         ids=["cut short", "fields missing"])
def test_a_bad_file_a_user_names_is_one_line_naming_it(tmp_path, kind, content):
    path = tmp_path / ("space.yaml" if kind == "space" else f"{kind.replace(' ', '-')}.json")
    path.write_text(content if kind != "space" or content.endswith("}") else "name: [unclosed")
    with pytest.raises(DraftnasError) as caught:
        _readers()[kind](str(path))
    text = str(caught.value)
    assert path.name in text and "\n" not in text.strip(), text
