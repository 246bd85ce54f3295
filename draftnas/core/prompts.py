"""Prompt sets: the workloads traces are built on (shipped JSONL sets or a user's JSONL file).

A prompt set is JSONL, one object a line: ``{"id", "domain", "language", "text"}``
(``language`` is the language of the text to translate for the translation set,
``en`` elsewhere). Shipped sets live in ``draftnas/data/prompts/``:

- ``chat``: instructions and questions;
- ``translation``: German, French, Russian, Japanese and Chinese into English
  (``translation-de``, ``-fr``, ``-ru``, ``-ja``, ``-zh`` select one language);
- ``code``: programming tasks;
- ``math``: arithmetic and algebra word problems;
- ``all``: the four together;
- context workloads (`WORKLOADS`, not in ``all``): ``edit`` (a function and an instruction to change it),
  ``code-qa`` (code and a question about it), ``doc-qa`` (a guide's section and a question or summary
  request); built by ``scripts/make_workloads.py`` from CPython's standard library (PSF-2.0) and this
  repository's guides (Apache-2.0), each prompt's ``source`` naming its file and licence.

Several sets can be joined with commas (``chat,code``). Chat models get their
chat template applied when a prompt is encoded (`encode_prompt`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from draftnas.core.errors import InvalidInputError
from draftnas.core.records import Record

DOMAINS: tuple[str, ...] = ("chat", "translation", "code", "math")
WORKLOADS: tuple[str, ...] = ("edit", "code-qa", "doc-qa")  # answers that copy their context
TRANSLATION_LANGUAGES: tuple[str, ...] = ("de", "fr", "ru", "ja", "zh")
MAX_REPORTED_PROBLEMS = 5


@dataclass(frozen=True)
class Prompt(Record):
    """One prompt of a workload."""

    id: str
    domain: str
    text: str
    language: str = "en"


def shipped_sets() -> tuple[str, ...]:
    """Names `load_prompts` accepts besides a file path."""
    return (*DOMAINS, "all", *(f"translation-{lang}" for lang in TRANSLATION_LANGUAGES), *WORKLOADS)


def _read_shipped(domain: str) -> list[Prompt]:
    text = resources.files("draftnas").joinpath("data", "prompts", f"{domain}.jsonl").read_text("utf-8")
    return _parse_jsonl(text, source=f"shipped set {domain!r}", default_domain=domain)


def _check_line(obj: Any, lineno: int, default_domain: str) -> tuple[Prompt | None, list[str]]:
    if not isinstance(obj, dict):
        return None, [f"line {lineno}: expected a JSON object, got {type(obj).__name__}"]
    problems: list[str] = []
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        problems.append(f"line {lineno}: field 'text' must be a non-empty string")
    for name in ("id", "domain", "language"):
        value = obj.get(name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            problems.append(f"line {lineno}: field {name!r} must be a non-empty string when given")
    if problems:
        return None, problems
    prompt = Prompt(
        id=str(obj.get("id") or f"line-{lineno}"),
        domain=str(obj.get("domain") or default_domain),
        text=str(text),
        language=str(obj.get("language") or "en"),
    )
    return prompt, []


def _parse_jsonl(text: str, *, source: str, default_domain: str) -> list[Prompt]:
    """Parse and validate every line; raise one error that lists the first problems found."""
    prompts: list[Prompt] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"line {lineno}: not valid JSON ({exc.msg})")
            continue
        prompt, line_problems = _check_line(obj, lineno, default_domain)
        problems.extend(line_problems)
        if prompt is None:
            continue
        if prompt.id in seen:
            problems.append(f"line {lineno}: duplicate id {prompt.id!r} (first on line {seen[prompt.id]})")
            continue
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if problems:
        more = len(problems) - MAX_REPORTED_PROBLEMS
        shown = "; ".join(problems[:MAX_REPORTED_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")
        raise InvalidInputError(f"{source}: {shown}")
    if not prompts:
        raise InvalidInputError(f"{source}: no prompts (expected JSONL lines with a 'text' field)")
    return prompts


def _load_one(spec: str) -> list[Prompt]:
    key = spec.strip().lower()
    if key in DOMAINS or key in WORKLOADS:
        return _read_shipped(key)
    if key == "all":
        return [p for domain in DOMAINS for p in _read_shipped(domain)]
    if key.startswith("translation-") and key.removeprefix("translation-") in TRANSLATION_LANGUAGES:
        lang = key.removeprefix("translation-")
        return [p for p in _read_shipped("translation") if p.language == lang]
    path = Path(spec).expanduser()
    if path.is_file():
        return _parse_jsonl(path.read_text("utf-8"), source=str(path), default_domain="custom")
    raise InvalidInputError(
        f"unknown prompt set {spec!r}: expected one of {', '.join(shipped_sets())} or a JSONL file path"
    )


def load_prompts(spec: str, *, per_domain: int | None = None) -> tuple[Prompt, ...]:
    """Load a shipped set, a comma-separated list of sets, or a user's JSONL file.

    `per_domain` keeps at most that many prompts of each domain, evenly spaced
    through the set (so a small translation sample still covers every language).
    """
    if per_domain is not None and per_domain < 1:
        raise InvalidInputError(f"per_domain must be >= 1, got {per_domain}")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    parts = [spec] if Path(spec).expanduser().is_file() else [p for p in spec.split(",") if p.strip()]
    for part in parts:
        for prompt in _load_one(part):
            if prompt.id not in seen:
                seen.add(prompt.id)
                prompts.append(prompt)
    if not prompts:
        raise InvalidInputError(f"prompt set {spec!r} is empty")
    if per_domain is not None:
        prompts = subsample(prompts, per_domain)
    return tuple(prompts)


def subsample(prompts: Sequence[Prompt], per_domain: int) -> list[Prompt]:
    """At most `per_domain` prompts of each domain, evenly spaced through `prompts`, in order."""
    by_domain: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_domain.setdefault(p.domain, []).append(p)
    keep: set[str] = set()
    for items in by_domain.values():
        n = min(per_domain, len(items))
        keep.update(items[(i * len(items)) // n].id for i in range(n))
    return [p for p in prompts if p.id in keep]


def prompt_set_hash(prompts: tuple[Prompt, ...] | list[Prompt]) -> str:
    """sha256 of the prompts' canonical JSON (ids, domains, languages and texts, in order)."""
    payload = json.dumps([p.to_dict() for p in prompts], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def uses_chat_template(tokenizer: Any) -> bool:
    """True when the tokenizer carries a chat template (an instruction-tuned model)."""
    return bool(getattr(tokenizer, "chat_template", None))


def user_turn_opening(tokenizer: Any, words: str) -> list[int]:
    """Token ids of the chat template up to and including `words` at the start of a user turn, with
    the turn left open: what a chat model continues to write a user message of its own."""
    if not uses_chat_template(tokenizer):
        raise InvalidInputError("the target has no chat template, so it cannot write user turns of its own")
    marker = "\u2063draftnas\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=False,
                                         tokenize=False)
    if not isinstance(text, str) or marker not in text:
        raise InvalidInputError("the target's chat template does not place the user's text verbatim")
    ids = tokenizer(text[:text.index(marker)] + words, add_special_tokens=False)["input_ids"]
    return [int(i) for i in ids]


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a prompt as the model expects it: through the chat template when there is one.

    `apply_chat_template` returns a BatchEncoding in transformers 5 (take
    ``["input_ids"]``) and a plain list in older versions; both are handled.
    """
    if uses_chat_template(tokenizer):
        encoded: Any = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
    else:
        encoded = tokenizer(text)
    if hasattr(encoded, "keys") and "input_ids" in encoded:
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):  # a batch of one
        encoded = encoded[0]
    ids = [int(i) for i in encoded]
    if not ids:
        raise InvalidInputError(f"prompt encodes to no tokens: {text[:40]!r}")
    return ids


def check_context(prompts: Sequence[Prompt], encoded: Sequence[Sequence[int]], new_tokens: int, limit: int,
                  engine: str) -> None:
    """One line naming the longest prompt when a prompt and its `new_tokens` do not fit the `limit`
    positions the target was built for in `engine`."""
    needed = [len(ids) + new_tokens for ids in encoded]
    worst = max(range(len(needed)), key=needed.__getitem__, default=None)
    if worst is not None and needed[worst] > limit:
        raise InvalidInputError(
            f"prompt {prompts[worst].id} has {len(encoded[worst])} tokens; with {new_tokens} new tokens it "
            "needs "
            f"{needed[worst]} positions, more than the {limit} the target holds in {engine}: shorten it or "
            "lower --max-new-tokens")
