"""What the latency stage hands on: profiles (timings and the fitted model's coefficients),
target timings, host calibrations, and what `draftnas profile` is asked. No torch, no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftnas.core.engine_kinds import LLAMA_CPP
from draftnas.core.machine import DEVICES
from draftnas.core.options import check_options, option, option_group, parse_ints
from draftnas.core.placement import Hardware
from draftnas.core.records import CpuIdentity, Record
from draftnas.core.registry import Architecture
from draftnas.latency.batch_records import BatchTiming
from draftnas.models.records import llama_cpp_option

SCHEMA_VERSION = 1
KINDS = ("measured", "spec-sheet")


@dataclass(frozen=True)
class Measurement(Record):
    """One timed configuration: median and quartiles of `repeats` timed calls, in ms.

    kind "model": a full forward of `shape` (embedding, layers, final norm, LM head of
    `head_rows` = vocab rows) over `new_tokens` new tokens per sequence with a KV cache
    of `context_tokens`. kind "head": final norm + LM head of `head_rows` rows only, on
    [batch_size, new_tokens, hidden] activations. `split` is "train", "heldout" or
    "extrapolation" (timings used only to check the k-layer extrapolation).
    """

    kind: str
    shape: str
    batch_size: int
    new_tokens: int
    context_tokens: int
    head_rows: int
    median_ms: float
    q1_ms: float
    q3_ms: float
    repeats: int
    split: str = "train"


@dataclass(frozen=True)
class SkippedConfig(Record):
    """A configuration the profiler did not time because its memory peak would not fit.

    `needed_bytes`: weights + KV cache as allocated + held outputs + the largest transient
    of one forward; `budget_bytes`: the memory the run allowed itself on this device.
    """

    kind: str
    shape: str
    batch_size: int
    new_tokens: int
    context_tokens: int
    needed_bytes: int
    budget_bytes: int
    reason: str


@dataclass(frozen=True)
class ExtrapolationPoint(Record):
    batch_size: int
    new_tokens: int
    context_tokens: int
    full_ms: float
    extrapolated_ms: float
    error_pct: float  # (extrapolated - full) / full * 100


@dataclass(frozen=True)
class ExtrapolationCheck(Record):
    """Error of "time k layers, extrapolate fixed + L * per-layer" on a model that fits.

    Two stacks of `timed_layers` (k1 < k2) layers give per_layer = (t2 - t1) / (k2 - k1)
    and fixed = t1 - k1 * per_layer; the estimate for L layers is fixed + L * per_layer.
    """

    shape: str
    full_layers: int
    timed_layers: tuple[int, ...]
    points: tuple[ExtrapolationPoint, ...]
    mean_abs_error_pct: float
    max_abs_error_pct: float


@dataclass(frozen=True)
class TargetTiming(Record):
    """A target's full-depth step latencies, extrapolated from stacks of its first k layers timed
    on the profile's device (`draftnas profile --target T --layers k1,k2`).

    `arch` is the shape that was timed: the target itself, or one tensor-parallel rank's share
    of it (`gpus` > 1). `ms["BxN"]` is batch B reading N new tokens (N = 1 decode, gamma + 1
    verify) after `context_tokens`. `check`: the method's error on a stack that fits.
    """

    target: str
    arch: Architecture
    gpus: int
    timed_layers: tuple[int, ...]
    context_tokens: int
    batch_sizes: tuple[int, ...]
    new_tokens: tuple[int, ...]
    ms: dict[str, float]
    check: ExtrapolationCheck | None = None
    device_name: str = ""
    mode: str = "eager"
    wall_s: float = 0.0

    def matches(self, arch: Architecture, head_rows: int) -> bool:
        """Whether a prediction for `arch` with `head_rows` LM-head rows is this timed shape."""
        a, t = arch, self.arch
        return (head_rows == t.vocab_size and a.num_hidden_layers == t.num_hidden_layers
                and a.hidden_size == t.hidden_size and a.intermediate_size == t.intermediate_size
                and a.num_attention_heads == t.num_attention_heads
                and a.num_key_value_heads == t.num_key_value_heads and a.head_dim == t.head_dim)


@dataclass(frozen=True)
class LatencyProfile(Record):
    """A device's latency profile (schema-versioned JSON under `profiles/`)."""

    schema_version: int
    kind: str  # "measured" | "spec-sheet"
    device: str  # "cpu" | "cuda"
    device_name: str
    dtype: str  # fp32 | fp16 | bf16
    versions: dict[str, str]
    measurements: tuple[Measurement, ...]
    coefficients: dict[str, float]
    heldout_mape: float | None
    train_mape: float | None = None
    mode: str = "eager"  # "eager" (transformers) | "static" | "cuda-graph" (draftnas.models.decoder)
    threads: int | None = None
    shapes: tuple[Architecture, ...] = ()
    heldout_shapes: tuple[str, ...] = ()
    extrapolation: ExtrapolationCheck | None = None
    created: str = ""
    wall_s: float | None = None
    command: str = ""
    notes: str = ""
    spec: dict[str, float] = field(default_factory=dict)
    series: dict[str, tuple[str, ...]] = field(default_factory=dict)  # "depth"/"width" -> shape names
    skipped: tuple[SkippedConfig, ...] = ()
    hardware: Hardware | None = None  # GPU memory, dtypes and interconnect (placement, parallelism)
    targets: dict[str, TargetTiming] = field(default_factory=dict)  # "name" or "name/tpN" -> timing
    cpu: CpuIdentity | None = None  # the CPU it was measured on (None: a GPU, or not recorded)


@dataclass(frozen=True)
class FitResult(Record):
    """Coefficients (ms per feature unit, plus the ridge point) and their errors in %."""

    coefficients: dict[str, float]
    train_mape: float
    heldout_mape: float | None
    n_train: int
    n_heldout: int


@dataclass(frozen=True)
class StackCalibration(Record):
    """One more shape timed beside the target (a drafter's base, a reference drafter), batch 1, one
    new token: its first k layers (`prefix_ms`), its full depth (`full_ms`), and the decode time a
    reduced head of that many rows saves under its full depth and under its first layer."""

    arch: Architecture
    prefix_ms: dict[int, float]
    full_ms: float
    head_saving_ms: dict[int, float] = field(default_factory=dict)
    head_saving_prefix_ms: dict[int, float] = field(default_factory=dict)
    # prompt tokens -> its full depth reading a prompt that long (batch 1, no context): a drafter's
    # prefill, which a quantized format's kernel may run slower than dense while it decodes faster
    prefill_ms: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HostCalibration(Record):
    """Steps of one target shape timed on the machine a search runs on (batch 1, one context).

    `target_ms[n]`: the whole target reading n new tokens (n = 1 decode, n = gamma + 1 verify);
    `prefix_ms[k]`: its first k layers (embedding, k layers, final norm, LM head) decoding one
    token, for a few small k: drafter-sized stacks of the same kernels.
    """

    target: str
    device_name: str
    threads: int
    context_tokens: int
    target_ms: dict[int, float]
    prefix_ms: dict[int, float]
    mode: str = "eager"
    wall_s: float = 0.0
    # per-call work outside the forward, from real decoding runs: transformers' generate per
    # token (the target alone), draftnas's loop per drafted token and per verify step
    generate_overhead_ms: float = 0.0
    draft_overhead_ms: float = 0.0
    verify_overhead_ms: float = 0.0
    prefill_ms: dict[int, float] = field(default_factory=dict)  # prompt tokens -> the target's prefill
    # head rows -> decode time the target's full depth saves with that reduced head (measured)
    head_saving_ms: dict[int, float] = field(default_factory=dict)
    # head rows -> the same saving for its first layer alone (a 1-layer drafter's stack)
    head_saving_prefix_ms: dict[int, float] = field(default_factory=dict)
    dtype: str = "fp32"  # the weights' dtype every step was timed in
    stacks: dict[str, StackCalibration] = field(default_factory=dict)  # bases and references by name
    # weight format ("int8", "int4", per layer group) -> drafter bases timed alike with their linear layers
    # in that format, by name: the format's drafters are priced from these
    quant_stacks: dict[str, dict[str, StackCalibration]] = field(default_factory=dict)
    cpu: CpuIdentity | None = None
    # dtype -> its target decode and verify, timed to choose the dtype (empty: the dtype was given)
    dtype_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    quant_dtype: str = ""  # the activation dtype quantized stacks were timed in ("" none timed; may differ)
    batched: tuple[BatchTiming, ...] = ()  # the target and drafter bases at batch > 1 (`batch_records`)


@dataclass(frozen=True)
class SpecSheet(Record):
    """A GPU's data-sheet figures and the overheads assumed on top of them."""

    name: str
    memory_bandwidth_gb_s: float
    peak_tflops: float  # dense fp16/bf16 tensor-core, fp32 accumulate
    kernel_overhead_us: float = 4.0
    kernels_per_layer: int = 12
    call_overhead_us: float = 50.0
    source: str = ""
    hardware: Hardware | None = None


Condition = tuple[int, int, int]  # (batch_size, new_tokens, context_tokens)
MODES = ("eager", "static", "cuda-graph")
STATIC_MODES = ("static", "cuda-graph")
DTYPES_BY_DEVICE = {"cpu": ("fp32", "bf16"), "cuda": ("fp16", "bf16")}
DRAFT_CONDITION: Condition = (1, 1, 128)


@dataclass(frozen=True)
class ProfileOptions(Record):
    """What to measure. `quick` is a reduced grid that takes a few minutes on a 2-core CPU."""

    device: str = option("cpu", help="Device to time on.", short="-d", choices=DEVICES)
    dtype: str | None = option(None, help="fp32 or bf16 on CPU (default fp32); fp16 or bf16 on CUDA "
                                          "(default fp16).", choices=("fp32", "bf16", "fp16"))
    mode: str = option("eager", choices=MODES,
                       help="eager: transformers' forward over a growing cache. static: draftnas's decoder "
                            "over a cache allocated once. cuda-graph: that static step captured and "
                            "replayed (CUDA only).")
    quick: bool = option(False, help="Reduced grid: a few minutes on a 2-core CPU.")
    warmup: int | None = option(None, help="Warm-up calls per configuration (default: 1 quick, 2 full).",
                                low=0, cli=False)
    repeats: int | None = option(None, help="Timed repeats per configuration (default: 7 quick, 15 full).",
                                 low=3)
    seed: int = option(0, help="Seed of the random weights and inputs.", cli=False)
    extrapolation_check: bool = option(True, flag="--extrapolation-check/--no-extrapolation-check",
                                       help="Time k layers against the full model to check extrapolation.")
    threads: int | None = option(None, help="torch CPU threads (default: torch's default here).", low=1)
    memory_budget_bytes: int | None = option(None, help="Peak memory a chunk of timings may take.", low=1,
                                             cli=False)

    def resolved_dtype(self) -> str:
        return self.dtype or DTYPES_BY_DEVICE.get(self.device, ("fp32",))[0]

    def resolved_repeats(self) -> int:
        return self.repeats if self.repeats is not None else (7 if self.quick else 15)

    def resolved_warmup(self) -> int:
        return self.warmup if self.warmup is not None else (1 if self.quick else 2)

    def validate(self) -> ProfileOptions:
        extra = []
        if self.device in DTYPES_BY_DEVICE and self.resolved_dtype() not in DTYPES_BY_DEVICE[self.device]:
            allowed = ", ".join(DTYPES_BY_DEVICE[self.device])
            extra.append(("dtype", f"on {self.device} must be one of {allowed}, got {self.dtype!r}"))
        if self.mode == "cuda-graph" and self.device != "cuda":
            extra.append(("mode", "cuda-graph needs {device} cuda"))
        return check_options(self, extra)


PROFILE_ENGINES = ("torch", LLAMA_CPP)  # torch: the static and hf engines' steps


@dataclass(frozen=True)
class ProfileRequest(Record):
    """What `draftnas profile` was asked: time this device's decoder shapes (the default), load a
    profile (`from_file`), add a target's real shape timed through its first layers (`target`), or time
    a GGUF in llama.cpp's llama-bench (`engine` llama.cpp)."""

    out: str | None = option(None, short="-o", help="Profile JSON to write (default: draftnas-profile-DEVICE-"
                                                   "DTYPE.json).")
    report: bool = option(False, help="Print draft latency vs depth and width and save it as a PNG.")
    report_png: str | None = option(None, help="PNG path for the report (default: next to the profile).")
    from_file: str | None = option(None, flag="--from",
                                   help="Do not measure: load this profile (e.g. for the report, or as the "
                                        "profile a target is added to).")
    target: str | None = option(
        None, help="Time this target's real shape (random weights) through only its first layers, "
                   "extrapolate to full depth and add the result to the profile (the --from one, else the "
                   "shipped one for "
                   "the device); the search then prices that target with it.")
    layers: tuple[int, ...] = option((2, 4), low=1, nonempty=True, cli_type=str, cli_default="2,4",
                                     parse=parse_ints, help="Layer counts timed for the target, e.g. 2,4.")
    tp: int = option(1, low=1, help="With a target on CUDA: time one tensor-parallel rank's share of N GPUs.")
    batch_sizes: tuple[int, ...] = option((1,), low=1, nonempty=True, cli_type=str, cli_default="1",
                                          parse=parse_ints,
                                          help="Batch sizes timed for the target, e.g. 1,8,32.")
    max_gamma: int = option(4, low=1, help="Verify steps of up to this many drafted tokens (+1) are timed (a "
                                           "target; llama.cpp: batches up to max(8, this + 1)).")
    context: int = option(128, low=0, help="Context tokens before each timed step (a target; llama.cpp).")
    engine: str = option(
        "torch", choices=PROFILE_ENGINES,
        help="torch: draftnas's own runtime. llama.cpp: time the model (a GGUF) in llama.cpp's stock "
             "llama-bench: decode and batches of k = 2..8 tokens after the context; with a base and quant "
             "types also random-weight GGUF drafters of that base at three depths per type, lines fitted.")
    model: str | None = option(None, help="With the llama.cpp engine: the GGUF file to time.")
    base: str | None = option(None, help="With the llama.cpp engine: the registry shape of the drafters' "
                                         "base (e.g. qwen2.5-coder-0.5b).")
    quants: tuple[str, ...] = option((), cli_type=str, cli_default="", parse=lambda t: _quants(t),
                                     help="With the llama.cpp engine and a base: quant types of the random "
                                          "drafters, e.g. Q8_0,Q4_0.")
    llama_cpp: str | None = llama_cpp_option("time the model with the llama.cpp engine")
    options: ProfileOptions = option_group(ProfileOptions)

    def validate(self) -> ProfileRequest:
        extra = []
        if self.engine == LLAMA_CPP and (self.model is None or not self.model.endswith(".gguf")):
            extra.append(("model", "must name a GGUF file with the {engine} llama.cpp, got "
                                   f"{self.model!r}"))
        if self.quants and self.base is None:
            extra.append(("quants", "times random drafters of a base: set {base} (a registry shape)"))
        return check_options(self, extra)


def _quants(text: str | tuple[str, ...]) -> tuple[str, ...]:
    items = text if isinstance(text, tuple) else text.split(",")
    return tuple(q.strip().upper() for q in items if q.strip())


@dataclass(frozen=True)
class ProfilePlan(Record):
    """The shapes and conditions one profiling run times (pure data; see `plan_profile`)."""

    shapes: tuple[Architecture, ...]
    heldout: tuple[str, ...]
    conditions: tuple[tuple[int, int, int], ...]
    head_points: tuple[tuple[str, int, int], ...]  # (shape whose hidden size, head rows, tokens)
    extrapolation_shape: Architecture | None
    extrapolation_layers: tuple[int, ...]
    extrapolation_conditions: tuple[tuple[int, int, int], ...]
    series: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineTiming(Record):
    """One GGUF file timed in an engine at one context: a one-token decode and a batch of n tokens
    (n = gamma + 1: a verify, or a drafter catching up on the verified tokens), ms, medians over
    `repeats`."""

    file: str
    decode_ms: float
    batch_ms: dict[int, float]
    repeats: int = 0


@dataclass(frozen=True)
class EngineCalibration(Record):
    """llama.cpp timed on this host: the target file, the reference drafters' files and random-weight
    drafters of the base's shape at a few depths per quant type (`quants[q][layers]`), all at
    `context_tokens` with `threads` threads. `flags`: what this build needs here, and `flags_why`."""

    engine: str
    version: str
    cpu: CpuIdentity
    threads: int
    context_tokens: int
    target: EngineTiming
    base: str
    quants: dict[str, dict[int, EngineTiming]]
    references: dict[str, EngineTiming] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    flags_why: str = ""
    wall_s: float = 0.0


@dataclass(frozen=True)
class ProfileOutcome(Record):
    """What `draftnas profile` did: the file written (or loaded) and what it holds, a device's profile
    (`target`: the target timed into it) or a GGUF's llama.cpp timings."""

    path: str
    profile: LatencyProfile | None = None
    calibration: EngineCalibration | None = None
    target: str | None = None  # the target added to the profile
    next_command: str | None = None  # what to run with it
