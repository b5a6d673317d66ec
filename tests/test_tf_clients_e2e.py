"""Real clients against a transformers chat folder that takes tools, through fitbox: the
``openai`` SDK's tools, ``parse``, ``n`` and logprobs, LangChain's ``bind_tools`` and
instructor's TOOLS mode, each read back into its own types.

The folder is SmolLM2 under a Hermes/Qwen-style tool template (support/tf_engine.py
``tool_folder``). A 135M model does not choose to call a tool well on its own; a forced
``tool_choice`` (required, or a tool named, as LangChain's ``tool_choice`` and instructor
send it) is a grammar the child enforces while the tokens are drawn (tf_child/grammar.py),
so every call these clients make is well-formed whatever the model prefers: what is tested
is the path from the request to the client's own objects, not the model's judgement.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import instructor
import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from pydantic import BaseModel, SecretStr

from .support.clients import openai_client
from .support.processes import FitboxProcess, running_fitbox
from .support.tf_engine import engine_env, tool_folder

pytestmark = pytest.mark.engine
MODEL = "smol-tools"
WEATHER: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather now in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, tf_python: Path, smol_tf: Path
) -> Iterator[FitboxProcess]:
    tmp = tmp_path_factory.mktemp("tf-clients")
    tool_folder(smol_tf, tmp / "models" / MODEL)
    with running_fitbox(tmp / "home", [tmp / "models"], env=engine_env(tf_python, tmp)) as box:
        yield box


class Person(BaseModel):
    name: str
    age: int


def test_openai_sdk_tools_parse_n_and_logprobs(box: FitboxProcess) -> None:
    client = openai_client(box.url, timeout=300, max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=WEATHER, tool_choice="required", n=2, logprobs=True
    )
    assert len(reply.choices) == 2
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        call = choice.message.tool_calls[0]
        assert call.type == "function"
        assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
        assert choice.logprobs is not None and choice.logprobs.content
    history: list[ChatCompletionMessageParam] = [
        *ASK,
        reply.choices[0].message.model_dump(exclude_none=True),  # type: ignore[list-item]
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=history, tools=WEATHER, tool_choice="none", max_tokens=20
    )
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    person = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Alice is 30. Who is she?"}],
        response_format=Person,
        temperature=0,
        max_tokens=40,
    )
    assert isinstance(person.choices[0].message.parsed, Person)


@tool
def get_weather(city: str) -> str:
    """The weather now in a city."""
    return "Sunny"


def test_langchain_bind_tools(box: FitboxProcess) -> None:
    chat = ChatOpenAI(
        model=MODEL,
        base_url=f"{box.url}/v1",
        api_key=SecretStr("unused"),
        max_retries=0,
        timeout=300,
        temperature=0,  # a 135M model sampling at 1.0 may write a city name for pages
        max_completion_tokens=60,
    )
    for choice in ("get_weather", "any"):
        bound = chat.bind_tools([get_weather], tool_choice=choice)
        message = bound.invoke("What is the weather in Paris?")
        assert isinstance(message, AIMessage)
        (call,) = message.tool_calls
        assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
        assert call["id"]


def test_instructor_tools_mode(box: FitboxProcess) -> None:
    client = instructor.from_openai(
        openai_client(box.url, timeout=300, max_retries=0), mode=instructor.Mode.TOOLS
    )
    person = client.chat.completions.create(
        model=MODEL,
        response_model=Person,
        messages=[{"role": "user", "content": "Bob is 42 years old. Extract him."}],
        temperature=0,
        max_tokens=40,
        max_retries=0,
    )
    assert isinstance(person, Person) and person.name and isinstance(person.age, int)
