"""Target traces: the target's continuations of a prompt set, with its top-k next-token probabilities.

The target runs once per prompt and temperature; every candidate drafter is then
scored against the cached traces (`draftnas.acceptance`) and can be healed on them
(`draftnas.distill`) without loading the target again.

File format: one safetensors file. Tensors (all records concatenated, in record order):

- ``prompt_ids`` int32 [sum P], ``prompt_offsets`` int64 [N+1]
- ``continuation_ids`` int32 [sum C], ``continuation_offsets`` int64 [N+1]
- ``topk_ids`` int32 [sum C, K] and ``topk_probs`` float16 [sum C, K]: the target's
  K most likely next tokens at each continuation position (the distribution the
  token at that position was drawn from), and ``leftover`` float32 [sum C] = 1 -
  the sum of those K probabilities.

The header's metadata holds ``draftnas_traces`` (`TraceMetadata` JSON) and
``records`` (a `TraceRecordInfo` JSON list). For a greedy record (temperature 0)
the stored probabilities are the temperature-1 softmax (useful for distillation);
for a sampled record they are the temperature-T softmax the token was sampled from.

An interrupted `build_traces` keeps finished shards in ``<out>.partial/`` and
resumes from them when run again with the same target, prompts and options.

Size: the trace file format (records, metadata, atomic save and load, resumable builds) and the
target decoding that fills it; format and builder change together.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftnas.errors import InvalidInputError, TraceError
from draftnas.prompts import Prompt, encode_prompt, prompt_set_hash, uses_chat_template
from draftnas.provenance import package_versions
from draftnas.record import Record

if TYPE_CHECKING:
    import torch

    from draftnas.sources import LoadedModel

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class TraceOptions(Record):
    """How traces are generated.

    batch_size: prompts decoded together (left padded); 1 decodes each prompt alone.
    shard_size: records per checkpoint shard (what an interruption can lose at most).
    """

    max_new_tokens: int = 128
    temperatures: tuple[float, ...] = (0.0,)
    top_k: int = 20
    seed: int = 0
    batch_size: int = 8
    shard_size: int = 8

    def validate(self) -> None:
        problems = []
        if not 1 <= self.max_new_tokens <= 8192:
            problems.append(f"max_new_tokens must be in [1, 8192], got {self.max_new_tokens}")
        if not self.temperatures:
            problems.append("temperatures must name at least one value (0 = greedy)")
        bad = [t for t in self.temperatures if not 0.0 <= t <= 10.0]
        if bad:
            problems.append(f"temperatures must be in [0, 10], got {bad}")
        if len(set(self.temperatures)) != len(self.temperatures):
            problems.append(f"temperatures repeat a value: {list(self.temperatures)}")
        if not 1 <= self.top_k <= 1024:
            problems.append(f"top_k must be in [1, 1024], got {self.top_k}")
        if not 1 <= self.batch_size <= 256:
            problems.append(f"batch_size must be in [1, 256], got {self.batch_size}")
        if not 1 <= self.shard_size <= 100_000:
            problems.append(f"shard_size must be in [1, 100000], got {self.shard_size}")
        if problems:
            raise InvalidInputError("; ".join(problems))


@dataclass(frozen=True)
class TraceMetadata(Record):
    """Identity of a trace file: which target, tokenizer, prompts and options produced it."""

    schema_version: int
    target: str
    target_kind: str
    model_type: str
    num_hidden_layers: int
    vocab_size: int
    tokenizer_fingerprint: str
    chat_template: bool
    prompt_set: str
    prompt_set_hash: str
    n_prompts: int
    temperatures: tuple[float, ...]
    seed: int
    top_k: int
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    n_records: int = 0
    n_tokens: int = 0
    wall_s: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TraceRecordInfo(Record):
    """Per record (one prompt at one temperature) bookkeeping."""

    prompt_id: str
    domain: str
    language: str
    temperature: float
    prompt_len: int
    continuation_len: int
    ended_with_eos: bool


@dataclass
class TraceRecord:
    """One prompt's trace at one temperature (tensors are views into the loaded file).

    prompt_ids [P] and continuation_ids [C] int64; topk_ids [C, K] int64;
    topk_probs [C, K] float32; leftover [C] float32 (probability mass outside the top K).
    """

    info: TraceRecordInfo
    prompt_ids: torch.Tensor
    continuation_ids: torch.Tensor
    topk_ids: torch.Tensor
    topk_probs: torch.Tensor
    leftover: torch.Tensor

    @property
    def input_ids(self) -> torch.Tensor:
        """Prompt followed by the continuation, [P + C] (what a drafter is teacher-forced on)."""
        import torch

        return torch.cat([self.prompt_ids, self.continuation_ids])


@dataclass
class Traces:
    """Loaded traces: metadata plus records, filterable by temperature and domain."""

    metadata: TraceMetadata
    records: list[TraceRecord]

    def __len__(self) -> int:
        return len(self.records)

    @property
    def temperatures(self) -> tuple[float, ...]:
        return tuple(sorted({r.info.temperature for r in self.records}))

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.info.domain for r in self.records))

    @property
    def n_tokens(self) -> int:
        return sum(r.info.continuation_len for r in self.records)

    def select(self, *, temperature: float | None = None, domains: Sequence[str] | None = None) -> Traces:
        """The records at one temperature and/or in the given domains (TraceError when none are)."""
        records = self.records
        if temperature is not None:
            records = [r for r in records if abs(r.info.temperature - temperature) < 1e-6]
            if not records:
                raise TraceError(
                    f"traces hold no records at temperature {temperature:g}; they have "
                    f"{', '.join(f'{t:g}' for t in self.temperatures)} (rebuild with --temperature)"
                )
        if domains is not None:
            records = [r for r in records if r.info.domain in set(domains)]
            if not records:
                raise TraceError(f"traces hold no records in domains {list(domains)}; they have "
                                 f"{', '.join(self.domains)}")
        return Traces(metadata=self.metadata, records=records)

    def save(self, path: str | Path) -> Path:
        """Write to one safetensors file (atomically: a temporary file renamed into place)."""
        return _save(self.metadata, self.records, Path(path))


# ---------------------------------------------------------------- the held-out split

#: every n-th trace record is held out for acceptance estimates (search, e2e, export's readings)
HELD_OUT_EVERY = 3


def held_out(index: int, every: int = HELD_OUT_EVERY) -> bool:
    """Whether item `index` of a sequence of records or prompts is held out: every `every`-th,
    counting from the first. The one split rule: the search's acceptance estimate, e2e's
    baselines and healing's own held-out readings (with their `heldout_every`) all use it."""
    return index % every == 0


def split_traces(traces: Traces, every: int = HELD_OUT_EVERY) -> tuple[Traces, Traces]:
    """(held out, the rest) of `traces` by `held_out`; the rest is the held-out part when nothing
    else is left (a single record)."""
    held = [r for i, r in enumerate(traces.records) if held_out(i, every)]
    rest = [r for i, r in enumerate(traces.records) if not held_out(i, every)]
    return (Traces(metadata=traces.metadata, records=held),
            Traces(metadata=traces.metadata, records=rest or held))


# ---------------------------------------------------------------- identity


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 (first 16 hex digits) of the tokenizer's vocabulary (token -> id), order-free."""
    vocab = tokenizer.get_vocab()
    payload = json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def eos_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """End-of-sequence ids from the generation config, else the tokenizer."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]))


def model_vocab_size(model: Any) -> int:
    """Rows of the input embedding (the ids a model can read)."""
    return int(model.get_input_embeddings().weight.shape[0])


def make_metadata(loaded: LoadedModel, prompts: Sequence[Prompt], options: TraceOptions,
                  prompt_set: str) -> TraceMetadata:
    model, tokenizer = loaded.model, loaded.tokenizer
    return TraceMetadata(
        schema_version=SCHEMA_VERSION,
        target=loaded.source.spec,
        target_kind=loaded.source.kind,
        model_type=str(getattr(model.config, "model_type", "unknown")),
        num_hidden_layers=int(getattr(model.config, "num_hidden_layers", 0)),
        vocab_size=model_vocab_size(model),
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        chat_template=uses_chat_template(tokenizer),
        prompt_set=prompt_set,
        prompt_set_hash=prompt_set_hash(list(prompts)),
        n_prompts=len(prompts),
        temperatures=tuple(float(t) for t in options.temperatures),
        seed=options.seed,
        top_k=options.top_k,
        max_new_tokens=options.max_new_tokens,
        eos_token_ids=eos_token_ids(model, tokenizer),
        versions=package_versions(),
    )


# ---------------------------------------------------------------- decoding


@dataclass
class _Decoded:
    continuation: list[int]
    topk_ids: torch.Tensor  # [C, K]
    topk_probs: torch.Tensor  # [C, K]
    leftover: torch.Tensor  # [C]
    ended_with_eos: bool


def _next_token_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Distribution a token is drawn from: softmax(logits / T); greedy records keep T = 1."""
    import torch

    scale = temperature if temperature > 0 else 1.0
    return torch.softmax(logits.float() / scale, dim=-1)


def decode_batch(
    model: Any,
    prompts_ids: Sequence[Sequence[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    top_k: int,
    eos_ids: Sequence[int],
    generators: Sequence[torch.Generator] | None = None,
) -> list[_Decoded]:
    """Decode a batch of prompts with a KV cache (left padded), keeping top-k probabilities.

    Greedy when temperature is 0, else ancestral sampling from softmax(logits / T),
    each row with its own generator so a prompt's sample does not depend on its batch.
    """
    import torch
    from transformers import DynamicCache

    batch = len(prompts_ids)
    width = max(len(p) for p in prompts_ids)
    input_ids = torch.zeros(batch, width, dtype=torch.long)
    attention = torch.zeros(batch, width, dtype=torch.long)
    for row, prompt in enumerate(prompts_ids):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention[row, width - len(prompt):] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    eos = torch.tensor(list(eos_ids) or [-1])
    done = torch.zeros(batch, dtype=torch.bool)
    tokens: list[torch.Tensor] = []
    top_ids: list[torch.Tensor] = []
    top_probs: list[torch.Tensor] = []
    lengths = torch.zeros(batch, dtype=torch.long)
    with torch.inference_mode():
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        for _ in range(max_new_tokens):
            probs = _next_token_probs(out.logits[:, -1, :], temperature)  # [B, V]
            if temperature > 0:
                gens = list(generators) if generators else [None] * batch
                nxt = torch.cat([torch.multinomial(probs[r], 1, generator=gens[r]) for r in range(batch)])
            else:
                nxt = probs.argmax(-1)
            vals, ids = probs.topk(top_k, dim=-1)
            tokens.append(nxt)
            top_ids.append(ids)
            top_probs.append(vals)
            lengths += (~done).long()
            done = done | torch.isin(nxt, eos)
            if bool(done.all()):
                break
            attention = torch.cat([attention, torch.ones(batch, 1, dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(input_ids=nxt[:, None], attention_mask=attention, position_ids=positions,
                        past_key_values=cache, use_cache=True)
    all_tokens = torch.stack(tokens, 1)  # [B, T]
    all_ids, all_probs = torch.stack(top_ids, 1), torch.stack(top_probs, 1)  # [B, T, K]
    results = []
    for row in range(batch):
        n = int(lengths[row])
        probs_row = all_probs[row, :n]
        cont = all_tokens[row, :n].tolist()
        results.append(_Decoded(
            continuation=cont, topk_ids=all_ids[row, :n], topk_probs=probs_row,
            leftover=(1.0 - probs_row.sum(-1)).clamp(min=0.0),
            ended_with_eos=bool(cont) and cont[-1] in set(eos_ids),
        ))
    return results


def teacher_forced_topk(
    model: Any, prompt_ids: Sequence[int], continuation: Sequence[int], *, temperature: float, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k target probabilities at each continuation position from one forward pass.

    Returns (topk_ids [C, K], topk_probs [C, K], leftover [C]). Used to make traces from
    continuations produced elsewhere (e.g. the plain-decoding runs of `draftnas bench`).
    """
    import torch

    ids = torch.tensor([list(prompt_ids) + list(continuation)], device=next(model.parameters()).device)
    n = len(continuation)
    with torch.inference_mode():
        logits = model(input_ids=ids, logits_to_keep=n + 1).logits[0, :n].float().cpu()  # [C, V]
    probs = _next_token_probs(logits, temperature)
    vals, top = probs.topk(top_k, dim=-1)
    return top, vals, (1.0 - vals.sum(-1)).clamp(min=0.0)


def _record(prompt: Prompt, temperature: float, prompt_ids: Sequence[int], decoded: _Decoded) -> TraceRecord:
    import torch

    info = TraceRecordInfo(
        prompt_id=prompt.id, domain=prompt.domain, language=prompt.language,
        temperature=float(temperature), prompt_len=len(prompt_ids),
        continuation_len=len(decoded.continuation), ended_with_eos=decoded.ended_with_eos,
    )
    return TraceRecord(
        info=info,
        prompt_ids=torch.tensor(list(prompt_ids), dtype=torch.long),
        continuation_ids=torch.tensor(decoded.continuation, dtype=torch.long),
        topk_ids=decoded.topk_ids.long(), topk_probs=decoded.topk_probs.float(),
        leftover=decoded.leftover.float(),
    )


def record_from_continuation(model: Any, prompt: Prompt, prompt_ids: Sequence[int],
                             continuation: Sequence[int], *, temperature: float, top_k: int,
                             eos_ids: Sequence[int]) -> TraceRecord:
    """A trace record for a continuation the target produced elsewhere (one teacher-forced pass)."""
    top, vals, left = teacher_forced_topk(model, prompt_ids, continuation, temperature=temperature,
                                          top_k=top_k)
    cont = list(continuation)
    decoded = _Decoded(cont, top, vals, left, ended_with_eos=bool(cont) and cont[-1] in set(eos_ids))
    return _record(prompt, temperature, prompt_ids, decoded)


# ---------------------------------------------------------------- file format


def _save(metadata: TraceMetadata, records: Sequence[TraceRecord], path: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    def offsets(lengths: list[int]) -> torch.Tensor:
        return torch.tensor([0, *lengths], dtype=torch.long).cumsum(0)

    top_k = records[0].topk_ids.shape[1] if records else metadata.top_k
    empty_k = torch.zeros(0, top_k)
    tensors = {
        "prompt_ids": torch.cat([r.prompt_ids for r in records] or [torch.zeros(0)]).int(),
        "prompt_offsets": offsets([len(r.prompt_ids) for r in records]),
        "continuation_ids": torch.cat([r.continuation_ids for r in records] or [torch.zeros(0)]).int(),
        "continuation_offsets": offsets([len(r.continuation_ids) for r in records]),
        "topk_ids": torch.cat([r.topk_ids for r in records] or [empty_k]).int(),
        "topk_probs": torch.cat([r.topk_probs for r in records] or [empty_k]).half(),
        "leftover": torch.cat([r.leftover for r in records] or [torch.zeros(0)]).float(),
    }
    header = {
        "draftnas_traces": json.dumps(metadata.to_dict()),
        "records": json.dumps([r.info.to_dict() for r in records]),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=header)
    tmp.replace(path)
    return path


def _read(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors import safe_open

    if not path.is_file():
        raise TraceError(f"trace file not found: {path} (make one with `draftnas trace`)")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors raises its own error types
        raise TraceError(f"{path} is not a readable safetensors trace file: {exc}") from exc
    if "draftnas_traces" not in header:
        raise TraceError(f"{path} is a safetensors file but holds no draftnas traces metadata")
    return header, tensors


def load_traces(path: str | Path) -> Traces:
    """Load a trace file written by `build_traces` (TraceError when missing, corrupt or too new)."""
    path = Path(path)
    header, t = _read(path)
    try:
        metadata = TraceMetadata.from_dict(json.loads(header["draftnas_traces"]))
        infos = [TraceRecordInfo.from_dict(d) for d in json.loads(header.get("records", "[]"))]
    except (ValueError, TypeError, KeyError) as exc:
        raise TraceError(f"{path}: corrupted traces metadata ({exc})") from exc
    if metadata.schema_version > SCHEMA_VERSION:
        raise TraceError(f"{path}: traces schema {metadata.schema_version} is newer than this draftnas "
                         f"reads ({SCHEMA_VERSION}); upgrade draftnas")
    po, co = t["prompt_offsets"].tolist(), t["continuation_offsets"].tolist()
    if len(po) != len(infos) + 1 or len(co) != len(infos) + 1:
        raise TraceError(f"{path}: {len(infos)} records but offsets for {len(po) - 1}; the file is corrupted")
    prompt_ids, cont_ids = t["prompt_ids"].long(), t["continuation_ids"].long()
    topk_ids, topk_probs, leftover = t["topk_ids"].long(), t["topk_probs"].float(), t["leftover"].float()
    records = [
        TraceRecord(
            info=info,
            prompt_ids=prompt_ids[po[i]:po[i + 1]],
            continuation_ids=cont_ids[co[i]:co[i + 1]],
            topk_ids=topk_ids[co[i]:co[i + 1]],
            topk_probs=topk_probs[co[i]:co[i + 1]],
            leftover=leftover[co[i]:co[i + 1]],
        )
        for i, info in enumerate(infos)
    ]
    return Traces(metadata=metadata, records=records)


# ---------------------------------------------------------------- building (sharded, resumable)


def _manifest(metadata: TraceMetadata, options: TraceOptions) -> dict[str, Any]:
    """What must match for a partial run to be resumed."""
    keep = ("target", "model_type", "num_hidden_layers", "vocab_size", "tokenizer_fingerprint",
            "prompt_set_hash", "temperatures", "seed", "top_k", "max_new_tokens")
    data = metadata.to_dict()
    return {**{k: data[k] for k in keep}, "shard_size": options.shard_size,
            "batch_size": options.batch_size}


def _open_partial(partial: Path, manifest: dict[str, Any]) -> None:
    mpath = partial / "manifest.json"
    if mpath.is_file():
        try:
            same = json.loads(mpath.read_text()) == manifest
        except ValueError:
            same = False
        if same:
            return
        log.warning("discarding %s: it was built with other settings", partial)
        shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    mpath.write_text(json.dumps(manifest, indent=1))


def _generator(seed: int, prompt_index: int, temperature: float) -> torch.Generator:
    import torch

    digest = hashlib.sha256(f"{seed}|{prompt_index}|{temperature:.6f}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _decode_shard(loaded: LoadedModel, prompts: Sequence[Prompt], encoded: Sequence[list[int]],
                  jobs: Sequence[tuple[int, float]], options: TraceOptions,
                  eos_ids: Sequence[int], on_done: Callable[[int], None]) -> list[TraceRecord]:
    records: list[TraceRecord] = []
    for start in range(0, len(jobs), options.batch_size):
        group = jobs[start:start + options.batch_size]
        by_temp: dict[float, list[int]] = {}
        for prompt_index, temp in group:
            by_temp.setdefault(temp, []).append(prompt_index)
        for temp, indices in by_temp.items():
            decoded = decode_batch(
                loaded.model, [encoded[i] for i in indices], temperature=temp,
                max_new_tokens=options.max_new_tokens, top_k=options.top_k, eos_ids=eos_ids,
                generators=[_generator(options.seed, i, temp) for i in indices],
            )
            records.extend(_record(prompts[i], temp, encoded[i], d)
                           for i, d in zip(indices, decoded, strict=True))
            on_done(len(indices))
    return records


def build_traces(
    target: str | LoadedModel,
    prompts: Sequence[Prompt],
    options: TraceOptions,
    out: str | Path,
    *,
    prompt_set: str = "custom",
    progress: Progress | None = None,
) -> Path:
    """Run the target over every prompt at every temperature and write the traces to `out`.

    Finished shards are kept in ``<out>.partial/`` so an interrupted run resumes; the
    final file is written atomically and the partial folder removed. `progress(done, total)`
    is called after each batch (records, i.e. prompts x temperatures).
    """
    from draftnas.sources import load_model

    options.validate()
    if not prompts:
        raise InvalidInputError("no prompts to trace")
    started = time.perf_counter()
    loaded = load_model(target) if isinstance(target, str) else target
    metadata = make_metadata(loaded, prompts, options, prompt_set)
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    _open_partial(partial, _manifest(metadata, options))
    encoded = [encode_prompt(loaded.tokenizer, p.text) for p in prompts]
    eos_ids = metadata.eos_token_ids
    jobs = [(i, float(t)) for t in options.temperatures for i in range(len(prompts))]
    shards = [jobs[s:s + options.shard_size] for s in range(0, len(jobs), options.shard_size)]
    done = 0
    for index, shard_jobs in enumerate(shards):
        if (partial / f"shard-{index:05d}.safetensors").is_file():
            done += len(shard_jobs)
    if done:
        log.info("resuming %s: %d of %d records already traced", out, done, len(jobs))
    if progress:
        progress(done, len(jobs))

    def on_done(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, len(jobs))

    for index, shard_jobs in enumerate(shards):
        shard_path = partial / f"shard-{index:05d}.safetensors"
        if shard_path.is_file():
            continue
        records = _decode_shard(loaded, prompts, encoded, shard_jobs, options, eos_ids, on_done)
        _save(metadata, records, shard_path)
    records = [r for i in range(len(shards))
               for r in load_traces(partial / f"shard-{i:05d}.safetensors").records]
    metadata = replace(metadata, n_records=len(records),
                       n_tokens=sum(r.info.continuation_len for r in records),
                       wall_s=round(time.perf_counter() - started, 3))
    _save(metadata, records, out)
    shutil.rmtree(partial, ignore_errors=True)
    log.info("wrote %d trace records (%d tokens) to %s", len(records), metadata.n_tokens, out)
    return out


def check_compatible(traces: Traces, *, vocab_size: int, fingerprint: str | None = None,
                     what: str = "drafter") -> None:
    """Refuse a model whose vocabulary differs from the traces' target (TraceError, one line)."""
    meta = traces.metadata
    if fingerprint is not None and fingerprint != meta.tokenizer_fingerprint:
        raise TraceError(
            f"the {what}'s tokenizer (fingerprint {fingerprint}) differs from the traces' target "
            f"{meta.target!r} (fingerprint {meta.tokenizer_fingerprint}); drafter and target must "
            "share one tokenizer"
        )
    if vocab_size != meta.vocab_size:
        raise TraceError(
            f"the {what} reads a vocabulary of {vocab_size} ids but the traces' target {meta.target!r} "
            f"has {meta.vocab_size}; drafter and target must share one tokenizer"
        )
