"""Pointing the tools people already use at this box: what each tool is told (its base URL,
its key, each model's window and output limit) and where it is told it.

- ``limits``: a model's window and output limit from the box's placement (``/v1/plan``),
  or why it has none (a model that cannot be placed is named with the reason).
- ``tools``: the table, one entry per tool: how it is pointed at an OpenAI- or
  Anthropic-shaped base (environment, inline config, flags) and its own config file.
- ``shapes``: what an entry is made of (``Target``, ``ConfigFile``, ``Launch``, ``Tool``).
- ``render``: JSON, a small YAML and a small TOML written from plain data.
- ``blocks``: the block ``fitbox config TOOL`` prints (``config_block_text``, pure: the
  helper model calls it too) and what ``fitbox launch TOOL`` runs.
- ``merge``: a block merged into the tool's own file: the user's entries kept, a backup
  written, a fitbox entry that differs replaced only when forced.

Pure but for ``merge`` (files) and nothing here speaks HTTP: the CLI (cli/launch.py) asks
the running box and hands the answers in.
"""
