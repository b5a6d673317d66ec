"""Box routes beyond the OpenAI surface. Read-only so far: what the box would do."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fitbox.box.box import Box
from fitbox.errors import InvalidRequest


def _positive(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidRequest(f"Query parameter '{name}' must be a positive integer.", param=name)
    return int(raw)


async def plan(request: Request) -> Response:
    """GET /v1/plan?model=&ctx=&parallel=&kv= : the placement, priced, without loading."""
    box: Box = request.app.state.box
    model = request.query_params.get("model")
    if not model:
        raise InvalidRequest("Query parameter 'model' is required.", param="model")
    report = box.plan_for(
        model,
        ctx=_positive(request, "ctx"),
        parallel=_positive(request, "parallel"),
        kv=request.query_params.get("kv") or "f16",
    )
    return JSONResponse(report)
