"""The settings of what one connection may cost the box before any route runs (enforced by
server/door/connections.py), a part of the one settings table (setting_table.py)."""

from __future__ import annotations

from fitbox import setting_values as values
from fitbox.setting_values import Setting

CONNECTIONS: tuple[Setting, ...] = (
    Setting(
        "request_head_max",
        "FITBOX_REQUEST_HEAD_MAX",
        "64KiB",
        "largest request line and headers together; a larger head is answered 431 before "
        "the rest is read",
        values.positive_size,
    ),
    Setting(
        "request_headers_max",
        "FITBOX_REQUEST_HEADERS_MAX",
        "100",
        "most headers one request may have; more are answered 431",
        values.positive_int,
    ),
    Setting(
        "request_head_timeout",
        "FITBOX_REQUEST_HEAD_TIMEOUT",
        "30",
        "seconds a connection has to send a request's line and headers (from its opening, "
        "or from a kept-alive connection's first byte); one that sent nothing is closed, a "
        "slow one answered 408",
        values.positive_float,
    ),
    Setting(
        "request_body_timeout",
        "FITBOX_REQUEST_BODY_TIMEOUT",
        "300",
        "seconds a request's body has to arrive after its headers (time fitbox is not "
        "reading it does not count); a slower one is answered 408",
        values.positive_float,
    ),
    Setting(
        "send_stall_timeout",
        "FITBOX_SEND_STALL_TIMEOUT",
        "120",
        "seconds a reply may wait on a client that takes none of it (a transfer reader that "
        "stopped reading) before the connection is cut and what it held is freed",
        values.positive_float,
    ),
    Setting(
        "connections_max",
        "FITBOX_CONNECTIONS_MAX",
        "",
        "most connections open at once; one more is answered 503 and closed; default: half "
        "the open-file limit (raised to its hard limit at start) left after a reserve of 128",
        values.optional_positive_int,
    ),
)
