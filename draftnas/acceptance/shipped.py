"""Traces of an embedded target shipped with draftnas (`draftnas/data/traces/`), so a search need not decode
the target to score its drafters: on a host without bf16 instructions the 1.5B target traces in fp32 at a
few tokens a second, ten minutes of the main job.

A shipped trace is the target's own greedy continuations of a prompt set, as `draftnas trace` writes them.
The index names, per target and trace key (`search.resolve.default_traces`: the prompt set, its size, the
tokens, the temperature and the dtype), the file and the sha256 of the embedded weights it was made from.
It is used only while those are the weights draftnas embeds (`models.records.EMBEDDED`); when they change,
the search makes its own traces as before. `scripts/ship_traces.py` adds one.
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from draftnas.core.errors import InvalidInputError
from draftnas.models.records import EMBEDDED

INDEX = "index.json"


def _folder() -> Path:
    return Path(str(resources.files("draftnas") / "data" / "traces"))


def _index(folder: Path) -> dict[str, Any]:
    path = folder / INDEX
    return json.loads(path.read_text()) if path.is_file() else {}


def shipped_traces(target: str, key: str, folder: Path | None = None) -> Path | None:
    """The shipped trace of `target` for `key`, where one exists and was made from the weights draftnas
    embeds for it now; None otherwise."""
    folder = folder or _folder()
    model = EMBEDDED.get(target)
    entry = _index(folder).get(target, {}).get(key)
    if model is None or entry is None or not model.sha256 or entry.get("weights_sha256") != model.sha256:
        return None
    path = folder / entry["file"]
    return path if path.is_file() else None


def copy_shipped(target: str, key: str, out: Path, folder: Path | None = None) -> Path | None:
    """`out`, a copy of the shipped trace of `target` for `key` (`shipped_traces`); None where none fits."""
    found = shipped_traces(target, key, folder)
    if found is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    shutil.copyfile(found, part)
    part.replace(out)
    return out


def ship(trace: Path, target: str, key: str, made: str, folder: Path | None = None) -> Path:
    """Add `trace` (a trace of the embedded `target` for `key`) to the shipped ones, with `made` (how and
    where it was made) in the index -> the shipped file."""
    folder = folder or _folder()
    model = EMBEDDED.get(target)
    if model is None or not model.sha256:
        raise InvalidInputError(f"{target!r} is not an embedded target with a known sha256 "
                                f"(embedded: {', '.join(k for k, m in EMBEDDED.items() if m.sha256)})")
    name = f"{target}-{key}.safetensors"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(trace, folder / name)
    index = _index(folder)
    index.setdefault(target, {})[key] = {"file": name, "weights_sha256": model.sha256,
                                          "weights_version": model.version, "made": made}
    (folder / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return folder / name
