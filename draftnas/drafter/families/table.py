"""Drafter families declared once: each family is a class registered in `FAMILIES` (as importance criteria
are in `drafter.importance`), declaring its spec syntax and label, the engines that run it, how draftnas
prices its acceptance, and its settings in each engine (llama-server's flags, vLLM's `speculative_config`,
transformers' `generate` keywords). A drafter a user names is read once, by `parse_drafter`, into a
`DrafterSpec`; verdicts, tables, arms and the CLI ask the spec's family instead of parsing the text again.

Torch-free: the CLI and the report read this table without loading a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from draftnas.core.errors import InvalidInputError
from draftnas.core.records import Record
from draftnas.drafter.lookup import LookupSettings

#: What `settings` returns for an engine that does not run a family.
NOT_RUN = None


@dataclass(frozen=True)
class DrafterSpec(Record):
    """A drafter as a user named it, read once: its family, the text typed, the model it loads (a folder,
    a .gguf file or an embedded name; '' for none), its lookup settings (None for none) and, for a hybrid,
    the policy that picks between its two proposals."""

    family: str
    text: str
    model: str = ""
    lookup: LookupSettings | None = None
    policy: str = ""

    @property
    def label(self) -> str:
        return family(self.family).label(self)

    def settings(self, engine: str, gamma: int, **where: Any) -> Any:
        """This drafter's settings in `engine` at draft length `gamma` (see `DrafterFamily.settings`)."""
        return family(self.family).settings(self, engine, gamma, **where)


class DrafterFamily:
    """One family of drafters. A subclass sets the class attributes and the methods below."""

    name: ClassVar[str]
    title: ClassVar[str]  # what tables call it
    syntax: ClassVar[str]  # how a spec of this family is written (for help texts and errors)
    engines: ClassVar[tuple[str, ...]]  # the engine kinds (`core.engine_kinds`) that run it
    pricing: ClassVar[str]  # how draftnas prices its acceptance
    catch_all: ClassVar[bool] = False  # matched when no other family claims a spec (the model drafter)
    drafts_gamma: ClassVar[bool] = True  # a step drafts the γ it is given (lookup drafts what it matched)

    def matches(self, text: str) -> bool:
        """Whether `text` names a drafter of this family."""
        raise NotImplementedError

    def parse(self, text: str) -> DrafterSpec:
        """`text` as this family's spec; one line naming what is wrong otherwise."""
        raise NotImplementedError

    def label(self, spec: DrafterSpec) -> str:
        """A short name for tables."""
        raise NotImplementedError

    def llama_server(self, spec: DrafterSpec, gamma: int, *, draft_file: str = "", threads: int = 1
                     ) -> list[str]:
        """llama-server's speculative flags (`draft_file`: the GGUF the model part runs from)."""
        raise NotImplementedError

    def vllm(self, spec: DrafterSpec, gamma: int, *, draft_folder: str = "") -> dict[str, Any]:
        """vLLM's `speculative_config` (`draft_folder`: the folder vLLM loads the model part from)."""
        raise NotImplementedError

    def transformers(self, spec: DrafterSpec, gamma: int) -> dict[str, Any]:
        """transformers' `generate` keywords (the assistant model itself is passed by the caller)."""
        raise NotImplementedError

    def settings(self, spec: DrafterSpec, engine: str, gamma: int, **where: Any) -> Any:
        """Its settings in `engine`: llama.cpp's flags, vLLM's config or transformers' keywords; for
        draftnas's own loop the spec itself; `NOT_RUN` where the engine does not run this family."""
        from draftnas.core.engine_kinds import HF, LLAMA_CPP, STATIC, VLLM

        if engine not in self.engines:
            return NOT_RUN
        if engine == LLAMA_CPP:
            return self.llama_server(spec, gamma, **where)
        if engine == VLLM:
            return self.vllm(spec, gamma, **where)
        if engine == HF:
            return self.transformers(spec, gamma)
        assert engine == STATIC
        return spec


FAMILIES: dict[str, DrafterFamily] = {}


def register_family(cls: type[DrafterFamily]) -> type[DrafterFamily]:
    """Class decorator: one instance of the family in `FAMILIES`, under its name."""
    FAMILIES[cls.name] = cls()
    return cls


def family(name: str) -> DrafterFamily:
    """The declared family `name`; one line naming the declared ones otherwise."""
    found = FAMILIES.get(name)
    if found is None:
        raise InvalidInputError(f"drafter family {name!r} is not declared (declared: {', '.join(FAMILIES)})")
    return found


def parse_drafter(text: str) -> DrafterSpec:
    """The spec `text` names, read by the family that claims it (the model drafter where none does)."""
    stripped = text.strip()
    if not stripped:
        raise InvalidInputError("a drafter spec is empty (allowed: " +
                                "; ".join(f"{f.name}: {f.syntax}" for f in FAMILIES.values()) + ")")
    claims = [f for f in FAMILIES.values() if not f.catch_all and f.matches(stripped)]
    chosen = claims[0] if claims else next(f for f in FAMILIES.values() if f.catch_all)
    return chosen.parse(stripped)


def short_name(model: str) -> str:
    """A model part's short name: a folder or file by its own name, an embedded name as is."""
    return Path(model.rstrip("/")).name
