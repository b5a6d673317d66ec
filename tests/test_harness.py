"""fitbox.harness without a box: every tool's block read back by a real parser (PyYAML,
tomllib, json), a model the plan refuses named and left out, and a user's own file merged
with their entries kept, a backup written, and a differing fitbox entry replaced only when
forced."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitbox.harness import merge
from fitbox.harness.blocks import NothingToWrite, config_block_text
from fitbox.harness.limits import ModelLimits, Unplaceable, from_plan, output_limit
from fitbox.harness.render import to_toml, to_yaml
from fitbox.harness.shapes import Target
from fitbox.harness.tools import TOOLS, UnknownTool, tool

BASE = "http://127.0.0.1:8484"
PLACED: dict[str, Any] = {
    "decision": "place",
    "model": "SmolLM2-135M-Instruct.Q4_1",
    "window": 4096,
    "variants": ["SmolLM2-135M-Instruct.Q4_1"],
}
REFUSED: dict[str, Any] = {
    "decision": "refuse",
    "model": "Big-70B.Q8_0",
    "reason": "larger_than_box",
    "needed_bytes": 75_000_000_000,
    "available_bytes": 24_000_000_000,
    "device": "host",
    "detail": "",
}
PLANS = {"smollm2": PLACED, "Big-70B": REFUSED}
TARGET = Target(BASE, None, (ModelLimits("smollm2", 4096, 1024),))


def parsed(cf_format: str, text: str) -> Any:
    if cf_format == "json":
        return json.loads(text)
    if cf_format == "yaml":
        return yaml.safe_load(text)
    if cf_format == "toml":
        return tomllib.loads(text)
    return text


@pytest.mark.parametrize("name", [t.name for t in TOOLS if not t.unsupported])
def test_each_tools_files_read_back_as_the_data_fitbox_meant(name: str) -> None:
    for cf in tool(name).files(TARGET):
        from fitbox.harness.blocks import file_text

        assert parsed(cf.format, file_text(cf)) == cf.data, cf.path


def test_the_block_names_a_refused_model_with_its_reason_and_writes_only_the_placed() -> None:
    text = config_block_text("opencode", ["smollm2", "Big-70B"], PLANS, BASE)
    body = text.split("\n# not written")[0].split("\n", 1)[1]
    config = json.loads(body)
    models = config["provider"]["fitbox"]["models"]
    assert models == {"smollm2": {"name": "smollm2", "limit": {"context": 4096, "output": 1024}}}
    assert config["provider"]["fitbox"]["options"]["baseURL"] == f"{BASE}/v1"
    assert "# not written: Big-70B: larger_than_box: needs 75000000000 bytes on host" in text
    with pytest.raises(NothingToWrite, match="Big-70B: larger_than_box"):
        config_block_text("aider", ["Big-70B"], PLANS, BASE)


def test_limits_come_from_the_plan_window() -> None:
    found = from_plan("smollm2", PLACED)
    assert found == ModelLimits("smollm2", 4096, 1024, ("SmolLM2-135M-Instruct.Q4_1",))
    missing = from_plan("nope", {"error": {"message": "The model 'nope' does not exist"}})
    assert missing == Unplaceable("nope", "The model 'nope' does not exist")
    assert output_limit(512) == 128 and output_limit(10**7) == 32768


def test_the_default_model_is_a_resident_one_else_the_first_listed() -> None:
    catalog = {"data": [{"id": "a"}, {"id": "b", "resident": True}]}
    text = config_block_text("env", [], {"b": {**PLACED, "window": 2048}}, BASE, catalog=catalog)
    assert "FITBOX_MODEL=b" in text and "FITBOX_MODEL_WINDOW=2048" in text


def test_a_key_goes_where_each_tool_reads_it() -> None:
    keyed = Target(BASE, "fb_abc_secret", TARGET.models)
    (codex,) = tool("codex").files(keyed)
    assert codex.data["model_providers"]["fitbox"]["env_key"] == "FITBOX_API_KEY"
    assert tool("codex").launch(keyed).env == {"FITBOX_API_KEY": "fb_abc_secret"}
    (claude,) = tool("claude").files(keyed)
    assert claude.data["env"]["ANTHROPIC_AUTH_TOKEN"] == "fb_abc_secret"
    assert claude.data["env"]["ANTHROPIC_BASE_URL"] == BASE  # it adds /v1/messages itself
    assert "ANTHROPIC_API_KEY" in tool("claude").launch(keyed).unset


def test_unsupported_and_unknown_tools_say_why() -> None:
    assert "Gemini API" in config_block_text("gemini", ["smollm2"], PLANS, BASE)
    with pytest.raises(UnknownTool, match="known tools: claude, codex, opencode, aider"):
        tool("vim")
    result = subprocess.run(
        [sys.executable, "-m", "fitbox", "launch", "vim"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "known tools: claude, codex" in result.stderr


def test_yaml_and_toml_writers_quote_what_would_change_type() -> None:
    tricky = {"a": "no", "b": "1e3", "c": "x: y", "d": [True, None, 1.5], "e": {}, "f": []}
    assert yaml.safe_load(to_yaml(tricky)) == tricky
    nested = {"k": 1, "t": {"s": "v", "u": {"w": [1, 2]}}, "arr": [{"x": 1}, {"x": 2}]}
    assert tomllib.loads(to_toml(nested)) == nested


USER_CONTINUE = """\
# my Continue config
name: Mine
version: 0.0.1
schema: v1
models:
  - name: gpt
    provider: openai
    model: gpt-4o  # the one I pay for
context:
  - provider: code
"""


def test_a_users_file_is_merged_with_their_entries_kept_and_a_backup_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(USER_CONTINUE)
    (cf,) = tool("continue").files(TARGET)
    result = merge.merge(cf, path.read_text())
    assert not result.conflicts and result.text is not None
    assert result.added == ["models: name smollm2"]
    assert any(k.startswith("name (yours: name: Mine") for k in result.kept)
    backup = merge.write(path, result.text)
    assert backup is not None and backup.read_text() == USER_CONTINUE
    merged = yaml.safe_load(path.read_text())
    assert merged["name"] == "Mine" and merged["context"] == [{"provider": "code"}]
    assert [m["name"] for m in merged["models"]] == ["gpt", "smollm2"]
    assert merged["models"][1]["defaultCompletionOptions"] == {
        "contextLength": 4096,
        "maxTokens": 1024,
    }
    assert "# the one I pay for" in path.read_text()  # the user's lines untouched
    assert merge.merge(cf, path.read_text()).text is None  # again: nothing to change

    wider = Target(BASE, None, (ModelLimits("smollm2", 8192, 2048),))
    (changed,) = tool("continue").files(wider)
    refused = merge.merge(changed, path.read_text())
    assert refused.text is None and refused.conflicts  # never overwritten unforced
    forced = merge.merge(changed, path.read_text(), force=True)
    assert forced.text is not None
    again = yaml.safe_load(forced.text)
    assert again["models"][0]["model"] == "gpt-4o"
    assert again["models"][1]["defaultCompletionOptions"]["contextLength"] == 8192


def test_json_and_toml_merges_keep_the_users_keys(tmp_path: Path) -> None:
    (oc,) = tool("opencode").files(TARGET)
    mine = {"model": "anthropic/claude", "provider": {"anthropic": {"options": {"x": 1}}}}
    result = merge.merge(oc, json.dumps(mine))
    assert result.text is not None
    merged = json.loads(result.text)
    assert merged["model"] == "anthropic/claude"  # the user's default model is theirs
    assert merged["provider"]["anthropic"] == {"options": {"x": 1}}
    assert merged["provider"]["fitbox"]["models"]["smollm2"]["limit"]["context"] == 4096
    with pytest.raises(merge.MergeError, match="not plain JSON"):
        merge.merge(oc, "{ // a comment\n}")
    (codex,) = tool("codex").files(TARGET)
    toml_mine = 'approval_policy = "never"\n[tui]\nanimations = false\n'
    written = merge.merge(codex, toml_mine)
    assert written.text is not None
    loaded = tomllib.loads(written.text)
    assert loaded["approval_policy"] == "never" and loaded["tui"] == {"animations": False}
    assert loaded["model_providers"]["fitbox"]["wire_api"] == "responses"
    clash = merge.merge(codex, 'model = "o3"\n')
    assert clash.text is None and clash.conflicts[0].startswith("model (yours")
    *_, settings = tool("aider").files(TARGET)
    listed = merge.merge(settings, "- name: gpt-4o\n  edit_format: diff\n")
    assert listed.text is not None
    assert [e["name"] for e in yaml.safe_load(listed.text)] == ["gpt-4o", "openai/smollm2"]


def test_through_a_central_the_windows_come_from_its_catalog() -> None:
    """A central plans nothing: a BOX/MODEL entry carries its box's entry (``meta``), and a
    bare name takes the window of a box that has it."""
    meta = {"n_ctx": None, "n_ctx_train": 8192}
    catalog = {
        "data": [
            {"id": "smollm2", "boxes": ["b1"]},
            {"id": "b1/smollm2", "box_id": "b1", "meta": meta},
        ]
    }
    text = config_block_text("env", ["b1/smollm2", "smollm2"], {}, BASE, catalog=catalog)
    assert "FITBOX_MODEL=b1/smollm2" in text and "FITBOX_MODEL_WINDOW=8192" in text
    bare = config_block_text("env", ["smollm2"], {}, BASE, catalog=catalog)
    assert "FITBOX_MODEL_WINDOW=8192" in bare
