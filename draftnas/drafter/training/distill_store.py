"""The self-distillation data set on disk: a folder of shards and one manifest (`DataManifest`).

A shard is one work unit's sequences, written atomically and named in the manifest with its sha256;
the manifest is rewritten (atomically) after each shard, so an interrupted run loses at most the unit
it was making and resumes at the next. Each shard holds, flat:

- `ids` int32 [T] the tokens of all its sequences, `offsets` int64 [n + 1];
- `prompt_len` int32 [n]: positions before the first one taught (1 for teacher-forced text: the first
  token has no prediction);
- `domain` [n] (strings);
- `topk_ids` int32 [P, K] and `topk_probs` float16 [P, K]: the target's top-k at every taught position
  (P = sum of len - prompt_len), in order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.provenance import sha256_file
from draftnas.drafter.training.distill_records import DATA_FORMAT, MANIFEST, DataManifest, ShardInfo


@dataclass
class DistillSequence:
    """One sequence: its tokens, where teaching starts, its domain, and the target's top-k at every taught
    position ([C, K] each, C = len(ids) - prompt_len)."""

    ids: list[int]
    prompt_len: int
    domain: str
    topk_ids: torch.Tensor
    topk_probs: torch.Tensor

    @property
    def positions(self) -> int:
        return len(self.ids) - self.prompt_len


def read_manifest(folder: str | Path) -> DataManifest | None:
    """The folder's manifest; None where the folder has none. A damaged one is a one-line error."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        manifest = DataManifest.from_dict(data)
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
        raise InvalidInputError(f"{path}: not a draftnas data manifest ({exc})") from None
    if manifest.format != DATA_FORMAT:
        raise InvalidInputError(f"{path}: data format {manifest.format}; this draftnas reads {DATA_FORMAT}")
    return manifest


def write_manifest(folder: Path, manifest: DataManifest) -> None:
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest.to_dict(), indent=1))
    os.replace(tmp, folder / MANIFEST)


def append_shard(folder: Path, manifest: DataManifest, unit: str, kind: str,
                 seqs: Sequence[DistillSequence]) -> DataManifest:
    """Write `seqs` as the shard of `unit` and return the manifest naming it (also written)."""
    seqs = [s for s in seqs if s.positions > 0]
    name = f"shard-{len(manifest.shards):06d}.pt"
    lengths = [len(s.ids) for s in seqs]
    offsets = torch.tensor([0] + lengths).cumsum(0)
    payload = {
        "ids": torch.tensor([t for s in seqs for t in s.ids], dtype=torch.int32),
        "offsets": offsets,
        "prompt_len": torch.tensor([s.prompt_len for s in seqs], dtype=torch.int32),
        "domain": [s.domain for s in seqs],
        "topk_ids": torch.cat([s.topk_ids.to(torch.int32) for s in seqs]) if seqs else torch.zeros(0, 1),
        "topk_probs": torch.cat([s.topk_probs.to(torch.float16) for s in seqs]) if seqs else torch.zeros(0,
                                                                                                         1),
    }
    tmp = folder / (name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, folder / name)
    domains: dict[str, int] = {}
    for s in seqs:
        domains[s.domain] = domains.get(s.domain, 0) + s.positions
    info = ShardInfo(file=name, unit=unit, kind=kind, sequences=len(seqs), tokens=sum(lengths),
                     positions=sum(s.positions for s in seqs), sha256=sha256_file(folder / name),
                     domains=domains)
    manifest = replace(manifest, shards=(*manifest.shards, info))
    write_manifest(folder, manifest)
    return manifest


def read_shard(folder: Path, info: ShardInfo, *, check: bool = True) -> list[DistillSequence]:
    path = folder / info.file
    if not path.is_file():
        raise InvalidInputError(f"{path}: named in the manifest but missing")
    if check and sha256_file(path) != info.sha256:
        raise InvalidInputError(f"{path}: its sha256 differs from the manifest's (changed or truncated)")
    try:
        data: dict[str, Any] = torch.load(path, weights_only=True)
        offsets, plen = data["offsets"].tolist(), data["prompt_len"].tolist()
        ids, tk_ids, tk_probs, domains = data["ids"], data["topk_ids"], data["topk_probs"], data["domain"]
    except Exception as exc:  # a damaged pickle raises many kinds
        raise InvalidInputError(f"{path}: not a readable data shard ({exc})") from None
    out, at = [], 0
    for i, p in enumerate(plen):
        seq_ids = ids[offsets[i]:offsets[i + 1]].tolist()
        n = len(seq_ids) - p
        out.append(DistillSequence(seq_ids, p, domains[i], tk_ids[at:at + n], tk_probs[at:at + n]))
        at += n
    return out


def iter_sequences(folder: str | Path, manifest: DataManifest, *, domain: str | None = None,
                   check: bool = True) -> Iterator[DistillSequence]:
    """Every sequence of the set (of one domain when given), shard by shard, in manifest order."""
    root = Path(folder)
    for info in manifest.shards:
        if domain is not None and not info.domains.get(domain):
            continue
        for seq in read_shard(root, info, check=check):
            if domain is None or seq.domain == domain:
                yield seq
