"""fitbox-helper in process, driven with the OpenAI SDK: every menu, whole and streamed; a
refused model explained in ``fitbox plan``'s words; a setting changed with an admin key (and
from the box itself) and refused to an inference key; other routes refused by name; its
call rows. No engine is launched: the helper never places anything."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionUserMessageParam
from starlette.testclient import TestClient

from fitbox import config
from fitbox.box.helper.answers import ConfigTarget
from fitbox.box.helper.assist import commands, read_answer
from fitbox.box.helper.menu import HELPER, Action, parse
from fitbox.cli.plan import _print_plan
from fitbox.harness.blocks import config_block_text

from .support.boxes import actions
from .support.clients import app_client, call_rows, make_key
from .support.ggufs import write_tiny_llama
from .support.paths import BOX

LOCAL, OUTSIDE = ("127.0.0.1", 5000), ("203.0.113.5", 5000)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    write_tiny_llama(tmp_path / "models" / "tiny.gguf")
    write_tiny_llama(tmp_path / "models" / "other.gguf")
    return tmp_path


def box_client(home: Path, peer: tuple[str, int] = LOCAL, **settings: str) -> TestClient:
    cfg = config.load(
        {"home": str(home), "models": str(home / "models"), "ram_max": "1MiB", **settings},
        env={"FITBOX_SIMULATED_GPUS": ""},
    )
    return app_client(cfg, peer)


@pytest.fixture
def local(home: Path) -> Iterator[TestClient]:
    with box_client(home) as client:
        yield client


def sdk(client: TestClient, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{BOX}/v1", api_key=key, http_client=client, max_retries=0)


def ask(client: openai.OpenAI, text: str) -> str:
    reply = client.chat.completions.create(
        model=HELPER, messages=[{"role": "user", "content": text}]
    )
    assert reply.model == HELPER and reply.choices[0].finish_reason == "stop"
    return reply.choices[0].message.content or ""


def ask_streamed(client: openai.OpenAI, text: str) -> tuple[str, Any]:
    stream = client.chat.completions.create(
        model=HELPER,
        messages=[{"role": "user", "content": text}],
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        parts += [c.delta.content or "" for c in chunk.choices]
    return "".join(parts), usage


def test_models_lists_the_helper_and_it_is_not_weights(local: TestClient) -> None:
    listed = {m.id: m for m in sdk(local).models.list().data}
    assert set(listed) == {"tiny", "other", HELPER}
    helper = listed[HELPER].model_dump()
    assert helper["owned_by"] == "fitbox" and helper["weights"] is False
    assert sdk(local).models.retrieve(HELPER).id == HELPER


def test_every_menu_whole_and_streamed(local: TestClient) -> None:
    client = sdk(local)
    menu = ask(client, "menu")
    for word in ("residents", "why MODEL", "settings", "set SETTING VALUE", "config TOOL"):
        assert word in menu
    assert ask(client, "0") == menu and ask(client, "") == menu
    assert "Nothing is resident" in ask(client, "1")
    assert "window = 4096" in ask(client, "settings")
    assert "rungs =" in ask(client, "3 tiny")  # a model's own knobs
    assert "Which model?" in ask(client, "why") and "tiny" in ask(client, "why")
    assert "Not written: tiny cannot be placed now" in ask(client, "config aider tiny")
    text, usage = ask_streamed(client, "settings")
    assert text == ask(client, "settings") and usage is not None and usage.total_tokens == 0
    assert "I did not understand" in ask(client, "please tell me a joke")
    rows = [r for r in call_rows(local) if r["model_asked"] == HELPER]
    assert rows and all(r["outcome"] == "ok" and r["http_status"] == 200 for r in rows)
    assert all(r["artifact"] is None and r["rung"] is None for r in rows)  # never placed
    assert local.app.state.box.residents() == []  # type: ignore[attr-defined]


def test_a_refused_model_is_explained_in_fitbox_plans_words(
    local: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    report = local.get("/v1/plan", params={"model": "tiny"}).json()
    assert report["decision"] == "refuse"
    report["source"] = "test"
    _print_plan(report)
    printed = capsys.readouterr().out.splitlines()[:-1]  # without its source line
    said = ask(sdk(local), "why tiny")
    assert said.startswith("tiny is refused now:")
    assert said.splitlines()[1:] == printed
    assert report["reason"] in said
    for rejected in report["rejected"]:
        assert rejected["reason"] in said and rejected["detail"] in said
    assert "does not exist" in ask(sdk(local), "why nothing-here")


def test_a_setting_is_changed_with_an_admin_key_and_refused_to_an_inference_key(
    home: Path,
) -> None:
    with box_client(home):
        pass  # the store and its keys
    admin, inference = make_key(home, "admin"), make_key(home, "inference")
    with box_client(home, OUTSIDE) as outside:
        refused = ask(sdk(outside, inference), "set window 8192")
        assert refused.startswith("Not changed:") and "admin scope" in refused
        assert "403" in refused
        assert "window = 4096" in ask(sdk(outside, inference), "settings")
        done = ask(sdk(outside, admin), "set window 8192")
        assert done == "Changed box-wide: window = 8192."
        assert (
            outside.get("/v1/settings/box", headers={"Authorization": f"Bearer {admin}"}).json()[
                "effective"
            ]["window"]
            == 8192
        )
        bad = ask(sdk(outside, admin), "set window lots")
        assert bad.startswith("Not changed: Setting 'window' must be a number")
        pair = ask(sdk(outside, admin), "set kv_types f16,q8_0 for tiny")
        assert pair == 'Changed for tiny: kv_types = ["f16", "q8_0"].'
        unknown = ask(sdk(outside, admin), "set nothing 1")
        assert "Unknown setting 'nothing'" in unknown
        store = outside.app.state.store  # type: ignore[attr-defined]
        recorded = [(a["action"], a["key_id"] is not None) for a in actions(store)]
        assert ("settings-box", True) in recorded and ("settings-pair", True) in recorded
    with box_client(home) as local:  # the box itself, keyless, as the door rules say
        assert ask(sdk(local), "set window null") == "Changed box-wide: window = null."
        assert "window = 4096 (default)" in ask(sdk(local), "settings")


def test_other_routes_naming_the_helper_are_refused_by_name(local: TestClient) -> None:
    for path, body in (
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/embeddings", {"input": "x"}),
        ("/v1/responses", {"input": "x"}),
    ):
        refused = local.post(path, json={"model": HELPER, **body})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "helper_chat_only" and path in error["message"]


def test_the_grammar_reads_only_menu_actions() -> None:
    assert parse("2 tiny") == Action("why", ("tiny",))
    assert parse("Set window 8192 for tiny") == Action("set", ("window", "8192", "for", "tiny"))
    assert parse("config aider") == Action("config", ("aider",))
    assert parse("residents are what?") is None
    assert parse("rm -rf /") is None and parse("set a b c") is None
    offered = commands(["tiny"])
    assert "why tiny" in offered and all(c.split()[0] != "set" for c in offered)

    def reply(content: str) -> bytes:
        return json.dumps({"choices": [{"message": {"content": content}}]}).encode()

    assert read_answer(reply('{"command": "why tiny"}'), offered).action == Action("why", ("tiny",))
    for answer in ('{"command": "set window 1"}', '{"command": "rm -rf /"}', "residents", "{}"):
        assert read_answer(reply(answer), offered).action is None


def test_config_points_a_tool_at_the_box_with_the_plans_window(home: Path) -> None:
    with box_client(home, ram_max="8GiB") as local:
        report = local.get("/v1/plan", params={"model": "tiny"}).json()
        assert report["decision"] == "place"
        block = ask(sdk(local), "5 aider tiny")
        # fitbox config's own block (fitbox.harness), the window from the plan
        assert block == config_block_text("aider", ["tiny"], {"tiny": report}, BOX)
        assert f'openai-api-base: "{BOX}/v1"' in block and 'model: "openai/tiny"' in block
        assert f'"max_input_tokens": {report["window"]}' in block
        assert 'openai-api-key: "fitbox"' in block  # no key needed from the box itself
        helper = local.app.state.helper  # type: ignore[attr-defined]
        seen: list[ConfigTarget] = []

        def blocks(target: ConfigTarget) -> str:  # fitbox config's renderer, at its call site
            seen.append(target)
            return f"BLOCK {target.tool}"

        helper.blocks = blocks
        message: ChatCompletionUserMessageParam = {
            "role": "user",
            "content": [{"type": "text", "text": "config"}, {"type": "text", "text": "opencode"}],
        }
        reply = sdk(local).chat.completions.create(model=HELPER, messages=[message])
        assert reply.choices[0].message.content == "BLOCK opencode"
        assert seen == [  # no model named: the first in the catalog
            ConfigTarget(
                "opencode", "other", f"{BOX}/v1", report["window"], report["window"], False
            )
        ]


def test_a_streamed_refusal_is_said_in_the_reply(home: Path) -> None:
    with box_client(home):
        pass
    inference = make_key(home, "inference")
    with box_client(home, OUTSIDE) as outside:
        text, usage = ask_streamed(sdk(outside, inference), "set goal fast for tiny")
        assert text.startswith("Not changed:") and "403 insufficient_scope" in text
        assert usage is not None
        assert "goal = quality" in ask(sdk(outside, inference), "settings tiny")
