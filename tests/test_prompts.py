"""The prompt-token bound's parts (core/prompts.py, models/templates.py); the bound against
the real tokenizer is tests/test_slots_e2e.py."""

from __future__ import annotations

from fitbox.core.prompts import ADDED_TOKENS, CHATML_BYTES, TOJSON_GROWTH, prompt_bound
from fitbox.models.templates import emitted_bytes


def test_a_template_counts_its_text_expressions_and_statement_literals_only() -> None:
    template = "{# note #}{% for m in messages %}<|im_start|>{{ m['content'] }}{% endfor %}"
    assert emitted_bytes(template) == len("<|im_start|>{{ m['content'] }}")
    greeting = "{% set hello = 'You are kind.' %}{{ hello }}"
    assert emitted_bytes(greeting) == len("'You are kind.'") + len("{{ hello }}")


def test_a_chat_bound_takes_the_template_once_per_item_and_once_more_and_every_value() -> None:
    one = {"messages": [{"role": "user", "content": "é"}]}
    assert (
        prompt_bound(one, 100)
        == 2 * 100 + len('{"messages": [{"role": "user", "content": "é"}]}'.encode()) + ADDED_TOKENS
    )
    tools = {**one, "tools": [{"type": "function"}]}
    tools_json = len('[{"type": "function"}]')
    assert (
        prompt_bound(tools, 100)
        == prompt_bound(one, 100) + 100 + len(', "tools": ') + TOJSON_GROWTH * tools_json
    )
    system = {**one, "system": "Be brief."}  # an Anthropic body's system is rendered too
    assert prompt_bound(system, 100) == prompt_bound(one, 100) + len(', "system": "Be brief."')
    assert prompt_bound(one, 0) == prompt_bound(one, CHATML_BYTES)  # no template: chatml
    responses = {"input": "hi", "instructions": "Be brief."}
    assert (
        prompt_bound(responses, 100)
        == 2 * 100 + len('{"input": "hi", "instructions": "Be brief."}') + ADDED_TOKENS
    )


def test_a_completion_bound_is_its_text_bytes() -> None:
    assert prompt_bound({"prompt": "héllo"}, 500) == 6 + ADDED_TOKENS
    assert prompt_bound({"prompt": ["a", "b"]}, 500) == len('["a", "b"]') + ADDED_TOKENS
    assert prompt_bound({}, 500) == 0
