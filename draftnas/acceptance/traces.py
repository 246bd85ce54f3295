"""Target traces: the target's continuations of a prompt set, with its top-k next-token probabilities.

The target runs once per prompt and temperature; every candidate drafter is then
scored against the cached traces (`draftnas.acceptance.estimate`) and can be healed on them
(`draftnas.drafter.heal.heal`) without loading the target again.

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
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftnas.acceptance.records import (
    HELD_OUT_EVERY,
    SCHEMA_VERSION,
    TraceMetadata,
    TraceOptions,
    TraceRecordInfo,
    held_out,
)
from draftnas.core.errors import TraceError
from draftnas.core.prompts import Prompt, prompt_set_hash, uses_chat_template
from draftnas.core.provenance import package_versions
from draftnas.models.records import dtype_name

if TYPE_CHECKING:
    from draftnas.models.sources import LoadedModel


log = logging.getLogger(__name__)


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
                    f"{', '.join(f'{t:g}' for t in self.temperatures)} (traces are made per temperature: "
                    "make them at this one)"
                )
        if domains is not None:
            records = [r for r in records if r.info.domain in set(domains)]
            if not records:
                raise TraceError(f"traces hold no records in domains {list(domains)}; they have "
                                 f"{', '.join(self.domains)}")
        return Traces(metadata=self.metadata, records=records)

    def save(self, path: str | Path) -> Path:
        """Write to one safetensors file (atomically: a temporary file renamed into place)."""
        return save_traces(self.metadata, self.records, Path(path))


def split_traces(traces: Traces, every: int = HELD_OUT_EVERY) -> tuple[Traces, Traces]:
    """(held out, the rest) of `traces` by `held_out`; the rest is the held-out part when nothing
    else is left (a single record)."""
    held = [r for i, r in enumerate(traces.records) if held_out(i, every)]
    rest = [r for i, r in enumerate(traces.records) if not held_out(i, every)]
    return (Traces(metadata=traces.metadata, records=held),
            Traces(metadata=traces.metadata, records=rest or held))


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 (first 16 hex digits) of the tokenizer's vocabulary (token -> id), order-free."""
    vocab = tokenizer.get_vocab()
    payload = json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


#: the files a Hugging Face folder's tokenizer is read from (a chat template does not change the ids)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model")


def same_tokenizer_files(a: Path, b: Path) -> bool:
    """Whether two model folders hold the same tokenizer files, byte for byte (then their tokenizers map
    tokens to the same ids, with no tokenizer loaded); False also where either has no tokenizer.json."""
    names = [n for n in TOKENIZER_FILES if (a / n).is_file() or (b / n).is_file()]
    return "tokenizer.json" in names and all((a / n).is_file() and (b / n).is_file()
                                             and (a / n).read_bytes() == (b / n).read_bytes() for n in names)


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
        dtype=dtype_name(next(model.parameters()).dtype),
    )


def save_traces(metadata: TraceMetadata, records: Sequence[TraceRecord], path: Path) -> Path:
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
