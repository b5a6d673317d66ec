"""The dashboard's cells: escaping and small formatting, shared by the box's page
(server/views/dashboard_html.py, dashboard_parts.py) and the central's (central/page_html.py)."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence
from typing import Any


def _e(value: Any) -> str:
    """Escaped for text and attributes; line breaks as references, so a fragment is one line
    (an SSE data line cannot carry a raw one)."""
    text = html.escape("" if value is None else str(value))
    return text.replace("\r", "&#13;").replace("\n", "&#10;")


def _table(
    heads: Sequence[str], rows: Iterable[Sequence[str]], empty: str, css: Sequence[str] = ()
) -> str:
    """Cells are HTML already escaped; ``css`` names a class per row (or "")."""
    body = [
        f"<tr{f' class={c!r}' if c else ''}>{''.join(f'<td>{cell}</td>' for cell in row)}</tr>"
        for row, c in zip(rows, [*css, *([""] * 10_000)], strict=False)
    ]
    if not body:
        return f'<p class="muted">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in heads)
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _ms(start: Any, end: Any) -> str:
    return f"{(end - start) * 1000:.0f} ms" if start and end else ""


def _when(stamp: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(stamp)) if stamp else ""


def _share(size: int, capacity: int) -> str:
    return f"{min(100 * size / max(capacity, 1), 100):.2f}%"
