"""The transformers child keeps each call's contract: through fitbox, against real children
in the engine venv, with SmolLM2 (as a folder, and under a chat template that takes tools)
and all-MiniLM-L6-v2.

Every field is honoured (``n``, logprobs, seed, tools through the template, structured
output enforced while tokens are drawn, embeddings' base64 and dimensions) or refused naming
it; the child runs one call at a time and says so, so a second call waits in fitbox's queue;
a call whose client leaves stops at the child's next token. Holds are events: a SIGSTOPped
child, a call forced long by its logit bias, the child's own token count.
"""

from __future__ import annotations

import base64
import json
import math
import os
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionToolParam,
)
from pydantic import BaseModel

from .support.clients import openai_client
from .support.holds import HOLD_IDLE_TIMEOUT, Background, resident, until
from .support.processes import FitboxProcess, running_fitbox
from .support.tf_engine import MINILM_DIM, engine_env, matryoshka_folder, tool_folder

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct-f32"
TOOLS_MODEL = "smol-tools"
MINILM = "all-MiniLM-L6-v2"
MRL = "minilm-matryoshka"
WINDOW = 1024  # two prompts of 600 tokens fit it alone, not together
EOS = 2  # SmolLM2's <|im_end|>: a bias of -100 keeps a call going to its max_tokens
HELLO: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}
]
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
ASK_WEATHER: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris?"}
]


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory, tf_python: Path, smol_tf: Path, minilm_tf: Path
) -> Iterator[FitboxProcess]:
    tmp = tmp_path_factory.mktemp("tfc")
    root = tmp / "models"
    root.mkdir()
    for folder in (smol_tf, minilm_tf):
        (root / folder.name).symlink_to(folder)
    tool_folder(smol_tf, root / TOOLS_MODEL)
    matryoshka_folder(minilm_tf, root / MRL)
    env = engine_env(tf_python, tmp) | HOLD_IDLE_TIMEOUT | {"FITBOX_CTX": str(WINDOW)}
    with running_fitbox(tmp / "home", [root], env=env) as running:
        yield running


def client_for(box: FitboxProcess) -> openai.OpenAI:
    return openai_client(box.url, timeout=300, max_retries=0)


def child_props(box: FitboxProcess, model: str) -> dict[str, Any]:
    """The child's own report (/props): its port read from its command line."""
    argv = psutil.Process(int(resident(box, model)["pid"])).cmdline()
    port = argv[argv.index("--port") + 1]
    props: dict[str, Any] = httpx.get(f"http://127.0.0.1:{port}/props", timeout=30).json()
    return props


def test_n_choices_logprobs_and_a_seed(box: FitboxProcess) -> None:
    client = client_for(box)
    two = client.chat.completions.create(
        model=SMOL, messages=HELLO, max_tokens=6, temperature=0, n=2, logprobs=True, top_logprobs=3
    )
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].message.content == two.choices[1].message.content  # greedy, both
    assert two.usage is not None and two.usage.completion_tokens <= 12
    for choice in two.choices:
        assert choice.logprobs is not None and choice.logprobs.content
        first = choice.logprobs.content[0]
        assert first.logprob <= 0 and len(first.top_logprobs) == 3
        assert first.token == first.top_logprobs[0].token  # greedy: the likeliest token
        text = "".join(t.token for t in choice.logprobs.content)
        assert text == choice.message.content
    seeded = [
        client.chat.completions.create(
            model=SMOL,
            messages=HELLO,
            max_tokens=8,
            temperature=1.5,
            seed=7,
            n=3,
            extra_body={"top_k": 40},
        )
        for _ in range(2)
    ]
    texts = [[c.message.content for c in s.choices] for s in seeded]
    assert texts[0] == texts[1]  # the same seed, the same draws
    streamed = client.chat.completions.create(
        model=SMOL, messages=HELLO, max_tokens=4, temperature=0, n=2, stream=True
    )
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in streamed if c.choices}
    assert set(finishes) == {0, 1} and all(finishes.values())


GENERATE = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, question, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder).eval()
ids = tokenizer.apply_chat_template(
    [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt",
    return_dict=True,
)["input_ids"]
out = model.generate(ids, max_new_tokens=n, do_sample=False)
print(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
"""


def test_greedy_choices_are_generates_token_for_token(
    box: FitboxProcess, tf_python: Path, smol_tf: Path
) -> None:
    """The decode loop (each choice a row of one batch) against transformers' own
    ``generate`` at temperature 0, run in the engine venv on the same folder."""
    question = "Name three rivers of Europe."
    reply = client_for(box).chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": question}],
        max_tokens=16,
        temperature=0,
        n=2,
    )
    own = subprocess.run(
        [str(tf_python), "-c", GENERATE, str(smol_tf), question, "16"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"},
    ).stdout.removesuffix("\n")
    assert [c.message.content for c in reply.choices] == [own, own]


def test_tools_reach_the_template_and_come_back_as_tool_calls(box: FitboxProcess) -> None:
    client = client_for(box)
    bare = client.chat.completions.create(model=TOOLS_MODEL, messages=ASK_WEATHER, max_tokens=1)
    called = client.chat.completions.create(
        model=TOOLS_MODEL, messages=ASK_WEATHER, tools=WEATHER, tool_choice="required"
    )
    assert bare.usage is not None and called.usage is not None
    assert called.usage.prompt_tokens > bare.usage.prompt_tokens + 50  # the tools are in it
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    named: ChatCompletionNamedToolChoiceParam = {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    stream = client.chat.completions.create(
        model=TOOLS_MODEL, messages=ASK_WEATHER, tools=WEATHER, tool_choice=named, stream=True
    )
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [t for d in deltas for t in d.delta.tool_calls or []]
    assert [t.function.name for t in calls if t.function] == ["get_weather"]
    assert deltas[-1].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError) as refused:  # its template shows no tools
        client.chat.completions.create(model=SMOL, messages=ASK_WEATHER, tools=WEATHER)
    assert refused.value.body["param"] == "tools"  # type: ignore[index]
    assert "chat template takes no tools" in refused.value.body["message"]  # type: ignore[index]


class City(BaseModel):
    city: str
    country: str


def test_structured_output_is_enforced_while_tokens_are_drawn(box: FitboxProcess) -> None:
    client = client_for(box)
    ask: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Name a city and its country."}
    ]
    parsed = client.chat.completions.parse(
        model=TOOLS_MODEL, messages=ask, response_format=City, temperature=0, max_tokens=60
    )
    city = parsed.choices[0].message.parsed
    assert isinstance(city, City) and city.city and city.country
    loose = client.chat.completions.create(
        model=SMOL,
        messages=ask,
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=60,
    )
    content = loose.choices[0].message.content
    assert content is not None and isinstance(json.loads(content), dict)


def error_of(box: FitboxProcess, body: dict[str, Any], route: str = "chat/completions") -> Any:
    reply = httpx.post(f"{box.url}/v1/{route}", json=body, timeout=300)
    assert reply.status_code == 400, reply.text
    return reply.json()["error"]


def test_what_the_child_cannot_do_is_refused_by_name(box: FitboxProcess) -> None:
    base = {"model": SMOL, "messages": HELLO}
    for field, value, said in (
        ("max_tokens", "ten", "'max_tokens' must be an integer"),
        ("temperature", "hot", "'temperature' must be a number"),
        ("top_logprobs", 3, "'top_logprobs' needs 'logprobs': true"),
        ("audio", {"voice": "alloy"}, "makes text only"),
        ("response_format", {"type": "xml"}, "'response_format.type' must be"),
        ("tool_choice", "required", "'tool_choice' needs 'tools'"),
    ):
        error = error_of(box, base | {field: value})
        assert error["param"] == field and said in error["message"], error
        assert error["type"] == "invalid_request_error"
    nothing = client_for(box).chat.completions.create(model=SMOL, messages=HELLO, max_tokens=0)
    assert nothing.usage is not None and nothing.usage.completion_tokens == 1  # llama-server's
    assert nothing.choices[0].finish_reason == "length"


def test_embeddings_in_base64_and_cut_only_where_the_model_allows(box: FitboxProcess) -> None:
    texts = ["a cat", "tax law"]
    floats = httpx.post(
        f"{box.url}/v1/embeddings", json={"model": MINILM, "input": texts}, timeout=300
    ).json()
    packed = httpx.post(
        f"{box.url}/v1/embeddings",
        json={"model": MINILM, "input": texts, "encoding_format": "base64"},
        timeout=300,
    ).json()
    for plain, coded in zip(floats["data"], packed["data"], strict=True):
        raw = base64.b64decode(coded["embedding"])
        assert list(struct.unpack(f"<{MINILM_DIM}f", raw)) == pytest.approx(plain["embedding"])
    error = error_of(box, {"model": MINILM, "input": texts, "dimensions": 128}, "embeddings")
    assert error["param"] == "dimensions" and "not trained to be cut" in error["message"]
    full = client_for(box).embeddings.create(model=MRL, input=texts).data[0].embedding
    cut = client_for(box).embeddings.create(model=MRL, input=texts, dimensions=128).data[0]
    norm = math.sqrt(sum(x * x for x in full[:128]))
    assert cut.embedding == pytest.approx([x / norm for x in full[:128]], abs=1e-5)


def long_call_socket(box: FitboxProcess, max_tokens: int) -> socket.socket:
    """A whole call sent on a socket the test closes when it chooses (its client leaving);
    the end token is biased away so the call would run to ``max_tokens``."""
    body = json.dumps(
        {
            "model": TOOLS_MODEL,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "logit_bias": {str(EOS): -100},
        }
    ).encode()
    host, port = box.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_a_second_call_waits_in_the_queue_and_an_abandoned_one_stops(
    box: FitboxProcess,
) -> None:
    """The child runs one call: a second waits at fitbox's door, seen in /v1/queue. The
    first one's client leaves after 10 tokens of 500: the child stops making them, the
    waiting call runs, and the first call's row says abandoned."""
    client = client_for(box)
    client.chat.completions.create(model=TOOLS_MODEL, messages=HELLO, max_tokens=1)  # loaded
    before = child_props(box, TOOLS_MODEL)
    assert before["total_slots"] == 1
    sock = long_call_socket(box, 500)
    until(lambda: child_props(box, TOOLS_MODEL)["tokens_made"] >= before["tokens_made"] + 10, "A")
    waiting = Background(
        lambda: client.chat.completions.create(
            model=TOOLS_MODEL, messages=HELLO, max_tokens=3, temperature=0
        )
    )
    queued = until(lambda: httpx.get(f"{box.url}/v1/queue").json()["data"], "B in the queue")
    assert [(q["model"], q["blocked_by"]) for q in queued] == [(TOOLS_MODEL, [TOOLS_MODEL])]
    etas = httpx.get(f"{box.url}/v1/telemetry/state", timeout=30).json()["queue_eta"]
    assert TOOLS_MODEL in etas  # its one slot, priced for the next call (None: unmeasured)
    assert child_props(box, TOOLS_MODEL)["calls"] == before["calls"] + 1  # B is not in it
    sock.close()  # A's client leaves
    left = time.monotonic()
    answered = waiting.result()
    stopped = until(lambda: not child_props(box, TOOLS_MODEL)["generating"], "the child idle")
    after = child_props(box, TOOLS_MODEL)
    assert stopped and after["calls"] == before["calls"] + 2
    assert answered.usage is not None
    made_for_a = after["tokens_made"] - before["tokens_made"] - answered.usage.completion_tokens
    print(f"A made {made_for_a} tokens; B answered {time.monotonic() - left:.2f} s after A left")
    assert 10 <= made_for_a < 500
    rows = [r for r in box.calls() if r["model_asked"] == TOOLS_MODEL]
    assert [r["outcome"] for r in rows[-2:]] == ["abandoned", "ok"]


def test_a_stream_whose_client_leaves_stops_in_the_child(box: FitboxProcess) -> None:
    """Closed after 10 tokens of 500: the child's own count stops short of the 500 and the
    next call is answered."""
    client = client_for(box)
    client.chat.completions.create(model=TOOLS_MODEL, messages=HELLO, max_tokens=1)  # loaded
    before = child_props(box, TOOLS_MODEL)["tokens_made"]
    body = {
        "model": TOOLS_MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 500,
        "logit_bias": {str(EOS): -100},
        "stream": True,
    }
    url = f"{box.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=300) as response:
        for _ in response.iter_lines():
            if child_props(box, TOOLS_MODEL)["tokens_made"] >= before + 10:
                break  # leaving the block closes the connection
    until(lambda: not child_props(box, TOOLS_MODEL)["generating"], "the child stopped")
    made = child_props(box, TOOLS_MODEL)["tokens_made"] - before
    print(f"the stream's call made {made} tokens of 500")
    assert 10 <= made < 500
    again = client.chat.completions.create(model=TOOLS_MODEL, messages=HELLO, max_tokens=2)
    assert again.choices[0].message.content


def test_two_prompts_that_fit_the_window_alone_but_not_together_are_both_answered(
    box: FitboxProcess,
) -> None:
    """While a long call holds the child's one slot, both are sent: each is counted by the
    child (its byte bound overflows the window, its count does not) and waits in fitbox's
    queue, not in the child; the long call's client leaves, and both are answered, whole
    and streamed."""
    client = client_for(box)
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 60)  # ~600 tokens
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": long}]
    client.chat.completions.create(model=TOOLS_MODEL, messages=HELLO, max_tokens=1)  # loaded

    def whole() -> int:
        reply = client.chat.completions.create(model=TOOLS_MODEL, messages=ask, max_tokens=4)
        assert reply.usage is not None
        return reply.usage.prompt_tokens

    def streamed() -> str:
        chunks = client.chat.completions.create(
            model=TOOLS_MODEL, messages=ask, max_tokens=4, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    before = child_props(box, TOOLS_MODEL)
    holder = long_call_socket(box, 500)
    until(lambda: child_props(box, TOOLS_MODEL)["generating"], "the long call on the child")
    first, second = Background(whole), Background(streamed)
    queued = until(
        lambda: len(q := httpx.get(f"{box.url}/v1/queue").json()["data"]) == 2 and q, "both wait"
    )
    assert [q["blocked_by"] for q in queued] == [[TOOLS_MODEL], [TOOLS_MODEL]]
    holder.close()
    prompt_tokens = first.result()
    assert WINDOW / 2 < prompt_tokens < WINDOW and second.result()
    assert child_props(box, TOOLS_MODEL)["calls"] == before["calls"] + 3  # no reload
    rows = [r for r in box.calls() if r["model_asked"] == TOOLS_MODEL][-3:]
    assert sorted(r["outcome"] for r in rows) == ["abandoned", "ok", "ok"]
