"""Lookup drafting: the draft is the text that followed the last n tokens where they occurred before, in the
prompt or in the answer so far. It needs no model, so it costs (almost) nothing, and it is accepted in long
runs where an answer copies its context (an edited file, a quoted document).

One rule serves every engine draftnas runs it in and prices it with, so its acceptance on the target's
greedy output is exact (`replay_lookup`): the pattern is the history's last `n` tokens; the match is its
most recent earlier occurrence that ends at least one token before the pattern starts; the draft is the
`m` tokens after the match, or no draft where fewer than `n` follow it or the history holds n + m + 2
tokens or fewer. That is llama.cpp's `ngram-simple` (its `--spec-ngram-simple-size-n/-m`); transformers'
`prompt_lookup_num_tokens` (= m, with `max_matching_ngram_size` = n) also tries shorter n-grams and takes
the earliest match, so its acceptance is measured there, not replayed.

Settings are parsed from a drafter spec, `lookup:n=4,m=16` (`lookup` alone: the defaults), and are checked
against `RANGES` in one line. Importing this module does not load torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from draftnas.core.errors import InvalidInputError
from draftnas.core.records import Record

PREFIX = "lookup"
RANGES = {"n": (1, 32), "m": (1, 64)}
# llama.cpp's lookup types: ngram-simple is the rule above (stateless); the others keep statistics across
# the requests a server answers (so a bench restarts their server before each request)
LLAMA_CPP_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
STATEFUL_TYPES = frozenset({"ngram-map-k", "ngram-map-k4v", "ngram-mod"})


@dataclass(frozen=True)
class LookupSettings(Record):
    """A lookup drafter: match the last `n` tokens, draft the `m` after the match; `kind`: the llama.cpp
    type it runs as there (draftnas's loop always runs the rule above)."""

    n: int = 3
    m: int = 16
    kind: str = "ngram-simple"

    def __post_init__(self) -> None:
        for name, (low, high) in RANGES.items():
            value = getattr(self, name)
            if not isinstance(value, int) or not low <= value <= high:
                what = f"lookup setting {name}={value}"
                raise InvalidInputError(f"{what} is out of range (allowed: {low}-{high})")
        if self.kind not in LLAMA_CPP_TYPES:
            allowed = ", ".join(LLAMA_CPP_TYPES)
            raise InvalidInputError(f"lookup kind {self.kind!r} is unknown (allowed: {allowed})")

    @property
    def label(self) -> str:
        kind = "" if self.kind == "ngram-simple" else f"{self.kind},"
        return f"{PREFIX}:{kind}n={self.n},m={self.m}"

    @property
    def stateful(self) -> bool:
        return self.kind in STATEFUL_TYPES

    def llama_cpp_flags(self) -> list[str]:
        """llama-server's flags for these settings (draft length capped at m as well)."""
        if self.kind == "ngram-mod":
            sizes = ["--spec-ngram-mod-n-match", str(self.n), "--spec-ngram-mod-n-max", str(self.m),
                     "--spec-ngram-mod-n-min", "1"]
        else:
            key = self.kind.removeprefix("ngram-")
            sizes = [f"--spec-ngram-{key}-size-n", str(self.n), f"--spec-ngram-{key}-size-m", str(self.m)]
        return ["--spec-type", self.kind, *sizes, "--spec-draft-n-max", str(self.m)]

    def transformers_kwargs(self) -> dict[str, int]:
        """`generate` keyword arguments of transformers' prompt lookup for these settings."""
        return {"prompt_lookup_num_tokens": self.m, "max_matching_ngram_size": self.n}


def server_flags(draft: str | None, gamma: int, lookup: LookupSettings | None, threads: int) -> list[str]:
    """llama-server's speculative flags: a drafter file at its fixed gamma, lookup settings, or both
    (llama.cpp runs the lookup first and the drafter where it finds nothing; one draft-length limit)."""
    if draft is None:
        return lookup.llama_cpp_flags() if lookup is not None else []
    types = "draft-simple" if lookup is None else f"{lookup.kind},draft-simple"
    longest = max(gamma, lookup.m if lookup else 0)
    flags = ["-md", draft, "--spec-type", types, "--spec-draft-n-max", str(longest),
             "--spec-draft-n-min", "0",
             "--spec-draft-p-min", "0", "-td", str(threads)]
    if lookup is not None:
        flags += lookup.llama_cpp_flags()[2:-2]  # its sizes (the type and length are set above)
    return flags


def is_lookup(spec: str) -> bool:
    return spec.strip().lower() == PREFIX or spec.strip().lower().startswith(PREFIX + ":")


def parse_lookup(spec: str) -> LookupSettings:
    """`lookup`, `lookup:n=4,m=16` or `lookup:ngram-mod,n=8,m=32` as settings; one clear line otherwise."""
    if not is_lookup(spec):
        raise InvalidInputError(f"{spec!r} is not a lookup drafter (expected lookup or lookup:n=N,m=M)")
    body = spec.strip()[len(PREFIX):].lstrip(":")
    values: dict[str, object] = {}
    for part in (p.strip() for p in body.split(",") if p.strip()):
        if part in LLAMA_CPP_TYPES:
            values["kind"] = part
            continue
        key, eq, value = part.partition("=")
        if not eq or key not in RANGES or not value.strip().lstrip("-").isdigit():
            raise InvalidInputError(
                f"lookup setting {part!r} is not understood (allowed: n=INT, m=INT and one of "
                f"{', '.join(LLAMA_CPP_TYPES)}; e.g. lookup:n=4,m=16)"
            )
        values[key] = int(value)
    return LookupSettings(**values)  # type: ignore[arg-type]


def propose(history: Sequence[int], n: int, m: int) -> list[int]:
    """The lookup draft after `history` (prompt and answer so far, its last token the one just emitted)."""
    length = len(history)
    if length <= n + m + 2:
        return []
    pattern = list(history[length - n:])
    for start in range(length - n - 2, 0, -1):
        if history[start] == pattern[0] and list(history[start:start + n]) == pattern:
            follow = min(m, length - 1 - (start + n))
            return list(history[start + n:start + n + follow]) if follow >= n else []
    return []


def propose_earliest_longest(history: Sequence[int], n: int, m: int, n_min: int | None = None) -> list[int]:
    """vLLM's n-gram rule (0.32, `ngram` with `prompt_lookup_min` n_min, default n, and `prompt_lookup_max`
    n): the longest v in [n_min, n] whose last v tokens occur earlier, starting before the history's last
    token, at the earliest such start; the draft is up to `m` tokens after the match (fewer where the
    history ends first)."""
    length, low = len(history), n if n_min is None else n_min
    best, begin = 0, 0
    for start in range(length - 2, -1, -1):  # latest to earliest: a tie keeps the earliest start
        for v in range(min(n, length - 1 - start), max(best, low) - 1, -1):
            if v and list(history[start:start + v]) == list(history[length - v:]):
                best, begin = v, start
                break
    if best < low:
        return []
    after = begin + best
    return list(history[after:after + min(m, length - after)])


#: The lookup rules an engine drafts by: draftnas's loop and llama.cpp's ngram-simple, and vLLM's ngram.
RULES = {"latest": propose, "earliest-longest": propose_earliest_longest}


@dataclass(frozen=True)
class LookupReplay(Record):
    """Steps of lookup drafting over a known greedy answer: per step the tokens drafted and accepted."""

    drafted: tuple[int, ...]
    accepted: tuple[int, ...]
    new_tokens: int

    @property
    def steps(self) -> int:
        return len(self.drafted)


def replay_lookup(prompt: Sequence[int], answer: Sequence[int], n: int, m: int, rule: str = "latest",
                  budget: int | None = None) -> LookupReplay:
    """Exactly what greedy speculative decoding with lookup drafts does over the target's own `answer`:
    each step drafts from the history by `rule` (`RULES`), accepts the drafts equal to the answer's next
    tokens, and emits those plus the target's token (never past the answer's end). With a `budget` of new
    tokens shorter than the answer, steps stop at the budget and drafts are not cut at it (vLLM drafts
    past its `max_tokens`; the answer's tokens after the budget are what those drafts meet)."""
    draft_by = RULES[rule]
    end = len(answer) if budget is None else min(budget, len(answer))
    history = list(prompt) + list(answer[:1])  # the prefill emits the answer's first token
    done, drafted, accepted = min(1, len(answer)), [], []
    while done < end:
        draft = draft_by(history, n, m)
        if budget is None:  # drafts cut at the answer's end, as draftnas's loop cuts them at its budget
            draft = draft[: len(answer) - done - 1]
        k = 0
        while k < len(draft) and done + k < len(answer) and draft[k] == answer[done + k]:
            k += 1
        drafted.append(len(draft))
        accepted.append(k)
        history += answer[done:done + k + 1]
        done += k + 1
    return LookupReplay(drafted=tuple(drafted), accepted=tuple(accepted), new_tokens=end)
