"""fitbox as faithful as the llama-server behind it: the same openai SDK calls against a
direct llama-server and against fitbox, over the same SmolLM2 GGUF, compared field by field
(text aside, except where temperature 0 makes it deterministic).

The direct engine is started with the argv of fitbox's own child (another port), so both
run the same flags. One engine each, for the whole module; small max_tokens.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from openai.types.chat import ChatCompletionMessageParam

from .support.clients import openai_client
from .support.ggufs import write_tiny_llama
from .support.processes import FitboxProcess, running_fitbox

pytestmark = pytest.mark.engine
SMOL = "SmolLM2-135M-Instruct.Q4_1"
ALIAS = "smollm2"  # the name `fitbox pull smollm2` gives it (models/pull.py)
FAMILY = "SmolLM2-135M-Instruct"  # the file name without its quant tag
ORIGIN = "http://app.example"
RERANKER, DECODER = "tiny-reranker", "tiny-decoder"  # written by the module's fixture
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hi."}]
DETERMINISTIC: dict[str, Any] = {"temperature": 0, "seed": 7}


_clients: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _clients:  # an unclosed socket would warn later, inside some other test
        _clients.pop().close()


@dataclass
class Pair:
    box: FitboxProcess
    direct: str  # the direct llama-server's URL

    def clients(self, **options: Any) -> tuple[openai.OpenAI, openai.OpenAI]:
        made = [openai_client(url, **options) for url in (self.direct, self.box.url)]
        _clients.extend(made)
        return made[0], made[1]

    def rows(self, endpoint: str) -> int:
        return sum(1 for r in self.box.calls() if r["endpoint"] == endpoint)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_argv(box: FitboxProcess) -> list[str]:
    for child in psutil.Process(box.proc.pid).children(recursive=True):
        argv = child.cmdline()
        if "--port" in argv and "-m" in argv:
            return argv
    raise AssertionError(f"fitbox has no llama-server child:\n{box.log()}")


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Path, llama_server_bin: Path
) -> Iterator[Pair]:
    home = tmp_path_factory.mktemp("compat")
    tiny = home / "tiny"
    tiny.mkdir()
    write_tiny_llama(tiny / f"{RERANKER}.gguf", arch="qwen3", reranker=True)
    write_tiny_llama(tiny / f"{DECODER}.gguf")
    env = {"FITBOX_CORS_ORIGINS": ORIGIN, "FITBOX_DEFAULT_MODEL": ALIAS}
    with running_fitbox(home, [smollm2.parent, tiny], env=env) as box:
        loaded = httpx.post(f"{box.url}/v1/operator/load", json={"model": SMOL}, timeout=120)
        assert loaded.status_code == 200, loaded.text
        argv = _child_argv(box)
        port = _free_port()
        argv[argv.index("--port") + 1] = str(port)
        with (home / "direct.log").open("wb") as log:
            direct = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not _healthy(url):
                assert direct.poll() is None and time.monotonic() < deadline, (
                    home / "direct.log"
                ).read_text()
                time.sleep(0.1)
            yield Pair(box, url)
        finally:
            direct.terminate()
            direct.wait(timeout=20)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def keys_of(value: Any) -> Any:
    """The shape of a JSON value: its keys, recursively, with the values' types."""
    if isinstance(value, dict):
        return {k: keys_of(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [keys_of(v) for v in value[:1]]
    return type(value).__name__


VARYING = ("id", "created", "system_fingerprint", "timings")  # differ call to call


def same_shape(direct: dict[str, Any], through: dict[str, Any]) -> None:
    assert keys_of(through) == keys_of(direct)
    for key in direct.keys() - set(VARYING):
        if key not in ("choices", "usage", "output", "content"):
            assert through[key] == direct[key], key


# -- chat ----------------------------------------------------------------------------------


def test_chat_whole_and_deterministic_text(pair: Pair) -> None:
    direct, fitbox = pair.clients(max_retries=0)
    a = direct.chat.completions.create(model=SMOL, messages=HI, max_tokens=8, **DETERMINISTIC)
    b = fitbox.chat.completions.create(model=SMOL, messages=HI, max_tokens=8, **DETERMINISTIC)
    same_shape(a.model_dump(), b.model_dump())
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.choices[0].finish_reason == a.choices[0].finish_reason
    assert b.usage == a.usage


def _chunks(client: openai.OpenAI, model: str, **extra: Any) -> list[dict[str, Any]]:
    stream = client.chat.completions.create(
        model=model, messages=HI, max_tokens=6, stream=True, **DETERMINISTIC, **extra
    )
    return [chunk.model_dump(exclude_unset=True) for chunk in stream]


def test_chat_stream_and_its_usage(pair: Pair) -> None:
    direct, fitbox = pair.clients(max_retries=0)
    usage = {"stream_options": {"include_usage": True}}
    a, b = _chunks(direct, SMOL, **usage), _chunks(fitbox, SMOL, **usage)
    assert [keys_of({k: v for k, v in c.items() if k != "timings"}) for c in b] == [
        keys_of({k: v for k, v in c.items() if k != "timings"}) for c in a
    ]
    assert b[-1]["choices"] == [] and b[-1]["usage"] == a[-1]["usage"]
    text = [
        "".join(c["choices"][0]["delta"].get("content") or "" for c in s if c["choices"])
        for s in (a, b)
    ]
    assert text[0] == text[1] and text[0]


def test_stop_seed_and_logprobs(pair: Pair) -> None:
    direct, fitbox = pair.clients(max_retries=0)
    extra: dict[str, Any] = {"stop": ["!"], "logprobs": True, "top_logprobs": 2, "max_tokens": 12}
    a = direct.chat.completions.create(model=SMOL, messages=HI, **DETERMINISTIC, **extra)
    b = fitbox.chat.completions.create(model=SMOL, messages=HI, **DETERMINISTIC, **extra)
    same_shape(a.model_dump(), b.model_dump())
    assert b.choices[0].finish_reason == a.choices[0].finish_reason
    assert a.choices[0].logprobs is not None and b.choices[0].logprobs is not None
    assert [t.token for t in b.choices[0].logprobs.content or []] == [
        t.token for t in a.choices[0].logprobs.content or []
    ]


def test_json_schema_and_tool_calls(pair: Pair) -> None:
    direct, fitbox = pair.clients(max_retries=0)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    replies = [
        c.chat.completions.create(
            model=SMOL, messages=HI, max_tokens=48, response_format=fmt, **DETERMINISTIC
        )
        for c in (direct, fitbox)
    ]
    texts = [r.choices[0].message.content or "" for r in replies]
    assert texts[1] == texts[0] and texts[0].startswith("{")  # the grammar held both
    if replies[1].choices[0].finish_reason == "stop":  # whole (the model may ramble spaces)
        assert isinstance(json.loads(texts[1])["ok"], bool)
    tool: Any = {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string"}},
                "required": ["zone"],
            },
        },
    }
    calls = [
        c.chat.completions.create(
            model=SMOL,
            messages=HI,
            max_tokens=64,
            tools=[tool],
            tool_choice="required",
            **DETERMINISTIC,
        )
        for c in (direct, fitbox)
    ]
    same_shape(calls[0].model_dump(), calls[1].model_dump())
    assert calls[1].choices[0].finish_reason == calls[0].choices[0].finish_reason
    made = [[t.model_dump() for t in r.choices[0].message.tool_calls or []] for r in calls]
    assert [t["function"] for t in made[1]] == [t["function"] for t in made[0]]
    assert calls[1].choices[0].message.content == calls[0].choices[0].message.content


# -- the Responses and Messages APIs ---------------------------------------------------


def test_responses_whole_and_streamed(pair: Pair) -> None:
    direct, fitbox = pair.clients(max_retries=0)
    a = direct.responses.create(model=SMOL, input="Say hi.", max_output_tokens=6, temperature=0)
    b = fitbox.responses.create(model=SMOL, input="Say hi.", max_output_tokens=6, temperature=0)
    assert keys_of(b.model_dump()) == keys_of(a.model_dump())
    assert b.output_text == a.output_text and b.status == a.status == "completed"
    events = [
        [
            e.type
            for e in c.responses.create(
                model=SMOL, input="Say hi.", stream=True, max_output_tokens=4, temperature=0
            )
        ]
        for c in (direct, fitbox)
    ]
    assert events[1] == events[0] and events[1][-1] == "response.completed"
    rows = [r for r in pair.box.calls() if r["endpoint"] == "/v1/responses"]
    assert [r["outcome"] for r in rows] == ["ok", "ok"] and rows[0]["completion_tokens"]


def _messages(url: str, stream: bool = False) -> httpx.Response:
    body = {"model": SMOL, "max_tokens": 5, "messages": HI, "temperature": 0, "stream": stream}
    return httpx.post(f"{url}/v1/messages", json=body, timeout=60)


def test_anthropic_messages_whole_and_streamed(pair: Pair) -> None:
    a, b = _messages(pair.direct), _messages(pair.box.url)
    assert b.status_code == a.status_code == 200
    same_shape(a.json(), b.json())
    assert b.json()["content"] == a.json()["content"]
    events = [
        [ln for ln in _messages(url, True).text.splitlines() if ln.startswith("event:")]
        for url in (pair.direct, pair.box.url)
    ]
    assert events[1] == events[0] and events[1][-1] == "event: message_stop"
    assert [r["outcome"] for r in pair.box.calls() if r["endpoint"] == "/v1/messages"] == [
        "ok",
        "ok",
    ]


# SmolLM2 answers this, greedily, with an emoji whose first token ends inside its UTF-8
# bytes: llama-server sends no piece for that token, and its stream's opening went with it
EMOJI = "Reply with only an emoji of a tree."


def _events(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    text = httpx.post(
        f"{url}{path}", json={"model": SMOL, "stream": True, "temperature": 0, **body}, timeout=60
    ).text
    return [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]


def test_a_reply_that_opens_inside_a_character_still_opens_its_stream(pair: Pair) -> None:
    """What the engine leaves out of such a stream's opening (the opening stages of
    server/streams/reshape.py) comes through fitbox; each first assert shows the engine still
    leaves it out."""
    messages = {"max_tokens": 4, "messages": [{"role": "user", "content": EMOJI}]}
    direct, through = (
        _events(url, "/v1/messages", messages) for url in (pair.direct, pair.box.url)
    )
    assert all(e["type"] != "message_start" for e in direct), direct
    assert through[0]["type"] == "message_start" and through[1:] == direct
    start = through[0]["message"]
    assert start["model"] == SMOL and start["role"] == "assistant" and start["content"] == []
    whole = httpx.post(
        f"{pair.box.url}/v1/messages",
        timeout=60,
        json={"model": SMOL, "temperature": 0, **messages},
    ).json()
    prompt = whole["usage"]["input_tokens"] + whole["usage"].get("cache_read_input_tokens", 0)
    assert start["usage"] == {"input_tokens": prompt, "output_tokens": 0}

    direct, through = (
        _events(url, "/v1/chat/completions", messages) for url in (pair.direct, pair.box.url)
    )
    assert "role" not in direct[0]["choices"][0]["delta"], direct[0]
    assert through[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}
    ]
    assert through[0]["id"] == through[1]["id"] and through[0]["model"] == SMOL
    assert [e["choices"] for e in through[1:]] == [e["choices"] for e in direct]

    asked = {"max_output_tokens": 8, "input": EMOJI}
    direct, through = (_events(url, "/v1/responses", asked) for url in (pair.direct, pair.box.url))
    kinds = [e["type"] for e in direct]
    assert kinds.count("response.created") > 1, kinds
    opening = ("response.created", "response.in_progress")
    once = [k for i, k in enumerate(kinds) if k not in opening or k not in kinds[:i]]
    assert [e["type"] for e in through] == once
    # llama-server's opening response has no output; OpenAI's (and what SDK stream helpers
    # of openai-python 2.x and openai-node 6.x append each item to) has an empty one
    assert "output" not in direct[0]["response"] and through[0]["response"]["output"] == []
    fitbox = pair.clients(max_retries=0)[1]
    with fitbox.responses.stream(
        model=SMOL, input=EMOJI, max_output_tokens=8, temperature=0
    ) as stream:
        final = stream.get_final_response()
    assert final.status in ("completed", "incomplete") and final.output_text


# -- the engine's own routes ---------------------------------------------------------------


def test_tokenize_detokenize_apply_template(pair: Pair) -> None:
    def both(path: str, body: dict[str, Any]) -> list[Any]:
        a = httpx.post(f"{pair.direct}{path}", json=body, timeout=60)
        b = httpx.post(f"{pair.box.url}{path}", json={"model": SMOL, **body}, timeout=60)
        assert b.status_code == a.status_code == 200, b.text
        assert b.headers["x-fitbox-model"] == SMOL
        return [a.json(), b.json()]

    tokens = both("/tokenize", {"content": "Hello there"})
    assert tokens[1] == tokens[0] and tokens[0]["tokens"]
    text = both("/detokenize", {"tokens": tokens[0]["tokens"]})
    assert text[1] == text[0] and "Hello" in text[0]["content"]
    prompt = both("/apply-template", {"messages": HI})
    counted = both("/v1/messages/count_tokens", {"messages": HI})
    assert counted[1] == counted[0] and counted[0]["input_tokens"] > 0
    assert prompt[1] == prompt[0] and "Say hi." in prompt[0]["prompt"]
    # a model named in the query instead of the body
    by_query = httpx.post(
        f"{pair.box.url}/tokenize",
        params={"model": SMOL},
        json={"content": "Hello there"},
        timeout=60,
    )
    assert by_query.json() == tokens[0]


def test_props_and_slots_by_the_model_query_parameter(pair: Pair) -> None:
    a = httpx.get(f"{pair.direct}/props", timeout=30).json()
    b = httpx.get(f"{pair.box.url}/props", params={"model": SMOL}, timeout=30)
    assert b.status_code == 200 and b.json()["total_slots"] == a["total_slots"]
    assert (
        b.json()["default_generation_settings"]["n_ctx"]
        == a["default_generation_settings"]["n_ctx"]
    )
    slots = httpx.get(f"{pair.box.url}/slots", params={"model": SMOL}, timeout=30)
    assert slots.status_code == 200 and len(slots.json()) == a["total_slots"]
    assert "model_path" in b.json()  # the box itself is an insider
    missing = httpx.get(f"{pair.box.url}/props", timeout=30)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    # an inference key is no insider, wherever it calls from: no paths, no other prompts
    made = httpx.post(
        f"{pair.box.url}/v1/keys", json={"name": "app", "scopes": ["inference"]}, timeout=30
    )
    key = {"Authorization": f"Bearer {made.json()['key']}"}
    outsider = httpx.get(f"{pair.box.url}/props", params={"model": SMOL}, headers=key, timeout=30)
    assert outsider.status_code == 200 and "model_path" not in outsider.json()
    assert outsider.json()["total_slots"] == a["total_slots"]
    refused = httpx.get(f"{pair.box.url}/slots", params={"model": SMOL}, headers=key, timeout=30)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "insider_only"


def test_routes_the_model_does_not_serve_are_not_retried(pair: Pair) -> None:
    """Infill (no FIM tokens) and embeddings (a chat model): the engine's 501 is the
    client's mistake (it named a model for a route the model does not serve), so a 400
    invalid_request_error with a code naming the mismatch, a reason about the model and
    x-should-retry: false, so the SDK (default retries) asks once."""
    _, fitbox = pair.clients()  # max_retries left at the SDK's default
    before = pair.rows("/v1/embeddings")
    with pytest.raises(openai.BadRequestError) as refused:
        fitbox.embeddings.create(model=SMOL, input="hi")
    assert refused.value.code == "not_an_embeddings_model"
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert f"'{SMOL}' is not an embeddings model" in refused.value.message
    assert pair.rows("/v1/embeddings") == before + 1  # the SDK did not retry
    body = {"input_prefix": "def f(", "input_suffix": "):"}
    a = httpx.post(f"{pair.direct}/infill", json=body, timeout=60)
    b = httpx.post(f"{pair.box.url}/infill", json={"model": SMOL, **body}, timeout=60)
    assert a.status_code == 501 and b.status_code == 400  # the engine's words, a client's status
    assert b.json()["error"]["type"] == "invalid_request_error"
    assert b.json()["error"]["code"] == "no_fill_in_the_middle_tokens"
    assert b.headers["x-should-retry"] == "false" and SMOL in b.json()["error"]["message"]


def test_rerank_launches_a_reranker_with_reranking_and_refuses_a_chat_model(pair: Pair) -> None:
    body = {"query": "hi", "documents": ["the yes", "a b"]}
    a = httpx.post(f"{pair.direct}/v1/rerank", json=body, timeout=60)
    assert a.status_code == 501  # the direct engine is a chat model, as fitbox's SMOL is
    refused = httpx.post(f"{pair.box.url}/v1/rerank", json={"model": SMOL, **body}, timeout=60)
    assert refused.status_code == 400 and refused.headers["x-should-retry"] == "false"
    assert refused.json()["error"]["code"] == "not_a_reranker"
    for path in ("/v1/rerank", "/rerank"):
        ranked = httpx.post(f"{pair.box.url}{path}", json={"model": RERANKER, **body}, timeout=60)
        assert ranked.status_code == 200, ranked.text
        results = ranked.json()["results"]
        assert sorted(r["index"] for r in results) == [0, 1]
        assert all(isinstance(r["relevance_score"], float) for r in results)
    argv = next(
        c.cmdline()
        for c in psutil.Process(pair.box.proc.pid).children(recursive=True)
        if any(RERANKER in part for part in c.cmdline())
    )
    assert "--reranking" in argv


def test_a_decoder_serves_embeddings_when_asked(pair: Pair) -> None:
    _, fitbox = pair.clients(max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        fitbox.embeddings.create(model=DECODER, input="hi")
    assert "/v1/settings/pair" in refused.value.message  # says how to turn it on
    httpx.post(f"{pair.box.url}/v1/operator/unload", json={"model": DECODER}, timeout=60)
    turned_on = httpx.post(
        f"{pair.box.url}/v1/settings/pair", json={"model": DECODER, "embeddings": True}, timeout=30
    )
    assert turned_on.status_code == 200, turned_on.text
    vectors = fitbox.embeddings.create(model=DECODER, input=["hi", "the yes"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 64  # n_embd
    argv = next(
        c.cmdline()
        for c in psutil.Process(pair.box.proc.pid).children(recursive=True)
        if any(DECODER in part for part in c.cmdline())
    )
    assert "--embeddings" in argv and argv[argv.index("--pooling") + 1] == "mean"
    chat = fitbox.chat.completions.create(model=DECODER, messages=HI, max_tokens=2)
    # it still chats (a random tiny model, sampled, may end its two tokens early)
    assert chat.choices[0].finish_reason in ("length", "stop") and chat.usage is not None


# -- models, CORS, names ---------------------------------------------------------------


def test_models_retrieve_and_meta(pair: Pair) -> None:
    _, fitbox = pair.clients(max_retries=0)
    listed = httpx.get(f"{pair.direct}/v1/models", timeout=30).json()["data"][0]["meta"]
    fitbox.chat.completions.create(model=SMOL, messages=HI, max_tokens=1)  # n_ctx: resident
    for name in (SMOL, ALIAS):
        model = fitbox.models.retrieve(name).model_dump()
        assert model["id"] == name and model["object"] == "model"
        meta = model["meta"]
        for key in ("n_ctx", "n_ctx_train", "n_params", "n_vocab", "n_embd", "size"):
            assert meta[key] == listed[key], key
    entry = next(m for m in fitbox.models.list().model_dump()["data"] if m["id"] == SMOL)
    assert entry["meta"]["n_params"] == listed["n_params"]
    with pytest.raises(openai.NotFoundError) as missing:
        fitbox.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"


def test_cors_preflight_is_answered_by_fitbox(pair: Pair) -> None:
    ask = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    a = httpx.options(f"{pair.direct}/v1/chat/completions", headers=ask, timeout=30)
    b = httpx.options(f"{pair.box.url}/v1/chat/completions", headers=ask, timeout=30)
    assert a.status_code == b.status_code == 200
    assert b.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in b.headers["access-control-allow-methods"]
    assert "authorization" in b.headers["access-control-allow-headers"].lower()
    other = httpx.options(
        f"{pair.box.url}/v1/chat/completions",
        headers={**ask, "Origin": "http://evil.example"},
        timeout=30,
    )
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    call = httpx.get(f"{pair.box.url}/v1/models", headers={"Origin": ORIGIN}, timeout=30)
    assert call.headers["access-control-allow-origin"] == ORIGIN
    assert "x-fitbox-model" in call.headers["access-control-expose-headers"]
    assert not any(
        r["endpoint"] == "/v1/chat/completions" and r["model_asked"] == "" for r in pair.box.calls()
    )  # the preflight never became a call


def test_the_asked_name_comes_back_whole_and_streamed(pair: Pair) -> None:
    _, fitbox = pair.clients(max_retries=0)
    for name in (ALIAS, FAMILY):
        raw = fitbox.chat.completions.with_raw_response.create(
            model=name, messages=HI, max_tokens=3
        )
        assert raw.parse().model == name and raw.headers["x-fitbox-model"] == SMOL
        chunks = _chunks(fitbox, name)
        assert chunks and all(c["model"] == name for c in chunks)
    raw_r = fitbox.responses.with_raw_response.create(model=ALIAS, input="hi", max_output_tokens=3)
    assert raw_r.parse().model == ALIAS
    done = [
        e
        for e in fitbox.responses.create(model=ALIAS, input="hi", max_output_tokens=3, stream=True)
        if e.type == "response.completed"
    ]
    assert done and done[0].response.model == ALIAS
    assert _messages_as(pair.box.url, ALIAS)["model"] == ALIAS
    body = {"model": ALIAS, "max_tokens": 3, "messages": HI, "stream": True}
    streamed = httpx.post(f"{pair.box.url}/v1/messages", json=body, timeout=60).text
    start = next((ln for ln in streamed.splitlines() if '"message_start"' in ln), None)
    assert start is not None, streamed[:2000]  # what came instead, to see why
    assert json.loads(start.removeprefix("data: "))["message"]["model"] == ALIAS


def _messages_as(url: str, model: str) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 3, "messages": HI}
    reply: dict[str, Any] = httpx.post(f"{url}/v1/messages", json=body, timeout=60).json()
    return reply


def test_a_hosted_model_name_reaches_the_default_model(pair: Pair) -> None:
    _, fitbox = pair.clients(max_retries=0)
    raw = fitbox.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=HI, max_tokens=3
    )
    assert raw.headers["x-fitbox-default-model"] == ALIAS
    assert raw.headers["x-fitbox-model"] == SMOL and raw.parse().model == "gpt-4o-mini"
    row = [r for r in pair.box.calls() if r["model_asked"] == "gpt-4o-mini"][-1]
    assert row["outcome"] == "ok" and row["artifact"].endswith(f"{SMOL}.gguf")
    served = fitbox.chat.completions.with_raw_response.create(model=SMOL, messages=HI, max_tokens=2)
    assert "x-fitbox-default-model" not in served.headers  # a model the box has is itself


# -- last: it may reload fitbox's child at a larger window ---------------------------------


def test_context_overflow_keeps_the_engines_numbers(pair: Pair) -> None:
    direct, fitbox = pair.clients()  # max_retries left at the SDK's default
    too_long: list[ChatCompletionMessageParam] = [{"role": "user", "content": "a " * 9000}]
    errors = []
    before = pair.rows("/v1/chat/completions")
    for client in (direct, fitbox):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=SMOL, messages=too_long, max_tokens=1)
        errors.append(refused.value)
    a, b = (e.body for e in errors)
    assert isinstance(a, dict) and isinstance(b, dict)
    assert b["type"] == a["type"] == "exceed_context_size_error"
    assert b["n_prompt_tokens"] == a["n_prompt_tokens"] > 9000
    # fitbox refuses it before any engine, at the largest window the model loads (its
    # training window: unified slots each hold the whole window), not the loaded one
    meta = httpx.get(f"{pair.box.url}/v1/models/{SMOL}", timeout=30).json()["meta"]
    assert a["n_ctx"] == meta["n_ctx"] < b["n_ctx"] == meta["n_ctx_train"]
    assert isinstance(b["code"], str)
    assert b["code"] == "context_length_exceeded"
    assert errors[1].response.headers["x-should-retry"] == "false"
    assert pair.rows("/v1/chat/completions") == before + 1


# -- slots and prompt sizes (issue #15's slots part) ---------------------------------------


def test_n_2_gives_two_choices_of_the_same_shape_both_ways(pair: Pair) -> None:
    direct, fitbox = pair.clients(max_retries=0)
    replies = [
        c.chat.completions.create(model=SMOL, messages=HI, n=2, max_tokens=4)
        for c in (direct, fitbox)
    ]
    assert [sorted(ch.index for ch in r.choices) for r in replies] == [[0, 1], [0, 1]]
    shapes = [[keys_of(ch.model_dump()) for ch in r.choices] for r in replies]
    assert shapes[0] == shapes[1]
