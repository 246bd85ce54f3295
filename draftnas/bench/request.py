"""`draftnas bench` as one call: the request's prompts through the engine it names, and with the
llama.cpp engine's `torch_arms` the same prompts through draftnas's loop after it."""

from __future__ import annotations

from dataclasses import replace

from draftnas.bench.batch_records import BatchedBenchResult
from draftnas.bench.records import BenchResult
from draftnas.bench.replay_records import ReplayResult
from draftnas.bench.request_records import BenchRequest
from draftnas.core.engine_kinds import LLAMA_CPP, STATIC, VLLM
from draftnas.core.prompts import load_prompts
from draftnas.core.records import Progress


def bench_from_request(request: BenchRequest, *, progress: Progress | None = None,
                       torch_progress: Progress | None = None
                       ) -> tuple[BenchResult | BatchedBenchResult | ReplayResult, BenchResult | None]:
    """The bench the request asks for (the arms in one interleaved run, or with `batch_sizes` the
    batched loop per batch size, or with `replay` the recorded acceptance over random weights of the
    named shapes) and, for the llama.cpp engine with `torch_arms`, draftnas's own loop on the same
    prompts (None otherwise)."""
    from draftnas.bench.run import run_batch_sizes, run_bench

    options = request.validate().options
    if request.replay:
        from draftnas.bench.replay import run_replay

        return run_replay(request, progress=progress), None
    if request.ablation:
        from draftnas.bench.ablation import run_ablation

        return run_ablation(request, progress=progress), None
    prompts = load_prompts(request.prompts)
    if options.engine == LLAMA_CPP:
        from draftnas.bench.llama_cpp import run_llama_cpp_bench

        result: BenchResult | BatchedBenchResult | ReplayResult = run_llama_cpp_bench(
            request.target, request.draft, prompts, options, references=request.references, progress=progress)
    elif options.engine == VLLM and options.batch_sizes:
        from draftnas.bench.vllm_batched import run_vllm_batch_sizes

        result = run_vllm_batch_sizes(request.target, request.draft, prompts, options,
                                      references=request.references, progress=progress)
    elif options.engine == VLLM:
        from draftnas.bench.vllm import run_vllm_bench

        result = run_vllm_bench(request.target, request.draft, prompts, options,
                                references=request.references, progress=progress)
    elif options.batch_sizes:
        result = run_batch_sizes(request.target, request.draft, prompts, options,
                                 reference=request.one_reference(), progress=progress)
    else:
        result = run_bench(request.target, request.draft, prompts, options, references=request.references,
                           progress=progress)
    if options.engine != LLAMA_CPP or not options.torch_arms:
        return result, None
    torch_options = replace(options, engine=STATIC, hf_assisted=False, hf_routed=False, predictions=None)
    return result, run_bench(request.target, request.draft, prompts, torch_options,
                             references=request.references, progress=torch_progress)
