"""The settings of task calls' files (speech, transcription, images): how large an upload
may be, and how long and how much of their outputs the box keeps (enforced by
server/door/uploads.py and server/door/artifacts.py), a part of the one settings table
(setting_table.py)."""

from __future__ import annotations

from fitbox import setting_values as values
from fitbox.setting_values import Setting

TASKS: tuple[Setting, ...] = (
    Setting(
        "upload_max",
        "FITBOX_UPLOAD_MAX",
        "25MiB",
        "largest file a task call may upload (an audio file to transcribe); a larger one is "
        "refused with 413 before it is read whole (its Content-Length, else as it streams)",
        values.positive_size,
    ),
    Setting(
        "artifact_max_age",
        "FITBOX_ARTIFACT_MAX_AGE",
        "3600",
        "seconds a task call's output (speech, an image) is kept in the artifact dir",
        values.positive_float,
    ),
    Setting(
        "artifact_max",
        "FITBOX_ARTIFACT_MAX",
        "1GiB",
        "most bytes the artifact dir keeps; the oldest outputs go first",
        values.positive_size,
    ),
)
