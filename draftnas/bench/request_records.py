"""What `draftnas bench` is asked (pure): the options every arm runs with (`BenchOptions`) and the
request (`BenchRequest`: target, drafter, references, prompts, replay, ablation), each checked in one
`OptionError` naming every problem."""

from __future__ import annotations

from dataclasses import dataclass

from draftnas.core.engine_kinds import HF, STATIC, VLLM, EngineKind, engine_kind, engines_for
from draftnas.core.machine import DEVICES
from draftnas.core.options import check_options, option, option_group, parse_ints
from draftnas.core.records import Record
from draftnas.models.records import TORCH_DTYPES, llama_cpp_option, target_gguf_option, weights_problem


def _schedule_problems(text: str, vllm_batched: bool) -> list[tuple[str, str]]:
    """Why --gamma-schedule cannot run as asked: a bench that is not vLLM's batched one, or a schedule vLLM
    would refuse."""
    from draftnas.core.options import OptionError
    from draftnas.search.vllm import parse_schedule

    if not vllm_batched:
        return [("gamma_schedule", "is vLLM's, served at several batches: add {engine} vllm and "
                                   "{batch_sizes}")]
    try:
        parse_schedule(text)
    except OptionError as e:
        return list(e.problems)
    return []


def _lookup_problems(options: BenchOptions) -> list[tuple[str, str]]:
    """Why --lookup cannot run as asked: its settings, or a bench that is not draftnas's greedy loop."""
    from draftnas.core.errors import InvalidInputError
    from draftnas.drafter.lookup import parse_lookup

    try:
        parse_lookup(options.lookup or "")
    except InvalidInputError as e:
        return [("lookup", str(e).removeprefix("lookup "))]
    if options.kind.name == VLLM and options.temperature <= 0:
        return []  # vLLM's ngram arm beside its draft models
    if not options.kind.own_loop or options.batch_sizes or options.temperature > 0:
        return [("lookup", "runs in draftnas's greedy one-sequence loop or in vLLM: drop {engine} "
                           "llama.cpp (there, give lookup settings as --draft or --reference) and "
                           "{batch_sizes}, set {temperature} 0")]
    return []


def _per_domain(value: int | None) -> int | None:
    return value or None  # the flag's 0 means every prompt


@dataclass(frozen=True)
class BenchOptions(Record):
    """What `draftnas bench` is asked (its flags are built from these fields)."""

    gamma: int = option(4, help="Draft tokens per step.", short="-g", low=1, high=32)
    reference_gamma: int | None = option(
        None, help="Draft tokens per step of a reference drafter given by name (default: --gamma); an "
                   "exported folder runs at the γ its draftnas.json records. Run it at the gamma its users "
                   "would pick (the search prints its best), not at the winner's.", low=1, high=32)
    p_min: float = option(
        0.0, help="The drafter's confidence stop (greedy): a step drafts up to --gamma tokens and stops "
                  "after the first the drafter gives a probability below this (transformers' "
                  "assistant_confidence_threshold runs the same rule); 0 drafts --gamma every step. An "
                  "exported reference runs at the stop its draftnas.json records.", low=0.0, high=0.99)
    reference_p_min: float = option(
        0.0, help="The confidence stop of a reference drafter given by name (see --p-min; the search prints "
                  "the reference's own best).", low=0.0, high=0.99)
    temperature: float = option(0.0, help="0 = greedy (checked lossless).", low=0.0, high=10.0)
    max_new_tokens: int = option(64, help="New tokens per prompt.", short="-n", low=1, high=8192)
    seed: int = option(0, help="Seed of sampling runs.")
    rounds: int = option(
        3, help="Interleaved rounds over the prompts: every arm runs every prompt once per round; figures "
                "are medians over rounds, then over prompts, with 95% bootstrap intervals over prompts "
                "(--batch-size: runs per B, a speedup the median of the runs' paired ones).",
        low=1, high=100)
    hf_assisted: bool = option(True, flag="--hf/--no-hf", help="Run transformers' assisted generation.")
    hf_routed: bool = option(
        True, flag="--hf-routed/--no-hf-routed",
        help="Also run the transformers arms (CPU only) with every model's linear layers routed through "
             "the product that timed fastest here (draftnas.models.linears.route_linears).")
    estimate: bool = option(True, help="Predict tokens per step from traces of these prompts.", cli=False)
    top_k: int = option(20, help="Target probabilities kept per position for the estimate.", low=1, high=1024,
                        cli=False)
    device: str = option("cpu", help="Device to run on.", choices=DEVICES)
    dtype: str = option("fp32", help="Weights' dtype (in fp32 outputs must match exactly).",
                        choices=tuple(TORCH_DTYPES))
    draft_weights: str | None = option(
        None, help="How the drafter's linear layers run: dense (in --dtype), int8 (weight-only, one scale "
                   "per output row), int4 (a scale and zero point per 32 inputs), or per layer group "
                   "'attn=int8,mlp=int8,head=int4' (the static engine and the routed transformers arm, "
                   "plain transformers runs dense; CUDA runs int4 in bf16, not int8). Default: as the "
                   "drafter folder's draftnas.json says (dense otherwise).")
    reference_weights: str | None = option(
        None, help="How the reference drafters' linear layers run, spelled as --draft-weights (int8: to see "
                   "what the weight format alone buys a reference). Default: as an exported folder's "
                   "draftnas.json says, dense otherwise.")
    engine: str | None = option(
        None, help="The loop's engine. hf: transformers models over a growing cache. static: draftnas's "
                   "decoder over a cache allocated once (CUDA graphs on a GPU). llama.cpp: the GGUFs in "
                   "llama.cpp's own server, greedy, draft length fixed at --gamma. vllm: vLLM's own engine "
                   "(`draftnas engines --install vllm`), fp32, greedy, one request at a time: its "
                   "draft_model at --gamma and, with --lookup, its ngram. Default: static on cuda, hf on "
                   "cpu.",
        choices=engines_for("bench"))
    llama_cpp: str | None = llama_cpp_option("run the llama.cpp arms")
    torch_arms: bool = option(
        False, flag="--torch-arms/--no-torch-arms",
        help="With --engine llama.cpp: then run the same prompts through draftnas's own loop (static engine, "
             "--dtype; the drafter folder's weights) and print both engines in one table.")
    target_gguf: str | None = target_gguf_option("run")
    lookup: str | None = option(
        None, help="Lookup settings (lookup:n=3,m=8) run in draftnas's loop beside the drafter: the lookup "
                   "alone and a hybrid (lookup first, the drafter where lookup finds nothing, or the longer "
                   "of the two: --hybrid-policy). With --engine llama.cpp give lookup settings as -d or -r.")
    hybrid_policy: str = option("fallback", choices=("fallback", "longer"),
                                help="How the hybrid arm mixes lookup and the drafter (see --lookup).")
    per_domain: int | None = option(
        None, help="At most this many prompts per domain, evenly spaced (0 = all); prompts a drafter was "
                   "healed on are left out first.", low=1, cli_default=2, parse=_per_domain)

    batch_sizes: tuple[int, ...] = option(
        (), flag="--batch-size",
        help="Comma-separated batch sizes (e.g. 1,2,4,8): instead of the arms, decode B prompts together "
             "with the target alone and with each drafter's batched loop (static engine, greedy) at each B, "
             "and put the measured crossover (the first B where speculative decoding stops paying) beside "
             "the latency profile's. With --engine vllm: B requests at once in vLLM's continuous batching "
             "(no profile prices vLLM yet).", low=1, high=1024, distinct=True, cli_type=str, cli_default="",
        parse=parse_ints)
    gamma_schedule: str | None = option(
        None, help="With --engine vllm and --batch-size: one more arm, the drafter with this batch-size "
                   "schedule of γ (vLLM's num_speculative_tokens_per_batch_size; START-END:γ,... such as "
                   "1-3:4,4-65536:0, or the JSON list `search --engine vllm --batch B` prints), beside the "
                   "drafter at --gamma and each reference at --reference-gamma.")
    predictions: str | None = option(
        None, help="A search's predictions.json (it prints the path): each arm's predicted tokens/s and "
                   "speedup beside the measured ones, with the error, and apart from them the held-out "
                   "prediction (the latency model on a shape the calibration did not time).")
    write_accepts: str | None = option(
        None, help="Write each drafter's accepted counts per step and prompt (draftnas's loop, first round) "
                   "and the estimator's for the same prompts to this JSON: what `bench --replay` replays on "
                   "another machine at the same or other shapes.")
    profile: str | None = option(
        None, help="What prices the batch sizes' predictions: a shipped profile, a profile JSON, or a "
                   "calibration of this host a search stored (`search --batch B` times batches up to B). "
                   "Default: on CPU the profile measured on this host; on CUDA the GPU's spec sheet.")

    def resolved_engine(self) -> str:
        return STATIC if self.batch_sizes and not self.kind.external else self.kind.name

    @property
    def kind(self) -> EngineKind:  # the engine asked for, or the device's default
        return engine_kind(self.engine or (STATIC if self.device == "cuda" else HF))

    def validate(self) -> BenchOptions:
        if self.engine not in (None, *engines_for("bench")):
            return check_options(self)  # names the allowed engines
        extra = []
        if self.batch_sizes and self.temperature > 0:
            extra.append(("batch_sizes", "runs greedy decoding only: set {temperature} 0"))
        if self.batch_sizes and self.engine is not None and not self.kind.batched:
            extra.append(("batch_sizes", f"runs in the static engine: drop {{engine}} {self.engine}"))
        if self.kind.name == VLLM and self.temperature > 0:
            extra.append(("temperature", "vLLM's arms run greedy here (outputs compared with the target "
                                         "alone's): set {temperature} 0"))
        vllm_batched = bool(self.batch_sizes) and self.kind.name == VLLM
        if self.gamma_schedule is not None:
            extra += _schedule_problems(self.gamma_schedule, vllm_batched)
        if self.batch_sizes and not vllm_batched and self.reference_gamma not in (None, self.gamma):
            extra.append(("reference_gamma", "applies to the arms bench; {batch_sizes} runs every "
                                             "drafter at {gamma}"))
        one_greedy = not (self.batch_sizes or not self.kind.own_loop or self.temperature > 0)
        if max(self.p_min, self.reference_p_min) > 0 and not one_greedy:
            extra.append(("p_min", "runs in the greedy one-sequence loops: drop {batch_sizes} and {engine} "
                                   "llama.cpp, set {temperature} 0"))
        if self.write_accepts and not one_greedy:
            extra.append(("write_accepts", "records draftnas's greedy loop: drop {batch_sizes} and {engine} "
                                           "llama.cpp, set {temperature} 0"))
        if self.lookup is not None:
            extra += _lookup_problems(self)
        if self.engine is not None and self.kind.limits(self.device, self.temperature):
            extra.append(("engine", f"{self.engine} {self.kind.limits(self.device, self.temperature)}"))
        for name in ("draft_weights", "reference_weights"):
            weights = getattr(self, name)
            try:
                problem = weights_problem(weights, self.device, self.dtype) if weights is not None else None
                if problem:
                    extra.append((name, problem))
            except ValueError as e:
                extra.append((name, str(e)))
        return check_options(self, extra)


@dataclass(frozen=True)
class BenchRequest(Record):
    """What `draftnas bench` was asked: the target, the drafter, the one it must beat, the prompts."""

    target: str = option(help="Target model: embedded name, folder or .gguf.", short="-t")
    draft: str = option(help="Draft model folder (the target's tokenizer), a .gguf with the llama.cpp "
                             "engine, or head:FOLDER (a head `draftnas distill head` trained: in draftnas's "
                             "loop and vLLM; in llama.cpp once `distill export --gguf` wrote its GGUF in "
                             "the folder).", short="-d")
    references: tuple[str, ...] = option(
        (), flag="--reference", short="-r",
        help="A drafter benched in the same interleaved run with the same arms: one a user would otherwise "
             "pick (an embedded name, folder or .gguf sharing the target's tokenizer). Repeatable: the stock "
             "drafter and the search's hand-made best beside the winner. An exported folder runs at the γ "
             "and weights its draftnas.json records (its own best), a name at --reference-gamma.")
    prompts: str = option("all", short="-p", help="Prompt set or JSONL file.")
    ablation: bool = option(
        False, help="Bench where the drafter's speed comes from: the chain from the stock drafter to it, "
                    "one transform added per link (weight format, head, depth/width/selection, per-layer "
                    "formats), each the drafter its study priced (exported into drafters/ first), all in one "
                    "run of draftnas's static loop, each at its own γ. The drafter must be a search's "
                    "export; the table also goes into its README.md.")
    replay: str | None = option(
        None, help="Replay recorded acceptance instead of running the models: an accepts JSON (written by "
                   "--write-accepts) or alpha=RATE (counts drawn at that per-token acceptance rate, a "
                   "stand-in). --target and --draft are then shapes: a registered name (draftnas targets) "
                   "or a model folder (its config.json, draft head and draftnas.json; no weights are read), "
                   "built with random weights in the static engine; each step accepts the recorded count. "
                   "Reports tokens/s of the loop and of the target alone, the speedup and the latency "
                   "model's prediction; with --batch-size, at each batch size. A --max-new-tokens below "
                   "the recorded runs' replays each run's first steps that fit it.")
    replay_drafter: str | None = option(
        None, help="Which trace of the accepts file to replay (its labels: draftnas, reference, ..., "
                   "draftnas-estimate); default: the only one, else draftnas.")
    options: BenchOptions = option_group(BenchOptions)

    def validate(self) -> BenchRequest:
        extra = []
        if self.replay and (self.references or self.ablation or self.options.engine not in (None, STATIC)
                            or self.options.temperature > 0 or self.options.write_accepts):
            extra.append(("replay", "replays one drafter's greedy counts in draftnas's static loop: drop "
                                    "{references}, {ablation}, {write_accepts} and {engine} other than "
                                    "static, set {temperature} 0"))
        if self.replay_drafter and not self.replay:
            extra.append(("replay_drafter", "names a trace of {replay}'s file: give --replay"))
        if self.ablation and (self.references or self.options.batch_sizes or self.options.engine
                              not in (None, STATIC)):
            extra.append(("ablation", "benches its own chain in draftnas's static loop: drop {references}, "
                                      "{batch_sizes} and {engine} other than static"))
        if self.options.batch_sizes and len(self.references) > 1:
            extra.append(("references",
                          f"takes one drafter with {{batch_sizes}}, not {len(self.references)}"))
        extra += self._family_problems()
        self.options.validate()
        return check_options(self, extra)

    def _family_problems(self) -> list[tuple[str, str]]:
        """A drafter whose family the engine does not take as --draft or --reference: draftnas's loops take
        model drafters there (lookup and the hybrid come in through --lookup)."""
        from draftnas.core.errors import InvalidInputError
        from draftnas.drafter.families import family, parse_drafter

        engine = self.options.kind
        out = []
        for name, text in [("draft", self.draft)] + [("references", r) for r in self.references]:
            try:
                spec = parse_drafter(text)
            except InvalidInputError as e:
                out.append((name, str(e)))
                continue
            if spec.family == "head" and engine.own_loop:
                if name != "draft":
                    out.append((name, f"{text}: in draftnas's loop a head is the benched drafter "
                                      "({draft}); references are model drafters"))
                elif self.options.batch_sizes:
                    out.append((name, f"{text}: a head is benched one request at a time in draftnas's loop "
                                      "(leave out {batch_sizes}, or bench it batched with --engine vllm)"))
            elif spec.family != "model" and engine.own_loop:
                out.append((name, f"{text} is a {spec.family} drafter: in draftnas's loop give lookup "
                                  "settings as {lookup} and a model drafter as {draft}"))
            elif engine.name not in family(spec.family).engines:
                runs = ", ".join(family(spec.family).engines)
                out.append((name, f"{text}: a {spec.family} drafter does not run in {engine.name} (it runs "
                                  f"in {runs})"))
        return out

    def one_reference(self) -> str | None:
        """The reference of a bench that takes one (llama.cpp, batch sizes), None without one."""
        return self.references[0] if self.references else None
