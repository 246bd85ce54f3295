"""Prompt sets: shipped sets, user JSONL validation, chat-template encoding."""

from __future__ import annotations

import json

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.core.prompts import (
    DOMAINS,
    TRANSLATION_LANGUAGES,
    Prompt,
    encode_prompt,
    load_prompts,
    prompt_set_hash,
    shipped_sets,
)


def test_shipped_sets_have_30_prompts_per_domain_and_valid_fields():
    for domain in DOMAINS:
        prompts = load_prompts(domain)
        assert len(prompts) >= 30, domain
        assert all(p.domain == domain and p.text.strip() and p.id for p in prompts)
    everything = load_prompts("all")
    assert len({p.id for p in everything}) == len(everything)
    assert len(everything) == sum(len(load_prompts(d)) for d in DOMAINS)


def test_translation_languages_are_tagged_and_selectable():
    translation = load_prompts("translation")
    assert {p.language for p in translation} == set(TRANSLATION_LANGUAGES)
    for lang in TRANSLATION_LANGUAGES:
        subset = load_prompts(f"translation-{lang}")
        assert subset and all(p.language == lang for p in subset)
    assert all(p.language == "en" for p in load_prompts("chat"))


def test_comma_list_and_per_domain_sampling_cover_languages():
    both = load_prompts("chat,code")
    assert {p.domain for p in both} == {"chat", "code"}
    sample = load_prompts("translation", per_domain=5)
    assert len(sample) == 5
    assert {p.language for p in sample} == set(TRANSLATION_LANGUAGES)
    assert len(load_prompts("all", per_domain=2)) == 2 * len(DOMAINS)


def test_unknown_set_is_refused_with_the_allowed_names():
    with pytest.raises(InvalidInputError, match="unknown prompt set 'poetry'.*chat"):
        load_prompts("poetry")
    assert "translation-ja" in shipped_sets()


def test_user_jsonl_defaults_and_hash(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"text": "Hello"}) + "\n\n" + json.dumps(
        {"id": "b", "domain": "legal", "language": "fr", "text": "Bonjour"}) + "\n")
    prompts = load_prompts(str(path))
    assert prompts == (Prompt(id="line-1", domain="custom", text="Hello"),
                       Prompt(id="b", domain="legal", text="Bonjour", language="fr"))
    assert prompt_set_hash(prompts) == prompt_set_hash(list(prompts))
    assert prompt_set_hash(prompts) != prompt_set_hash(prompts[:1])


def test_user_jsonl_errors_name_every_bad_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([
        json.dumps({"id": "a", "text": "ok"}),
        "{not json",
        json.dumps({"id": "b", "text": ""}),
        json.dumps({"id": "a", "text": "again"}),
        json.dumps(["a list"]),
        json.dumps({"text": "x", "domain": 3}),
    ]))
    with pytest.raises(InvalidInputError) as info:
        load_prompts(str(path))
    message = str(info.value)
    assert "\n" not in message
    for part in ("line 2: not valid JSON", "line 3: field 'text'", "line 4: duplicate id 'a'",
                 "line 5: expected a JSON object", "line 6: field 'domain'"):
        assert part in message


class _ChatTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and tokenize
        return {"input_ids": [1, 2, len(messages[0]["content"])], "attention_mask": [1, 1, 1]}


class _PlainTokenizer:
    chat_template = None

    def __call__(self, text):
        return {"input_ids": [7] * len(text)}


def test_encode_prompt_uses_the_chat_template_when_present():
    assert encode_prompt(_ChatTokenizer(), "abcd") == [1, 2, 4]
    assert encode_prompt(_PlainTokenizer(), "abc") == [7, 7, 7]


def test_the_context_workloads_load_by_name_with_long_prompts_and_a_licence_each():
    import json
    from importlib import resources

    from draftnas.core.prompts import WORKLOADS

    for name in WORKLOADS:
        prompts = load_prompts(name)
        assert len(prompts) >= 24 and {p.domain for p in prompts} == {name}
        assert min(len(p.text) for p in prompts) > 600  # hundreds of tokens of context at least
        raw = resources.files("draftnas").joinpath("data", "prompts", f"{name}.jsonl").read_text("utf-8")
        assert all("PSF-2.0" in row["source"] or "Apache-2.0" in row["source"]
                   for row in map(json.loads, raw.splitlines()))
    assert not {p.domain for p in load_prompts("all")} & set(WORKLOADS)  # the main job's set is unchanged


def test_a_prompt_longer_than_the_context_is_one_line_naming_it():
    from draftnas.core.errors import InvalidInputError
    from draftnas.core.prompts import Prompt, check_context

    prompts = [Prompt(id="short", domain="x", text="a"), Prompt(id="long", domain="x", text="b")]
    check_context(prompts, [[1] * 10, [1] * 50], 14, 64, "static")
    with pytest.raises(InvalidInputError) as e:
        check_context(prompts, [[1] * 10, [1] * 60], 14, 64, "static")
    assert str(e.value).startswith("prompt long has 60 tokens; with 14 new tokens it needs 74 positions, "
                                   "more than the 64 the target holds in static")
