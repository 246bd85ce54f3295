"""Records: the frozen dataclasses that cross stage boundaries, and the one shared by all stages.

A record holds primitives, tuples, dicts and other records only, and round-trips
through `to_dict` / `from_dict` (JSON-safe), which is how records are stored in
Optuna trials, profiles and `draftnas.json`. Importing this module imports no torch.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

R = TypeVar("R", bound="Record")
#: a long job's progress callback: progress(done, total)
Progress = Callable[[int, int], None]
#: field metadata of a record field that lives in memory only (a model, a tensor): `to_dict`
#: leaves it out and `from_dict` leaves it at its default
TRANSIENT = {"draftnas_transient": True}


def _encode(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    return value


def _decode(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            return _decode(arg, value)
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp.from_dict(value)
    if origin is tuple:
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        return tuple(_decode(item_tp, v) for v in value)
    if origin is dict:
        _, val_tp = typing.get_args(tp) or (Any, Any)
        return {k: _decode(val_tp, v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class Record:
    """Frozen dataclass with JSON round-trip."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not f.metadata.get("draftnas_transient")}

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)
                 if f.init and not f.metadata.get("draftnas_transient")}
        kwargs = {k: _decode(hints[k], v) for k, v in data.items() if k in names}
        return cls(**kwargs)


@dataclass(frozen=True)
class MachineInfo(Record):
    cpu_model: str
    logical_cores: int
    torch_threads: int
    platform: str
    load_average_before: str
    load_average_after: str = ""
    versions: dict[str, str] = field(default_factory=dict)
