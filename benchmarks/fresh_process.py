"""What the benchmarks that time a decode step in fresh processes share: their common flags, the
random-weight static decoder each child builds, and running a child and reading its JSON line.
(A decode step's speed on the AMD EPYC Zen 5 host differs between processes, so these compare
settings process by process.)"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def decoder_parser(description: str, steps: int) -> argparse.ArgumentParser:
    """--arch, --dtype, --steps, --json and the hidden --child every such benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--arch", default="qwen2.5-coder-1.5b", help="a registry shape (random weights)")
    parser.add_argument("--dtype", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--steps", type=int, default=steps, help="steps timed per median")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


def random_decoder(arch_name: str, dtype_name: str) -> tuple[Any, Any]:
    """(architecture, draftnas's static decoder of it with random weights on the CPU, in eval mode)."""
    import torch

    from draftnas.core.registry import get_architecture
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.records import TORCH_DTYPES

    arch = get_architecture(arch_name)
    decoder = StaticDecoder(arch, dtype=getattr(torch, TORCH_DTYPES[dtype_name]), device="cpu",
                            max_positions=256).init_random(0).eval()
    return arch, decoder


def prefilled(arch: Any, decoder: Any, context: int, extra: int) -> Any:
    """A static cache of `context` + `extra` slots holding a random `context`-token prompt that
    `decoder` has read (call under torch.inference_mode)."""
    import torch

    cache = decoder.new_cache(1, context + extra)
    decoder(torch.randint(0, arch.vocab_size, (1, context)), torch.arange(context), cache)
    return cache


def step_inputs(context: int, new_tokens: int) -> tuple[Any, Any]:
    """(token ids, positions) of a step of `new_tokens` tokens after a `context`-token prompt."""
    import torch

    return torch.full((1, new_tokens), 7), torch.arange(context, context + new_tokens)


def run_child(script: str, args: list[str], env: dict[str, str] | None = None) -> Any:
    """`script --child ARGS` in a fresh Python process; its last line of output, as JSON."""
    out = subprocess.run([sys.executable, script, "--child", *args], env={**os.environ, **(env or {})},
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
