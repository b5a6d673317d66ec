"""Quantized test models, made with the ``llama-quantize`` that ships beside llama-server.

The base is a tiny llama whose widths are multiples of 256 (n_embd 512, n_ff 1536), so the
K-quants and the 256-block IQ types apply instead of falling back, and whose vocabulary
(112 tokens) is a multiple of 8, so the output matrix can be repacked too. Every type the
bundled ``llama-quantize`` writes without an importance matrix is here; IQ1_*, IQ2_*,
IQ3_XXS, IQ3_XS and Q2_K_S refuse without one (llama-quant.cpp tensor_requires_imatrix).
Two more files cover what the dense base cannot: routed experts (the zoo's MoE model) and
a tied output (no ``output.weight``). Every base keeps n_ff ≥ 2.5 × n_embd, as real models
do: the compute formula is fitted there (FORMULAS.md §Compute).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fitbox.core.repack import CpuFeatures, kernel
from fitbox.engines.llama_server import find_binary, inspect

from .gguf_zoo import write_moe
from .ggufs import write_tiny_llama

BASE_TYPES = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K_S",
    "Q3_K_M",
    "Q3_K_L",
    "Q4_K_S",
    "Q4_K_M",
    "Q5_K_S",
    "Q5_K_M",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "IQ3_S",
    "IQ3_M",
    "TQ1_0",
    "TQ2_0",
    "Q1_0",
    "Q2_0",
    "MXFP4_MOE",
    "F16",
    "BF16",
)
# (name, writer of the F32 source, llama-quantize type, extra arguments)
EXTRA = (
    ("moe-Q4_0", "moe", "Q4_0", ()),
    ("moe-MXFP4_MOE", "moe", "MXFP4_MOE", ()),
    ("tied-Q4_0", "tied", "Q4_0", ("--pure",)),
)


def quantize_binary() -> Path:
    return find_binary().path.with_name("llama-quantize")


def write_base(path: Path) -> Path:
    return write_tiny_llama(
        path, n_embd=512, n_layer=2, n_head=8, n_head_kv=4, n_ff=1536, n_ctx=8192
    )


def quantize(source: Path, target: Path, qtype: str, *extra: str) -> Path:
    """Run the real llama-quantize; a failure is the test's failure, with its output."""
    argv = [str(quantize_binary()), *extra, str(source), str(target), qtype, "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize {qtype} failed:\n{done.stdout[-2000:]}{done.stderr}")
    return target


def quantized_models(root: Path) -> dict[str, Path]:
    """Every quant of the base, plus the MoE and tied-output cases, written under ``root``
    once (files already there are kept: a bench rerun or a session fixture reuses them)."""
    root.mkdir(parents=True, exist_ok=True)
    sources = {
        "base": root / "base-F32.gguf",
        "moe": root / "moe-F32.gguf",
        "tied": root / "tied-F32.gguf",
    }
    if not sources["base"].exists():
        write_base(sources["base"])
    if not sources["moe"].exists():
        write_moe(sources["moe"])
    if not sources["tied"].exists():
        write_tiny_llama(sources["tied"], n_embd=256, n_head=4, n_ff=768, n_ctx=8192, tied=True)
    jobs = [(qtype, "base", qtype, ()) for qtype in BASE_TYPES] + list(EXTRA)
    out: dict[str, Path] = {}
    for name, source, qtype, extra in jobs:
        target = root / f"{name}.gguf"
        if not target.exists():
            quantize(sources[source], target.with_suffix(".tmp"), qtype, *extra).rename(target)
        out[name] = target
    return out


def repacking_cpu(binary: Path) -> CpuFeatures:
    """The engine's CPU features, or a skip that says why: a CPU that repacks nothing (no
    REPACK, or no Q4_0 kernel) cannot show the repack rule at all."""
    cpu = inspect(binary).cpu
    if kernel("Q4_0", 8, cpu) is None or not cpu.repacks:
        pytest.skip("this engine's CPU repacks nothing (no REPACK, or no kernel for Q4_0)")
    return cpu
