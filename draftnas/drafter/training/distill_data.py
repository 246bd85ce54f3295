"""Making self-distillation data at scale (`draftnas distill data`): work units taken in rounds until a
budget of minutes or trained positions, each unit one shard (`distill_store`), resumable and appendable.

Units, in the order a call takes them:
- `set:T:i`: the i-th batch of the shipped prompt sets' training prompts (every `heldout_every`-th prompt
  of each domain is held out: the bench's), answered by the target at temperature T; first, all of them;
- then rounds r = 0, 1, ...: `written:D:k` (a batch of user turns the target writes itself, opening like
  domain D's training prompts, answered at the round's temperature; round r takes the next domain of
  `written_domains`, k counts that domain's batches), `text:r` (the r-th batch of windows of
  text found on this machine, teacher-forced: one forward gives the target's top-k at every position),
  `open:r` (openings of such files, continued by the target at the round's temperature).

Text found on the machine: the Python sources and the package descriptions (METADATA) under this
interpreter's library folders: code for a code target, prose for a chat one; none of it is shipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from draftnas.acceptance.records import held_out
from draftnas.acceptance.traces import eos_token_ids, tokenizer_fingerprint
from draftnas.acceptance.tracing import decode_batch
from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import cpu_has_native_bf16, host_line, require_device
from draftnas.core.options import option_error
from draftnas.core.prompts import DOMAINS, Prompt, encode_prompt, load_prompts, uses_chat_template
from draftnas.core.records import Progress
from draftnas.drafter.heal.heal_data import written_prompts
from draftnas.drafter.training.distill_records import (
    DATA_FORMAT,
    HELDOUT_PROMPTS,
    DataManifest,
    DistillDataRequest,
    DistillDataResult,
)
from draftnas.drafter.training.distill_store import DistillSequence, append_shard, read_manifest

log = logging.getLogger(__name__)

#: text files taken from this machine: sizes outside this range are skipped (stubs, generated tables)
TEXT_BYTES = (1_000, 200_000)
#: tokens of a file's opening that the target continues (`open` units)
OPENING_TOKENS = 64
MIN_WINDOW = 32
#: windows of a `text` unit, per row of --batch-size: teacher forcing is the cheap kind, so a round takes
#: more of it than of the generated kinds
TEXT_ROWS_FACTOR = 4


def data_dtype(choice: str, device: str = "cpu") -> str:
    """The target's dtype for making data: bf16 on CUDA and where the CPU multiplies it natively (auto)."""
    if choice != "auto":
        return choice
    return "bf16" if device == "cuda" or cpu_has_native_bf16() else "fp32"


def split_prompts(prompts: Sequence[Prompt], every: int) -> tuple[list[Prompt], list[Prompt]]:
    """(training, held out): every `every`-th prompt of each domain is held out (the one split rule)."""
    seen: dict[str, int] = {}
    train: list[Prompt] = []
    held: list[Prompt] = []
    for p in prompts:
        i = seen.get(p.domain, 0)
        seen[p.domain] = i + 1
        (held if held_out(i, every) else train).append(p)
    return train, held


def machine_text_files(seed: int) -> list[Path]:
    """Python sources and package descriptions under this interpreter's library folders, within
    TEXT_BYTES, in an order shuffled by `seed` (the same on every call)."""
    roots = {Path(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]) if p}
    found: set[Path] = set()
    for root in roots:
        for pattern in ("**/*.py", "**/METADATA"):
            for path in root.glob(pattern):
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                if TEXT_BYTES[0] <= size <= TEXT_BYTES[1] and "test" not in path.parts:
                    found.add(path)
    key = (lambda p: hashlib.sha256(f"{seed}:{p}".encode()).hexdigest())  # noqa: E731
    return sorted(found, key=key)


def file_domain(path: Path) -> str:
    return "code" if path.suffix == ".py" else "docs"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="ignore")
    except OSError:
        return ""


def text_windows(tokenizer: Any, files: Sequence[Path], window: int) -> Iterator[tuple[list[int], str]]:
    """(window ids, domain) over `files` in order: each file's tokens cut into `window`-token pieces
    (a last piece shorter than MIN_WINDOW dropped)."""
    for path in files:
        ids = tokenizer(_read_text(path), add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids), window):
            piece = ids[start:start + window]
            if len(piece) >= MIN_WINDOW:
                yield [int(t) for t in piece], file_domain(path)


def teacher_forced(model: Any, windows: Sequence[list[int]], top_k: int, rows: int = 4
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The target's top-k (ids, probs) [L - 1, K] at positions 1..L-1 of each window, `rows` windows a
    forward (right padded; padding changes no earlier position)."""
    device = next(model.parameters()).device
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    with torch.inference_mode():
        for start in range(0, len(windows), rows):
            chunk = windows[start:start + rows]
            width = max(len(w) for w in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for r, w in enumerate(chunk):
                ids[r, :len(w)] = torch.tensor(w)
                mask[r, :len(w)] = 1
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # [R, L, V]
            for r, w in enumerate(chunk):
                probs = torch.softmax(logits[r, :len(w) - 1].float(), dim=-1)
                vals, top = probs.topk(top_k, dim=-1)
                out.append((top.cpu(), vals.cpu()))
    return out


class _Maker:
    """One `distill data` call: the target, its prompts and files, and the manifest as it grows."""

    def __init__(self, request: DistillDataRequest, loaded: Any, manifest: DataManifest, folder: Path,
                 train_prompts: list[Prompt]) -> None:
        self.request, self.model, self.tokenizer = request, loaded.model, loaded.tokenizer
        self.manifest, self.folder, self.train_prompts = manifest, folder, train_prompts
        self.eos = eos_token_ids(self.model, self.tokenizer)
        self._files: list[Path] | None = None
        self._windows: Iterator[tuple[list[int], str]] | None = None
        self._window_at = 0  # windows of the stream already passed
        self.text_done = False
        have = sorted({p.domain for p in train_prompts})
        self.written_domains = [d for d in (request.written_domains or have) if d in have]

    @property
    def files(self) -> list[Path]:
        if self._files is None:
            self._files = machine_text_files(self.request.seed)
            log.info("text found on this machine: %d files", len(self._files))
        return self._files

    def temperature(self, r: int) -> float:
        temps = self.request.temperatures
        return temps[r % len(temps)]

    def units(self) -> Iterator[tuple[str, str, Callable[[], list[DistillSequence]]]]:
        """(unit, kind, make) in the call's order; `make` builds the unit's sequences."""
        req, batch = self.request, self.request.batch_size
        if "set" in req.sources:
            for t in req.temperatures:
                for i in range(0, len(self.train_prompts), batch):
                    chunk = self.train_prompts[i:i + batch]
                    yield f"set:{t:g}:{i // batch}", "generated", (
                        lambda c=chunk, tt=t, k=i: self.answer(c, tt, k))  # type: ignore[misc]
        r = 0
        while True:
            any_left = False
            if "written" in req.sources and uses_chat_template(self.tokenizer) and self.written_domains:
                any_left = True
                domain = self.written_domains[r % len(self.written_domains)]
                k = r // len(self.written_domains)
                yield (f"written:{domain}:{k}", "generated",
                       lambda d=domain, kk=k, rr=r: self.written(d, kk, rr))  # type: ignore[misc]
            if "text" in req.sources and not self.text_done:
                any_left = True
                yield f"text:{r}", "teacher-forced", (lambda rr=r: self.text(rr))  # type: ignore[misc]
            if "open" in req.sources and r * batch < len(self.files):
                any_left = True
                yield f"open:{r}", "generated", (lambda rr=r: self.openings(rr))  # type: ignore[misc]
            if not any_left:
                return
            r += 1

    def _decode(self, encoded: Sequence[list[int]], temperature: float, seed: int,
                domains: Sequence[str]) -> list[DistillSequence]:
        gens = [torch.Generator().manual_seed(self.request.seed * 1_000_003 + seed * 1_009 + j)
                for j in range(len(encoded))]
        decoded = decode_batch(self.model, encoded, temperature=temperature,
                               max_new_tokens=self.request.max_new_tokens, top_k=self.request.top_k,
                               eos_ids=self.eos, generators=gens)
        return [DistillSequence(list(ids) + d.continuation, len(ids), dom, d.topk_ids, d.topk_probs)
                for ids, d, dom in zip(encoded, decoded, domains, strict=True) if d.continuation]

    def answer(self, prompts: Sequence[Prompt], temperature: float, k: int) -> list[DistillSequence]:
        encoded = [encode_prompt(self.tokenizer, p.text) for p in prompts]
        return self._decode(encoded, temperature, k, [p.domain for p in prompts])

    def written(self, domain: str, k: int, r: int) -> list[DistillSequence]:
        """Batch k of user turns written like `domain`'s training prompts, answered at round r's
        temperature; seeded by (domain, k), so a unit is the same whichever domains a call rotates."""
        pool = [p.text for p in self.train_prompts if p.domain == domain]
        start = k * self.request.batch_size
        openings = [pool[(start + j) % len(pool)] for j in range(self.request.batch_size)]
        unit_seed = int(hashlib.sha256(f"{domain}:{k}".encode()).hexdigest()[:8], 16)
        texts = written_prompts(self.model, self.tokenizer, openings, len(openings),
                                seed=self.request.seed * 10_007 + unit_seed)
        encoded = [encode_prompt(self.tokenizer, t) for t in texts]
        if not encoded:
            return []
        return self._decode(encoded, self.temperature(k), 50_000 + unit_seed, [domain] * len(encoded))

    def text(self, r: int) -> list[DistillSequence]:
        batch = self.request.batch_size * TEXT_ROWS_FACTOR
        if self._windows is None:  # one stream over the files: units come in order, each window read once
            self._windows = text_windows(self.tokenizer, self.files, self.request.window_tokens)
        windows: list[tuple[list[int], str]] = []
        for item in self._windows:
            self._window_at += 1
            if self._window_at > r * batch:
                windows.append(item)
            if self._window_at >= (r + 1) * batch:
                break
        if len(windows) < batch:
            self.text_done = True
        if not windows:
            return []
        tops = teacher_forced(self.model, [w for w, _ in windows], self.request.top_k)
        return [DistillSequence(w, 1, dom, ids, probs) for (w, dom), (ids, probs) in zip(windows, tops,
                                                                                         strict=True)]

    def openings(self, r: int) -> list[DistillSequence]:
        batch = self.request.batch_size
        chosen = self.files[r * batch:(r + 1) * batch]
        encoded, domains = [], []
        for path in chosen:
            ids = self.tokenizer(_read_text(path), add_special_tokens=False)["input_ids"][:OPENING_TOKENS]
            if len(ids) >= MIN_WINDOW:
                encoded.append([int(t) for t in ids])
                domains.append(file_domain(path))
        return self._decode(encoded, self.temperature(r), 90_000 + r, domains) if encoded else []


def _open_manifest(request: DistillDataRequest, folder: Path, tokenizer: Any, vocab_size: int,
                   dtype: str, heldout: Sequence[Prompt]) -> DataManifest:
    fresh = DataManifest(format=DATA_FORMAT, target=request.target, vocab_size=vocab_size,
                         tokenizer_fingerprint=tokenizer_fingerprint(tokenizer), top_k=request.top_k,
                         dtype=dtype, heldout_every=request.heldout_every,
                         heldout_prompts=tuple(p.id for p in heldout), batch_size=request.batch_size,
                         max_new_tokens=request.max_new_tokens, window_tokens=request.window_tokens)
    existing = read_manifest(folder)
    if existing is None:
        return fresh
    for name in ("tokenizer_fingerprint", "vocab_size", "top_k", "heldout_every", "batch_size",
                 "max_new_tokens", "window_tokens"):
        if getattr(existing, name) != getattr(fresh, name):
            raise InvalidInputError(
                f"{folder} holds data of {existing.target} with {name} {getattr(existing, name)}; this call "
                f"makes {getattr(fresh, name)} (target {request.target}): use another folder")
    return existing


def check_data_folder(request: DistillDataRequest, vocab_size: int, fingerprint: str) -> None:
    """Before the target loads: an existing folder of another tokenizer or top-k is refused."""
    existing = read_manifest(request.out)
    if existing is not None and (existing.vocab_size != vocab_size or existing.top_k != request.top_k
                                 or (fingerprint and existing.tokenizer_fingerprint != fingerprint)):
        raise InvalidInputError(f"{request.out} holds data of {existing.target} (vocabulary "
                                f"{existing.vocab_size}, top-{existing.top_k}); it cannot take "
                                f"{request.target}'s top-{request.top_k}: use another folder")


def make_distill_data(request: DistillDataRequest, *, progress: Progress | None = None) -> DistillDataResult:
    """Make or extend the data set in `request.out` until `minutes` pass, the set holds `tokens`
    positions, or every unit is done; resumes after the units the manifest names."""
    from draftnas.models.records import TORCH_DTYPES
    from draftnas.models.sources import load_model

    request.validate()
    if request.minutes is None and request.tokens is None:
        raise option_error("minutes", "and {tokens} are both unset: give a budget (one or both)")
    folder = Path(request.out)
    read_manifest(folder)  # a damaged manifest is said before the target loads
    require_device(request.device)
    dtype = data_dtype(request.dtype, request.device)
    loaded = load_model(request.target, dtype=TORCH_DTYPES[dtype], device=request.device)
    prompts = load_prompts(",".join(DOMAINS))
    train, held = split_prompts(prompts, request.heldout_every)
    vocab = int(loaded.model.get_input_embeddings().weight.shape[0])
    folder.mkdir(parents=True, exist_ok=True)
    manifest = _open_manifest(request, folder, loaded.tokenizer, vocab, dtype, held)
    (folder / HELDOUT_PROMPTS).write_text("".join(json.dumps(p.to_dict()) + "\n" for p in held))
    maker = _Maker(request, loaded, manifest, folder, train)
    return _run_units(request, maker, progress)


def _run_units(request: DistillDataRequest, maker: _Maker, progress: Progress | None) -> DistillDataResult:
    started = time.perf_counter()
    budget_s = request.minutes * 60.0 if request.minutes else None
    before = maker.manifest.positions()
    done = maker.manifest.done_units()
    added_seqs, stopped = 0, "exhausted"
    for unit, kind, make in maker.units():
        elapsed = time.perf_counter() - started
        if budget_s is not None and elapsed >= budget_s:
            stopped = "minutes"
            break
        if request.tokens is not None and maker.manifest.positions() >= request.tokens:
            stopped = "tokens"
            break
        if unit in done:
            continue
        seqs = make()
        if not seqs and kind == "teacher-forced":  # the machine's text ran out
            continue
        maker.manifest = append_shard(maker.folder, replace(maker.manifest, wall_s=maker.manifest.wall_s
                                      + time.perf_counter() - started - elapsed), unit, kind, seqs)
        added_seqs += len(seqs)
        _report(request, maker.manifest, before, time.perf_counter() - started, progress, unit)
    from draftnas.drafter.training.distill_store import write_manifest

    write_manifest(maker.folder, maker.manifest)
    m = maker.manifest
    kinds = {k: m.positions(kind=k) for k in sorted({s.kind for s in m.shards})}
    domains = sorted({d for s in m.shards for d in s.domains})
    return DistillDataResult(
        out=request.out, target=request.target, added_positions=m.positions() - before,
        added_sequences=added_seqs, wall_s=round(time.perf_counter() - started, 3),
        positions_per_kind=kinds, positions_per_domain={d: m.positions(domain=d) for d in domains},
        total_positions=m.positions(), units_done=len(m.shards), stopped_by=stopped,
        host=host_line())


def _report(request: DistillDataRequest, manifest: DataManifest, before: int, elapsed: float,
            progress: Progress | None, unit: str) -> None:
    added = manifest.positions() - before
    rate = added / elapsed if elapsed > 0 else 0.0
    log.info("%s: set holds %d positions (+%d in %.0f s, %.0f positions/s)", unit, manifest.positions(),
             added, elapsed, rate)
    if progress is None:
        return
    if request.tokens is not None:
        progress(min(manifest.positions(), request.tokens), request.tokens)
    else:
        total = int(request.minutes * 60.0) if request.minutes else 1
        progress(min(int(elapsed), total), total)
    sys.stdout.flush()
