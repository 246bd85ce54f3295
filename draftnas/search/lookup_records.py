"""Records of the lookup search (`draftnas lookup`): what it was asked, each setting's price, the result.
Importing this module does not load torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftnas.core.engine_kinds import LLAMA_CPP
from draftnas.core.options import check_options, option, parse_ints
from draftnas.core.records import Record
from draftnas.drafter.lookup import RANGES

ENGINES = (LLAMA_CPP,)  # the lookup search times llama-server; draftnas's loop runs lookup in the bench


def _ints(text: object) -> tuple[int, ...]:
    return text if isinstance(text, tuple) else parse_ints(str(text))


@dataclass(frozen=True)
class LookupRequest(Record):
    """`draftnas lookup`: price lookup drafting for a target on a workload in an engine, every setting."""

    target: str = option("qwen2.5-coder-1.5b", short="-t", help="Target model (a registered name).")
    prompts: str = option("edit", short="-p",
                          help="Workload: a shipped set (edit, code-qa, doc-qa, chat, code, math, ...) or a "
                               "JSONL file. Its search split is priced; the held-out split (every third "
                               "prompt) is written for the bench.")
    engine: str = option("llama.cpp", choices=ENGINES, help="Engine the lookup runs and is timed in.")
    n: tuple[int, ...] = option((2, 3, 4, 6), flag="--match-lengths", parse=_ints, cli_type=str,
                                cli_default="2,3,4,6", nonempty=True,
                                distinct=True, low=RANGES["n"][0], high=RANGES["n"][1],
                                help="Match lengths n searched (tokens; llama.cpp's size-n).")
    m: tuple[int, ...] = option((2, 3, 4, 6, 8, 12, 16), flag="--draft-lengths", parse=_ints, cli_type=str,
                                cli_default="2,3,4,6,8,12,16", nonempty=True, distinct=True,
                                low=RANGES["m"][0], high=RANGES["m"][1],
                                help="Draft lengths m searched (llama.cpp's size-m; below n: skipped).")
    max_new_tokens: int = option(192, short="-n", low=8, high=4096, help="Tokens the target answers each "
                                                                         "prompt with.")
    target_gguf: str | None = option(None, help="The target's GGUF file (default: the embedded Q4_K_M).")
    llama_cpp: str | None = option(None, help="llama.cpp build folder (default: `draftnas engines "
                                              "--build`'s).")
    held_out: bool = option(True, flag="--held-out/--no-held-out",
                            help="Hold every third prompt out of the pricing for the bench (--no-held-out: "
                                 "price every prompt given, e.g. the very prompts a bench ran, to check the "
                                 "prediction on them).")
    server_steps: bool = option(True, flag="--server-steps/--no-server-steps",
                                help="Answer the prompts a second time with the best setting in llama-server "
                                     "and price every step at the server's cost (llama-bench's batches alone "
                                     "underprice a speculative step); --no-server-steps: llama-bench only.")
    out: str = option("runs/lookup", help="Folder written: lookup.json and heldout-prompts.jsonl.")

    def validate(self) -> LookupRequest:
        check_options(self)
        return self


@dataclass(frozen=True)
class LookupPrice(Record):
    """One setting priced on the workload's traces: its exact replay (steps, drafted, accepted) and the
    speedup the engine's measured step costs give it, the median over prompts and pooled."""

    label: str
    n: int
    m: int
    tokens_per_step: float
    acceptance: float  # accepted over drafted
    drafted_share: float  # steps that drafted anything
    speedup: float  # median of the per-prompt predictions
    speedup_low: float  # the lowest prompt's
    pooled_speedup: float  # all prompts' plain time over all their lookup time
    break_even_tokens_per_step: float  # what a step drafting m tokens every time must yield to pay
    # the 95% bootstrap interval of the median over prompts (resampling prompts, as a bench's interval
    # does): how far another sample of this workload's prompts may read; absent in results before it
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None


@dataclass(frozen=True)
class LookupResult(Record):
    """The lookup search's answer for one workload and engine."""

    target: str
    engine: str
    workload: str
    searched_prompts: tuple[str, ...]
    heldout_prompts: tuple[str, ...]
    heldout_file: str
    context_tokens: int  # the depth the step costs were timed at (the prompts' median + half an answer)
    decode_ms: float  # the step costs the prices use: llama-server's (see server_step_scale)
    batch_ms: dict[int, float]
    prices: tuple[LookupPrice, ...]  # best first
    flags: tuple[str, ...]  # the engine's flags of the best setting
    transformers: dict[str, int] = field(default_factory=dict)
    host: str = ""
    threads: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    answer_tokens: int = 0  # new tokens over the searched prompts
    wall_s: float = 0.0
    bench_decode_ms: float = 0.0  # llama-bench's decode and batches at the same depth
    bench_batch_ms: dict[int, float] = field(default_factory=dict)
    server_step_scale: float = 1.0  # llama-server's drafting steps over llama-bench's batches (1: not run)
    bench_best: LookupPrice | None = None  # the best setting as llama-bench's costs alone priced it

    @property
    def best(self) -> LookupPrice:
        return self.prices[0]
