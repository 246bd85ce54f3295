"""Lookup drafting: the rule (llama.cpp's ngram-simple), its exact replay over a greedy answer, the loop's
losslessness in fp32 alone and beside a model drafter, settings checked in one line, and its pricing."""

from __future__ import annotations

import re

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.lookup import LookupSettings, parse_lookup, propose, replay_lookup
from draftnas.drafter.lookup_loop import lookup_generate
from draftnas.models.speculative import greedy_generate
from tests.helpers import tiny_llama, truncated

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_draft_is_what_followed_the_most_recent_earlier_match():
    history = [9, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 8, 8, 8, 1, 2, 3]
    assert propose(history, 3, 4) == [8, 8, 8, 1]  # the match at 8 (most recent), not at 1
    assert propose(history, 2, 2) == [8, 8]
    assert propose(history, 3, 2) == []  # a draft shorter than the match is never made (llama.cpp's rule)
    assert propose(history[:12], 3, 4) == []  # history of n + m + 2 tokens or fewer: no draft
    assert propose([5, 6, 7, 8, 9, 10, 11, 12, 13, 14], 2, 3) == []  # no earlier match
    # fewer than n tokens follow the match (it ends just before the pattern): no draft
    assert propose([1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 9, 9], 2, 2) == []


def test_settings_parse_and_refuse_out_of_range_in_one_line():
    assert parse_lookup("lookup") == LookupSettings()
    assert parse_lookup("lookup:n=4,m=12") == LookupSettings(n=4, m=12)
    assert parse_lookup("lookup:ngram-mod,n=8,m=32").kind == "ngram-mod"
    assert LookupSettings(n=2, m=3, kind="ngram-map-k").label == "lookup:ngram-map-k,n=2,m=3"
    for bad, said in (("lookup:n=0", "n=0 is out of range (allowed: 1-32)"),
                      ("lookup:m=65", "m=65 is out of range (allowed: 1-64)"),
                      ("lookup:k=3", "'k=3' is not understood"), ("lookup:ngram-foo", "not understood")):
        with pytest.raises(InvalidInputError, match=re.escape(said)) as e:
            parse_lookup(bad)
        assert "\n" not in str(e.value)
    flags = LookupSettings(n=3, m=6).llama_cpp_flags()
    assert flags[:2] == ["--spec-type", "ngram-simple"] and "--spec-ngram-simple-size-n" in flags


@pytest.fixture(scope="module")
def pair(tiny_llama_config):
    target = tiny_llama(tiny_llama_config, initializer_range=0.2)
    return target, truncated(target, 2)


# prompts that repeat themselves, so lookup finds matches
PROMPTS = [[1, 5, 9, 3, 7, 1, 5, 9, 3, 7, 1, 5, 9], [2, 4, 8, 16, 32, 64, 2, 4, 8, 16, 32, 64, 2, 4, 8],
           list(range(40, 60)) * 2]


def test_the_loop_is_lossless_and_its_steps_are_the_replay(pair):
    target, _ = pair
    settings = LookupSettings(n=2, m=4)
    drafted_any = False
    for prompt in PROMPTS:
        want = greedy_generate(target, prompt, max_new_tokens=30)
        out = lookup_generate(target, prompt, settings, max_new_tokens=30)
        assert out.tokens == want
        replay = replay_lookup(prompt, want, settings.n, settings.m)
        assert (tuple(out.drafted), tuple(out.accepted)) == (replay.drafted, replay.accepted)
        assert len(out.tokens) == 1 + sum(out.accepted) + out.steps
        drafted_any |= sum(out.drafted) > 0
    assert drafted_any  # the test exercises verification, not only plain steps


@pytest.mark.parametrize("policy", ["fallback", "longer"])
def test_a_hybrid_with_a_model_drafter_is_lossless(pair, policy):
    target, drafter = pair
    for prompt in PROMPTS:
        want = greedy_generate(target, prompt, max_new_tokens=30)
        out = lookup_generate(target, prompt, LookupSettings(n=2, m=4), max_new_tokens=30, drafter=drafter,
                              gamma=3, policy=policy)
        assert out.tokens == want
        assert sum(out.drafted) > 0


def test_the_static_engine_runs_lookup_as_transformers_does(pair):
    from draftnas.models.decoder import StaticDecoder
    from draftnas.models.engines import StaticEngine

    target, drafter = pair
    engine = StaticEngine(StaticDecoder.from_hf(target, max_positions=128), 128)
    d_engine = StaticEngine(StaticDecoder.from_hf(drafter, max_positions=128), 128)
    for prompt in PROMPTS:
        hf = lookup_generate(target, prompt, LookupSettings(n=2, m=4), max_new_tokens=20, drafter=drafter,
                             gamma=2)
        out = lookup_generate(engine, prompt, LookupSettings(n=2, m=4), max_new_tokens=20, drafter=d_engine,
                              gamma=2)
        assert out.tokens == hf.tokens and out.accepted == hf.accepted


def test_an_unknown_policy_is_one_line():
    with pytest.raises(InvalidInputError, match="hybrid policy 'both' is unknown"):
        lookup_generate(None, [1], LookupSettings(), max_new_tokens=4, policy="both")


def test_a_setting_is_priced_from_its_replay_and_the_step_costs():
    from draftnas.search.lookup import price_setting, step_ms

    batch = {1: 10.0, 2: 14.0, 3: 16.0, 5: 20.0}
    assert step_ms(10.0, batch, 0) == 10.0 and step_ms(10.0, batch, 2) == 16.0
    assert step_ms(10.0, batch, 3) == 18.0  # between the 3- and 5-token batches
    prompt = [7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2]
    answer = [3, 4, 5, 6, 8, 9, 1, 2, 0, 0]
    price = price_setting(LookupSettings(n=2, m=2), [(prompt, answer)], 10.0, batch)
    replay = replay_lookup(prompt, answer, 2, 2)
    spent = sum(16.0 if d == 2 else 10.0 for d in replay.drafted)
    assert price.speedup == pytest.approx((len(answer) - 1) * 10.0 / spent, abs=1e-4)
    assert price.tokens_per_step == pytest.approx((sum(replay.accepted) + replay.steps) / replay.steps,
                                                  abs=1e-4)
    assert price.break_even_tokens_per_step == 1.6


def test_a_best_setting_on_the_grid_edge_is_warned_about():
    from draftnas.cli.cmd_lookup import edge_warnings
    from draftnas.search.lookup import price_setting
    from draftnas.search.lookup_records import LookupResult

    traces = [([7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2, 3, 4], [5, 6, 8, 9, 1, 2, 3, 4, 5, 6, 8, 9, 0])]
    batch = {1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0, 5: 14.0}
    priced = [price_setting(LookupSettings(n=n, m=m), traces, 10.0, batch) for n in (1, 2) for m in (2, 4)]
    prices = sorted(priced, key=lambda p: -p.speedup)
    result = LookupResult(target="t", engine="llama.cpp", workload="w", searched_prompts=("a",),
                          heldout_prompts=("b",), heldout_file="f", context_tokens=8, decode_ms=10.0,
                          batch_ms=batch, prices=tuple(prices), flags=())
    said = edge_warnings(result)
    assert ("draft length m (4)" in " ".join(said)) == (prices[0].m == 4)
    assert all(line.startswith("WARNING: the best ") for line in said)


def test_every_third_prompt_is_held_out_for_the_bench_unless_asked_not_to():
    from draftnas.core.prompts import load_prompts
    from draftnas.search.lookup import split_prompts
    from draftnas.search.lookup_records import LookupRequest

    prompts = load_prompts("edit")
    searched, held = split_prompts(prompts)
    assert [p.id for p in held] == [p.id for i, p in enumerate(prompts) if i % 3 == 0]
    assert not {p.id for p in searched} & {p.id for p in held} and len(searched) + len(held) == len(prompts)
    kinds = {p.text.split()[0] + p.text.split()[1] for p in held}
    assert len(kinds) >= 5  # the held-out prompts meet (almost) every kind of edit, not two of six
    assert LookupRequest(held_out=False).validate().held_out is False


def test_the_servers_steps_rescale_llama_benchs_batches_to_what_the_server_spent():
    """llama-bench times a batch alone, and its costs priced the server's speculative steps 17-24% too
    cheaply on edit; the search answers again with its pick and prices every step at the server's cost."""
    from draftnas.search.lookup import price_setting, server_step_scale

    prompt = [7, 1, 2, 3, 4, 5, 6, 8, 9, 1, 2]
    answer = [3, 4, 5, 6, 8, 9, 1, 2, 0, 0]
    settings, batch = LookupSettings(n=2, m=2), {1: 10.0, 2: 14.0, 3: 16.0}
    replay = replay_lookup(prompt, answer, 2, 2)
    decodes = sum(d == 0 for d in replay.drafted)
    drafting = sum(16.0 for d in replay.drafted if d == 2)
    assert decodes and drafting  # the answer has both kinds of step
    plain_ms = [(len(answer) - 1) * 12.0]  # the server decodes at 12 ms, llama-bench said 10
    lookup_ms = [decodes * 12.0 + 1.25 * drafting]  # and its drafting steps cost 1.25x llama-bench's batch
    decode, scale = server_step_scale(settings, [(prompt, answer)], plain_ms, lookup_ms, 10.0, batch)
    assert decode == pytest.approx(12.0) and scale == pytest.approx(1.25)
    priced = price_setting(settings, [(prompt, answer)], decode, {k: v * scale for k, v in batch.items()})
    assert priced.speedup == pytest.approx(plain_ms[0] / lookup_ms[0], abs=1e-4)  # what the server spent
    # nothing timed (a server that returned no timings): llama-bench's costs as they were
    assert server_step_scale(settings, [(prompt, answer)], [0.0], [0.0], 10.0, batch) == (10.0, 1.0)
