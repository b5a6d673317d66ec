"""The one error a call can get from the child's reading of it: a 400 naming the field."""

from __future__ import annotations


class BadRequest(ValueError):
    """A call this child cannot serve as asked; the message says what to change."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
