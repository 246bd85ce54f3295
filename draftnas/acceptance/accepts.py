"""Accepted counts per step: what a speculative run's acceptance was, step by step, so that another
machine can replay it (`draftnas bench --replay`).

A greedy run's accepted-token sequence does not depend on the hardware, and at batch 1 with dense
kernels a step's latency does not depend on the weights' values. So the counts a CPU run recorded
(or the estimator derived from the target's traces) replayed over random weights of the same shapes
time the same loop as the real run, at any size the device holds.

The file (`AcceptsFile`, JSON) holds one `AcceptsTrace` per drafter label. Its sources:
- "bench": the counts draftnas's loop measured (`draftnas bench --write-accepts`);
- "estimate": the estimator's greedy walk over the target's own outputs (same command, the
  estimate of the same prompts, labelled `<label>-estimate`);
- "rate": counts drawn at a stated per-token acceptance rate (`synthetic_accepts`), a stand-in
  for a pair no run here measured (a published rate, say), and marked as such wherever shown.

Importing this module imports no torch.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftnas.acceptance.records import PolicySteps
from draftnas.core.errors import InvalidInputError
from draftnas.core.options import option_error
from draftnas.core.records import Record, write_json_file

#: the file's schema; a file of another schema is refused in one line
SCHEMA = "draftnas-accepts/1"
SOURCES = ("bench", "estimate", "rate")


@dataclass(frozen=True)
class AcceptsPrompt(Record):
    """One prompt's run: per step the drafts proposed (`drafted`) and the drafts accepted (`accepted`);
    `new_tokens`: what the run emitted (each step emits its accepted drafts and one token of the
    target's, the last step maybe cut at an end-of-sequence token)."""

    prompt_id: str
    prompt_tokens: int
    new_tokens: int
    accepted: tuple[int, ...]
    drafted: tuple[int, ...]

    @property
    def steps(self) -> int:
        return len(self.accepted)

    def problems(self) -> list[str]:
        out = []
        if len(self.accepted) != len(self.drafted):
            out.append(f"{len(self.accepted)} accepted counts for {len(self.drafted)} drafted counts")
        if any(k < 0 or k > g for k, g in zip(self.accepted, self.drafted, strict=False)):
            out.append("an accepted count outside 0..drafted")
        emitted = sum(self.accepted) + len(self.accepted)
        if self.accepted and not emitted - self.accepted[-1] <= self.new_tokens <= emitted:
            out.append(f"new_tokens {self.new_tokens} does not fit its steps ({emitted} emitted at most)")
        if self.prompt_tokens < 3:
            out.append(f"prompt_tokens {self.prompt_tokens} is below 3")
        return out


@dataclass(frozen=True)
class AcceptsTrace(Record):
    """One drafter's counts over the prompts, at its draft length `gamma`."""

    label: str
    drafter: str
    source: str  # "bench" | "estimate" | "rate"
    gamma: int
    prompts: tuple[AcceptsPrompt, ...]
    note: str = ""  # what a "rate" trace stands in for

    @property
    def tokens_per_step(self) -> float:
        steps = sum(p.steps for p in self.prompts)
        return sum(p.new_tokens for p in self.prompts) / steps if steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        drafted = sum(sum(p.drafted) for p in self.prompts)
        return sum(sum(p.accepted) for p in self.prompts) / drafted if drafted else 0.0


@dataclass(frozen=True)
class AcceptsFile(Record):
    """Every trace one run wrote, with the run's target, host and token budget."""

    schema: str
    target: str
    host: str
    max_new_tokens: int
    traces: dict[str, AcceptsTrace]

    def trace(self, label: str | None) -> AcceptsTrace:
        """The trace called `label` (None: the only one, else "draftnas")."""
        if label is None:
            label = next(iter(self.traces)) if len(self.traces) == 1 else "draftnas"
        if label not in self.traces:
            raise option_error("replay_drafter", f"{label!r} is not in the file (its traces: "
                                                 f"{', '.join(self.traces)})")
        return self.traces[label]


def write_accepts(path: str | Path, accepts: AcceptsFile) -> Path:
    return write_json_file(path, accepts.to_dict())


def read_accepts(path: str | Path) -> AcceptsFile:
    """An accepts file, checked: one line naming what is wrong otherwise."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise option_error("replay", f"{str(path)!r} is not a file (an accepts JSON written by "
                                     "`draftnas bench --write-accepts`, or alpha=RATE)")
    try:
        data: dict[str, Any] = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise option_error("replay", f"{str(path)!r} is not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise option_error("replay", f"{str(path)!r} is not an accepts file (schema {SCHEMA!r})")
    try:
        accepts = AcceptsFile.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise option_error("replay", f"{str(path)!r} is an accepts file with missing or malformed fields "
                                     f"({type(e).__name__}: {e})") from None
    for label, trace in accepts.traces.items():
        if trace.source not in SOURCES or trace.gamma < 1 or not trace.prompts:
            raise InvalidInputError(f"{path}: trace {label!r} needs a source in {SOURCES}, gamma >= 1 and "
                                    "at least one prompt")
        for p in trace.prompts:
            problems = p.problems()
            if problems:
                raise InvalidInputError(f"{path}: trace {label!r}, prompt {p.prompt_id!r}: "
                                        + "; ".join(problems))
    return accepts


def walk_accepts(agree: Sequence[float], gamma: int, max_new_tokens: int,
                 confidence: Sequence[float] | None = None,
                 p_min: float = 0.0) -> tuple[list[int], list[int]]:
    """Greedy speculative decoding walked over one continuation's 0/1 agreement of drafter and target
    (position t: the drafter's argmax equals the target's token) -> (accepted, drafted) per step.
    A step at position t drafts g = min(gamma, budget - t - 1) and accepts the agreements in a row
    from t, at most g; it emits those and one token of the target's. With `p_min` > 0 and the drafter's
    `confidence` per position (its probability of its own argmax), a step stops drafting after the first
    draft whose confidence is below `p_min` (that draft still goes to the verify: the rule of
    transformers' `assistant_confidence_threshold`, `models.speculative`)."""
    n = len(agree)
    run = [0] * (n + 1)  # run[t] = agreements in a row from t
    for t in range(n - 1, -1, -1):
        run[t] = run[t + 1] + 1 if agree[t] > 0.5 else 0
    stops = p_min > 0 and confidence is not None
    low = [n + max_new_tokens] * (n + 1)  # low[t] = the first position >= t drafted below p_min
    if stops:
        assert confidence is not None
        for t in range(n - 1, -1, -1):
            low[t] = t if confidence[t] < p_min else low[t + 1]
    accepted, drafted, t = [], [], 0
    while t < n:
        g = max(0, min(gamma, max_new_tokens - t - 1))
        if stops:
            g = min(g, low[t] - t + 1)
        k = min(run[t], g)
        accepted.append(k)
        drafted.append(g)
        t += k + 1
    return accepted, drafted


def policy_steps(agree: Sequence[Sequence[float]], confidence: Sequence[Sequence[float]], max_gamma: int,
                 max_new_tokens: int, p_mins: Sequence[float] = (0.0,)) -> tuple[PolicySteps, ...]:
    """Each drafting policy (gamma 1..max_gamma, each p_min and 0) walked over every record's agreement
    and the drafter's confidence per position (`walk_accepts`): pooled and per record."""
    out = []
    for gamma in range(1, max_gamma + 1):
        for p_min in sorted({float(p) for p in p_mins} | {0.0}):
            tokens, steps, drafted = [], [], []
            for a, c in zip(agree, confidence, strict=True):
                accepted, drafts = walk_accepts(a, gamma, max(max_new_tokens, len(a)), c, p_min)
                tokens.append(len(a))
                steps.append(max(len(accepted), 1))
                drafted.append(sum(drafts))
            out.append(PolicySteps(
                gamma=gamma, p_min=p_min, tokens_per_step=sum(tokens) / max(sum(steps), 1),
                drafted_per_step=sum(drafted) / max(sum(steps), 1),
                prompt_tokens_per_step=tuple(round(n / s, 4) for n, s in zip(tokens, steps, strict=True)),
                prompt_drafted_per_step=tuple(round(d / s, 4) for d, s in zip(drafted, steps, strict=True))))
    return tuple(out)


def synthetic_accepts(alpha: float, gamma: int, max_new_tokens: int, prompt_tokens: Sequence[int], *,
                      seed: int = 0, label: str = "draftnas", drafter: str = "",
                      note: str = "") -> AcceptsTrace:
    """Counts drawn at per-token acceptance rate `alpha`: each draft is accepted with probability alpha
    while every draft before it was (the i.i.d. model of Leviathan et al.), one prompt per entry of
    `prompt_tokens`, each run to `max_new_tokens` (seeded: the same counts every time)."""
    if not 0.0 <= alpha <= 1.0:
        raise option_error("replay", f"alpha={alpha:g} is not a rate in [0, 1]")
    rng = random.Random(seed)
    prompts = []
    for i, length in enumerate(prompt_tokens):
        agree = [1.0 if rng.random() < alpha else 0.0 for _ in range(max_new_tokens)]
        accepted, drafted = walk_accepts(agree, gamma, max_new_tokens)
        prompts.append(AcceptsPrompt(prompt_id=f"rate-{i}", prompt_tokens=int(length),
                                     new_tokens=max_new_tokens, accepted=tuple(accepted),
                                     drafted=tuple(drafted)))
    return AcceptsTrace(label=label, drafter=drafter, source="rate", gamma=gamma, prompts=tuple(prompts),
                        note=note or f"synthetic: every draft accepted with probability {alpha:g}")


def parse_rate(spec: str) -> float | None:
    """`alpha=0.8` -> 0.8; anything else (a file) -> None."""
    if not spec.startswith("alpha="):
        return None
    try:
        return float(spec.removeprefix("alpha="))
    except ValueError:
        raise option_error("replay", f"{spec!r}: alpha= takes a number in [0, 1]") from None
