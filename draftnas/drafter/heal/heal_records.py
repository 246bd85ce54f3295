"""What healing is asked and what it did (pure records): `HealOptions`, its held-out `HealReading`s and
`HealResult`, and `prompt_key`, the identity by which a drafter's training prompts are left out of its
acceptance estimates.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from draftnas.core.machine import DEVICES
from draftnas.core.options import check_options, option
from draftnas.core.records import Record


@dataclass(frozen=True)
class HealOptions(Record):
    """How to heal. `steps` optimizer steps of `batch_size` sequences (prompt + continuation).

    lr: peak AdamW learning rate after `warmup_steps` (default: 10% of steps), cosine to 0.
    train: "layers" (kept decoder layers + final norm; embedding/LM head frozen), "all", or "lowrank"
    (rank-`rank` adapters over the decoder layers' linear layers, merged at the end; `drafter.adapters`).
    eval_every: steps between held-out readings (0: only before and after).
    heldout_every: every n-th prompt (or trace record) is held out for the readings.
    prompts / prompts_per_domain / max_new_tokens / data_temperature: self-distillation data in
    live mode (the target's continuations; generating them is most of a short run's cost).
    exclude_prompts: ids of prompts kept out of the live data altogether (e.g. the ones an
    acceptance estimate will be made on).
    written_prompts: in live mode, this many more user turns the target writes itself (each opening
    with the first words of a training prompt of the set), answered like the set's prompts and
    added to the training sequences only (chat models; other targets write none).
    teacher_topk: in live mode, keep the target's top-k probabilities at every continuation position
    while generating the data and train on them (the trace teacher's loss) instead of running the
    target at every step; 0 runs it at every step (full-vocabulary KL).
    max_seconds: stop early after this much training wall time (the search's budget).
    checkpoint_every: steps between checkpoints when a checkpoint folder is given.
    device: where the drafter trains; `heal` moves it (and a live teacher) there.
    """

    steps: int = option(150, help="Optimizer steps.", low=1)
    batch_size: int = option(4, help="Sequences per step.", low=1)
    lr: float = option(2e-3, help="Peak AdamW learning rate (cosine schedule).", low=0.0, low_open=True,
                       high=1.0)
    weight_decay: float = option(0.0, help="AdamW weight decay.", low=0.0, cli=False)
    warmup_steps: int | None = option(None, help="Warm-up steps (default: 10% of steps).", low=0, cli=False)
    train: str = option(
        "layers", help="What trains: layers (the kept layers and the final norm), all, or lowrank (a rank "
                       "--rank update on every linear layer of the decoder layers, merged into the weights "
                       "at the end: the healed drafter keeps its shape and kernels).",
        choices=("layers", "all", "lowrank"))
    rank: int = option(8, help="Rank of the low-rank updates (--train lowrank).", low=1, high=1024)
    # train "layers" on these drafter layer positions only (the final norm too): the layers next to a cut,
    # which a search healing within a budget trains (`drafter.plan.cut_neighbours`); () = every kept layer
    only_layers: tuple[int, ...] = option((), help="Drafter layers that train (default: all kept).",
                                          cli=False)
    eval_every: int = option(25, help="Steps between held-out readings (0: ends).", low=0)
    heldout_every: int = option(5, help="Every n-th prompt is held out for the readings.", low=2, cli=False)
    prompts: str = option("all", help="Prompt set for self-distillation data (live).")
    prompts_per_domain: int | None = option(10, flag="--per-domain", help="Prompts per domain for live data.",
                                            low=1)
    exclude_prompts: tuple[str, ...] = option((), help="Prompts kept out of the data.", cli=False)
    max_new_tokens: int = option(96, help="Target continuation length (live).", low=1)
    data_temperature: float = option(0.0, help="Temperature of the live data (0: greedy).", low=0.0,
                                     high=10.0, cli=False)
    written_prompts: int = option(
        0, low=0, help="Live: this many more training prompts the target writes itself, each opening with "
                       "the first words of a training prompt (chat models; export uses 128).")
    teacher_topk: int = option(
        0, low=0, help="Live: keep the target's top-k while making the data and train on it, with no target "
                       "forward per step (export uses 64); 0 runs the target at every step.")
    max_seq_len: int = option(384, help="Longest training sequence (tokens).", low=8, cli=False)
    gamma: int = option(4, help="Gamma of the held-out tokens-per-step reading.", low=1, cli=False)
    seed: int = option(0, help="Seed of the data order (and sampled data).")
    max_seconds: float | None = option(None, flag="--max-minutes", scale=60.0, low=0.0, low_open=True,
                                       help="Stop after this much training (minutes).")
    checkpoint_every: int = option(25, help="Steps between checkpoints.", low=1, cli=False)
    device: str = option("cpu", help="Device the drafter trains on (and a live teacher runs on).",
                         choices=DEVICES)

    def validate(self) -> HealOptions:
        extra = []
        if self.warmup_steps is not None and self.warmup_steps > self.steps:
            extra.append(("warmup_steps", f"must be in [0, steps={self.steps}], got {self.warmup_steps}"))
        return check_options(self, extra)


@dataclass(frozen=True)
class HealReading(Record):
    """A held-out reading: top-1 agreement and greedy tokens per step at `gamma`."""

    step: int
    train_s: float
    loss: float | None
    top1_agreement: float
    tokens_per_step: float


@dataclass(frozen=True)
class HealResult(Record):
    """What a healing run did and how much acceptance it bought."""

    teacher: str  # "live" | "target top-k" (live data, cached teacher) | "traces"
    steps: int
    resumed_from_step: int
    train_s: float
    data_s: float
    top1_before: float
    top1_after: float
    tokens_per_step_before: float
    tokens_per_step_after: float
    gamma: int
    top1_rise_per_minute: float
    n_train_sequences: int
    n_heldout_sequences: int
    n_heldout_positions: int
    trained_tokens: int
    trainable_parameters: int
    readings: tuple[HealReading, ...] = ()
    options: HealOptions = field(default_factory=HealOptions)
    kept: bool = True  # False: healing lowered held-out top-1, so the export kept the unhealed weights
    trained_prompts: tuple[str, ...] = ()  # `prompt_key` of every prompt the drafter was trained on
    n_written_sequences: int = 0  # of n_train_sequences, those whose prompt the target wrote itself


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """A prompt's identity by its token ids (sha256, 12 hex digits): what healing records of the
    prompts it trained on, so an acceptance estimate can leave them out wherever its text came from."""
    return hashlib.sha256(json.dumps([int(i) for i in prompt_ids]).encode()).hexdigest()[:12]
