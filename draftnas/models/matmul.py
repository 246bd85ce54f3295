"""Matrix products over a few rows on CPU: the form that times fastest on this machine.

On CPU, a linear layer over a few rows can be done as F.linear(x, W) or as (W @ x.T).T;
on some hosts the second reads a large W once and is several times faster for a large LM head,
while for small matrices either may win. `MatmulChooser` times the forms
once per (rows, out, in) on the machine it runs on and keeps the faster; the static decoder
and `models.linears.route_linears` multiply through it.

A weight may also be multiplied quantized (`MatmulChooser.quantize`), activations left in the run's
dtype: in int8, one scale per output row (`torch._weight_int8pack_mm`; half the bytes of bf16), or in
int4, a scale and zero point per group of 32 inputs (`torch._weight_int4pack_mm_for_cpu` on the CPU,
`torch._weight_int4pack_mm` on CUDA, bf16 activations; a quarter). `weights_problem` says where a format
runs. `benchmarks/weight_formats.py` times them; docs/hosts/ has the figures. On the CPU a quantized
weight's products over a prompt (more than `MAX_WEIGHT_ONCE_ROWS` rows) run dense, from the weight its values
stand for, where that timed faster: on the Intel Xeon host the int4 and int8 kernels read a 44-token
prompt 2.6-3.5× slower than dense while they decode 1.5-2.1× faster (a dense copy of those weights is then
kept).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from draftnas.core.errors import InvalidInputError
from draftnas.models import kernel_choices
from draftnas.models.records import INT4_GROUP, MAX_WEIGHT_ONCE_ROWS, dtype_name, weights_problem
from draftnas.models.records import TORCH_DTYPES as TORCH_DTYPE_NAMES

LINEAR, WEIGHT_ONCE, TRANSPOSED = 0, 1, 2  # F.linear(x, W), (W @ x.T).T, x @ W.T.contiguous()
PROMPT_ROWS = 44  # rows a quantized weight's many-row products are timed at: the workloads' prompts
# the weights of one shape a choice is timed over: the first of them that add up to this many bytes (all of
# them where they add up to less), far past a CPU's last-level cache so each pass streams from memory as a
# decode step does, without reading every layer's copy of the shape 20-40 times per choice (on an AVX2
# host in fp32, choosing the 1.5B's forms over all 28 layers took minutes of the main job)
STREAM_BYTES = 256 << 20
# timed passes of each form after one warm-up; each form's fastest pass decides. With five after two warm-ups,
# two main jobs on 2-core Zen 3 hosts (fp32) still chose differently for 14 of the 84 keys they shared: forms
# that close are level, and the passes were a share of an empty cache's calibration there
TIMING_ROUNDS = 3


@dataclass
class MatmulChooser:
    """Per (rows, out, in): F.linear(x, W), (W @ x.T).T, or x @ Wt with Wt a contiguous copy of
    W's transpose — the form that timed fastest here (another form must beat F.linear by 10%).
    An odd row count may also be padded with one row whose output is dropped, in every form: on
    some hosts the kernels are not monotonic in the row count (3 rows slower than 4), so the padded
    product is a candidate too. A lone row padded to two helps some whole decode steps where no product timed
    alone shows it: `models.row_padding.choose_row_padding` times that on whole steps (`pad_single_rows`).

    Enabled on CPU only (on CUDA F.linear is used as is, int4 weights through their kernel). The first
    product of a new key times the forms (a few passes each, interleaved) on random inputs, each pass over
    the registered weights of that shape, up to `STREAM_BYTES` of them: a decode step streams all layers'
    weights from memory, and a single small matrix timed alone stays in cache and misleads (a form
    that wins in cache can lose streaming).
    The input is made contiguous first: a weight-once product returns a transposed view, and
    MKL multiplies by the transpose of such a view (a contiguous [in, rows]) several times slower
    than by a contiguous [rows, in].
    The transposed form costs a copy of each weight of that shape (made when chosen); the
    decoder is for inference, so weights are not expected to change after the first step.
    """

    enabled: bool
    form: dict[tuple[int, int, int], int] = field(default_factory=dict)
    padded: dict[tuple[int, int, int], int] = field(default_factory=dict)  # key -> rows computed
    margin: float = 0.9  # another form must take < 90% of F.linear's time
    by_shape: dict[tuple[int, int], list[torch.Tensor]] = field(default_factory=dict)
    transposed: dict[int, torch.Tensor] = field(default_factory=dict)  # id(W) -> W.T.contiguous()
    timing_s: float = 0.0  # seconds spent timing forms so far (a caller timing its own work checks it)
    # a new row count is timed on its n-th product with one weight, F.linear before: 2 leaves a
    # prefill length met once untimed (its timing costs far more than the one product it would help)
    time_after: int = 1
    met: dict[tuple[int, int, int, int], int] = field(default_factory=dict)  # (*key, id(W)) -> products
    # id(W) -> ("int8", (values, scales)) or ("int4", (packed, scales and zeros)): products run quantized
    packed: dict[int, tuple[str, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    # id(W) -> the dense weight its quantized values stand for (CPU), multiplied over more than
    # MAX_WEIGHT_ONCE_ROWS rows (a prompt) where that timed faster than the quantized kernel (dropped
    # where not); many_rows_dense: (kind, out, in) -> that choice
    dequantized: dict[int, torch.Tensor] = field(default_factory=dict)
    many_rows_dense: dict[tuple[str, int, int], bool] = field(default_factory=dict)
    # the weights stand for nothing (random values for timing): the transposed form reads each weight's own
    # memory as an [in, out] matrix instead of copying its transpose (the same bytes in the same order, so
    # the same cost; other products): copying them took 42 s of one calibration of the 1.5B and its
    # drafters on a 2-core Zen 3 in fp32
    timing_only: bool = False

    def quantize(self, weight: torch.Tensor, kind: str = "int8") -> None:
        """Multiply by `weight` in `kind` ("int8": `quantize_int8`; "int4": `quantize_int4`) from now
        on: on the CPU through the chosen products, on CUDA int4 only (`weights_problem`). "dense" leaves it
        as it is."""
        if kind == "dense":
            return
        problem = weights_problem(kind, weight.device.type, dtype_name(weight.dtype))
        if problem:
            raise InvalidInputError(problem)
        if weight.device.type == "cpu" and not self.enabled:
            raise InvalidInputError(f"{kind} weights run through draftnas's chosen products (this model's "
                                    "products are not chosen here: matmul='linear')")
        if id(weight) in self.packed:
            return
        if self.timing_only:  # any values of the format's layout cost the same to multiply by
            quantized = arbitrary_quantized(weight, kind)
        else:
            quantized = quantize_int8(weight) if kind == "int8" else quantize_int4(weight)
        self.packed[id(weight)] = (kind, quantized if kind == "int8" else pack_int4(weight, quantized))
        if weight.device.type == "cpu" and self.many_rows_dense.get((kind, *weight.shape)) is not False:
            if self.timing_only:  # the weight itself stands in for the one its values stand for
                self.dequantized[id(weight)] = weight.detach()
            else:
                dense = dequantize_int8(*quantized) if kind == "int8" else dequantize_int4(*quantized)
                self.dequantized[id(weight)] = dense.to(weight.dtype)  # kept until the many-row choice

    def single_rows(self) -> list[tuple[int, int, int]]:
        """The one-row products chosen as plain F.linear (padded or not): what `pad_single_rows` sets."""
        return [k for k, form in self.form.items() if k[0] == 1 and form == LINEAR]

    def pad_single_rows(self, padded: bool) -> None:
        """Multiply each one-row F.linear product over two rows (the second dropped), or not."""
        for key in self.single_rows():
            if padded:
                self.padded[key] = 2
            else:
                self.padded.pop(key, None)

    def register(self, weight: torch.Tensor) -> None:
        """A weight the model multiplies by (timed together with the others of its shape)."""
        self.by_shape.setdefault((int(weight.shape[0]), int(weight.shape[1])), []).append(weight)

    def prepare(self, rows: Iterable[int]) -> None:
        """Time now, for every registered shape, each row count in `rows` (up to the weight-once
        limit) not chosen yet: the first product of a new row count otherwise pays for its timing
        (seconds for a model's weights), which lands in whatever
        forward meets that count first — a prompt's prefill of up to 16 tokens, for one."""
        if not self.enabled:
            return
        if any(int(r) > MAX_WEIGHT_ONCE_ROWS for r in rows):
            for weights in self.by_shape.values():
                for w in weights:
                    if id(w) in self.packed:
                        self._dense_for_many(self.packed[id(w)][0], w)
        for n in sorted({int(r) for r in rows if 0 < int(r) <= MAX_WEIGHT_ONCE_ROWS}):
            for (out_features, in_features), weights in self.by_shape.items():
                if all(id(w) in self.packed for w in weights):  # multiplied quantized at any row count
                    continue
                key = (n, out_features, in_features)
                if key not in self.form:
                    self._choose(key, weights[0])

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        packed = self.packed.get(id(weight)) if self.packed else None
        if packed is not None:
            if x.numel() // x.shape[-1] > MAX_WEIGHT_ONCE_ROWS and self._dense_for_many(packed[0], weight):
                return F.linear(x, self.dequantized[id(weight)])
            return _quantized_product(x, packed).reshape(*x.shape[:-1], weight.shape[0])
        if not self.enabled:
            return F.linear(x, weight)
        rows = x.numel() // x.shape[-1]
        if rows > MAX_WEIGHT_ONCE_ROWS:
            return F.linear(x, weight)
        key = (rows, int(weight.shape[0]), int(weight.shape[1]))
        form = self.form.get(key)
        if form is None:
            if self.time_after > 1:
                seen = self.met[(*key, id(weight))] = self.met.get((*key, id(weight)), 0) + 1
                if seen < self.time_after:
                    return F.linear(x, weight)
            form = self._choose(key, weight)
        computed = self.padded.get(key, rows)
        if form == LINEAR and computed == rows:
            return linear_2d(x, weight)
        flat = x.reshape(rows, x.shape[-1]).contiguous()
        if computed > rows:
            flat = F.pad(flat, (0, 0, 0, computed - rows))
        if form == LINEAR:
            out = F.linear(flat, weight)
        elif form == WEIGHT_ONCE:
            out = torch.mm(weight, flat.T).T
        else:
            out = torch.mm(flat, self._transpose(weight))
        return out[:rows].reshape(*x.shape[:-1], weight.shape[0])

    def _choose(self, key: tuple[int, int, int], weight: torch.Tensor) -> int:
        """The form for `key`: kept from an earlier timing on this host (`kernel_choices`), else timed."""
        store = kernel_choices.active()
        n_weights = len(self.by_shape.get((key[1], key[2]), [weight]))
        store_key = store.key("matmul", str(weight.dtype), *key, n_weights) if store else ""
        kept = store.get(store_key) if store else None
        if kept is not None:
            form, computed = int(kept[0]), int(kept[1])
        else:
            started = time.perf_counter()
            form, computed = self._time(key[0], weight)
            self.timing_s += time.perf_counter() - started
            if store:
                store.put(store_key, [form, computed])
        self.form[key] = form
        if computed > key[0]:
            self.padded[key] = computed
        return form

    def _dense_for_many(self, kind: str, weight: torch.Tensor) -> bool:
        """Whether products of many rows (a prompt) by this quantized weight run dense, from the weight its
        values stand for: timed once per (kind, shape) here (`PROMPT_ROWS` rows over every weight of that
        shape, the dense product must beat the quantized one by the margin), kept in `kernel_choices`. On
        some CPUs the quantized kernels read a prompt several times slower than dense ones while they
        decode faster. Where the quantized kernel wins, the dense copies are dropped."""
        key = (kind, int(weight.shape[0]), int(weight.shape[1]))
        chosen = self.many_rows_dense.get(key)
        if chosen is not None:
            return chosen and id(weight) in self.dequantized
        weights = [w for w in self.by_shape.get(key[1:], [weight])
                   if self.packed.get(id(w), ("",))[0] == kind and id(w) in self.dequantized] or [weight]
        timed = streamed(weights)
        if id(weight) not in self.dequantized:
            chosen = False
        else:
            store = kernel_choices.active()
            store_key = (store.key("many-rows", kind, str(weight.dtype), *key[1:], len(weights)) if store
                         else "")
            kept = store.get(store_key) if store else None
            if kept is not None:
                chosen = bool(kept)
            else:
                started = time.perf_counter()
                chosen = self._time_many(timed)
                self.timing_s += time.perf_counter() - started
                if store:
                    store.put(store_key, chosen)
        self.many_rows_dense[key] = chosen
        if not chosen:
            for w in weights:
                self.dequantized.pop(id(w), None)
        return chosen

    def _time_many(self, weights: list[torch.Tensor]) -> bool:
        """Whether `PROMPT_ROWS` rows by every one of `weights` take less than the margin of the quantized
        kernels' time multiplied dense."""
        x = torch.randn(PROMPT_ROWS, weights[0].shape[1], dtype=weights[0].dtype, device=weights[0].device)
        times: list[list[float]] = [[], []]
        for i in range(5):
            for j, dense in enumerate((False, True)):
                started = time.perf_counter()
                for w in weights:
                    if dense:
                        F.linear(x, self.dequantized[id(w)])
                    else:
                        _quantized_product(x, self.packed[id(w)])
                if i >= 1:  # one warm-up round
                    times[j].append(time.perf_counter() - started)
        return min(times[1]) < self.margin * min(times[0])

    def _transpose(self, weight: torch.Tensor) -> torch.Tensor:
        wt = self.transposed.get(id(weight))
        if wt is None or wt.dtype != weight.dtype or wt.device != weight.device:  # made before a `.to()`
            w = weight.detach()
            wt = (w.view(w.shape[1], w.shape[0]) if self.timing_only and w.is_contiguous()
                  else w.T.contiguous())
            self.transposed[id(weight)] = wt
        return wt

    def _time(self, rows: int, weight: torch.Tensor) -> tuple[int, int]:
        """The fastest (form, rows computed) for `rows` rows over every weight of this shape
        (LINEAR unless another is faster by the margin; odd counts also padded by one row);
        drops transposed copies the choice does not use."""
        weights = streamed(self.by_shape.get((int(weight.shape[0]), int(weight.shape[1])), [weight]))
        had = {id(w) for w in weights if id(w) in self.transposed}
        copies = [self._transpose(w) for w in weights]

        def linear(x: torch.Tensor) -> None:
            for w in weights:
                F.linear(x, w)

        def weight_once(x: torch.Tensor) -> None:
            for w in weights:
                torch.mm(w, x.T)

        def transposed(x: torch.Tensor) -> None:
            for wt in copies:
                torch.mm(x, wt)

        counts = (rows, rows + 1) if rows % 2 else (rows,)
        inputs = {n: torch.randn(n, weight.shape[1], dtype=weight.dtype, device=weight.device)
                  for n in counts}
        forms = ((WEIGHT_ONCE, weight_once), (TRANSPOSED, transposed))
        candidates = ([(LINEAR, n, linear) for n in counts]
                      + [(f, n, fn) for n in counts for f, fn in forms])
        times: list[list[float]] = [[] for _ in candidates]
        for i in range(TIMING_ROUNDS + 1):
            for j, (_, n, fn) in enumerate(candidates):
                started = time.perf_counter()
                fn(inputs[n])
                if i >= 1:  # one warm-up round
                    times[j].append(time.perf_counter() - started)
        # each form's fastest pass decides: the work is fixed, so a slower pass measured other
        # work on the machine, and the choice is made once and kept for the whole process
        fastest = [min(t) for t in times]
        best = min(range(len(candidates)), key=lambda j: fastest[j])
        form, computed, _ = candidates[best] if fastest[best] < self.margin * fastest[0] else candidates[0]
        if form != TRANSPOSED:
            for w in weights:
                if id(w) not in had:
                    self.transposed.pop(id(w), None)
        return form, computed


def streamed(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """The first of `weights` that add up to `STREAM_BYTES` (all of them where they add up to less)."""
    out: list[torch.Tensor] = []
    total = 0
    for w in weights:
        out.append(w)
        total += w.numel() * w.element_size()
        if total >= STREAM_BYTES:
            break
    return out


def linear_2d(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) as one product of a [rows, in] view. F.linear on a [B, 1, in] input whose size-1
    dimension has a stride other than `in` (the attention's output at one new token: stride B x in) does
    not fold it to one product: it broadcasts to a batched one, copying the weight once per sequence
    (the 1.5B's decode at batch 8 took 10 s instead of 0.3: `benchmarks/batched_steps.py`)."""
    if x.dim() == 2:
        return F.linear(x, weight)
    return F.linear(x.reshape(-1, x.shape[-1]), weight).reshape(*x.shape[:-1], weight.shape[0])


def _quantized_product(x: torch.Tensor, packed: tuple[str, tuple[torch.Tensor, torch.Tensor]]
                       ) -> torch.Tensor:
    """x [..., in] by a weight `MatmulChooser.quantize` packed ((kind, (values, scales))) -> [rows, out]."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    kind, (q, scales) = packed
    if kind == "int8":
        return torch._weight_int8pack_mm(flat, q, scales)
    if flat.device.type == "cuda":  # bf16 only, as `weights_problem` requires
        return torch._weight_int4pack_mm(flat, q, INT4_GROUP, scales)
    return torch._weight_int4pack_mm_for_cpu(
        flat, q, INT4_GROUP, scales if scales.dtype == flat.dtype else scales.to(flat.dtype))


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` [out, in] as int8 values and one scale per output row (symmetric, round to nearest:
    row max |w| maps to 127), the scales in the weight's dtype: what `torch._weight_int8pack_mm` reads."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    values = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return values, scales.to(weight.dtype)


def arbitrary_quantized(weight: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Values and scales in `kind`'s layout (`quantize_int8`, `quantize_int4`) taken from `weight`'s bytes,
    not computed from its values: for a model built to be timed, whose products cost the same whatever they
    hold, at one pass over a fraction of its bytes (computing them took 50 s of one calibration of
    the 0.5B in three formats on a 2-core Zen 3). Scales keep the products near the weights' magnitude."""
    out_features, in_features = weight.shape
    if kind == "int4":
        check_int4_width(in_features)
    raw = weight.detach().contiguous().view(torch.uint8)[:, :in_features]
    if kind == "int8":
        return raw.contiguous().view(torch.int8), torch.full((out_features,), 0.02 / 64, dtype=weight.dtype)
    values = raw.to(torch.int32) & 15
    scales_zeros = torch.zeros(in_features // INT4_GROUP, out_features, 2)
    scales_zeros[..., 0] = 0.02 / 4
    return values, scales_zeros


def dequantize_int8(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 weight `quantize_int8`'s values and scales stand for (what the int8 product multiplies by)."""
    return values.float() * scales.float()[:, None]


def check_int4_width(in_features: int) -> None:
    """One line where a weight's input width cannot be grouped for int4 (`INT4_GROUP` inputs a group)."""
    if in_features % INT4_GROUP:
        raise InvalidInputError(f"int4 weights need input widths in multiples of {INT4_GROUP}, not "
                                f"{in_features}")


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` [out, in] as 4-bit values 0..15 (int32, unpacked) and per group of `INT4_GROUP` inputs a
    scale and zero point [in / group, out, 2] (asymmetric, round to nearest: the group's min and max are
    the ends), in torch's int4 convention w = (q - 8) * scale + zero."""
    out_features, in_features = weight.shape
    check_int4_width(in_features)
    w = weight.detach().float().reshape(out_features, in_features // INT4_GROUP, INT4_GROUP)
    low, high = w.amin(-1), w.amax(-1)
    scales = ((high - low) / 15).clamp(min=1e-8)
    values = torch.round((w - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.int32)
    zeros = low + 8 * scales
    scales_zeros = torch.stack([scales, zeros], -1).transpose(0, 1).contiguous()
    return values.reshape(out_features, in_features), scales_zeros


def dequantize_int4(values: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """The fp32 weight `quantize_int4`'s values and scales stand for (what the int4 product multiplies by)."""
    out_features, in_features = values.shape
    groups = values.float().reshape(out_features, in_features // INT4_GROUP, INT4_GROUP)
    scales, zeros = scales_zeros[..., 0].T[..., None], scales_zeros[..., 1].T[..., None]
    return ((groups - 8) * scales + zeros).reshape(out_features, in_features)


def pack_int4(weight: torch.Tensor, quantized: tuple[torch.Tensor, torch.Tensor] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_int4` (or `quantized`, its result for `weight` already at hand) packed for the weight's
    device, the scales in the weight's dtype (the activations' dtype a model multiplies in): for
    `torch._weight_int4pack_mm_for_cpu` on the CPU (values as int32), for `torch._weight_int4pack_mm` on
    CUDA (two values a byte, the even input in the high half, tiled for its tensor cores: `k_tiles` inner
    tiles of 16 inputs, the most that divide the input width)."""
    values, scales_zeros = quantized if quantized is not None else quantize_int4(weight)
    if weight.device.type != "cuda":
        return torch._convert_weight_to_int4pack_for_cpu(values, 1), scales_zeros.to(weight.dtype)
    if torch.cuda.get_device_capability(weight.device) < (8, 0):
        major, minor = torch.cuda.get_device_capability(weight.device)
        raise InvalidInputError(f"int4 weights on CUDA need a GPU of compute capability 8.0 or newer (this "
                                f"one is {major}.{minor}): use dense")
    if weight.shape[0] % 8:
        raise InvalidInputError(f"int4 weights on CUDA need output widths in multiples of 8, not "
                                f"{weight.shape[0]}")
    two_a_byte = (values[:, ::2] << 4 | values[:, 1::2]).to(torch.uint8)
    k_tiles = next(t for t in (8, 4, 2) if weight.shape[1] % (16 * t) == 0)  # 32 | width: 2 always divides
    return torch._convert_weight_to_int4pack(two_a_byte, k_tiles), scales_zeros.to(weight.dtype)


def faster_int8_activations(in_features: int, out_features: int, dtypes: tuple[str, ...] = ("fp32", "bf16"),
                            repeats: int = 20) -> tuple[str, dict[str, float]]:
    """Of `dtypes`, the activation dtype in which an int8-weight product of this shape (one row) runs
    fastest here, and each one's best time in ms. torch's int8 kernel on the CPU is vectorized for bf16
    activations only on some hosts: there fp32 activations make the int8 product slower than a dense
    fp32 one, bf16 activations much faster (docs/hosts/ has the figures)."""
    values, scales = quantize_int8(torch.randn(out_features, in_features))
    times: dict[str, float] = {}
    for name in dtypes:
        dtype = getattr(torch, TORCH_DTYPE_NAMES[name])
        x, s = torch.randn(1, in_features, dtype=dtype), scales.to(dtype)
        torch._weight_int8pack_mm(x, values, s)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            torch._weight_int8pack_mm(x, values, s)
            best = min(best, time.perf_counter() - started)
        times[name] = best * 1e3
    return min(times, key=lambda k: times[k]), times
