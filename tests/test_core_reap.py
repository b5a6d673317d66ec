"""reap_to_fit over random drive states (hypothesis): it never removes a resident, serving,
pinned or last copy, only worker copies with a central twin, least recently called first,
and only as many as the room needs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fitbox.core.reap import Copy, Drive, DriveRole, Kept, reap_to_fit

HASHES = ["a" * 64, "b" * 64, "c" * 64, "d" * 64, None]
DRIVES = [
    Drive("worker", DriveRole.WORKER, free=0),
    Drive("central", DriveRole.CENTRAL, free=0),
    Drive("ro", DriveRole.IMMUTABLE, free=0),
]

copies = st.lists(
    st.builds(
        Copy,
        path=st.text("abcdef", min_size=1, max_size=6),
        drive=st.sampled_from(["worker", "central", "ro"]),
        bytes=st.integers(1, 1 << 30),
        sha256=st.sampled_from(HASHES),
        last_called=st.floats(0, 1e6),
        resident=st.booleans(),
        serving=st.booleans(),
        pinned=st.booleans(),
    ),
    max_size=25,
    unique_by=lambda c: (c.drive, c.path),
)


@settings(max_examples=400, deadline=None)
@given(copies=copies, free=st.integers(0, 1 << 32), budget=st.none() | st.integers(0, 1 << 33),
       need=st.integers(0, 1 << 34))  # fmt: skip
def test_reap_never_removes_what_it_must_keep(
    copies: list[Copy], free: int, budget: int | None, need: int
) -> None:
    used = sum(c.bytes for c in copies if c.drive == "worker")
    drives = [Drive("worker", DriveRole.WORKER, free, used, budget), *DRIVES[1:]]
    plan = reap_to_fit(drives, copies, "worker", need)
    central = {c.sha256 for c in copies if c.drive == "central" and c.sha256}
    for victim in plan.victims:
        assert victim.drive == "worker"
        assert not (victim.resident or victim.serving or victim.pinned)
        assert victim.sha256 is not None and victim.sha256 in central  # never the last copy
    assert plan == reap_to_fit(drives, copies, "worker", need)  # deterministic
    room = drives[0].room()
    assert plan.freed == sum(v.bytes for v in plan.victims)
    assert plan.short_by == max(0, need - room - plan.freed)
    if plan.victims:  # only as many as needed: without the last one it would not fit
        assert room + plan.freed - plan.victims[-1].bytes < need
    calls = [v.last_called for v in plan.victims]
    assert calls == sorted(calls)  # least recently called first
    not_needed = [c for c, why in plan.kept if why is Kept.NOT_NEEDED]
    assert all(c.last_called >= calls[-1] for c in not_needed) if calls else True
    everything_on_worker = {c.path for c in copies if c.drive == "worker"}
    assert {c.path for c in plan.victims} | {c.path for c, _ in plan.kept} == everything_on_worker


def test_each_kept_copy_says_why() -> None:
    twin = "a" * 64
    copies = [
        Copy("central/m.gguf", "central", 10, twin),
        Copy("w/serving.gguf", "worker", 10, twin, serving=True),
        Copy("w/pinned.gguf", "worker", 10, twin, pinned=True),
        Copy("w/resident.gguf", "worker", 10, twin, resident=True),
        Copy("w/only.gguf", "worker", 10, "b" * 64),
        Copy("w/unhashed.gguf", "worker", 10, None),
        Copy("w/old.gguf", "worker", 10, twin, last_called=1.0),
        Copy("w/new.gguf", "worker", 10, twin, last_called=2.0),
    ]
    drives = [Drive("worker", DriveRole.WORKER, free=100, used=70, budget=75), *DRIVES[1:]]
    plan = reap_to_fit(drives, copies, "worker", need=12)
    assert [v.path for v in plan.victims] == ["w/old.gguf"] and plan.short_by == 0
    assert dict((c.path, why) for c, why in plan.kept) == {
        "w/serving.gguf": Kept.SERVING, "w/pinned.gguf": Kept.PINNED,
        "w/resident.gguf": Kept.RESIDENT, "w/only.gguf": Kept.LAST_COPY,
        "w/unhashed.gguf": Kept.UNHASHED, "w/new.gguf": Kept.NOT_NEEDED,
    }  # fmt: skip
    nothing = reap_to_fit(drives, copies, "worker", need=1000)
    assert nothing.short_by == 1000 - 5 - 20
