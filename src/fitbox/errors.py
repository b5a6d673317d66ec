"""Failures a client can see. Each carries its HTTP status, OpenAI error type and code.

The server turns any of these into ``{"error": {"message", "type", "code", "param"}}``;
nothing reaches a client as a bare 500.
"""

from __future__ import annotations

from typing import Any


class FitboxError(Exception):
    status = 500
    type = "server_error"
    code = "internal_error"
    retry = False  # tells OpenAI SDKs (x-should-retry) whether retrying can help
    closes = False  # the connection is not reused after it (its request was not read whole)

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        **detail: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after  # seconds until a retry can help (Retry-After)
        if code is not None:
            self.code = code
        self.detail = detail

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "code": self.code,
            "param": self.param,
        }
        error.update(self.detail)
        return {"error": error}


class InvalidRequest(FitboxError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class ContextExceeded(InvalidRequest):
    """A prompt longer than any window the model can load (llama-server's own type and
    numbers, so a client trims history by them)."""

    type = "exceed_context_size_error"
    code = "context_length_exceeded"


class BodyTooLarge(FitboxError):
    """A request body over the box's limit (FITBOX_MAX_BODY), refused before it is read whole."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"
    closes = True


class AuthenticationFailed(FitboxError):
    """No usable key where one is needed. Says what is missing, never what the key was."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(FitboxError):
    status = 403
    type = "permission_error"
    code = "insufficient_scope"


class ModelNotFound(FitboxError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class ModelNotServable(FitboxError):
    """A model the box has a file for that it cannot serve (its file unreadable: code
    ``model_unreadable``; or not a GGUF it can size). The operator fixes it, not a retry."""

    status = 503
    type = "server_error"
    code = "model_not_servable"

    @classmethod
    def because(
        cls, name: str, reason: str, *, unreadable: bool, doing: str = "loaded"
    ) -> ModelNotServable:
        """The refusal of ``name``: its ``reason`` names paths, owners and modes, so it
        goes in ``operator_reason``, shown to the box itself and to admin keys only
        (server/door/errors.py body_for)."""
        return cls(
            f"The model '{name}' is on this box but cannot be {doing}",
            param="model",
            code="model_unreadable" if unreadable else "model_not_servable",
            operator_reason=reason,
        )


class RouteNotFound(FitboxError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class LogNotFound(FitboxError):
    """No engine log file has that name (GET /v1/logs lists them)."""

    status = 404
    type = "invalid_request_error"
    code = "log_not_found"


class RouteNotServed(FitboxError):
    """The model's engine kind has no such route (engines/seam.py ``routes()``)."""

    status = 501
    type = "not_supported_error"
    code = "route_not_served"


class DoesNotFit(FitboxError):
    """Even an empty box could not hold the model: retrying will not help."""

    status = 507
    type = "insufficient_capacity_error"
    code = "does_not_fit"


class ModelBusy(FitboxError):
    """Room exists only once calls in flight finish, and they did not finish in time."""

    status = 503
    type = "server_error"
    code = "model_busy"
    retry = True


class Conflict(FitboxError):
    """The box is not in a state where this can be done now (a model serving calls)."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


class EngineFailed(FitboxError):
    status = 502
    type = "server_error"
    code = "engine_failed"


class EngineTimeout(FitboxError):
    """The engine stopped sending bytes mid-call and did not answer a health probe."""

    status = 504
    type = "server_error"
    code = "engine_timeout"
    retry = True


class ShuttingDown(FitboxError):
    status = 503
    type = "server_error"
    code = "shutting_down"
    retry = True


class StorageFailed(FitboxError):
    """The store could not keep a change (its drive is full or failing): nothing changed.
    507 when the drive is full (``storage_full``); 503 ``storage_unavailable`` otherwise."""

    status = 507
    type = "server_error"
    code = "storage_full"


class StoreBusy(FitboxError):
    """The store did not answer within its bound (another process holds its write lock, or
    its drive is slow): nothing was changed, and a retry after ``Retry-After`` can succeed."""

    status = 503
    type = "server_error"
    code = "store_busy"
    retry = True


class StoreUnreadable(FitboxError):
    """The store could not be read for a reason a retry does not cure (a damaged file)."""

    status = 503
    type = "server_error"
    code = "store_unreadable"


class PathNotOffered(FitboxError):
    """A transfer path outside the model's own files (``..``, absolute, hidden, a link out)."""

    status = 403
    type = "permission_error"
    code = "path_not_offered"


class RangeNotSatisfiable(FitboxError):
    status = 416
    type = "invalid_request_error"
    code = "range_not_satisfiable"


class TooManyTransfers(FitboxError):
    """The box sends as many files as its transfer cap allows; one ends soon."""

    status = 429
    type = "rate_limit_error"
    code = "too_many_transfers"
    retry = True


class HeadersTooLarge(FitboxError):
    """A request's line and headers over the box's limits, refused before they are read
    whole (server/door/connections.py)."""

    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"
    closes = True


class RequestTimeout(FitboxError):
    """A request's head or body that did not arrive in time (server/door/connections.py)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"
    closes = True


class TooManyConnections(FitboxError):
    """The box holds as many connections as its cap allows (connections_max)."""

    status = 503
    type = "server_error"
    code = "too_many_connections"
    retry = True
    closes = True
