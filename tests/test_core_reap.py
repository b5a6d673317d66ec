"""reap_to_fit over random drive states (hypothesis): it never removes a resident, serving,
pinned or last copy, only worker copies with a central twin, least recently called first,
and only as many as the room needs; a split GGUF's shards only all together, and only when
each has its twin on a central drive."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from fitbox.core.reap import Copy, Drive, DriveRole, Kept, StoredFile, copies_of, reap_to_fit

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
@given(
    copies=copies,
    free=st.integers(0, 1 << 32),
    budget=st.none() | st.integers(0, 1 << 33),
    need=st.integers(0, 1 << 34),
)
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
        "w/serving.gguf": Kept.SERVING,
        "w/pinned.gguf": Kept.PINNED,
        "w/resident.gguf": Kept.RESIDENT,
        "w/only.gguf": Kept.LAST_COPY,
        "w/unhashed.gguf": Kept.UNHASHED,
        "w/new.gguf": Kept.NOT_NEEDED,
    }
    nothing = reap_to_fit(drives, copies, "worker", need=1000)
    assert nothing.short_by == 1000 - 5 - 20


# Stored files on the three drives: single GGUFs and shards of split GGUFs (some sets with
# a shard missing), each file's hash drawn from a few, so twins happen.
def _stored(drive: str, name: str, sha256: str | None, size: int) -> StoredFile:
    return StoredFile(f"{drive}/m/{name}", drive, size, sha256)


SET_NAMES = [f"big-{i:05d}-of-00003.gguf" for i in (1, 2, 3)] + [
    f"duo-{i:05d}-of-00002.gguf" for i in (1, 2)
]
stored_files = st.lists(
    st.builds(
        _stored,
        drive=st.sampled_from(["worker", "worker", "central", "ro"]),  # most on the worker
        name=st.sampled_from(["a.gguf", "b.gguf", *SET_NAMES]),
        sha256=st.sampled_from(["a" * 64, "b" * 64, None]),  # few, so twins and misses happen
        size=st.integers(1, 1 << 30),
    ),
    max_size=30,
    unique_by=lambda f: f.path,
)


@settings(max_examples=400, deadline=None)
@given(
    files=stored_files,
    marks=st.lists(st.sampled_from(["resident", "serving", "pinned"])),
    called=st.dictionaries(
        st.sampled_from(["a.gguf", SET_NAMES[0], SET_NAMES[3]]), st.floats(0, 1e6)
    ),
    free=st.integers(0, 1 << 32),
    need=st.integers(0, 1 << 34),
)
def test_a_split_gguf_is_reaped_whole_and_only_with_every_shard_twinned(
    files: list[StoredFile], marks: list[str], called: dict[str, float], free: int, need: int
) -> None:
    last_called = {f"worker/m/{name}": at for name, at in called.items()}
    copies = copies_of(files, last_called)
    # the marks fall on the first worker copies, as the registry marks a resident's path
    worker_copies = [c for c in copies if c.drive == "worker"]
    for mark, copy in zip(marks, worker_copies, strict=False):
        copies[copies.index(copy)] = replace(
            copy, resident=mark == "resident", serving=mark == "serving", pinned=mark == "pinned"
        )
    used = sum(f.bytes for f in files if f.drive == "worker")
    drives = [Drive("worker", DriveRole.WORKER, free, used), *DRIVES[1:]]
    plan = reap_to_fit(drives, copies, "worker", need)
    removed = {path for victim in plan.victims for path in victim.files}
    central = {f.sha256 for f in files if f.drive == "central" and f.sha256}
    for f in files:
        if f.path in removed:
            assert f.drive == "worker" and f.sha256 in central  # every removed file twinned
    for victim in plan.victims:
        assert not (victim.resident or victim.serving or victim.pinned)
        first = victim.files[0].rsplit("/", 1)[1]
        if first in SET_NAMES:  # a set goes whole: every shard its name counts, and no other
            base, count = first.split("-")[0], int(first[-10:-5])
            assert {p.rsplit("/", 1)[1] for p in victim.files} == {
                f"{base}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)
            }
    for f in files:  # no file of a set is removed unless the whole set is
        name = f.path.rsplit("/", 1)[1]
        if f.drive == "worker" and name in SET_NAMES and f.path in removed:
            base = name.split("-")[0]
            siblings = {
                g.path
                for g in files
                if g.drive == "worker" and g.path.rsplit("/", 1)[1].startswith(f"{base}-")
            }
            assert siblings <= removed
    assert plan.freed == sum(f.bytes for f in files if f.path in removed)
    assert plan == reap_to_fit(drives, copies, "worker", need)  # deterministic


def test_a_set_missing_a_shard_or_a_shard_twin_is_kept_whole() -> None:
    twin, other = "a" * 64, "b" * 64
    files = [
        StoredFile("central/m/s-00001-of-00002.gguf", "central", 5, twin),
        StoredFile("central/m/s-00002-of-00002.gguf", "central", 5, twin),
        StoredFile("worker/m/s-00001-of-00002.gguf", "worker", 5, twin),
        StoredFile("worker/m/s-00002-of-00002.gguf", "worker", 5, twin),
        StoredFile("worker/m/t-00001-of-00002.gguf", "worker", 5, twin),  # shard 2 lacks a twin
        StoredFile("worker/m/t-00002-of-00002.gguf", "worker", 5, other),
        StoredFile("worker/m/u-00002-of-00003.gguf", "worker", 5, twin),  # shards 1, 3 missing
    ]
    copies = copies_of(files, {})
    assert [(c.path, len(c.files), c.bytes, c.complete) for c in copies] == [
        ("central/m/s-00001-of-00002.gguf", 2, 10, True),
        ("worker/m/s-00001-of-00002.gguf", 2, 10, True),
        ("worker/m/t-00001-of-00002.gguf", 2, 10, True),
        ("worker/m/u-00002-of-00003.gguf", 1, 5, False),
    ]
    drives = [Drive("worker", DriveRole.WORKER, free=0, used=25, budget=25), *DRIVES[1:]]
    plan = reap_to_fit(drives, copies, "worker", need=100)
    assert [v.files for v in plan.victims] == [
        ("worker/m/s-00001-of-00002.gguf", "worker/m/s-00002-of-00002.gguf")
    ]
    assert plan.freed == 10 and plan.short_by == 90
    assert {c.path: why for c, why in plan.kept} == {
        "worker/m/t-00001-of-00002.gguf": Kept.LAST_COPY,
        "worker/m/u-00002-of-00003.gguf": Kept.INCOMPLETE_SET,
    }
