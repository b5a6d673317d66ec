"""The errors a call can get from the child: a 400 naming the field it cannot read as
asked, and the model computing NaN or infinity (500 engine_failed, never JSON)."""

from __future__ import annotations


class BadRequest(ValueError):
    """A call this child cannot serve as asked; the message says what to change."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class NonFinite(RuntimeError):
    """The model computed NaN or infinity: corrupt weights, found as they run. Never sent
    as JSON (a strict parser refuses a literal NaN): the call fails with the reason."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"the model's {what} hold NaN or infinity: its weights are likely corrupt "
            "(a bad conversion or download); fetch them again"
        )
