"""The ablation chain: from the stock drafter to a winner, one transform per link, each a study trial."""

from __future__ import annotations

from types import SimpleNamespace as NS

from draftnas.search.ablation import ablation_chain
from draftnas.search.records import CandidateChoice

FULL = 24


def _trial(number, hand_made=None, p_min=0.0, **choice):
    choice = CandidateChoice(**{"depth": FULL, **choice})
    return NS(number=number, hand_made=hand_made, candidate=NS(choice=choice), primary=NS(p_min=p_min))


def _result(*ranked):
    return NS(ranked=ranked, info=NS(base_arch=NS(num_hidden_layers=FULL)))


def test_a_per_layer_winner_is_reached_by_format_head_shape_then_per_layer_formats():
    per_layer = "attn=int8,mlp=int8,head=int4"
    winner = _trial(30, depth=20, layer_selection="block_influence", vocab_size=32768, weights=per_layer)
    stock = _trial(0, "dense, full head", layer_selection="first")
    int8 = _trial(3, "int8, full head", layer_selection="first", weights="int8")
    head = _trial(4, "int8, head 32768", layer_selection="first", weights="int8", vocab_size=32768)
    shaped = _trial(17, depth=20, layer_selection="block_influence", vocab_size=32768, weights="int8")
    links, notes = ablation_chain(_result(winner, head, shaped, int8, stock), winner)
    assert [(link.adds, link.trial.number) for link in links] == [
        ("stock", 0), ("+ int8 weights", 3), ("+ head of 32,768 rows", 4), ("+ depth/width/selection", 17),
        ("+ per-layer formats", 30)]
    assert notes == []


def test_a_link_the_study_did_not_price_is_left_out_with_a_note_and_the_stock_runs_by_name():
    winner = _trial(9, layer_selection="block_influence", vocab_size=8192, weights="int4")
    links, notes = ablation_chain(_result(winner), winner)
    assert [link.adds for link in links] == ["stock", "+ head of 8,192 rows"]  # the head link is the winner
    assert links[0].trial is None and links[-1].trial.number == 9
    assert len(notes) == 1 and notes[0].startswith("'+ int4 weights': the study priced no drafter")


def test_a_winner_that_is_the_stock_drafter_under_one_transform_needs_no_shape_link():
    winner = _trial(2, "int8, full head", layer_selection="first", weights="int8")
    links, _ = ablation_chain(_result(winner), winner)
    assert [(link.adds, link.trial.number if link.trial else None) for link in links] == [
        ("stock", None), ("+ int8 weights", 2)]


def test_a_winner_with_a_confidence_stop_ends_the_chain_with_it_every_link_before_at_a_fixed_gamma():
    winner = _trial(5, "int4, head 98304", p_min=0.6, layer_selection="first", weights="int4",
                    vocab_size=98304)
    int4 = _trial(4, "int4, full head", layer_selection="first", weights="int4")
    links, _ = ablation_chain(_result(winner, int4), winner)
    assert [(link.adds, link.trial.number if link.trial else None, link.stop) for link in links] == [
        ("stock", None, False), ("+ int4 weights", 4, False), ("+ head of 98,304 rows", 5, False),
        ("+ confidence stop (below 0.6)", 5, True)]
