"""GGUF headers, facts and discovery, on files the tests write with the gguf package."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

import pytest
from gguf import GGUFReader

from fitbox.errors import ModelNotFound
from fitbox.models import catalog as catalog_module
from fitbox.models.catalog import Artifact, Catalog, Unservable, scan
from fitbox.models.facts_cache import FactsCache
from fitbox.models.folder_judge import EngineSupport
from fitbox.models.gguf_facts import read_facts
from fitbox.models.gguf_header import NotGGUF, read_header

from .support.ggufs import write_projector, write_tiny_llama, write_vision_projector


def test_header_matches_the_gguf_package(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", extra_vocab=5000)
    ours = read_header(path)
    theirs = GGUFReader(str(path))
    assert sum(t.n_bytes for t in ours.tensors) == sum(int(t.n_bytes) for t in theirs.tensors)
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    assert ours.get("llama.block_count") == 2
    n_tokens = len(theirs.fields["tokenizer.ggml.tokens"].data)
    assert ours.get("tokenizer.ggml.tokens").length == n_tokens > 5000  # a length only


def test_facts_give_the_shape(tmp_path: Path) -> None:
    facts = read_facts(write_tiny_llama(tmp_path / "m.gguf", n_head=4, n_head_kv=2))
    shape = facts.shape
    assert (facts.architecture, shape.n_layer, shape.n_ctx_train) == ("llama", 2, 512)
    assert shape.kv_heads == (2, 2) and shape.key_length == 16
    assert not facts.is_projector and not facts.is_embedding


@pytest.mark.parametrize("content", [b"", b"GGUF", b"not a gguf file at all", b"GGUF\x03\x00"])
def test_broken_files_are_refused_clearly(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    with pytest.raises(NotGGUF):
        read_header(path)


def test_truncated_header_is_refused(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:200])
    with pytest.raises(NotGGUF):
        read_header(path)


def test_discovery_goes_by_magic_not_name(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "renamed.bin")
    (tmp_path / "fake.gguf").write_text("this is not a model")
    write_projector(tmp_path / "vision-proj.gguf")
    (tmp_path / "sub").mkdir()
    write_tiny_llama(tmp_path / "sub" / "nested.gguf")
    write_tiny_llama(tmp_path / "half.gguf.part")
    names = [a.name for a in scan([tmp_path])[0]]
    assert names == ["nested", "renamed.bin"]


def test_bad_files_get_a_reason_and_never_stop_discovery(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "good.gguf")
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "good.gguf").read_bytes()[:300])
    from gguf import GGUFWriter

    odd = GGUFWriter(str(tmp_path / "odd.gguf"), "some-future-arch")
    odd.write_header_to_file()
    odd.write_kv_data_to_file()
    odd.write_tensors_to_file()
    odd.close()
    artifacts, rejected = scan([tmp_path])
    assert [a.name for a in artifacts] == ["good"]
    reasons = {r.path.name: r.reason for r in rejected}
    assert "not a readable GGUF" in reasons["cut.gguf"]
    assert "'some-future-arch' has no block_count" in reasons["odd.gguf"]


def test_split_models_are_listed_once_by_their_first_shard(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "big-00001-of-00002.gguf")
    write_tiny_llama(tmp_path / "big-00002-of-00002.gguf")
    assert [a.name for a in scan([tmp_path])[0]] == ["big"]


def test_catalog_resolves_aliases_and_sees_new_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog_module, "RESCAN_AT_MOST_EVERY_S", 0.0)
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "tiny.gguf")
    aliases = tmp_path / "aliases.toml"
    aliases.write_text('[aliases]\nsmall = "tiny"\n')
    catalog = Catalog((root,), aliases)
    assert catalog.resolve("small").name == "tiny"
    assert catalog.aliases_of("tiny") == ["small"]
    shutil.copy(root / "tiny.gguf", root / "later.gguf")
    assert catalog.resolve("later").name == "later"  # a miss rescans the roots
    with pytest.raises(ModelNotFound, match="Known models: later, tiny"):
        catalog.resolve("nope")


def test_a_hundred_files_are_read_quickly(tmp_path: Path) -> None:
    source = write_tiny_llama(tmp_path / "src.gguf", extra_vocab=2000)
    root = tmp_path / "many"
    root.mkdir()
    for i in range(100):
        shutil.copy(source, root / f"m{i:03d}.gguf")
    started = time.perf_counter()
    found = scan([root])[0]
    assert len(found) == 100
    # not a timing assertion: the figure goes to bench/, this only shows it was measured
    print(f"discovered 100 files in {time.perf_counter() - started:.3f} s")


def test_misses_rescan_at_most_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_llama(tmp_path / "tiny.gguf")
    clock = [1000.0]  # the catalog's monotonic clock, moved by the test alone
    monkeypatch.setattr(catalog_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    catalog = Catalog((tmp_path,), tmp_path / "aliases.toml")  # scans once, at 1000.0
    scans: list[int] = []
    real = catalog_module.scan

    def counting(
        roots: Iterable[Path], cache: FactsCache | None = None, support: EngineSupport | None = None
    ) -> tuple[list[Artifact], list[Unservable]]:
        scans.append(1)
        return real(roots, cache, support)

    monkeypatch.setattr(catalog_module, "scan", counting)  # what a refresh runs

    def misses(n: int) -> None:
        for _ in range(n):
            with pytest.raises(ModelNotFound):
                catalog.resolve("nope")

    misses(50)
    clock[0] += 0.75
    misses(50)
    assert scans == []  # within a second of the last scan: none
    clock[0] += 0.25  # exactly 1 s after it
    misses(50)
    assert scans == [1]  # a second on: one rescan, for the first miss alone
    clock[0] += 5.0
    misses(50)
    assert scans == [1, 1]


def test_facts_survive_a_restart_through_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    path = write_tiny_llama(root / "tiny.gguf")
    cache_file = tmp_path / "cache" / "facts.json"
    first = scan([root], FactsCache(cache_file))[0][0].facts
    assert cache_file.is_file()
    second = FactsCache(cache_file).facts(path)  # a new process: read from the cache
    assert second == first and second.layout == first.layout
    assert second.shape.weights_by_kind == first.shape.weights_by_kind
    assert second.shape.tensors == first.shape.tensors and second.shape.tensors  # repack rule
    projector = write_vision_projector(root / "mmproj.gguf", n_embd_text=64)
    fresh = FactsCache(cache_file)
    assert fresh.facts(projector).projector is not None
    fresh.save()
    assert FactsCache(cache_file).facts(projector).projector == read_facts(projector).projector
    cache_file.write_text("{not json")  # damaged: ignored, rebuilt
    assert FactsCache(cache_file).facts(path) == first
    write_tiny_llama(path, n_layer=3)  # the file changed: read again, not served stale
    assert FactsCache(cache_file).facts(path).shape.n_layer == 3


def test_tensor_records_carry_layer_op_offset_and_the_tied_duplicate(tmp_path: Path) -> None:
    from fitbox.core.repack import MUL_MAT
    from fitbox.models.gguf_header import read_header

    path = write_tiny_llama(tmp_path / "tied.gguf", tied=True)
    header, facts = read_header(path), read_facts(path)
    by_offset = {t.offset: t for t in header.tensors}
    assert len(by_offset) == len(header.tensors)  # real, distinct data offsets
    assert sorted(by_offset)[0] % 32 == 0  # the data section is aligned
    records = facts.shape.tensors
    embd = next(t for t in records if t.layer == -1)
    assert embd.op == "" and not embd.duplicate  # token_embd: GET_ROWS, never repacked
    (dup,) = [t for t in records if t.duplicate]
    assert (dup.layer, dup.op, dup.offset) == (facts.shape.n_layer, MUL_MAT, embd.offset)
    norms = [t for t in records if t.dims == 1]
    assert norms and all(t.op == "" for t in norms)  # a norm is no matrix product
    q = next(t for t in records if t.layer == 0 and t.rows == 64 and t.dims == 2)
    assert q.op == MUL_MAT and q.type == "F32"


def test_a_vision_projector_has_its_own_shape(tmp_path: Path) -> None:
    path = write_vision_projector(
        tmp_path / "mmproj.gguf",
        n_embd_text=64,
        image_size=224,
        patch_size=14,
        n_embd=128,
        n_ff=256,
        n_layer=3,
    )
    facts = read_facts(path)
    assert facts.is_projector and facts.projector is not None
    p = facts.projector
    assert (p.projector_type, p.positions, p.n_embd, p.n_ff, p.n_layer) == ("mlp", 257, 128, 256, 3)
    assert p.weights_bytes >= sum(t.n_bytes for t in facts.shape.tensors)
    assert read_facts(write_tiny_llama(tmp_path / "t.gguf")).projector is None


def test_transformers_folders_are_artifacts_and_hf_caches_are_named_once(
    tmp_path: Path,
) -> None:
    from .support.hf_models import LLAMA, LLAMA_BYTES, llama_dir, write_config, write_raw

    llama_dir(tmp_path / "llama-hf")
    liar = tmp_path / "liar"
    write_config(liar, LLAMA)
    write_raw(
        liar / "model.safetensors",
        {"w": {"dtype": "F16", "shape": [3, 3], "data_offsets": [0, 10]}},
        10,
    )
    # a Hugging Face cache holding a GGUF: found once, by its snapshot name, not its blob
    cache = tmp_path / "hub" / "models--org--tiny"
    (cache / "blobs").mkdir(parents=True)
    blob = write_tiny_llama(cache / "blobs" / ("ab" * 32))
    (cache / "snapshots" / "rev").mkdir(parents=True)
    (cache / "snapshots" / "rev" / "tiny-q.gguf").symlink_to(blob)
    # a cached transformers model with two revisions: refs/main names the one served, and
    # its files are read through the blobs they link to
    hf = tmp_path / "hub" / "models--owner--chat"
    old, new = hf / "snapshots" / "old", hf / "snapshots" / "new"
    llama_dir(old)
    (hf / "blobs").mkdir()
    llama_dir(hf / "blobs" / "x")
    new.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (new / name).symlink_to(hf / "blobs" / "x" / name)
    (hf / "refs").mkdir()
    (hf / "refs" / "main").write_text("new")
    artifacts, rejected = scan([tmp_path])
    by_name = {a.name: a for a in artifacts}
    assert sorted(by_name) == ["llama-hf", "owner/chat", "tiny-q"]
    assert by_name["owner/chat"].path == new and by_name["owner/chat"].format == "transformers"
    folder = by_name["llama-hf"]
    assert folder.format == "transformers" and folder.facts.shape.weights_bytes == LLAMA_BYTES
    assert folder.facts.shape.n_layer == 4 and not folder.facts.is_embedding
    reasons = {r.path.name: r.reason for r in rejected}
    assert "not a usable transformers model" in reasons["liar"] and "needs 18" in reasons["liar"]
    assert "old" not in reasons  # a superseded revision is neither served nor refused


def test_a_family_name_stands_for_every_variant_largest_first(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "fam-Q8_0.gguf", extra_vocab=2000)
    write_tiny_llama(tmp_path / "fam-Q4_K_M.gguf")
    write_tiny_llama(tmp_path / "other.gguf")
    catalog = Catalog((tmp_path,), tmp_path / "aliases.toml")
    assert [a.name for a in catalog.variants("fam")] == ["fam-Q8_0", "fam-Q4_K_M"]
    assert [a.name for a in catalog.variants("fam-Q4_K_M")] == ["fam-Q4_K_M"]  # its own name
    assert [a.name for a in catalog.variants("other")] == ["other"]
    with pytest.raises(ModelNotFound):
        catalog.variants("fam-Q2")
    assert catalog_module.family_name("Qwen3-8B.UD-Q4_K_XL") == "Qwen3-8B"
    assert catalog_module.is_four_bit("Q4_K_M") and catalog_module.is_four_bit("IQ4_XS")
    assert not catalog_module.is_four_bit("Q5_K_M")


def test_a_cache_that_answered_from_disk_saves_again_after_a_file_left(tmp_path: Path) -> None:
    """One process scans again and again (a catalog refresh after a reap): answers from
    the cache file, a file removed, a rescan; saving must still write JSON (the entries
    once held the decoded tensors, and the removed file's entry was never read again)."""
    root = tmp_path / "models"
    root.mkdir()
    write_tiny_llama(root / "a.gguf")
    write_tiny_llama(root / "b.gguf", seed=2)
    cache_file = tmp_path / "facts.json"
    scan([root], FactsCache(cache_file))
    cache = FactsCache(cache_file)
    scan([root], cache)  # answered from the file
    (root / "a.gguf").unlink()
    scan([root], cache)
    write_tiny_llama(root / "c.gguf", seed=3)
    assert sorted(a.name for a in scan([root], cache)[0]) == ["b", "c"]
    assert str(root / "c.gguf") in FactsCache(cache_file)._entries  # saved
