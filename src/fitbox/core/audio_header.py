"""A WAV file's length in seconds from its header, for a transcription's expected work
(the admission queue's ETA, FORMULAS.md §Admission). Only the header is read; no sample is
decoded. None when the bytes do not say (another format, a truncated or odd file): the
call then waits without an ETA, as a chat call that asked for no ``max_tokens``.

Source: the RIFF WAVE layout (Microsoft's Multimedia Programming Interface and Data
Specifications 1.0, "WAVE Form Type"): ``fmt `` carries the byte rate, ``data`` the
samples' bytes. A writer that streams sets ``data``'s size to 0 or 0xFFFFFFFF: the rest of
the file is then taken as the samples.
"""

from __future__ import annotations

import struct

HEAD = 4096  # bytes of a file read for its header: fmt and data come first in practice


def wav_seconds(head: bytes, size: int) -> float | None:
    """Seconds of audio in a WAV file whose first bytes are ``head`` and whole size is
    ``size``; None when it is not a WAV this header describes."""
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    at, byte_rate = 12, 0
    while at + 8 <= len(head):
        name, length = head[at : at + 4], struct.unpack("<I", head[at + 4 : at + 8])[0]
        body = at + 8
        if name == b"fmt " and body + 12 <= len(head):
            byte_rate = struct.unpack("<I", head[body + 8 : body + 12])[0]
        elif name == b"data":
            if byte_rate <= 0:
                return None
            samples = size - body if length in (0, 0xFFFFFFFF) else min(length, size - body)
            return max(samples, 0) / byte_rate
        at = body + length + (length & 1)  # chunks are padded to an even length
    return None
