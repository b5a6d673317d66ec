"""Failures a client can see. Each carries its HTTP status, OpenAI error type and code.

The server turns any of these into ``{"error": {"message", "type", "code", "param"}}``;
nothing reaches a client as a bare 500.
"""

from __future__ import annotations

from typing import Any


class FitboxError(Exception):
    """Any failure a client can see; as itself, a fault of the box's own."""

    status = 500
    type = "server_error"
    code = "internal_error"
    remedy = (
        "Retry once; if it comes back, read fitbox's log (journalctl -u fitbox for the service, "
        "else the terminal running fitbox serve) and report it."
    )
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
    """The request itself is wrong: a field missing or of the wrong type, a value out of range."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"
    remedy = (
        "Fix the field the message (and param) names; the same request sent again fails the "
        "same way."
    )


class ContextExceeded(InvalidRequest):
    """A prompt longer than any window the model can load (llama-server's own type and
    numbers, so a client trims history by them)."""

    type = "exceed_context_size_error"
    code = "context_length_exceeded"
    remedy = (
        "Shorten the prompt (trim history) below n_ctx, or raise the model's window (the window"
        " setting)."
    )


class BodyTooLarge(FitboxError):
    """A request body over the box's limit (FITBOX_MAX_BODY), refused before it is read whole."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"
    remedy = "Send a smaller body, or raise FITBOX_MAX_BODY on the box."
    closes = True


class AuthenticationFailed(FitboxError):
    """No usable key where one is needed. Says what is missing, never what the key was."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"
    remedy = (
        "Send Authorization: Bearer fb_<id>_<secret> with a key that is not revoked or expired "
        "(fitbox keys create)."
    )


class PermissionDenied(FitboxError):
    """The caller is known but may not do this: its key's scope or model limit, or a call from
    outside the box to a route for the box itself."""

    status = 403
    type = "permission_error"
    code = "insufficient_scope"
    remedy = (
        "Use a key with the scope the message names (admin for management), call from the box "
        "itself, or name the box in Host / send no foreign Origin."
    )


class ModelNotFound(FitboxError):
    """No model of the catalog has this name, alias or family name."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"
    remedy = (
        "GET /v1/models (or fitbox models) lists the names; put the GGUF in a model root, or "
        "add an alias."
    )


class ModelNotServable(FitboxError):
    """A model the box has a file for that it cannot serve (its file unreadable: code
    ``model_unreadable``; or not a GGUF it can size). The operator fixes it, not a retry."""

    status = 503
    type = "server_error"
    code = "model_not_servable"
    remedy = (
        "Fix the file (its owner, mode or format) as operator_reason says, then POST "
        "/v1/operator/refresh-models."
    )

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
    """No such route, or no such thing at it (a box, a file, an optional extra)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"
    remedy = (
        "Check the path against the route reference (GET /openapi.json); install the extra the "
        "message names."
    )


class LogNotFound(FitboxError):
    """No engine log file has that name (GET /v1/logs lists them)."""

    status = 404
    type = "invalid_request_error"
    code = "log_not_found"
    remedy = "Take a name from GET /v1/logs: a log may have been pruned since it was listed."


class RouteNotServed(FitboxError):
    """The model's engine kind has no such route (engines/seam.py ``routes()``): the
    caller's mistake in naming the model, as an engine's own 501 for a mismatch is."""

    status = 400
    type = "invalid_request_error"
    code = "route_not_served"
    remedy = (
        "Send the call to a model whose engine serves that route (a GGUF for the engine's own "
        "routes)."
    )


class DoesNotFit(FitboxError):
    """Even an empty box could not hold the model: retrying will not help."""

    status = 507
    type = "insufficient_capacity_error"
    code = "does_not_fit"
    remedy = (
        "Use a smaller variant or window, raise the box's limits, or free the pinned models the"
        " message names."
    )


class ModelBusy(FitboxError):
    """Room exists only once calls in flight finish, and they did not finish in time."""

    status = 503
    type = "server_error"
    code = "model_busy"
    remedy = (
        "Retry after Retry-After, or raise max_wait (FITBOX_WAIT_TIMEOUT) so calls wait longer."
    )
    retry = True


class Conflict(FitboxError):
    """The box is not in a state where this can be done now (a model serving calls)."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"
    remedy = (
        "Wait for the state the message names (the model idle, loaded, or failed) and try again."
    )


class EngineFailed(FitboxError):
    """The engine child failed: it exited or refused to load, or a box or source the call went to
    did not answer."""

    status = 502
    type = "server_error"
    code = "engine_failed"
    remedy = (
        "Read the engine's last log lines (log_tail, shown to insiders) and fix what they say;"
        ' POST /v1/operator/clear-failed {"model": …} retries a model marked failed.'
    )


class EngineTimeout(FitboxError):
    """The engine stopped sending bytes mid-call and did not answer a health probe."""

    status = 504
    type = "server_error"
    code = "engine_timeout"
    remedy = "Retry: the box stops the hung child and loads it again on the next call."
    retry = True


class ShuttingDown(FitboxError):
    """The box is stopping and takes no new calls."""

    status = 503
    type = "server_error"
    code = "shutting_down"
    remedy = "Retry once it is back (systemd restarts the service), or at another box."
    retry = True


class StorageFailed(FitboxError):
    """The store could not keep a change (its drive is full or failing): nothing changed.
    507 when the drive is full (``storage_full``); 503 ``storage_unavailable`` otherwise."""

    status = 507
    type = "server_error"
    code = "storage_full"
    remedy = "Free space on the drive holding the data dir (or fix the drive), then retry."


class StoreBusy(FitboxError):
    """The store did not answer within its bound (another process holds its write lock, or
    its drive is slow): nothing was changed, and a retry after ``Retry-After`` can succeed."""

    status = 503
    type = "server_error"
    code = "store_busy"
    remedy = (
        "Retry after Retry-After; stop the other process holding fitbox.sqlite3 if it persists."
    )
    retry = True


class StoreUnreadable(FitboxError):
    """The store could not be read for a reason a retry does not cure (a damaged file)."""

    status = 503
    type = "server_error"
    code = "store_unreadable"
    remedy = (
        "Restart fitbox: a damaged store is set aside and a new one made (/health says what was"
        " lost)."
    )


class PathNotOffered(FitboxError):
    """A transfer path outside the model's own files (``..``, absolute, hidden, a link out)."""

    status = 403
    type = "permission_error"
    code = "path_not_offered"
    remedy = (
        "Ask only for the paths the model's manifest lists (GET /v1/transfer/{model}/manifest)."
    )


class RangeNotSatisfiable(FitboxError):
    """A Range header past the file's end, or not one fitbox reads."""

    status = 416
    type = "invalid_request_error"
    code = "range_not_satisfiable"
    remedy = "Ask for bytes within the file's size, as bytes=START- or bytes=START-END."


class TooManyTransfers(FitboxError):
    """The box sends as many files as its transfer cap allows; one ends soon."""

    status = 429
    type = "rate_limit_error"
    code = "too_many_transfers"
    remedy = "Retry after Retry-After, or raise FITBOX_TRANSFER_MAX on the source box."
    retry = True


class HeadersTooLarge(FitboxError):
    """A request's line and headers over the box's limits, refused before they are read
    whole (server/door/connections.py)."""

    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"
    remedy = (
        "Send fewer or shorter headers, or raise FITBOX_REQUEST_HEAD_MAX / "
        "FITBOX_REQUEST_HEADERS_MAX."
    )
    closes = True


class RequestTimeout(FitboxError):
    """A request's head or body that did not arrive in time (server/door/connections.py)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"
    remedy = (
        "Send the request whole within FITBOX_REQUEST_HEAD_TIMEOUT / "
        "FITBOX_REQUEST_BODY_TIMEOUT, or raise them."
    )
    closes = True


class TooManyConnections(FitboxError):
    """The box holds as many connections as its cap allows (connections_max)."""

    status = 503
    type = "server_error"
    code = "too_many_connections"
    remedy = "Retry: close idle connections, or raise FITBOX_CONNECTIONS_MAX."
    retry = True
    closes = True


class EngineEnvBuilding(FitboxError):
    """The model's engine environment is not built yet; its build has started (off the
    request path: engines/task_envs.py)."""

    status = 503
    type = "server_error"
    code = "engine_env_building"
    remedy = (
        "Retry after Retry-After: the engine's environment is being built (`fitbox engines` "
        "shows its state); or build it ahead with `fitbox install --tasks`."
    )
    retry = True


class EngineEnvFailed(FitboxError):
    """The model's engine environment failed to build; calls do not build it again."""

    status = 503
    type = "server_error"
    code = "engine_env_failed"
    remedy = (
        "Fix what the message says (the build log is beside the environment), then run "
        "`fitbox install --tasks` to build it again."
    )


class ImageExpired(FitboxError):
    """An image URL whose image is no longer kept (or never was)."""

    status = 404
    type = "invalid_request_error"
    code = "image_expired"
    remedy = (
        "Generate the image again, and fetch its URL within FITBOX_ARTIFACT_MAX_AGE seconds; "
        "or ask response_format b64_json to get its bytes in the reply."
    )


class UploadTooLarge(FitboxError):
    """An upload over the box's limit, refused before it was read whole."""

    status = 413
    type = "invalid_request_error"
    code = "upload_too_large"
    remedy = "Send a smaller file, or raise FITBOX_UPLOAD_MAX on the box."
    closes = True
