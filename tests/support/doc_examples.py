"""The user guide's examples: every fenced ``sh``/``bash``/``python`` block of docs/index.md
and docs/guide/, in page order, and README's tour. A block whose title says ``not run by the
tests: WHY`` is shown on the page with that reason and left out (it needs a GPU, the
network, root on another machine, or runs for good); tests/test_docs_examples_e2e.py runs
every other one against a real box. README's set-up commands are not examples: CI runs its
test command (.ci/run), and the first is the install it starts from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .paths import REPO

DOCS = REPO / "docs"
README = REPO / "README.md"
PAGES = (README, DOCS / "index.md", *sorted((DOCS / "guide").glob("*.md")))
ADDRESS = "http://127.0.0.1:8484"  # the address the guide's examples call
NOT_RUN = "not run by the tests:"
FENCE = re.compile(r'^```(?P<lang>[\w-]*)(?:\s+title="(?P<title>[^"]*)")?\s*$')


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    lang: str  # "sh" or "python"
    title: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        return not self.title.startswith(NOT_RUN)


def examples(pages: tuple[Path, ...] = PAGES) -> list[Example]:
    """Every shell and Python block of ``pages``; other fences (text, toml, json) are shown
    output or file contents, not examples."""
    found = []
    for page in pages:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            opening = FENCE.match(lines[i])
            if opening is None or not opening["lang"]:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            lang = {"bash": "sh", "shell": "sh"}.get(opening["lang"], opening["lang"])
            code = "\n".join(lines[i + 1 : end]) + "\n"
            if lang in ("sh", "python") and not (page == README and ADDRESS not in code):
                # README's tour runs the checkout's fitbox, as its set-up command installed it
                code = code.replace(".venv/bin/fitbox", "fitbox") if page == README else code
                found.append(Example(page, i + 1, lang, opening["title"] or "", code))
            i = end + 1
    return found
