"""What the acceptance stage hands on: trace metadata, acceptance estimates, and the one
held-out split rule every stage uses. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftnas.core.machine import DEVICES
from draftnas.core.options import check_options, option, option_group, parse_floats
from draftnas.core.records import Record

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TraceOptions(Record):
    """How traces are generated.

    batch_size: prompts decoded together (left padded); 1 decodes each prompt alone.
    shard_size: records per checkpoint shard (what an interruption can lose at most).
    """

    max_new_tokens: int = option(128, help="Tokens generated per prompt.", short="-n", low=1, high=8192)
    temperatures: tuple[float, ...] = option(
        (0.0,), flag="--temperature", help="Comma-separated temperatures; 0 = greedy.", low=0.0, high=10.0,
        nonempty=True, distinct=True, cli_type=str, cli_default="0", parse=parse_floats)
    top_k: int = option(20, help="Target probabilities kept per position.", low=1, high=1024)
    seed: int = option(0, help="Seed of the sampled (temperature > 0) traces.")
    batch_size: int = option(8, help="Prompts decoded together (left padded).", low=1, high=256)
    shard_size: int = option(8, help="Records per checkpoint shard.", low=1, high=100_000, cli=False)
    dtype: str = option("fp32", help="The target's dtype while it writes the traces (the dtype it will "
                                     "serve in: greedy tokens differ between dtypes).",
                        choices=("fp32", "bf16", "fp16"))
    device: str = option("cpu", help="Device the target decodes on.", choices=DEVICES)

    def validate(self) -> TraceOptions:
        return check_options(self)


@dataclass(frozen=True)
class TraceRequest(Record):
    """What `draftnas trace` was asked: a target, a prompt set and where to write."""

    target: str = option(help="Target model: embedded name, folder or .gguf.", short="-t")
    out: str = option(help="Output .safetensors file.", short="-o")
    prompts: str = option("all", short="-p", help="Prompt set (chat, translation, translation-de, code, "
                                                  "math, all; comma-separated) or a JSONL file.")
    per_domain: int | None = option(None, low=1, help="At most this many prompts per domain.")
    options: TraceOptions = option_group(TraceOptions)


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
    dtype: str = "fp32"  # the target's weights while it wrote them (greedy tokens differ between dtypes)


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


#: every n-th trace record is held out for acceptance estimates (search, e2e, export's readings)
HELD_OUT_EVERY = 3


def held_out(index: int, every: int = HELD_OUT_EVERY) -> bool:
    """Whether item `index` of a sequence of records or prompts is held out: every `every`-th,
    counting from the first. The one split rule: the search's acceptance estimate, e2e's
    baselines and healing's own held-out readings (with their `heldout_every`) all use it."""
    return index % every == 0


@dataclass(frozen=True)
class DomainAcceptance(Record):
    """Acceptance figures for one domain (or for all records)."""

    n_prompts: int
    n_positions: int
    top1_agreement: float
    acceptance_rate: float
    tokens_per_step: dict[str, float]
    ci_low: dict[str, float]
    ci_high: dict[str, float]


@dataclass(frozen=True)
class PolicySteps(Record):
    """Greedy speculative decoding under one drafting policy, walked over the held-out traces: up to
    `gamma` drafts a step, stopping after the first whose drafter probability is below `p_min` (0: always
    `gamma`). Pooled over records (all tokens over all steps) and per record, in the traces' order, so a
    latency model can price the median over prompts a bench reports beside the pooled figure."""

    gamma: int
    p_min: float
    tokens_per_step: float
    drafted_per_step: float
    prompt_tokens_per_step: tuple[float, ...] = ()
    prompt_drafted_per_step: tuple[float, ...] = ()


@dataclass(frozen=True)
class AcceptanceEstimate(Record):
    """Expected tokens per speculative step for gamma = 1..max_gamma (keys are str(gamma)).

    acceptance_rate: mean per-position acceptance probability (greedy: top-1 agreement
    with the target's token; sampling: the lower bound sum over top-k of min(p, q)).
    acceptance_rate_upper / tokens_per_step_upper: the same with the truncation bound
    added (equal to the point values under greedy). ci_low / ci_high: bootstrap
    percentile interval over prompts at `confidence`.
    """

    temperature: float
    max_gamma: int
    n_prompts: int
    n_positions: int
    top1_agreement: float
    acceptance_rate: float
    acceptance_rate_upper: float
    tokens_per_step: dict[str, float]
    tokens_per_step_upper: dict[str, float]
    ci_low: dict[str, float]
    ci_high: dict[str, float]
    per_domain: dict[str, DomainAcceptance] = field(default_factory=dict)
    confidence: float = 0.95
    n_bootstrap: int = 1000
    vocab_subset_size: int | None = None
    elapsed_s: float = 0.0
    # greedy: each (gamma, p_min) the search may run, the drafter's stop rule (`PolicySteps`)
    policies: tuple[PolicySteps, ...] = ()

    def expected_tokens(self, gamma: int) -> float:
        return self.tokens_per_step[str(gamma)]

    def policy(self, gamma: int, p_min: float = 0.0) -> PolicySteps | None:
        """The walk at (gamma, p_min), if the estimate made it."""
        return next((p for p in self.policies if p.gamma == gamma and abs(p.p_min - p_min) < 1e-9), None)
