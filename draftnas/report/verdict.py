"""What pays where (`draftnas verdict`): per workload and engine, the drafter family that pays, its settings
in that engine, its predicted speedup and break-even, and what the bench measured, from the results the
pipeline wrote: `draftnas lookup`'s `lookup.json` (lookup drafting priced per workload in llama.cpp) and
`draftnas bench` results (llama.cpp's arms, vLLM's, or draftnas's loop's drafter, lookup and hybrid arms).

A bench belongs to the lookup search whose held-out prompts it ran (a loop bench on other prompts of the
same set is taken, and said so). Per workload it recommends the fastest measured route over llama.cpp's
plain decode of the same weights. Importing this module does not load torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from draftnas.bench.records import ArmResult, BenchResult
from draftnas.core.engine_kinds import ENGINE_KINDS, HF, LLAMA_CPP, VLLM
from draftnas.core.errors import InvalidInputError
from draftnas.core.intervals import measured_word, predicted_word
from draftnas.core.records import Record
from draftnas.drafter.families import family, parse_drafter
from draftnas.report.records import VerdictRequest
from draftnas.search.lookup_records import LookupResult

LOOKUP_FILE = "lookup.json"
EXTERNAL = {k.name for k in ENGINE_KINDS.values() if k.external}  # engines apart from draftnas's loop


@dataclass(frozen=True)
class Route(Record):
    """One way to decode a workload in one engine: a drafter family at its settings, priced and measured."""

    engine: str
    family: str  # lookup, model drafter, hybrid
    settings: str
    run_with: str  # the engine's flags or call for these settings
    predicted: float | None = None  # speedup over the target alone in the same engine
    predicted_interval: tuple[float, float] | None = None
    break_even: str = ""
    measured: float | None = None  # the bench's median paired speedup
    measured_interval: tuple[float, float] | None = None
    tokens_per_s: float | None = None  # measured; llama.cpp decode only, the loop's with the prefill
    exact_match_rate: float | None = None
    measured_on: str = ""  # which prompts the bench ran

    @property
    def verdict(self) -> str:
        if self.measured is not None:
            low, high = self.measured_interval or (self.measured, self.measured)
            return measured_word(low, high)
        if self.predicted is not None:
            return f"{predicted_word(self.predicted)} (predicted)"
        return "not priced: bench it"  # e.g. transformers' lookup: it also tries shorter matches

    @property
    def rank(self) -> float:
        """What orders an engine's routes: the measured speedup where benched, else the predicted one."""
        return self.measured if self.measured is not None else self.predicted or 0.0


@dataclass(frozen=True)
class WorkloadVerdict(Record):
    """Every route priced or measured for one workload, and the one to take."""

    workload: str
    target: str
    host: str
    plain_tokens_per_s: float  # llama.cpp alone on the same weights
    plain_source: str
    routes: tuple[Route, ...]
    recommended: str

    def best(self, engine: str) -> Route | None:
        mine = [r for r in self.routes if r.engine == engine]
        return max(mine, key=lambda r: r.rank) if mine else None

    @property
    def engines(self) -> list[str]:
        return list(dict.fromkeys(r.engine for r in self.routes))


def read_results(paths: Sequence[str]) -> tuple[list[LookupResult], list[BenchResult]]:
    """The lookup results and benches among `paths` (a folder: its lookup.json), each read into its record
    and checked; a file that is neither, or is cut short, is one line naming it."""
    lookups: list[LookupResult] = []
    benches: list[BenchResult] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            path = path / LOOKUP_FILE
        try:
            data = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            raise InvalidInputError(f"{name}: no such file (give `draftnas lookup`'s folder or lookup.json, "
                                    "or a `draftnas bench --out-json` file)") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InvalidInputError(f"{path}: not a JSON results file ({exc})") from None
        kind = "lookup" if isinstance(data, dict) and "prices" in data else \
            "bench" if isinstance(data, dict) and "arms" in data else None
        if kind is None:
            raise InvalidInputError(f"{path}: neither a `draftnas lookup` result nor a `draftnas bench` "
                                    "result")
        result, problem = _read(data, kind)
        if problem:
            raise InvalidInputError(f"{path}: a {kind} result {problem}")
        if isinstance(result, LookupResult):
            lookups.append(result)
        elif isinstance(result, BenchResult):
            benches.append(result)
    if not lookups:
        raise InvalidInputError("no `draftnas lookup` result given: a verdict is per workload, and a "
                                "workload is named by its lookup search (`draftnas lookup -p WORKLOAD "
                                "--out DIR`)")
    return lookups, benches


def _read(data: dict[str, Any], kind: str) -> tuple[LookupResult | BenchResult | None, str]:
    """`data` as its record, or what is wrong with it."""
    for key in ("arms", "prompts") if kind == "bench" else ():
        if not isinstance(data.get(key), list):
            return None, f"without its {key!r} list"
    try:
        result = LookupResult.from_dict(data) if kind == "lookup" else BenchResult.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        return None, f"with missing or malformed fields ({exc})"
    if isinstance(result, LookupResult) and not result.prices:
        return None, "with no priced settings"
    if isinstance(result, BenchResult) and not result.has("target"):
        return None, "without the target-alone arm"
    return result, ""


def _held(search: LookupResult) -> set[str]:
    return set(search.heldout_prompts) or set(search.searched_prompts)


def _prompt_ids(bench: BenchResult) -> set[str]:
    return {p.prompt_id for p in bench.prompts}


def benches_of(search: LookupResult, benches: Sequence[BenchResult]
               ) -> tuple[BenchResult | None, BenchResult | None, bool]:
    """The llama.cpp bench and the loop bench of a lookup search: those that ran its held-out prompts (or,
    with --no-held-out, its own); a loop bench on other prompts of the same set where none did (the bool
    says so)."""
    mine = [b for b in benches if _prompt_ids(b) <= _held(search)]
    llama = next((b for b in mine if b.engine == LLAMA_CPP), None)
    loop = next((b for b in mine if b.engine not in EXTERNAL), None)
    if loop is None and search.heldout_prompts:
        loop = next((b for b in benches if b.engine not in EXTERNAL
                     and {p.domain for p in b.prompts} == {search.workload}), None)
        return llama, loop, loop is not None
    return llama, loop, False


def vllm_bench_of(search: LookupResult, benches: Sequence[BenchResult]) -> BenchResult | None:
    """The vLLM bench of a lookup search: one that ran only its held-out prompts (or its own)."""
    return next((b for b in benches if b.engine == VLLM and _prompt_ids(b) <= _held(search)), None)


def _prompts_run(bench: BenchResult | None, which: str) -> str:
    if bench is None:
        return ""
    return f"{bench.n_prompts or len(bench.prompts)} {which} x {bench.rounds or 1} round(s)"


def arm_of(bench: BenchResult, name: str) -> ArmResult | None:
    return bench.arm(name) if bench.has(name) else None


def _interval(value: Sequence[float] | None) -> tuple[float, float] | None:
    return (float(value[0]), float(value[1])) if value and len(value) == 2 else None


def _measured(arm: ArmResult, on: str) -> dict[str, Any]:
    return {"measured": arm.speedup, "measured_interval": _interval(arm.speedup_interval),
            "tokens_per_s": arm.tokens_per_s, "exact_match_rate": arm.exact_match_rate, "measured_on": on}


def _llama_routes(search: LookupResult, bench: BenchResult | None) -> list[Route]:
    """llama.cpp: the lookup search's pick (predicted; measured where its bench ran it) and every other
    speculative arm its bench ran (a model drafter, a hybrid)."""
    best = search.best
    on = _prompts_run(bench, "held-out prompts" if search.heldout_prompts else "prompts searched")
    lookup = Route(LLAMA_CPP, "lookup", best.label, " ".join(search.flags), predicted=best.speedup,
                   predicted_interval=(best.speedup_ci_low, best.speedup_ci_high)
                   if best.speedup_ci_low is not None and best.speedup_ci_high is not None else None,
                   break_even=f"{best.break_even_tokens_per_step:.1f} tokens/step at m={best.m}")
    routes = [lookup]
    for arm in bench.arms if bench else ():
        spec = arm.drafter or ""
        if arm.speedup is None or not spec:
            continue
        if spec == best.label:
            routes[0] = replace(lookup, **_measured(arm, on))
            continue
        drafter = parse_drafter(spec)
        gamma = arm.gamma or 0
        settings = f"{drafter.label}, γ {gamma}" if family(drafter.family).drafts_gamma else drafter.label
        flags = " ".join(drafter.settings(LLAMA_CPP, gamma, threads=bench.threads if bench else 1))
        routes.append(Route(LLAMA_CPP, family(drafter.family).title, settings, flags, **_measured(arm, on)))
    return routes


def _loop_routes(bench: BenchResult, other_prompts: bool) -> list[Route]:
    """draftnas's loop: every speculative arm of its bench, measured over the loop's own target alone."""
    engine = f"draftnas's loop ({bench.dtype})"
    on = _prompts_run(bench, "other prompts of the set" if other_prompts else "held-out prompts")
    out = []
    for arm in bench.arms:
        if arm.speedup is None or arm.engine == HF:
            continue
        drafter, gamma = parse_drafter(arm.drafter or ""), arm.gamma
        stop = f", stop {arm.p_min:g}" if arm.p_min else ""
        settings = drafter.label + (f", γ {gamma}{stop}" if family(drafter.family).drafts_gamma else "")
        lookup = drafter.lookup.label if drafter.lookup is not None else ""
        run = {"lookup": f"draftnas bench -d DRAFTER --lookup {lookup}",
               "hybrid": f"draftnas bench -d {drafter.model} --lookup {lookup} "
                         f"--hybrid-policy {drafter.policy}",
               }.get(drafter.family, f"draftnas bench -d {drafter.model} --gamma {gamma}")
        out.append(Route(engine, family(drafter.family).title, settings, run, **_measured(arm, on)))
    return out


def _vllm_routes(bench: BenchResult) -> list[Route]:
    """vLLM: every speculative arm of its bench, measured over vLLM's own target alone, with the
    `--speculative-config` its family writes."""
    from draftnas.search.vllm import speculative_config

    on = _prompts_run(bench, "held-out prompts")
    out = []
    for arm in bench.arms:
        if arm.speedup is None:
            continue
        drafter, gamma = parse_drafter(arm.drafter or ""), arm.gamma or 0
        # a model drafter's exported folder: vLLM loads its full-head copy where its head is reduced
        config = speculative_config(drafter.model, gamma) if drafter.family == "model" else \
            drafter.settings(VLLM, gamma)
        settings = drafter.label + (f", γ {gamma}" if family(drafter.family).drafts_gamma else "")
        out.append(Route(VLLM, family(drafter.family).title, settings,
                         f"--speculative-config '{json.dumps(config)}'", **_measured(arm, on)))
    return out


def _transformers_route(search: LookupResult) -> Route:
    kwargs = ", ".join(f"{k}={v}" for k, v in search.transformers.items())
    return Route("transformers", "lookup", search.best.label, f"generate(..., {kwargs})")


def workload_verdicts(lookups: Sequence[LookupResult], benches: Sequence[BenchResult]
                      ) -> list[WorkloadVerdict]:
    """One verdict per lookup search, its benches joined to it."""
    out = []
    for search in lookups:
        llama, loop, other = benches_of(search, benches)
        served = vllm_bench_of(search, benches)
        routes = _llama_routes(search, llama) + (_loop_routes(loop, other) if loop else []) \
            + (_vllm_routes(served) if served else [])
        routes.append(_transformers_route(search))
        target = arm_of(llama, "target") if llama else None
        plain, source = (target.tokens_per_s, "measured beside the routes, decode only") \
            if target else (1000 / search.decode_ms, "from the lookup search's decode step")
        out.append(WorkloadVerdict(workload=search.workload, target=search.target,
                                   host=f"{search.host}, {search.threads} threads", plain_tokens_per_s=plain,
                                   plain_source=source, routes=tuple(routes),
                                   recommended=_recommend(plain, routes)))
    return out


def verdicts_from_request(request: VerdictRequest) -> list[WorkloadVerdict]:
    """`draftnas verdict`: the results the request names, read and checked, joined into one verdict per
    workload."""
    return workload_verdicts(*read_results(request.validate().results))


def _recommend(plain: float, routes: Sequence[Route]) -> str:
    """The fastest measured route over llama.cpp alone, or llama.cpp alone where none is faster."""
    measured = [r for r in routes if r.tokens_per_s is not None and r.verdict == "pays"]
    fastest = max(measured, key=lambda r: r.tokens_per_s or 0.0, default=None)
    speed = fastest.tokens_per_s if fastest is not None else None
    if fastest is None or speed is None or speed <= plain:
        priced = [r for r in routes if r.measured is None and r.verdict == "pays (predicted)"]
        hint = f"; predicted to pay, not benched: {priced[0].engine} {priced[0].settings}" if priced else ""
        return f"{LLAMA_CPP} alone ({plain:.1f} tokens/s): no benched route is faster{hint}"
    return (f"{fastest.engine} with {fastest.family} {fastest.settings} ({fastest.run_with}): "
            f"{speed:.1f} tokens/s, {speed / plain:.2f}x {LLAMA_CPP} alone")
