"""The settings of the fleet: how a box joins a central, and the central's own store and
long-poll (fitbox central serve), a part of the one settings table (setting_table.py)."""

from __future__ import annotations

from fitbox import setting_values as values
from fitbox.setting_values import Setting

CENTRAL: tuple[Setting, ...] = (
    Setting(
        "central_url",
        "FITBOX_CENTRAL_URL",
        "",
        "a fitbox central to register with at start (and whenever this box's address "
        "changes); default: none. A central that refuses or is down never stops the box",
        flag="--central URL",
    ),
    Setting(
        "central_key",
        "FITBOX_CENTRAL_KEY",
        "",
        "the worker key the central printed for this box (fitbox central keys create)",
        flag="--central-key KEY",
        secret=True,
    ),
    Setting(
        "central_db",
        "FITBOX_CENTRAL_DB",
        "",
        "the central's store (fitbox central serve): a postgresql://USER:PASSWORD@HOST:PORT/DB "
        "URL for a fleet that outgrows one file (psycopg 3: pip install 'fitbox[central-pg]'); "
        "default: central.sqlite3 in the central's home",
        secret=True,
    ),
    Setting(
        "central_long_poll",
        "FITBOX_CENTRAL_LONG_POLL",
        "25",
        "seconds the central's mirror asks each box to hold a long-poll with nothing new "
        "(fitbox central serve); a box that has not answered 3 s after that is suspected "
        "(no new calls), and 10 s after it marked unreachable and asked again",
        values.positive_float,
    ),
)
