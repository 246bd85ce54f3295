"""`draftnas distill head`: what a head's training is asked and what it gives (torch-free records)."""

from __future__ import annotations

from dataclasses import dataclass

from draftnas.core.options import check_options, option
from draftnas.core.records import Record
from draftnas.drafter.head.shape import HeadShape
from draftnas.drafter.training.distill_records import TrainReading

#: the head folder inside a training folder (what vLLM serves, `head:RUN/head`)
HEAD_DIR = "head"
#: the training folder's result (`HeadTrainResult`)
RESULT_FILE = "head.json"


def _layers(text: object) -> tuple[int, ...]:
    if isinstance(text, tuple | list):
        return tuple(int(t) for t in text)
    return tuple(int(t) for t in str(text).split(",") if t.strip())


@dataclass(frozen=True)
class HeadTrainRequest(Record):
    """Train a head on the target's hidden states over a self-distillation set, to a token budget."""

    data: str = option(help="Data folder made by `draftnas distill data` (its target is the head's).",
                       argument=True)
    out: str = option(help="Training folder: checkpoints, readings, and the head folder (head/) vLLM serves.",
                      flag="--out")
    layers: tuple[int, ...] = option((), parse=_layers, cli_type=str, cli_default="",
                                     help="Target layers the head reads, ascending (e.g. 2,14,25; default: "
                                          "vLLM's 2, L/2, L-3 of an L-layer target).")
    draft_vocab: int = option(32768, low=1, help="Rows of the draft vocabulary: the data's most frequent "
                                                 "tokens plus special tokens (at most the target's).")
    ffn: int = option(0, low=0, help="FFN width of the head's layer (0: the target's).")
    tokens: int = option(200_000, low=1, help="Budget: trained positions.")
    unroll: int = option(3, low=1, high=8, help="Draft steps unrolled in training (each reads the step "
                                                "before's output, as at inference).")
    features: str = option("compute", choices=("compute", "store"),
                           help="Where the target's hidden states come from: compute (the target reads each "
                                "step's packed rows) or store (it reads each sequence alone once; kept in "
                                "memory in fp16, layers x width x 2 bytes a token, 9.2 KB for the 1.5B's "
                                "three layers): store pays when the budget passes over the data more than "
                                "once, and each sequence's states are then those inference sees.")
    seq_len: int = option(256, low=16, high=4096, help="Packed row length (tokens).")
    batch_rows: int = option(4, low=1, high=1024, help="Packed rows per optimizer step.")
    lr: float = option(1e-3, low=0.0, low_open=True, high=1.0, help="AdamW learning rate after warm-up "
                                                                    "(constant: a reading is a budget).")
    warmup_tokens: int = option(10_000, low=0, help="Linear warm-up (trained positions).")
    readings: int = option(6, low=2, high=100, help="Held-out readings, log-spaced over the budget.")
    heldout_prompts: int = option(16, low=1, help="Held-out prompts read (their greedy continuations).")
    gamma: int = option(4, low=1, high=16, help="Gamma of the tokens-per-step reading.")
    checkpoint_minutes: float = option(2.0, low=0.0, low_open=True, help="Minutes between checkpoints.")
    stop_after_tokens: int | None = option(None, low=1, cli=False,
                                           help="Stop this call at this many tokens (an interruption).")
    seed: int = option(0, help="Seed of the row order and the head's initial weights.")
    device: str = option("cpu", choices=("cpu", "cuda"),
                         help="Where the target and the head run (fp32 on either; the data and a stored "
                              "feature set stay in host memory, each step's rows copied over).")

    def validate(self) -> HeadTrainRequest:
        return check_options(self)


@dataclass(frozen=True)
class HeadTrainResult(Record):
    """A head's training: its shape's label, the budget, the readings (exact greedy acceptance of held-out
    continuations at each budget) and the head folder."""

    out: str
    head: str  # the head folder vLLM serves
    target: str
    label: str
    parameters: int
    trained_tokens: int
    budget_tokens: int
    train_s: float
    features_s: float  # of train_s: the target's forwards that gave the hidden states
    readings: tuple[TrainReading, ...]
    kept: str
    command: str
    resumed_from_tokens: int = 0
    gamma: int = 4
    host: str = ""
    shape: HeadShape | None = None  # None in results written before it was kept (its folder has it)
    unroll: int = 3  # draft steps unrolled in training (3 in results written before it was kept)

    @property
    def tokens_per_s(self) -> float:
        return self.trained_tokens / self.train_s if self.train_s > 0 else 0.0
