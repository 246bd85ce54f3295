"""One step of the static decoder at fixed inputs and write positions, run eagerly or captured once as a
CUDA graph and replayed: what the draft and verify steps of draftnas's static loop and the latency
timings run. torch is imported at module level: import this lazily.
"""

from __future__ import annotations

from typing import Any

import torch

from draftnas.models.decoder import KVCache, StaticDecoder


class StaticStep:
    """One forward at fixed inputs and write positions, eager or replayed from a CUDA graph.

    Every call writes the same cache slots (`positions`), so repeated calls see the same
    context: nothing to reset between timed repeats. `logits` holds the last output.
    Change `input_ids` / `positions` in place (`.copy_`) to run the step at other values.
    """

    def __init__(self, decoder: StaticDecoder, cache: KVCache, input_ids: torch.Tensor,
                 positions: torch.Tensor, layers: int | None = None, *, capture: bool = False,
                 pool: Any = None, warmup: int = 2) -> None:
        self.decoder, self.cache, self.layers = decoder, cache, layers
        self.input_ids, self.positions = input_ids, positions
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits = self._forward()
        if capture:
            self._capture(pool, warmup)

    def _forward(self) -> torch.Tensor:
        return self.decoder(self.input_ids, self.positions, self.cache, self.layers)

    def _capture(self, pool: Any, warmup: int) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the default stream, as capture requires
            for _ in range(warmup):
                self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = self._forward()

    def __call__(self) -> torch.Tensor:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.logits = self._forward()
        return self.logits

    def reset(self) -> None:
        """Nothing to undo: the next call writes the same slots."""
