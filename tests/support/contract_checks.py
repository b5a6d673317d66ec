"""The checks schemathesis runs besides its own over a box (tests/test_contract_e2e.py loads
this module as its hooks): schemathesis's ``not_a_server_error`` fails on every 5xx, but two
are the box's deliberate capacity answers, each an OpenAI error body a client acts on."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.check
def no_server_error_but_capacity(ctx: Any, response: Any, case: Any) -> None:
    """No 5xx, except 507 (the model does not fit in what the box has) and 503 with
    Retry-After (wait for room): both say when or how a retry can help."""
    status = response.status_code
    if status < 500 or status == 507:
        return
    if status == 503 and "retry-after" in {name.lower() for name in response.headers}:
        return
    raise AssertionError(f"{case.operation.label} answered {status}: {response.text[:300]}")


# A request the document allows may still be refused (400) for what the box holds, which no
# document can say: these codes name it (what a model is, what the run's own settings left
# it, which keys and device the box has).
STATE_CODES = frozenset(
    {
        "not_a_reranker",  # rerank names a model that is none
        "not_an_embeddings_model",
        "route_not_served",  # a task route (images, audio) names a chat model
        "no_fill_in_the_middle_tokens",
        "no_candidate",  # this run's random pins and settings left the model no variant
        "key_not_found",  # per-key settings of a key that does not exist
        "above_parent_tier",  # a limit above what the device has
    }
)
# and these fields, on these operations, are checked against the store or each other
STATE_FIELDS: dict[str, set[str] | None] = {
    "GET /v1/telemetry/rows": {"table", "order"},  # the store's tables and their columns
    "POST /v1/facts/import": None,  # the rows must agree with each other and a file here
    "POST /v1/operator/{action}": {"model", "bytes"},  # which field an action reads
}
ACCEPTED = {401, 403, 404, 409, 429}  # schemathesis's own positive_data_acceptance, 4xx


@schemathesis.check
def valid_requests_accepted(ctx: Any, response: Any, case: Any) -> None:
    """schemathesis's positive_data_acceptance, knowing the refusals above: a request the
    document allows gets no 4xx but those, unless the box's state is the reason."""
    status = response.status_code
    if not case.meta or not case.meta.generation.mode.is_positive:
        return
    if status < 400 or status >= 500 or status in ACCEPTED:
        return
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = {}
    label = case.operation.label
    fields = STATE_FIELDS.get(label, set())
    if error.get("code") in STATE_CODES or fields is None or error.get("param") in fields:
        return
    raise AssertionError(
        f"{label} refused a request its document allows ({status}): {response.text[:300]}"
    )
