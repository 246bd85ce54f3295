"""Training a drafter to a token budget on a self-distillation data set (`draftnas distill train`).

The drafter is cut from a base at full width (`--layers`: the first seed's shallow-wide design; k
layers of the target itself where the base is the target), with a reduced head of the data's most
frequent tokens. It learns KL(target top-k + leftover || drafter) at every taught position
(`losses.kl_to_topk`), on packed rows: the set's sequences, shuffled per epoch by the seed, laid end to
end and cut into rows of `seq_len` tokens; the loss is taken only where a token carries the target's
top-k, so a row's attention may cross a sequence boundary but no prediction is taught across one.

Two phases: pretrain on the whole set to `tokens` trained positions, then finetune on one domain to
`finetune_tokens`. The learning rate is constant after a linear warm-up, so the held-out readings taken
at log-spaced budgets along the run read the curve of acceptance against training tokens. A budget is
honoured exactly (the last micro-batch teaches only what is left). Checkpoints (every
`checkpoint_minutes`, atomic) resume to the same weights; a changed shape, data or option is refused.
The guard: where the last reading's top-1 is below the untrained drafter's, the untrained one is kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import cpu_has_native_bf16, host_line
from draftnas.core.options import option_error
from draftnas.core.records import Progress
from draftnas.drafter.heal.heal import trainable_parameters
from draftnas.drafter.heal.heal_data import HealSequence, pad_id
from draftnas.drafter.heal.losses import kl_to_topk, measure_agreement, selected_logits, topk_to_head
from draftnas.drafter.records import PruningPlan
from draftnas.drafter.training.distill_records import (
    DataManifest,
    DistillTrainRequest,
    DistillTrainResult,
    TrainReading,
)
from draftnas.drafter.training.distill_store import iter_sequences, read_manifest
from draftnas.drafter.training.packing import Stream, build_stream, epoch_rows, row_batch
from draftnas.drafter.training.train_setup import (
    check_request,
    finetune_manifest,
    heldout_sequences,
    run_plan,
)
from draftnas.drafter.training.trained import DELTA_FILE, save_delta

log = logging.getLogger(__name__)
STATE_FILE = "train-state.pt"
RESULT_FILE = "train.json"


def reading_budgets(total: int, n: int, first: int | None = None) -> list[int]:
    """`n` budgets log-spaced from `first` (default: 1,000 tokens, or a hundredth of a smaller budget) to
    `total` (distinct, ascending, the last = total)."""
    first = min(first if first is not None else min(1_000, max(1, total // 100)), total)
    if n <= 1 or first >= total:
        return [total]
    ratio = (total / first) ** (1.0 / (n - 1))
    return sorted({int(round(first * ratio ** i)) for i in range(n - 1)} | {total})


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """A run's state (with its `key`) at `path`, written whole beside it and renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path, key: str) -> dict[str, Any] | None:
    """The state saved at `path` (None where there is none); one line where another run saved it."""
    if not path.is_file():
        return None
    saved: dict[str, Any] = torch.load(path, weights_only=False)
    if saved.get("key") != key:
        raise option_error("out", f"{path.parent} holds a run trained with another shape, data or options: "
                                  "resume with the same ones, or give another folder")
    return saved


@dataclass
class _State:
    tokens: int = 0  # trained positions over both phases
    micro: int = 0  # micro-batches done in the current phase
    train_s: float = 0.0
    readings: list[TrainReading] = field(default_factory=list)
    fine_key: str | None = None  # the finetune's data, once it started


def _state_key(request: DistillTrainRequest, plan: PruningPlan, manifest: DataManifest) -> str:
    opts = request.to_dict()
    for volatile in ("checkpoint_minutes", "stop_after_tokens", "out", "data", "readings", "tokens",
                     "finetune_tokens", "finetune_data"):  # a finetune is keyed when it starts (`fine_key`)
        opts.pop(volatile, None)
    payload = json.dumps([opts, plan.to_dict(), [s.sha256 for s in manifest.shards]], sort_keys=True,
                         default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def fine_key(request: DistillTrainRequest, manifest: DataManifest) -> str:
    """What a finetune reads: its domain and its data's shards."""
    payload = json.dumps([request.finetune_domain, [s.sha256 for s in manifest.shards]])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class _Trainer:
    """One run: the drafter, its optimizer, the two phases' streams and the state that resumes."""

    def __init__(self, request: DistillTrainRequest, drafter: Any, heldout: list[HealSequence], pad: int,
                 folder: Path, key: str, progress: Progress | None) -> None:
        self.request, self.drafter, self.heldout, self.pad = request, drafter, heldout, pad
        self.folder, self.key, self.progress = folder, key, progress
        self.params = trainable_parameters(drafter, request.train)
        self.optimizer = torch.optim.AdamW([p for _, p in self.params], lr=request.lr, betas=(0.9, 0.95),
                                           weight_decay=0.0)
        self.state = _State()
        self.autocast = (request.dtype == "bf16" or (request.dtype == "auto" and cpu_has_native_bf16()))
        self.budgets = reading_budgets(request.total_tokens(), request.readings)
        self._last_save = time.perf_counter()
        self._losses: list[float] = []

    def lr_at(self, tokens: int) -> float:
        warm = self.request.warmup_tokens
        return self.request.lr * (min(1.0, (tokens + 1) / warm) if warm else 1.0)

    def read(self, phase: str) -> None:
        top1, tps, _ = measure_agreement(self.drafter, self.heldout, gamma=self.request.gamma,
                                         pad_id=self.pad)
        loss = sum(self._losses) / len(self._losses) if self._losses else None
        self._losses = []
        self.state.readings.append(TrainReading(tokens=self.state.tokens, phase=phase,
                                                train_s=round(self.state.train_s, 3), loss=loss,
                                                top1_agreement=top1, tokens_per_step=tps))
        log.info("%s at %d tokens: top-1 %.4f, tokens/step %.3f", phase, self.state.tokens, top1, tps)

    def phase(self, name: str, stream: Stream, start: int, end: int) -> bool:
        """Train from `start` to `end` total tokens on `stream`; False where the call was told to stop."""
        req = self.request
        if self.state.tokens <= start:  # the phase starts here (also after a checkpoint at its start)
            self.state.micro = 0
        micro_per_epoch = max(1, ((len(stream.ids) - 1) // req.seq_len) // req.batch_rows)
        epoch, rows = -1, None
        self.drafter.train()
        while self.state.tokens < end:
            if req.stop_after_tokens is not None and self.state.tokens >= req.stop_after_tokens:
                return False
            started = time.perf_counter()
            step_loss = 0.0
            for _ in range(req.accumulate):
                if self.state.micro // micro_per_epoch != epoch:
                    epoch = self.state.micro // micro_per_epoch
                    rows = epoch_rows(stream, req.seq_len, req.seed, epoch)
                assert rows is not None
                i = (self.state.micro % micro_per_epoch) * req.batch_rows
                batch = row_batch(stream, rows[0][i:i + req.batch_rows], rows[1][i:i + req.batch_rows],
                                  end - self.state.tokens)
                n = int(batch.positions.shape[0])
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                    logits = selected_logits(self.drafter, batch)
                loss = kl_to_topk(logits.float(), *topk_to_head(self.drafter, batch))
                (loss / req.accumulate).backward()
                step_loss += float(loss.detach()) / req.accumulate
                self.state.micro += 1
                self.state.tokens += n
                if self.state.tokens >= end:
                    break
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_at(self.state.tokens)
            torch.nn.utils.clip_grad_norm_([p for _, p in self.params], 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.state.train_s += time.perf_counter() - started
            self._losses.append(step_loss)
            self._after_step(name, end)
        return True

    def _after_step(self, phase: str, end: int) -> None:
        done = [r.tokens for r in self.state.readings]
        if any(b <= self.state.tokens and b > max(done, default=-1) for b in self.budgets):
            self.read(phase)
            self.drafter.train()
        if self.progress:
            self.progress(self.state.tokens, self.request.total_tokens())
        if time.perf_counter() - self._last_save >= self.request.checkpoint_minutes * 60.0:
            self.save(phase)

    def save(self, phase: str) -> None:
        s = self.state
        payload = {"key": self.key, "phase": phase, "tokens": s.tokens, "micro": s.micro,
                   "train_s": s.train_s, "fine_key": s.fine_key,
                   "readings": [r.to_dict() for r in s.readings],
                   "params": {n: p.detach().clone() for n, p in self.params},
                   "optimizer": self.optimizer.state_dict()}
        save_checkpoint(self.folder / STATE_FILE, payload)
        self._last_save = time.perf_counter()

    def load(self) -> str | None:
        saved = load_checkpoint(self.folder / STATE_FILE, self.key)
        if saved is None:
            return None
        with torch.no_grad():
            for name, param in self.params:
                param.copy_(saved["params"][name])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.state = _State(saved["tokens"], saved["micro"], saved["train_s"],
                            [TrainReading.from_dict(r) for r in saved["readings"]], saved.get("fine_key"))
        return str(saved["phase"])


def _load_phase_streams(request: DistillTrainRequest, manifest: DataManifest,
                        fine_manifest: DataManifest | None) -> tuple[Stream, Stream | None]:
    pre = build_stream(list(iter_sequences(request.data, manifest)))
    fine = None
    if request.finetune_domain and request.finetune_tokens and fine_manifest is not None:
        folder = request.finetune_data or request.data
        fine = build_stream(list(iter_sequences(folder, fine_manifest, domain=request.finetune_domain)))
    return pre, fine


def train_drafter(request: DistillTrainRequest, drafter: Any, heldout: list[HealSequence], pad: int,
                  manifest: DataManifest, folder: Path, key: str, progress: Progress | None,
                  fine_manifest: DataManifest | None = None) -> tuple[_Trainer, int, bool]:
    """Both phases (resuming where a checkpoint says); (trainer, tokens resumed from, finished). The
    finetune reads `fine_manifest` (default: `manifest`), keyed when it starts: a resumed finetune must
    read the same data."""
    trainer = _Trainer(request, drafter, heldout, pad, folder, key, progress)
    resumed_phase = trainer.load()
    resumed = trainer.state.tokens
    if not trainer.state.readings:
        trainer.read("untrained")
    fine_manifest = fine_manifest or manifest
    pre, fine = _load_phase_streams(request, manifest, fine_manifest)
    if fine is not None:
        key_now = fine_key(request, fine_manifest)
        if trainer.state.fine_key is not None and trainer.state.fine_key != key_now:
            raise option_error("out", f"{folder} finetuned on other data or another domain: a resumed "
                                      "finetune reads the same, or give another folder")
        trainer.state.fine_key = key_now
    finished = True
    if resumed_phase in (None, "pretrain") and trainer.state.tokens < request.tokens:
        finished = trainer.phase("pretrain", pre, 0, request.tokens)
    if finished and fine is not None and trainer.state.readings[-1].tokens < request.tokens:
        trainer.read("pretrain")  # the pretrain's own end: the curve's largest budget
    if finished and fine is not None:
        finished = trainer.phase("finetune", fine, request.tokens, request.total_tokens())
    last = "finetune" if fine is not None and trainer.state.tokens > request.tokens else "pretrain"
    if finished and trainer.state.readings[-1].tokens != trainer.state.tokens:
        trainer.read(last)
    trainer.save(last if finished else ("finetune" if trainer.state.tokens > request.tokens else "pretrain"))
    return trainer, resumed, finished


def reproduce_command(subcommand: str, request: Any) -> str:
    """The `draftnas distill SUBCOMMAND` call that reproduces a run of `request` (its data made by the data
    folder's own calls): every option given a value, DATA first."""
    flags = []
    for name, value in request.to_dict().items():
        if name in ("data", "stop_after_tokens") or value in (None, "", (), []):
            continue
        text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        flags += [f"--{name.replace('_', '-')}", text]
    return shlex.join(["draftnas", "distill", subcommand, request.data, *flags])


def _command(request: DistillTrainRequest) -> str:
    return reproduce_command("train", request)


def train_from_request(request: DistillTrainRequest, *,
                       progress: Progress | None = None) -> DistillTrainResult:
    """Cut, train to the budget (resuming a checkpoint of the same run), guard, keep the delta."""
    from draftnas.drafter.prune.surgery import apply_plan
    from draftnas.models.sources import load_model

    request.validate()
    manifest = read_manifest(request.data)
    if manifest is None:
        raise InvalidInputError(f"{request.data}: no data set here (make one with `draftnas distill data`)")
    base_spec = request.base or manifest.target
    loaded = load_model(base_spec)
    check_request(request, manifest, loaded.model, loaded.tokenizer)
    folder = Path(request.out)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(request.seed)
    plan = run_plan(request, manifest, loaded, folder)
    drafter = apply_plan(loaded.model, plan)
    target = loaded if base_spec == manifest.target else load_model(manifest.target)
    heldout = heldout_sequences(request.data, request.finetune_domain, request.heldout_prompts, target.model,
                                loaded.tokenizer, folder)
    if target is not loaded:
        del target
    pad = pad_id(loaded.tokenizer)
    if request.train == "lowrank":
        from draftnas.drafter.heal.adapters import attach_low_rank

        attach_low_rank(drafter, request.rank, (), request.seed)
    trainer, resumed, finished = train_drafter(request, drafter, heldout, pad, manifest, folder,
                                               _state_key(request, plan, manifest), progress,
                                               finetune_manifest(request, manifest))
    return _finish(request, trainer, plan, base_spec, manifest, folder, resumed, finished)


def _finish(request: DistillTrainRequest, trainer: _Trainer, plan: PruningPlan, base_spec: str,
            manifest: DataManifest, folder: Path, resumed: int, finished: bool) -> DistillTrainResult:
    from draftnas.drafter.heal.adapters import merge_low_rank

    merge_low_rank(trainer.drafter)
    readings = trainer.state.readings
    untrained, last = readings[0], readings[-1]
    names = [n for n, _ in trainer_params_after_merge(trainer, request)]
    kept = "trained"
    if finished and last.top1_agreement < untrained.top1_agreement:
        kept = "untrained (the guard: training lowered held-out top-1)"
        names = []
    sha = save_delta(trainer.drafter, plan, names, folder)
    result = DistillTrainResult(
        out=str(folder), base=base_spec, target=manifest.target, label=plan.label(), layers=plan.layers,
        head_rows=plan.vocab.size if plan.vocab is not None else 0, train=request.train,
        trained_tokens=trainer.state.tokens, budget_tokens=request.total_tokens(),
        train_s=round(trainer.state.train_s, 3),
        trainable_parameters=sum(p.numel() for _, p in trainer.params), readings=tuple(readings),
        delta_file=str(folder / DELTA_FILE), delta_sha256=sha, kept=kept if finished else "interrupted",
        command=_command(request), resumed_from_tokens=resumed, gamma=request.gamma,
        host=host_line())
    (folder / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=1))
    return result


def trainer_params_after_merge(trainer: _Trainer, request: DistillTrainRequest) -> list[tuple[str, Any]]:
    """The drafter's tensors training changed, named as in its state dict (low-rank updates merged into
    their weights)."""
    if request.train != "lowrank":
        return trainer.params
    changed = [(n, p) for n, p in trainer.drafter.named_parameters()
               if (".layers." in n and n.endswith(".weight") and "norm" not in n) or "norm" in n]
    return changed
