"""The table: one entry per tool, each saying how that tool is pointed at this box (for
``fitbox launch``: environment, inline config, flags) and what its own config file holds
(for ``fitbox config``). Each entry was read off the tool's own documentation or source,
at the version named beside it; docs/design/harness.md says how to add one.

A key in a config file is written as the tool reads it; with no key (a tool on the box
itself) a placeholder stands where the tool insists on one ("fitbox" is no key to the box:
only ``fb_…`` values are read as keys).
"""

from __future__ import annotations

import json
from typing import Any

from fitbox.harness.limits import ModelLimits
from fitbox.harness.shapes import KEY_ENV, PROVIDER, ConfigFile, Launch, Target, Tool

# --- Claude Code (2.1.x): the Anthropic Messages API at ANTHROPIC_BASE_URL + /v1/messages ---


def _claude_env(t: Target) -> dict[str, str]:
    m = t.default
    return {
        "ANTHROPIC_BASE_URL": t.base.rstrip("/"),
        "ANTHROPIC_AUTH_TOKEN": t.key_or_placeholder,
        "ANTHROPIC_MODEL": m.name,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": m.name,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": m.name,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": m.name,
        "ANTHROPIC_SMALL_FAST_MODEL": m.name,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(m.output),
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(m.window),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def _claude_files(t: Target) -> tuple[ConfigFile, ...]:
    return (
        ConfigFile(
            "~/.claude/settings.json",
            "json",
            {"env": _claude_env(t)},
            use="read by claude at start (user settings; .claude/settings.json in a project)",
        ),
    )


def _claude_launch(t: Target) -> Launch:
    return Launch(("claude",), _claude_env(t), unset=("ANTHROPIC_API_KEY",))


# --- Codex CLI (0.171): a model provider over the Responses API; a profile is its own file
# ($CODEX_HOME/<name>.config.toml, `codex --profile <name>`, since 0.134) ---


def _codex_provider(t: Target) -> dict[str, Any]:
    provider: dict[str, Any] = {"name": PROVIDER, "base_url": t.v1, "wire_api": "responses"}
    if t.key:
        provider["env_key"] = KEY_ENV
    return provider


def _codex_files(t: Target) -> tuple[ConfigFile, ...]:
    m = t.default
    data = {
        "model": m.name,
        "model_provider": PROVIDER,
        "model_context_window": m.window,
        "model_providers": {PROVIDER: _codex_provider(t)},
    }
    use = "codex --profile fitbox" + (f" (with {KEY_ENV} set to the key)" if t.key else "")
    return (ConfigFile("~/.codex/fitbox.config.toml", "toml", data, use=use),)


def _codex_launch(t: Target) -> Launch:
    m = t.default
    argv = ["codex", "-c", f'model_provider="{PROVIDER}"', "-m", m.name]
    argv += ["-c", f"model_context_window={m.window}"]
    for k, v in _codex_provider(t).items():  # each value TOML, as -c reads it
        argv += ["-c", f"model_providers.{PROVIDER}.{k}={json.dumps(v)}"]
    return Launch(tuple(argv), {KEY_ENV: t.key} if t.key else {})


# --- OpenCode (1.18): a provider through @ai-sdk/openai-compatible, limits per model ---


def _opencode_config(t: Target) -> dict[str, Any]:
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {"baseURL": t.v1, "apiKey": t.key_or_placeholder},
                "models": {
                    m.name: {"name": m.name, "limit": {"context": m.window, "output": m.output}}
                    for m in t.models
                },
            }
        },
        "model": f"{PROVIDER}/{t.default.name}",
    }


def _opencode_files(t: Target) -> tuple[ConfigFile, ...]:
    return (
        ConfigFile(
            "~/.config/opencode/opencode.json",
            "json",
            _opencode_config(t),
            use=f"opencode --model {PROVIDER}/{t.default.name} (or the default model below)",
            soft=("$schema", "model"),
        ),
    )


def _opencode_launch(t: Target) -> Launch:
    inline = json.dumps(_opencode_config(t))
    return Launch(("opencode",), {"OPENCODE_CONFIG_CONTENT": inline})


# --- aider (0.86): litellm's openai/ prefix at --openai-api-base; the window and output
# limit in its model metadata, max_tokens per call in its model settings ---


def _aider_name(m: ModelLimits) -> str:
    return f"openai/{m.name}"


def _aider_metadata(t: Target) -> dict[str, Any]:
    return {
        _aider_name(m): {
            "max_input_tokens": m.window,
            "max_output_tokens": m.output,
            "max_tokens": m.output,
            "input_cost_per_token": 0,
            "output_cost_per_token": 0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
        for m in t.models
    }


def _aider_settings(t: Target) -> list[dict[str, Any]]:
    return [
        {"name": _aider_name(m), "edit_format": "whole", "extra_params": {"max_tokens": m.output}}
        for m in t.models
    ]


def _aider_files(t: Target) -> tuple[ConfigFile, ...]:
    conf = {
        "model": _aider_name(t.default),
        "openai-api-base": t.v1,
        "openai-api-key": t.key_or_placeholder,
    }
    return (
        ConfigFile(
            "~/.aider.conf.yml",
            "yaml",
            conf,
            use="read by aider from the home, the git root or the current directory",
            soft=("model",),
        ),
        ConfigFile("~/.aider.model.metadata.json", "json", _aider_metadata(t)),
        ConfigFile(
            "~/.aider.model.settings.yml", "yaml", _aider_settings(t), entries="", identity="name"
        ),
    )


def _aider_launch(t: Target) -> Launch:
    from fitbox.harness import render

    argv = (
        "aider",
        "--model",
        _aider_name(t.default),
        "--model-metadata-file",
        "{dir}/model.metadata.json",
        "--model-settings-file",
        "{dir}/model.settings.yml",
    )
    return Launch(
        argv,
        {"OPENAI_API_BASE": t.v1, "OPENAI_API_KEY": t.key_or_placeholder},
        files={
            "model.metadata.json": render.to_json(_aider_metadata(t)),
            "model.settings.yml": render.to_yaml(_aider_settings(t)),
        },
    )


# --- Continue's CLI (cn 1.5): config.yaml model entries, provider openai ---


def _continue_models(t: Target) -> list[dict[str, Any]]:
    return [
        {
            "name": m.name,
            "provider": "openai",
            "model": m.name,
            "apiBase": t.v1,
            "apiKey": t.key_or_placeholder,
            "roles": ["chat", "edit", "apply"],
            "defaultCompletionOptions": {"contextLength": m.window, "maxTokens": m.output},
        }
        for m in t.models
    ]


def _continue_config(t: Target) -> dict[str, Any]:
    return {"name": "fitbox", "version": "1.0.0", "schema": "v1", "models": _continue_models(t)}


def _continue_files(t: Target) -> tuple[ConfigFile, ...]:
    return (
        ConfigFile(
            "~/.continue/config.yaml",
            "yaml",
            _continue_config(t),
            use="cn (or cn --config FILE)",
            entries="models",
            identity="name",
            soft=("name", "version", "schema"),
        ),
    )


def _continue_launch(t: Target) -> Launch:
    from fitbox.harness import render

    return Launch(
        ("cn", "--config", "{dir}/config.yaml"),
        files={"config.yaml": render.to_yaml(_continue_config(t))},
    )


# --- pi (pi-coding-agent 0.73): a provider in ~/.pi/agent/models.json ---


def _pi_models(t: Target) -> dict[str, Any]:
    return {
        "providers": {
            PROVIDER: {
                "baseUrl": t.v1,
                "api": "openai-completions",
                "apiKey": t.key_or_placeholder,
                "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                "models": [
                    {
                        "id": m.name,
                        "name": m.name,
                        "input": ["text"],
                        "contextWindow": m.window,
                        "maxTokens": m.output,
                    }
                    for m in t.models
                ],
            }
        }
    }


def _pi_files(t: Target) -> tuple[ConfigFile, ...]:
    return (
        ConfigFile(
            "~/.pi/agent/models.json",
            "json",
            _pi_models(t),
            use=f"pi --provider {PROVIDER} --model {t.default.name}",
        ),
    )


def _pi_launch(t: Target) -> Launch:
    from fitbox.harness import render

    return Launch(
        ("pi", "--provider", PROVIDER, "--model", t.default.name),
        {"PI_CODING_AGENT_DIR": "{dir}"},
        files={"models.json": render.to_json(_pi_models(t))},
    )


# --- Qwen Code (0.15): its OpenAI auth type, base URL and key in settings or flags ---


def _qwen_files(t: Target) -> tuple[ConfigFile, ...]:
    m = t.default
    data = {
        "security": {
            "auth": {"selectedType": "openai", "baseUrl": t.v1, "apiKey": t.key_or_placeholder}
        },
        "model": {"name": m.name, "generationConfig": {"contextWindowSize": m.window}},
    }
    return (ConfigFile("~/.qwen/settings.json", "json", data, use="qwen"),)


def _qwen_launch(t: Target) -> Launch:
    argv = ("qwen", "--auth-type", "openai", "--openai-base-url", t.v1, "--openai-api-key")
    return Launch((*argv, t.key_or_placeholder, "--model", t.default.name))


# --- Gemini CLI: Google's Gemini API only ---


def _none(t: Target) -> tuple[ConfigFile, ...]:
    return ()


def _gemini_launch(t: Target) -> Launch:
    return Launch(("gemini",))


GEMINI_WHY = (
    "Gemini CLI speaks only Google's Gemini API (GOOGLE_GEMINI_BASE_URL points it at another "
    "Gemini-API server); fitbox serves the OpenAI and Anthropic shapes, so it cannot be "
    "pointed here. Qwen Code, a fork of it, can: fitbox launch qwen"
)


# --- llm (0.30): extra-openai-models.yaml in its user directory ---


def _llm_models(t: Target) -> list[dict[str, Any]]:
    entries = []
    for m in t.models:
        entry: dict[str, Any] = {
            "model_id": f"{PROVIDER}/{m.name}",
            "model_name": m.name,
            "api_base": t.v1,
        }
        if t.key:
            entry["api_key_name"] = PROVIDER
        entries.append(entry)
    return entries


def _llm_files(t: Target) -> tuple[ConfigFile, ...]:
    use = f"llm -m {PROVIDER}/{t.default.name}" + (
        f" (once: llm keys set {PROVIDER}, with the key)" if t.key else ""
    )
    return (
        ConfigFile(
            "~/.config/io.datasette.llm/extra-openai-models.yaml",
            "yaml",
            _llm_models(t),
            use=use,
            entries="",
            identity="model_id",
        ),
    )


def _llm_launch(t: Target) -> Launch:
    from fitbox.harness import render

    argv: tuple[str, ...] = ("llm", "-m", f"{PROVIDER}/{t.default.name}")
    if t.key:
        argv += ("--key", t.key)
    return Launch(
        argv,
        {"LLM_USER_PATH": "{dir}"},
        files={"extra-openai-models.yaml": render.to_yaml(_llm_models(t))},
    )


# --- plain shell environment, and the openai SDK ---


def _env_vars(t: Target) -> dict[str, str]:
    m = t.default
    return {
        "OPENAI_BASE_URL": t.v1,
        "OPENAI_API_BASE": t.v1,
        "OPENAI_API_KEY": t.key_or_placeholder,
        "OPENAI_MODEL": m.name,
        "ANTHROPIC_BASE_URL": t.base.rstrip("/"),
        "ANTHROPIC_AUTH_TOKEN": t.key_or_placeholder,
        "FITBOX_MODEL": m.name,
        "FITBOX_MODEL_WINDOW": str(m.window),
        "FITBOX_MODEL_OUTPUT": str(m.output),
    }


def _env_files(t: Target) -> tuple[ConfigFile, ...]:
    import shlex

    text = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in _env_vars(t).items())
    return (ConfigFile("fitbox.env", "text", text, use="source it in a shell"),)


def _env_launch(t: Target) -> Launch:
    import os

    return Launch((os.environ.get("SHELL") or "sh",), _env_vars(t))


def python_snippet(t: Target) -> str:
    m = t.default
    return (
        "from openai import OpenAI\n\n"
        f"client = OpenAI(base_url={t.v1!r}, api_key={t.key_or_placeholder!r})\n"
        "reply = client.chat.completions.create(\n"
        f"    model={m.name!r},\n"
        '    messages=[{"role": "user", "content": "Say hello."}],\n'
        f"    max_tokens={m.output},  # the window is {m.window} tokens\n"
        ")\n"
        "print(reply.choices[0].message.content)\n"
    )


def _python_files(t: Target) -> tuple[ConfigFile, ...]:
    return (ConfigFile("fitbox_client.py", "text", python_snippet(t), use="python3 FILE"),)


def _python_launch(t: Target) -> Launch:
    env = {"OPENAI_BASE_URL": t.v1, "OPENAI_API_KEY": t.key_or_placeholder}
    return Launch(("python3",), env)


TOOLS: tuple[Tool, ...] = (
    Tool("claude", "Claude Code", "npm @anthropic-ai/claude-code", _claude_files, _claude_launch),
    Tool("codex", "Codex CLI", "npm @openai/codex", _codex_files, _codex_launch),
    Tool("opencode", "OpenCode", "npm opencode-ai", _opencode_files, _opencode_launch),
    Tool("aider", "aider", "pip aider-chat", _aider_files, _aider_launch),
    Tool(
        "continue", "Continue CLI (cn)", "npm @continuedev/cli", _continue_files, _continue_launch
    ),
    Tool(
        "pi",
        "pi",
        "npm @mariozechner/pi-coding-agent",
        _pi_files,
        _pi_launch,
        note="launch runs pi with a directory of its own (PI_CODING_AGENT_DIR) holding only "
        "fitbox's models.json: pi has no inline config",
    ),
    Tool("qwen", "Qwen Code", "npm @qwen-code/qwen-code", _qwen_files, _qwen_launch),
    Tool(
        "gemini",
        "Gemini CLI",
        "npm @google/gemini-cli",
        _none,
        _gemini_launch,
        unsupported=GEMINI_WHY,
    ),
    Tool(
        "llm",
        "llm",
        "pip llm",
        _llm_files,
        _llm_launch,
        note="launch runs llm with a user directory of its own (LLM_USER_PATH): llm reads "
        "extra models from no other place",
    ),
    Tool("env", "shell environment", "-", _env_files, _env_launch),
    Tool("python", "Python openai SDK", "pip openai", _python_files, _python_launch),
)
BY_NAME = {tool.name: tool for tool in TOOLS}
ALIASES = {"claude-code": "claude", "cn": "continue", "qwen-code": "qwen", "shell": "env"}


class UnknownTool(ValueError):
    def __init__(self, name: str) -> None:
        known = ", ".join(t.name for t in TOOLS)
        super().__init__(f"no tool called {name!r}; known tools: {known}")


def tool(name: str) -> Tool:
    found = BY_NAME.get(ALIASES.get(name, name))
    if found is None:
        raise UnknownTool(name)
    return found
