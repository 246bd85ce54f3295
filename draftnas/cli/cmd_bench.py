"""`draftnas bench`: real speculative decoding of target + drafter, measured beside the estimate."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from draftnas.cli.app import app, console, err_console, print_json


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _flag(value: bool | None, why_none: str = "sampling") -> str:
    return f"n/a ({why_none})" if value is None else ("[green]true[/green]" if value else "[red]false[/red]")


def _match(rate: float | None, margins: tuple[float, ...]) -> str:
    if rate is None:
        return "n/a (sampling)"
    text = f"{rate:.0%} of prompts"
    if margins:
        text += (" (target's top-1 minus top-2 logit where they part: "
                 + ", ".join(f"{m:.3g}" for m in margins) + ")")
    return text


@app.command()
def bench(
    target: str = typer.Option(..., "--target", "-t", help="Target model: embedded name, folder or .gguf."),
    draft: str = typer.Option(..., "--draft", "-d", help="Draft model folder (target's tokenizer)."),
    gamma: int = typer.Option(4, "--gamma", "-g", help="Draft tokens per step."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy (checked lossless)."),
    prompts: str = typer.Option("all", "--prompts", "-p", help="Prompt set or JSONL file."),
    per_domain: int | None = typer.Option(2, "--per-domain",
                                          help="At most this many prompts per domain, evenly spaced "
                                               "(0 = all); prompts the drafter was healed on are left "
                                               "out first."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", help="New tokens per prompt."),
    seed: int = typer.Option(0, "--seed", help="Seed of sampling runs."),
    no_hf: bool = typer.Option(False, "--no-hf", help="Skip transformers' assisted generation."),
    no_hf_routed: bool = typer.Option(
        False, "--no-hf-routed",
        help="Skip the second transformers pair (CPU only): the target alone and assisted generation with "
             "both models' linear layers routed through the product that timed fastest here "
             "(draftnas.models.linears.route_linears)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    dtype: str = typer.Option("fp32", "--dtype",
                              help="fp32, bf16 or fp16 (in fp32 outputs must match exactly)."),
    engine: str | None = typer.Option(
        None, "--engine",
        help="The loop's engine. hf: transformers models over a growing cache. static: draftnas's decoder "
             "over a cache allocated once, with CUDA graphs on a GPU. Default: static on cuda, hf on cpu."),
    json_out: bool = typer.Option(False, "--json",
                                  help="Print the result as JSON on stdout (progress stays on stderr)."),
    out_json: Path | None = typer.Option(None, "--out-json",
                                         help="Also write the result as JSON to this file."),
) -> None:
    """Decode with the target alone, draftnas's speculative loop and HF assisted generation; compare."""
    from draftnas.bench.records import BenchOptions
    from draftnas.bench.run import run_bench
    from draftnas.core.prompts import load_prompts

    prompt_list = load_prompts(prompts)
    options = BenchOptions(gamma=gamma, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                           hf_assisted=not no_hf, hf_routed=not no_hf_routed, device=device, dtype=dtype,
                           engine=engine, per_domain=per_domain or None)
    options.validate()
    with Progress(TextColumn("[bold]bench[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console) as bar:
        task = bar.add_task("bench", total=None)
        result = run_bench(target, draft, prompt_list, options,
                           progress=lambda done, total: bar.update(task, completed=done, total=total))
    if out_json is not None:
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    if json_out:
        print_json(result.to_dict())
        return
    per = Table(title="Per prompt", header_style="bold")
    routed = result.hf_routed_tokens_per_s is not None
    for col in ("prompt", "domain", "new tok", "target s", "draftnas s", "HF s",
                *(("HF routed s",) if routed else ()), "tok/step", "lossless"):
        per.add_column(col, justify="left" if col in ("prompt", "domain") else "right")
    for r in result.prompts:
        per.add_row(r.prompt_id, r.domain, str(r.new_tokens), f"{r.target_s:.2f}", f"{r.draftnas_s:.2f}",
                    _fmt(r.hf_assisted_s), *((_fmt(r.hf_routed_s),) if routed else ()),
                    f"{r.draftnas_tokens / max(r.steps, 1):.2f}", _flag(r.lossless))
    console.print(per)
    table = Table(show_header=False,
                  title=f"Speculative decoding, gamma={result.gamma}, T={result.temperature:g} "
                        f"({result.n_prompts} prompts x {result.max_new_tokens} tokens, {result.device}, "
                        f"{result.dtype}, {result.threads} threads, engine {result.engine})")
    rows = [
        ("target alone", f"{result.target_tokens_per_s:.2f} tokens/s"
         + (f"  (transformers generate: {result.hf_target_tokens_per_s:.2f})"
            if result.hf_target_tokens_per_s is not None else "")),
        ("draftnas loop", f"{result.draftnas_tokens_per_s:.2f} tokens/s ({result.draftnas_speedup:.3f}x)"),
        ("HF assisted generate", f"{_fmt(result.hf_assisted_tokens_per_s)} tokens/s "
                                 f"({_fmt(result.hf_assisted_speedup, '.3f')}x)"),
        *([("HF assisted, linears routed",
            f"{result.hf_routed_tokens_per_s:.2f} tokens/s ({result.hf_routed_speedup:.3f}x its target at "
            f"{result.hf_routed_target_tokens_per_s:.2f}; "
            f"{result.hf_routed_tokens_per_s / result.draftnas_tokens_per_s:.2f} of draftnas's loop)")]
          if result.hf_routed_tokens_per_s is not None and result.hf_routed_speedup is not None
          and result.hf_routed_target_tokens_per_s is not None else []),
        ("tokens per step (measured)",
         f"{result.tokens_per_step:.3f}  (HF: {_fmt(result.hf_tokens_per_step, '.3f')})"),
        ("tokens per step (estimated)",
         f"{_fmt(result.predicted_tokens_per_step, '.3f')}  [{_fmt(result.predicted_ci_low, '.3f')}, "
         f"{_fmt(result.predicted_ci_high, '.3f')}] in {_fmt(result.estimator_s)} s"),
        ("mean accepted drafts per step", f"{result.mean_accepted_per_step:.3f} "
                                          f"(acceptance {result.draft_acceptance_rate:.3f})"),
        ("lossless (draftnas / HF / HF routed)", f"{_flag(result.lossless)} / "
         f"{_flag(result.hf_lossless, 'sampling' if result.lossless is None else 'not run')} / "
         f"{_flag(result.hf_routed_lossless, 'sampling' if result.lossless is None else 'not run')}"),
        ("exact match with the target's greedy", _match(result.exact_match_rate, result.divergence_margins)),
        ("drafter ms per drafted token", f"{_fmt(result.draft_ms_per_token)}  (head: "
         + (f"{result.draft_vocab_size:,} of the vocabulary's ids, draft_vocab.json)"
            if result.draft_vocab_size else "full vocabulary)")),
        *([("host", f"{result.host}, load average before {result.load_average_before}")]
          if result.host else []),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    if result.left_out:
        console.print(f"left out {len(result.left_out)} prompt(s) the drafter was healed on: "
                      f"{', '.join(result.left_out)}", highlight=False, soft_wrap=True)
    if out_json is not None:
        console.print(f"result written to {out_json}")
