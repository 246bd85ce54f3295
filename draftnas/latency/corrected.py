"""Latency models corrected by measurements: a big target's extrapolated timings
(`TargetTimedModel`) and this machine's calibration (`CalibratedModel`). Both answer `predict_ms`
with `LatencyModel`'s signature, so the search uses them unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from draftnas.core.errors import InfeasibleCandidateError, ProfileError
from draftnas.core.registry import Architecture
from draftnas.latency.batch_records import BatchTiming, factor
from draftnas.latency.records import HostCalibration, StackCalibration, TargetTiming


class TargetTimedModel:
    """A latency model that answers a timed target's shape (`TargetTiming`) with its extrapolated
    full-depth latencies: exact at the timed (batch, new tokens) at the timed context; another
    batch, count or context scales the model's prediction by measured / predicted at the nearest
    timed point. Every other shape: the model itself. `predict_ms` has `LatencyModel`'s signature.
    """

    def __init__(self, model: Any, timings: Iterable[TargetTiming]) -> None:
        self.model, self.timings = model, tuple(timings)

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float:
        rows = head_vocab_size or arch.vocab_size
        timing = next((t for t in self.timings if t.matches(arch, rows)), None)
        if timing is not None:
            key = f"{batch_size}x{new_tokens}"
            if key in timing.ms and context_tokens == timing.context_tokens:
                return timing.ms[key]
            b = min(timing.batch_sizes, key=lambda x: abs(x - batch_size))
            n = min(timing.new_tokens, key=lambda x: abs(x - new_tokens))
            said = self.model.predict_ms(arch, batch_size=b, new_tokens=n,
                                         context_tokens=timing.context_tokens,
                                         head_vocab_size=head_vocab_size)
            ratio = timing.ms[f"{b}x{n}"] / said if said > 0 else 1.0
            return ratio * self.model.predict_ms(arch, batch_size=batch_size, new_tokens=new_tokens,
                                                 context_tokens=context_tokens,
                                                 head_vocab_size=head_vocab_size)
        return float(self.model.predict_ms(arch, batch_size=batch_size, new_tokens=new_tokens,
                                           context_tokens=context_tokens, head_vocab_size=head_vocab_size))


def head_share(arch: Architecture, rows: int) -> float:
    """The share of the weights one decode step of `arch` streams (its layers and its full head) that a
    head of `rows` rows leaves out."""
    streamed = arch.non_embedding_parameters() + arch.vocab_size * arch.hidden_size
    return max(0, arch.vocab_size - rows) * arch.hidden_size / streamed


class _Line:
    """Measured over predicted time of one shape's stack by depth: lines through the measured and
    the predicted times of its prefixes and its full depth, and the decode time its reduced heads
    save (linear in the row count, and in depth between the first layer and the full depth)."""

    def __init__(self, model: Any, arch: Architecture, points: dict[int, float], context: int,
                 saving: dict[int, float], saving_prefix: dict[int, float],
                 prefill: dict[int, float] | None = None) -> None:
        self.arch, self.saving, self.saving_prefix = arch, saving, saving_prefix
        self.prefill = prefill or {}  # prompt tokens -> the full stack's measured prefill
        rows = [(k, ms, model.predict_ms(arch.with_shape(num_hidden_layers=k), context_tokens=context))
                for k, ms in sorted(points.items())]
        ks = np.array([r[0] for r in rows], dtype=float)
        measured, predicted = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
        # ratio(k) = (a + b k) / (a' + b' k)
        self.measured = np.polyfit(ks, measured, 1) if len(ks) > 1 else np.array([0.0, measured[0]])
        self.predicted = np.polyfit(ks, predicted, 1) if len(ks) > 1 else np.array([0.0, predicted[0]])

    def ratio(self, layers: int) -> float:
        measured = float(np.polyval(self.measured, layers))
        predicted = float(np.polyval(self.predicted, layers))
        return measured / predicted if predicted > 0 and measured > 0 else 1.0

    def head_saving_ms(self, rows: int, layers: int | None) -> float | None:
        vocab, full = self.arch.vocab_size, self.arch.num_hidden_layers
        if not self.saving or rows >= vocab:
            return None

        def at(measured: dict[int, float]) -> float:
            sizes, saved = zip(*sorted({**measured, vocab: 0.0}.items()), strict=True)
            return float(np.interp(rows, sizes, saved))  # below the smallest size measured: its saving

        deep = at(self.saving)
        if not self.saving_prefix or layers is None or full <= 1:
            return deep
        return float(np.interp(layers, [1, full], [at(self.saving_prefix), deep]))

    def matches(self, arch: Architecture) -> bool:
        """The same layer shape (a drafter cut from this stack by depth only, its head aside)."""
        a, b = arch, self.arch

        def shape(x: Architecture) -> tuple[int, ...]:
            return (x.hidden_size, x.head_dim, x.num_attention_heads, x.num_key_value_heads,
                    x.intermediate_size)

        return shape(a) == shape(b)


class CalibratedModel:
    """A latency model corrected by what this machine measured (`HostCalibration`).

    - The target itself at batch 1 and the calibrated context: the measured time of that many
      new tokens (interpolated between measured counts, exact at them); a base or reference timed
      beside it (`HostCalibration.stacks`) at its full depth and one new token: its measured time.
    - Anything else: the model's prediction times measured / predicted for the stack it is cut
      from at the same depth (the base whose layer width it has, else the target), from a straight
      line through that stack's measured prefixes and full depth (depth is what the correction
      follows: per-layer and per-call costs are what differ most between hosts). Other batch sizes
      and contexts scale the same way.
    - A reduced draft head at one new token (batch 1): the full-head prediction so corrected,
      less the time the smaller head saved when measured (linear in the row count between
      measured sizes): under that stack's full depth and under its first layer, linear in depth
      between the two. The saving depends on depth: under one layer the small stack's weights
      partly stay in cache, so the same head saves more there than under the full stack.
    - A prompt's prefill (batch 1, no context): the measured prefill of that prompt length by the stack
      it is cut from (the target's, or a base's in the drafter's weight format: int4's few-row kernel on
      a CPU reads a prompt slower than dense while it decodes faster), scaled to its depth and head by
      the model.
    - Plus the measured work outside the forward: one new token of the target is plain
      decoding (`generate_overhead_ms`), more are a verify step of the loop
      (`verify_overhead_ms`), one new token of anything else is a draft step
      (`draft_overhead_ms`).

    - A reduced head never saves more than its share of the weights a decode step streams (the rows
      it drops over the layers' weights and the full head): a saving measured as the difference of
      two noisy timings once swallowed a 0.5B drafter's whole cost (priced at 5% of it).
    - `weights` "int8", "int4" or per layer group (`for_weights`): drafters run with their linear layers
      in that format, priced from the bases timed that way (`HostCalibration.quant_stacks`); a drafter of
      another layer shape is refused, and so is a format that timed no faster than dense here.

    `predict_ms` has `LatencyModel`'s signature, so the search uses it unchanged.
    """

    def __init__(self, model: Any, calibration: HostCalibration, target: Architecture,
                 weights: str = "dense", held_out: frozenset[str] = frozenset()) -> None:
        if not calibration.target_ms or not calibration.prefix_ms:
            raise ProfileError("a host calibration needs target and prefix timings")
        self.model, self.calibration, self.target, self.weights = model, calibration, target, weights
        self.held_out = held_out
        c, ctx = calibration, calibration.context_tokens
        own = {**c.prefix_ms, **({target.num_hidden_layers: c.target_ms[1]} if 1 in c.target_ms else {})}
        self._target_line = _Line(model, target, own, ctx, c.head_saving_ms, c.head_saving_prefix_ms,
                                  c.prefill_ms)
        stacks = c.stacks if weights == "dense" else c.quant_stacks.get(weights, {})
        self._stacks = [(s, _Line(model, s.arch, {**s.prefix_ms, **({} if name in held_out else
                                                                    {s.arch.num_hidden_layers: s.full_ms})},
                                  ctx, s.head_saving_ms, s.head_saving_prefix_ms, s.prefill_ms))
                        for name, s in stacks.items()]

    def for_weights(self, weights: str) -> CalibratedModel:
        """This calibration pricing drafters whose linear layers run as `weights` ("dense", "int8", "int4",
        per layer group): offered only where the calibration timed that format and it ran faster than
        dense here."""
        if weights == self.weights:
            return self
        c = self.calibration
        timed = c.quant_stacks.get(weights, {})
        if weights != "dense" and not timed:
            raise InfeasibleCandidateError(f"{weights} drafters are priced only by a calibration that timed "
                                           f"their base in {weights} (a search offering that format on CPU)")
        slower = [f"{name} {st.full_ms:.1f} ms in {weights} against {c.stacks[name].full_ms:.1f} dense"
                  for name, st in timed.items() if name in c.stacks and st.full_ms >= c.stacks[name].full_ms]
        if slower:
            # e.g. an AVX2 host with fp32 activations, where torch's int8 product runs a scalar loop
            raise InfeasibleCandidateError(f"{weights} weights are not offered on this host: they timed "
                                           "slower than dense here (" + "; ".join(slower) + ")")
        return CalibratedModel(self.model, self.calibration, self.target, weights, self.held_out)

    def without_full_depth(self, names: frozenset[str]) -> CalibratedModel:
        """This calibration with the full-depth timings of the stacks `names` left out: their full depth
        (and every drafter of their layer shape) priced from the line through their prefixes alone, a
        prediction of a shape the calibration did not time, to check the model's error on."""
        return CalibratedModel(self.model, self.calibration, self.target, self.weights, names)

    def _line(self, arch: Architecture) -> _Line:
        """The stack `arch` is cut from: a timed base of its layer shape, else the target (dense only)."""
        line = next((line for _, line in self._stacks if line.matches(arch)), None)
        if line is not None:
            return line
        if self.weights != "dense":
            raise InfeasibleCandidateError(f"no base of {arch.name}'s layer shape was timed with "
                                           f"{self.weights} weights")
        return self._target_line

    def ratio(self, layers: int) -> float:
        """Measured over predicted time of the target's stack cut to `layers` layers."""
        return self._target_line.ratio(layers)

    def _target_ms(self, new_tokens: int) -> float | None:
        counts, ms = zip(*sorted(self.calibration.target_ms.items()), strict=True)
        if not counts[0] <= new_tokens <= counts[-1]:
            return None
        return float(np.interp(new_tokens, counts, ms))  # exact at measured counts, linear between

    def timed_batches(self) -> tuple[int, ...]:
        """The batch sizes above 1 this calibration timed (empty: batches are priced from batch 1 alone)."""
        return tuple(sorted({b for t in self.calibration.batched for b in t.batches() if b > 1}))

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float:
        ms = self._single(arch, batch_size, new_tokens, context_tokens, head_vocab_size)
        if batch_size == 1:
            return ms
        timing = self._batch_timing(arch)
        if timing is None:  # batches priced from the batch-1 calibration alone (the profile's growth with B)
            return ms
        return ms * factor(timing, batch_size, new_tokens,
                           lambda a, b, n, ctx: self._single(a, b, n, ctx, None))

    def _batch_timing(self, arch: Architecture) -> BatchTiming | None:
        """The batched timing of `arch`'s layer shape in this model's weights: its own depth, else the
        deepest timed (a drafter cut from a base takes the base's correction)."""
        fits = [t for t in self.calibration.batched if t.weights == self.weights and t.layer_shape_of(arch)]
        if not fits:
            return None
        return max(fits, key=lambda t: (t.arch.num_hidden_layers == arch.num_hidden_layers,
                                        t.arch.num_hidden_layers))

    def _single(self, arch: Architecture, batch_size: int, new_tokens: int, context_tokens: int,
                head_vocab_size: int | None) -> float:
        """The price from the batch-1 calibration (a batch above 1 by the profile's growth with B)."""
        same = (self.weights == "dense" and arch.with_shape(name="") == self.target.with_shape(name="")
                and head_vocab_size in (None, self.target.vocab_size))
        c = self.calibration
        if same and batch_size == 1 and context_tokens == 0 and new_tokens in c.prefill_ms:
            return c.prefill_ms[new_tokens]
        overhead = (c.generate_overhead_ms if new_tokens == 1 else c.verify_overhead_ms) if same \
            else (c.draft_overhead_ms if new_tokens == 1 else c.verify_overhead_ms)
        exact = batch_size == 1 and context_tokens == c.context_tokens
        if same and exact:
            measured = self._target_ms(new_tokens)
            if measured is not None:
                return measured + overhead
        bare = arch.with_shape(name="")
        timed = next((s for s, _ in self._stacks if s.arch.with_shape(name="") == bare
                      and s.arch.name not in self.held_out), None)
        if timed is not None and exact and new_tokens == 1 and head_vocab_size in (None, arch.vocab_size):
            return timed.full_ms + overhead
        line = self._line(arch)
        if batch_size == 1 and context_tokens == 0 and new_tokens in line.prefill:
            # a prompt's prefill: the stack's own, timed in its format, scaled to this depth and head
            said = self.model.predict_ms(arch, new_tokens=new_tokens, context_tokens=0,
                                         head_vocab_size=head_vocab_size)
            said_stack = self.model.predict_ms(line.arch, new_tokens=new_tokens, context_tokens=0)
            return line.prefill[new_tokens] * (said / said_stack if said_stack > 0 else 1.0)
        rows = arch.vocab_size if head_vocab_size is None else head_vocab_size
        saving = line.head_saving_ms(rows, arch.num_hidden_layers) if batch_size == 1 and new_tokens == 1 \
            else None
        if saving is not None:
            full = (self.model.predict_ms(arch, context_tokens=context_tokens)
                    * line.ratio(arch.num_hidden_layers))
            return full - min(saving, head_share(arch, rows) * full) + overhead
        predicted = self.model.predict_ms(arch, batch_size=batch_size, new_tokens=new_tokens,
                                          context_tokens=context_tokens, head_vocab_size=head_vocab_size)
        return predicted * line.ratio(arch.num_hidden_layers) + overhead

    def head_saving_ms(self, rows: int, layers: int | None = None) -> float | None:
        """Decode time a `rows`-row head saves against the full one under `layers` layers of the
        target (default: its depth), from the measured sizes (None when none was measured or `rows`
        is the full vocabulary): linear in depth between the first-layer and full-depth savings."""
        depth = self.target.num_hidden_layers if layers is None else layers
        return self._target_line.head_saving_ms(rows, depth)

    def summary(self) -> str:
        """One line: what was measured here against what the profile said."""
        c = self.calibration
        said = self.model.predict_ms(self.target, context_tokens=c.context_tokens)
        verify = max(c.target_ms)
        said_verify = self.model.predict_ms(self.target, new_tokens=verify, context_tokens=c.context_tokens)
        k = min(c.prefix_ms)
        said_k = self.model.predict_ms(self.target.with_shape(num_hidden_layers=k),
                                       context_tokens=c.context_tokens)

        def read(st: StackCalibration) -> str:  # its prompt's prefill, where timed
            return "".join(f", prefill of {n} tokens {ms:.1f} ms" for n, ms in st.prefill_ms.items())

        stacks = "".join(f"; {name} decode {st.full_ms:.1f} ms (profile: "
                         f"{self.model.predict_ms(st.arch, context_tokens=c.context_tokens):.1f}){read(st)}"
                         for name, st in c.stacks.items())
        acts = f" and {c.quant_dtype} activations" if c.quant_dtype and c.quant_dtype != c.dtype else ""
        stacks += "".join(f"; {name} with {fmt} weights{acts} decode {st.full_ms:.1f} ms{read(st)}"
                          for fmt, timed in c.quant_stacks.items() for name, st in timed.items())
        chose = ("; dtype " + c.dtype + " chosen by timing: " + ", ".join(
            f"{d} decode {ms.get(1, float('nan')):.1f} / verify {ms[max(ms)]:.1f} ms"
            for d, ms in c.dtype_ms.items()) if c.dtype_ms else "")
        return (f"calibrated on this machine ({c.device_name}, {c.threads} threads, {c.dtype}, "
                f"{c.wall_s:.0f} s){chose}: "
                f"target decode {c.target_ms.get(1, float('nan')):.1f} ms (profile: {said:.1f}), verify of "
                f"{verify} tokens {c.target_ms[verify]:.1f} ms (profile: {said_verify:.1f}), its first {k} "
                f"layer(s) {c.prefix_ms[k]:.1f} ms (profile: {said_k:.1f}); outside the forward: "
                f"{c.generate_overhead_ms:.1f} ms per generated token, {c.draft_overhead_ms:.1f} per drafted "
                f"token, {c.verify_overhead_ms:.1f} per verify step{stacks}")
