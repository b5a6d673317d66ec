"""The transformers child's reading of a call, without torch: every field checked by name,
the folder's generation_config as defaults, tool-call blocks parsed into OpenAI's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fitbox.engines.tf_child.refusal import BadRequest
from fitbox.engines.tf_child.request import folder_defaults, read
from fitbox.engines.tf_child.tools import call_schema, check_template, parsed

HELLO = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def ask(**fields: Any) -> Any:
    return read({"messages": HELLO, **fields}, lambda c: c, {})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": "10"}, "max_tokens"),
        ({"max_tokens": -2}, "max_tokens"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stop": [1]}, "stop"),
        ({"logit_bias": {"5": 300}}, "logit_bias"),
        ({"seed": 1.5}, "seed"),
        ({"prediction": {"type": "content"}}, "prediction"),
        ({"functions": []}, "functions"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": [TOOL], "tool_choice": {"function": {"name": "g"}}}, "tool_choice"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
    ],
)
def test_a_field_the_child_cannot_take_is_refused_naming_it(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        ask(**fields)
    assert refused.value.param == param
    assert "Traceback" not in str(refused.value) and "invalid literal" not in str(refused.value)


def test_max_tokens_as_llama_server_reads_it() -> None:
    assert ask(max_tokens=0).max_tokens == 1  # llama-server makes one token (finish: length)
    assert ask(max_tokens=-1).max_tokens == -1  # up to the window
    assert ask().max_tokens == -1
    assert ask(max_tokens=5, max_completion_tokens=7).max_tokens == 7


def test_the_folders_generation_config_fills_what_the_call_leaves_out(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.1})
    )
    defaults = folder_defaults(tmp_path)
    request = read({"messages": HELLO, "top_p": 0.5}, lambda c: c, defaults)
    s = request.sampling
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty) == (0.6, 20, 0.5, 1.1)
    (tmp_path / "generation_config.json").write_text('{"do_sample": false}')
    assert (
        read({"messages": HELLO}, lambda c: c, folder_defaults(tmp_path)).sampling.temperature == 0
    )


def test_tool_call_blocks_become_openai_tool_calls() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    content, calls = parsed(text)
    assert content == "Let me look."
    (call,) = calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert parsed("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    assert parsed("no call") == ("no call", [])


def test_a_template_without_tools_is_refused_and_a_forced_call_has_its_schema() -> None:
    for template in ("{{ messages }}", "{% if tools %}{{ tools }}{% endif %}[TOOL_CALLS]"):
        with pytest.raises(BadRequest) as refused:
            check_template(template)
        assert refused.value.param == "tools"
    check_template("{% if tools %}<tool_call>{% endif %}")
    two = [TOOL, {"type": "function", "function": {"name": "g"}}]
    assert len(call_schema(two, None)["anyOf"]) == 2
    assert call_schema(two, "g")["properties"]["name"] == {"const": "g"}
