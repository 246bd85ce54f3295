"""Records of self-distillation at a token budget: the data set's manifest, the request that makes
data, the request that trains a drafter on it, and their results. Pure: no torch.

The data is the second seed's recipe (pretrain-and-finetune on the target's own outputs): the target's
continuations of prompts at temperatures {0, 0.3, 0.7, 1.0}, and its top-k next-token probabilities over
text found on the machine (teacher-forced: one forward per window, the cheap kind). A set is a folder of
shards and one manifest; it grows by appending and resumes by work unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftnas.core.options import check_options, option, option_error, parse_words
from draftnas.core.records import Record

#: The seed's sampling temperatures for self-distilled data.
SEED_TEMPERATURES = (0.0, 0.3, 0.7, 1.0)
#: Kinds of work a data set is made of, in the order a round takes them.
SOURCES = ("set", "written", "text", "open")
MANIFEST = "manifest.json"
HELDOUT_PROMPTS = "heldout-prompts.jsonl"
DATA_FORMAT = 1


def _floats(text: object) -> tuple[float, ...]:
    if isinstance(text, tuple):
        return tuple(float(t) for t in text)
    return tuple(float(t) for t in str(text).split(",") if t.strip())


@dataclass(frozen=True)
class ShardInfo(Record):
    """One shard file: the sequences of one work unit. `positions`: tokens that carry the target's
    top-k (what a drafter is trained on); `kind`: generated (the target wrote it) or teacher-forced."""

    file: str
    unit: str
    kind: str
    sequences: int
    tokens: int
    positions: int
    sha256: str
    domains: dict[str, int] = field(default_factory=dict)  # positions per domain


@dataclass(frozen=True)
class DataManifest(Record):
    """What a data folder holds and whose it is: the target and its tokenizer, the top-k kept, the
    prompts held out of it (every `heldout_every`-th of each shipped domain: the bench's), the work
    units done (resume) and the wall time spent making them."""

    format: int
    target: str
    vocab_size: int
    tokenizer_fingerprint: str
    top_k: int
    dtype: str
    heldout_every: int
    heldout_prompts: tuple[str, ...]
    batch_size: int = 16
    max_new_tokens: int = 128
    window_tokens: int = 256
    shards: tuple[ShardInfo, ...] = ()
    wall_s: float = 0.0

    def positions(self, kind: str | None = None, domain: str | None = None) -> int:
        """Trainable positions, of one kind and/or domain when given."""
        total = 0
        for s in self.shards:
            if kind is not None and s.kind != kind:
                continue
            total += s.positions if domain is None else s.domains.get(domain, 0)
        return total

    def done_units(self) -> set[str]:
        return {s.unit for s in self.shards}


@dataclass(frozen=True)
class DistillDataRequest(Record):
    """`draftnas distill data`: make (or add to) a self-distillation data set for a target."""

    out: str = option(help="Data folder (created; an existing one of the same target is resumed and "
                           "appended to).", argument=True)
    target: str = option("smollm2-135m", help="Target whose outputs the drafter learns.")
    sources: tuple[str, ...] = option(SOURCES, parse=parse_words, cli_type=str, choices=SOURCES,
                                      distinct=True, nonempty=True, cli_default=",".join(SOURCES),
                                      help="Kinds of data, taken in rounds: set (the shipped prompt sets' "
                                           "training prompts, answered), written (prompts the target writes "
                                           "itself, answered), text (teacher-forced top-k over text found "
                                           "on this machine), open (openings of such files, continued).")
    temperatures: tuple[float, ...] = option(SEED_TEMPERATURES, parse=_floats, cli_type=str, low=0.0,
                                             high=2.0, nonempty=True, cli_default="0,0.3,0.7,1",
                                             help="Sampling temperatures of generated data (the seed's).")
    written_domains: tuple[str, ...] = option((), parse=parse_words, cli_type=str, cli_default="",
                                              distinct=True,
                                              choices=("chat", "translation", "code", "math"),
                                              help="Domains the written prompts rotate over (default: every "
                                                   "shipped domain), e.g. chat for a chat workload.")
    minutes: float | None = option(None, low=0.0, low_open=True,
                                   help="Stop after this much wall time in this call (minutes).")
    tokens: int | None = option(None, low=1, help="Stop once the set holds this many trained positions.")
    top_k: int = option(16, low=1, high=256, help="Target probabilities kept per position (fp16).")
    max_new_tokens: int = option(128, low=8, high=2048, help="Tokens generated per answer or opening.")
    window_tokens: int = option(256, low=16, high=4096, help="Window length of teacher-forced text.")
    batch_size: int = option(16, low=1, high=256, help="Rows decoded or teacher-forced together.")
    heldout_every: int = option(3, low=2, high=100, cli=False,
                                help="Every n-th prompt of each shipped domain is held out (the bench's).")
    dtype: str = option("auto", choices=("auto", "fp32", "bf16"),
                        help="Target dtype while making data (auto: bf16 on CUDA and where the CPU has it).")
    seed: int = option(0, help="Seed of sampling and of the text order.")
    device: str = option("cpu", choices=("cpu", "cuda"), help="Where the target runs while making data.")

    def validate(self) -> DistillDataRequest:
        check_options(self)
        return self


@dataclass(frozen=True)
class DistillDataResult(Record):
    """One `distill data` call: what it added, what the set now holds, and how fast it went."""

    out: str
    target: str
    added_positions: int
    added_sequences: int
    wall_s: float
    positions_per_kind: dict[str, int]
    positions_per_domain: dict[str, int]
    total_positions: int
    units_done: int
    stopped_by: str  # "minutes" | "tokens" | "exhausted"
    host: str = ""

    @property
    def positions_per_s(self) -> float:
        return self.added_positions / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class TrainReading(Record):
    """A held-out reading during training: top-1 agreement with the target on its greedy continuations
    of held-out prompts (greedy acceptance per token) and the greedy tokens per step at `gamma`."""

    tokens: int
    phase: str
    train_s: float
    loss: float | None
    top1_agreement: float
    tokens_per_step: float


def _layers(text: object) -> tuple[int, ...]:
    if isinstance(text, tuple):
        return tuple(int(t) for t in text)
    return tuple(int(t) for t in str(text).split(",") if t.strip())


@dataclass(frozen=True)
class DistillTrainRequest(Record):
    """`draftnas distill train`: cut a drafter from a base and train it on a data set to a token budget
    (pretrain on the whole set, then finetune on one domain)."""

    data: str = option(help="Data folder made by `draftnas distill data`.", argument=True)
    out: str = option(help="Training folder: checkpoints, readings, the trained delta.", flag="--out")
    base: str = option("", help="Model the drafter is cut from (default: the data's target itself).")
    layers: tuple[int, ...] = option((0,), parse=_layers, cli_type=str, cli_default="0", nonempty=True,
                                     distinct=True, low=0, help="Base layers kept, at full width (e.g. 0,1).")
    head_rows: int = option(8192, low=0, help="Rows of the reduced draft head (0: the base's full head); the "
                                              "data's most frequent tokens plus special tokens.")
    tokens: int = option(1_000_000, low=1, help="Pretrain budget: trained positions over the whole set.")
    finetune_domain: str = option("", help="Domain finetuned on after pretraining (e.g. chat; empty: none).")
    finetune_tokens: int = option(0, low=0, help="Finetune budget (trained positions of that domain).")
    finetune_data: str = option("", help="Data folder the finetune reads its domain from (default: DATA); "
                                         "it may be made or grown after pretraining.")
    train: str = option("layers", choices=("layers", "all", "lowrank"),
                        help="What trains: layers (kept layers, final norm, a reduced head), all "
                             "(embeddings and head too), lowrank (rank --rank updates, merged at the end).")
    rank: int = option(16, low=1, high=1024, help="Rank of --train lowrank updates.")
    seq_len: int = option(256, low=16, high=4096, help="Packed row length (tokens).")
    batch_rows: int = option(8, low=1, high=1024, help="Packed rows per micro-batch.")
    accumulate: int = option(1, low=1, high=1024, help="Micro-batches per optimizer step.")
    lr: float = option(1e-3, low=0.0, low_open=True, high=1.0, help="AdamW learning rate after warm-up "
                                                                    "(constant: a reading is a budget).")
    warmup_tokens: int = option(20_000, low=0, help="Linear warm-up (trained positions).")
    dtype: str = option("auto", choices=("auto", "fp32", "bf16"),
                        help="Autocast dtype of the forward (auto: bf16 where the CPU has it).")
    readings: int = option(10, low=2, high=100, help="Held-out readings, log-spaced over the budget.")
    heldout_prompts: int = option(24, low=1, help="Held-out prompts read (their greedy continuations).")
    gamma: int = option(4, low=1, high=16, help="Gamma of the tokens-per-step reading.")
    checkpoint_minutes: float = option(2.0, low=0.0, low_open=True, help="Minutes between checkpoints.")
    stop_after_tokens: int | None = option(None, low=1, cli=False,
                                           help="Stop this call at this many tokens (an interruption).")
    seed: int = option(0, help="Seed of the row order.")

    def validate(self) -> DistillTrainRequest:
        check_options(self)
        if self.finetune_tokens and not self.finetune_domain:
            raise option_error("finetune_domain", "must name a domain when {finetune_tokens} is above 0")
        return self

    def total_tokens(self) -> int:
        return self.tokens + (self.finetune_tokens if self.finetune_domain else 0)


@dataclass(frozen=True)
class DistillTrainResult(Record):
    """A training run: budget, what trained, the readings (the curve of one run) and where the trained
    drafter's delta lies."""

    out: str
    base: str
    target: str
    label: str
    layers: tuple[int, ...]
    head_rows: int
    train: str
    trained_tokens: int
    budget_tokens: int
    train_s: float
    trainable_parameters: int
    readings: tuple[TrainReading, ...]
    delta_file: str
    delta_sha256: str
    kept: str  # "trained" | "untrained (the guard: training lowered held-out agreement)"
    command: str
    resumed_from_tokens: int = 0
    gamma: int = 4  # of the tokens-per-step readings
    host: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.trained_tokens / self.train_s if self.train_s > 0 else 0.0


@dataclass(frozen=True)
class CurvePoint(Record):
    """Held-out tokens per step (and top-1) of a drafter after `tokens` training positions."""

    tokens: int
    tokens_per_step: float
    top1_agreement: float


@dataclass(frozen=True)
class CurveCheck(Record):
    """The fit's prediction at a budget it was not fitted on, against the measurement there."""

    tokens: int
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        """The error on the gain over one token per step, (predicted - 1) / (measured - 1) - 1: near 1.0
        tokens per step an error on tokens per step itself is small whatever the fit does (predicting the
        previous reading would pass)."""
        gain = self.measured - 1.0
        return (self.predicted - 1.0) / gain - 1.0 if gain > 0 else float("inf")


@dataclass(frozen=True)
class TrainingCurve(Record):
    """tokens_per_step(T) = intercept + slope * ln(T) for one drafter shape, fitted on `points` with
    T >= `fitted_from` (the second seed's Figure 4: speedup linear in log training tokens); `check`:
    the fit made without the largest budget, read there. `gamma`: of the readings. `untrained`: tokens
    per step before any training (T = 0 is off the log axis)."""

    label: str
    base: str
    layers: tuple[int, ...]
    head_rows: int
    gamma: int
    points: tuple[CurvePoint, ...]
    intercept: float
    slope: float
    fitted_from: int
    untrained: float
    check: CurveCheck | None = None
    source: str = ""
    finetuned: tuple[CurvePoint, ...] = ()  # readings after the finetune (another recipe: not fitted)
    host: str = ""  # where the run trained (acceptance does not depend on it; its tokens/s does)
    command: str = ""  # the run's command (its data made by `draftnas distill data`)
    delta_sha256: str = ""  # the trained tensors' hash, which a rerun of the command reproduces
    family: str = "cut"  # "cut": `layers` of `base` at full width; "head": a head reading `base`'s `layers`
    ffn: int = 0  # a head's FFN width
    unroll: int = 1  # draft steps trained per position (a head's training-time test; 1 for a cut)

    def predict(self, tokens: float) -> float:
        """Tokens per step after `tokens` training positions (never below the untrained drafter's, never
        above gamma + 1)."""
        import math

        if tokens <= 0:
            return self.untrained
        value = self.intercept + self.slope * math.log(tokens)
        return min(float(self.gamma + 1), max(self.untrained, value))

    def tokens_for(self, tokens_per_step: float) -> float | None:
        """Training positions at which the fit reaches `tokens_per_step` (None: never, slope <= 0 or above
        gamma + 1)."""
        import math

        if tokens_per_step <= self.untrained:
            return 0.0
        if self.slope <= 0 or tokens_per_step > self.gamma + 1:
            return None
        return math.exp((tokens_per_step - self.intercept) / self.slope)

    def measured_max(self) -> int:
        return max(p.tokens for p in self.points)

    def slope_interval(self, level: float = 0.95) -> tuple[float, float] | None:
        """The `level` interval of the slope (tokens per step per e-fold of tokens) from the least-squares
        fit over the points it was fitted on (Student's t, n - 2 degrees of freedom); None with fewer than
        three points."""
        import math

        from scipy.stats import t as student

        fitted = [(math.log(p.tokens), p.tokens_per_step) for p in self.points
                  if p.tokens >= self.fitted_from]
        n = len(fitted)
        if n < 3:
            return None
        mx, my = sum(x for x, _ in fitted) / n, sum(y for _, y in fitted) / n
        sxx = sum((x - mx) ** 2 for x, _ in fitted)
        slope = sum((x - mx) * (y - my) for x, y in fitted) / sxx
        residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in fitted)
        half = float(student.ppf(0.5 + level / 2, n - 2)) * math.sqrt(residual / (n - 2) / sxx)
        return slope - half, slope + half

    @property
    def measurable_slope(self) -> bool:
        """Whether the slope's 95% interval lies above 0 (else no budget can be read off the fit)."""
        interval = self.slope_interval()
        return interval is not None and interval[0] > 0


@dataclass(frozen=True)
class CurveSet(Record):
    """Curves of one pair (target, base), kept with a study: `draftnas search --curves FILE`."""

    target: str
    curves: tuple[TrainingCurve, ...]
    plot: str = ""


@dataclass(frozen=True)
class DistillCurveRequest(Record):
    """`draftnas distill curve`: fit the curves of training runs (their folders) into one file."""

    runs: tuple[str, ...] = option(help="Training folders of `draftnas distill train` or `distill head` "
                                        "(comma-separated).",
                                   argument=True, parse=parse_words, cli_type=str, nonempty=True)
    out: str = option("curves.json", help="Curves file written (JSON; a PNG plot beside it).")
    min_tokens: int = option(10_000, low=1, help="Readings below this budget are left out of the fit "
                                                 "(warm-up).")

    def validate(self) -> DistillCurveRequest:
        check_options(self)
        return self


@dataclass(frozen=True)
class DistillExportRequest(Record):
    """`draftnas distill export`: a trained drafter as a Hugging Face folder (bench, GGUF export)."""

    run: str = option(help="Training folder of `draftnas distill train` or `distill head`.", argument=True)
    out: str = option(help="Folder written (a draftnas drafter folder, or a head's folder).", argument=True)
    gamma: int = option(4, low=1, high=32, help="Draft tokens per step the folder's generation config says.")
    gguf: str | None = option(None,
                              help="Also write OUT/<name>-<type>.gguf for llama.cpp (Q8_0, F16, ...); a "
                                         "reduced head is widened to the full vocabulary with zero rows (a "
                                         "logit of 0: a token the head left out is drafted only where "
                                         "every token it kept scores below 0). A head run's "
                                         "OUT gets OUT/<name>-<type>.gguf, the eagle3 file llama.cpp's "
                                         "draft-eagle3 loads (F32, F16, BF16, Q8_0 or Q4_0; three target "
                                         "layers).")
    force: bool = option(False, help="Replace an existing folder.")

    def validate(self) -> DistillExportRequest:
        check_options(self)
        return self


@dataclass(frozen=True)
class TrainedPrice(Record):
    """A trained shape as the search prices it at a budget (`search.trained`): latency, acceptance from its
    curve, predicted whole-request speed, and the budget at which it overtakes the hand-made best (None:
    not within the search's largest budget, or no measurable slope to read one off)."""

    label: str
    base: str
    layers: tuple[int, ...]
    head_rows: int
    budget_tokens: int
    draft_ms: float
    curve_gamma: int
    tokens_per_step: float
    acceptance_rate: float
    best_gamma: int
    tokens_per_s: float
    speedup: float
    measured_to_tokens: int
    extrapolated: bool
    check_error: float | None
    tokens_to_beat_bar: float | None
    bar_tokens_per_s: float | None
    curve_host: str = ""  # where the shape's curve was measured
    slope_interval: tuple[float, ...] = ()  # the curve's slope, 95% (tokens per step per e-fold of tokens)
    measurable_slope: bool = True  # the interval lies above 0; else no budget is read off the fit
    family: str = "cut"  # of the curve: "cut" or "head"
    flops_per_token: float = 0.0  # to make one trained position and train on it (a head's; 0: not planned)
    plan: str = ""  # a head's commands to make its data and train it to `tokens_to_beat_bar` on a GPU
