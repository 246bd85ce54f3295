"""Ship a trace of an embedded target with draftnas (`draftnas/data/traces/`), so searches of that target
on any host skip tracing it while its embedded weights stay the same.

    python scripts/ship_traces.py runs/qwen2.5-coder-1.5b/traces-<key>.safetensors \
        --made "draftnas search --target qwen2.5-coder-1.5b, fp32, AMD EPYC Zen 4 (AVX2 kernels), 2 threads"

The key is the one in the file's name (what `search.resolve.default_traces` named it by); the target is
read from the trace.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    from safetensors import safe_open

    from draftnas.acceptance.shipped import ship

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--made", required=True, help="how and where the trace was made (kept in the index)")
    args = parser.parse_args()
    name = args.trace.name
    if not (name.startswith("traces-") and name.endswith(".safetensors")):
        raise SystemExit(f"{args.trace}: not a search's trace file (traces-<key>.safetensors)")
    key = name.removeprefix("traces-").removesuffix(".safetensors")
    with safe_open(str(args.trace), "pt") as f:
        meta = json.loads((f.metadata() or {})["draftnas_traces"])
    print(ship(args.trace, meta["target"], key, args.made))


if __name__ == "__main__":
    main()
