"""The llama-server load-log parser, against real logs (tests/data/load_logs, written by its
regenerate.py) and against synthetic GPU lines built from the engine's format strings."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitbox.engines.load_log import (
    MIB,
    BreakdownRow,
    KVCacheLine,
    LoadReport,
    RecurrentLine,
    parse_load_log,
)

LOGS = Path(__file__).parent / "data" / "load_logs"
SMOLLM2 = {
    "c4096-np1": "smollm2-c4096-np1.log",
    "c8192-np4": "smollm2-c8192-np4.log",
    "c4096-np4-kvu": "smollm2-c4096-np4-kvu.log",
    "c2048-q8_0-fa": "smollm2-c2048-np1-q8_0-fa.log",
    "c1024-nofa": "smollm2-c1024-np1-nofa.log",
}
FAILURE = "failure-no-vocab.log"
TEXTS = {name: (LOGS / file).read_text() for name, file in {**SMOLLM2, "fail": FAILURE}.items()}


def mib(figure: str) -> int:
    """A figure as llama.cpp prints it (two decimals), in bytes."""
    return round(float(figure) * MIB)


def host_row(self_: int, model: int, context: int, compute: int) -> BreakdownRow:
    return BreakdownRow(
        "Host", None, None, None, self_ * MIB, model * MIB, context * MIB, compute * MIB, None
    )


def f16_kv(total: str, cells: int, seqs: int, streams: int, half: str) -> KVCacheLine:
    return KVCacheLine(
        mib(total), cells, 30, seqs, streams, "f16", mib(half), "f16", mib(half), "unified"
    )


# name: (KV line, compute MiB, output MiB, n_ctx, n_ctx_seq, n_seq_max, n_batch, flash_attn,
#        kv_unified, n_slots, n_ctx_slot, Host breakdown (self, model, context, compute))
EXPECTED = {
    "c4096-np1": (
        f16_kv("90.00", 4096, 1, 1, "45.00"),
        "18.64",
        "0.19",
        4096,
        4096,
        1,
        2048,
        "auto",
        False,
        1,
        4096,
        (200, 92, 90, 18),
    ),
    "c8192-np4": (
        f16_kv("180.00", 2048, 4, 4, "90.00"),
        "16.64",
        "0.75",
        8192,
        2048,
        4,
        2048,
        "auto",
        False,
        4,
        2048,
        (288, 92, 180, 16),
    ),
    "c4096-np4-kvu": (
        f16_kv("90.00", 4096, 4, 1, "45.00"),
        "18.64",
        "0.75",
        4096,
        4096,
        4,
        2048,
        "auto",
        True,
        4,
        4096,
        (200, 92, 90, 18),
    ),
    "c2048-q8_0-fa": (
        KVCacheLine(
            mib("23.91"), 2048, 30, 1, 1, "q8_0", mib("11.95"), "q8_0", mib("11.95"), "unified"
        ),
        "16.67",
        "0.19",
        2048,
        2048,
        1,
        2048,
        "enabled",
        False,
        1,
        2048,
        (132, 92, 23, 16),
    ),
    "c1024-nofa": (
        f16_kv("22.50", 1024, 1, 1, "11.25"),
        "27.51",
        "0.19",
        1024,
        1024,
        1,
        1024,
        "disabled",
        False,
        1,
        1024,
        (142, 92, 22, 27),
    ),
}


@pytest.mark.parametrize("name", sorted(SMOLLM2))
def test_smollm2_fixture(name: str) -> None:
    (
        kv,
        compute,
        output,
        n_ctx,
        n_ctx_seq,
        n_seq_max,
        n_batch,
        fa,
        unified,
        n_slots,
        n_ctx_slot,
        host,
    ) = EXPECTED[name]
    r = parse_load_log(TEXTS[name])
    assert r.model_buffers == {"CPU_Mapped": mib("92.10")} == {"CPU_Mapped": 96573850}
    assert r.kv_caches == (kv,)
    assert r.kv_buffers == {"CPU": kv.total_bytes}
    assert r.compute_buffers == {"CPU": mib(compute)}
    assert r.output_buffers == {"CPU": mib(output)}
    assert r.recurrent == ()
    assert r.recurrent_buffers == {}
    assert (r.n_ctx, r.n_ctx_seq, r.n_seq_max, r.n_batch, r.n_ubatch) == (
        n_ctx,
        n_ctx_seq,
        n_seq_max,
        n_batch,
        512,
    )
    assert (r.flash_attn, r.kv_unified, r.n_slots, r.n_ctx_slot) == (
        fa,
        unified,
        n_slots,
        n_ctx_slot,
    )
    assert r.offloaded_layers is None  # a CPU build does not print the offload summary
    assert r.breakdown == (host_row(*host),)
    assert r.errors == ()
    assert r.bytes_by_kind() == {
        "model": 96573850,
        "kv": kv.total_bytes,
        "recurrent": 0,
        "compute": mib(compute),
        "output": mib(output),
    }


def test_figures_are_rounded_mib() -> None:
    r = parse_load_log(TEXTS["c2048-q8_0-fa"])
    # 23.91 MiB printed for 25067520 real bytes (2048 × 30 × 192 × 2 × 34/32): within 0.005 MiB
    assert r.kv_buffers["CPU"] == 25071452
    assert abs(r.kv_buffers["CPU"] - 2048 * 30 * 192 * 2 * 34 // 32) <= 0.005 * MIB
    # streams × cells is the total token capacity in the non-unified c8192 -np 4 run
    kv = parse_load_log(TEXTS["c8192-np4"]).kv_caches[0]
    assert kv.cells * kv.streams == 8192


def test_failure_log() -> None:
    r = parse_load_log(TEXTS["fail"])
    path = "/tmp/fitbox-load-logs/no-vocab.gguf"
    assert r.errors == (
        "llama_model_load: error loading model: error loading model vocabulary: "
        "key not found in model: tokenizer.ggml.model",
        "llama_model_load_from_file_impl: failed to load model",
        f"cmn  common_init_: failed to load model '{path}'",
        f"srv    load_model: failed to load model, '{path}'",
        "srv  llama_server: exiting due to model loading error",
    )
    assert r.model_buffers == {} and r.kv_caches == () and r.breakdown == ()
    assert r.n_ctx is None and r.n_slots is None and r.kv_unified is None
    assert set(r.bytes_by_kind().values()) == {0}


_TS = re.compile(r"^\d+\.\d{2}\.\d{3}\.\d{3} ", re.M)
_LEVEL = re.compile(r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ", re.M)


def _coloured(text: str) -> str:
    """The shape common_log prints with --log-colors on."""
    return re.sub(
        r"^(\d+\.\d{2}\.\d{3}\.\d{3}) ([IWED]) (.*)$",
        lambda m: f"\x1b[34m{m[1]}\x1b[0m \x1b[32m{m[2]} \x1b[0m{m[3]}\x1b[0m\r",
        text,
        flags=re.M,
    )


@pytest.mark.parametrize("name", sorted(TEXTS))
@pytest.mark.parametrize(
    "variant",
    [
        _coloured,
        lambda t: _TS.sub("", t),  # --no-log-timestamps
        lambda t: _LEVEL.sub("", t),  # --no-log-prefix
        lambda t: t.replace("\n", "\r\n"),
    ],
    ids=["colours", "no-timestamps", "no-prefix", "crlf"],
)
def test_prefix_variants_parse_the_same(name: str, variant: Callable[[str], str]) -> None:
    assert parse_load_log(variant(TEXTS[name])) == parse_load_log(TEXTS[name])


GPU_LOG = """\
0.00.100.000 I load_tensors: offloading output layer to GPU
0.00.100.001 I load_tensors: offloading 31 repeating layers to GPU
0.00.100.002 I load_tensors: offloaded 33/33 layers to GPU
0.00.100.003 I load_tensors:   CPU_Mapped model buffer size =   281.81 MiB
0.00.100.004 I load_tensors:        CUDA0 model buffer size =  4155.99 MiB
0.00.100.005 I load_tensors:      Vulkan0 model buffer size =    10.00 MiB
0.00.100.006 I load_tensors:        ROCm0 model buffer size =    20.00 MiB
0.00.200.000 I llama_context: n_seq_max             = 4
0.00.200.001 I llama_context: n_ctx                 = 32768
0.00.200.002 I llama_context: n_ctx_seq             = 32768
0.00.200.003 I llama_context: kv_unified            = true
0.00.200.004 I llama_context:  CUDA_Host  output buffer size =     1.96 MiB
0.00.200.005 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 32768 cells
0.00.200.006 I llama_kv_cache:      CUDA0 KV buffer size =  1024.00 MiB
0.00.200.007 I llama_kv_cache: size = 1024.00 MiB ( 32768 cells,   8 layers,  4/1 seqs), \
K (f16):  512.00 MiB, V (f16):  512.00 MiB
0.00.200.008 I llama_kv_cache_iswa: creating     SWA KV cache, size = 5120 cells
0.00.200.009 I llama_kv_cache:      CUDA0 KV buffer size =   400.00 MiB
0.00.200.010 I llama_kv_cache: size =  400.00 MiB (  5120 cells,  40 layers,  4/1 seqs), \
K (q8_0):  200.00 MiB, V (q8_0):  200.00 MiB
0.00.200.011 I llama_memory_recurrent:      CUDA0 RS buffer size =    16.50 MiB
0.00.200.012 I llama_memory_recurrent: size =   16.50 MiB (     4 cells,  48 layers,  4 seqs), \
R (f32):    0.50 MiB, S (f32):   16.00 MiB
0.00.300.000 I sched_reserve:      CUDA0 compute buffer size =   300.01 MiB
0.00.300.001 I sched_reserve:  CUDA_Host compute buffer size =    72.02 MiB
0.00.300.002 D sched_reserve:      CUDA0 compute buffer size =   999.00 MiB
0.00.400.000 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 32768, kv_unified = 'true'
0.01.000.000 I common_memory_breakdown_print: | memory breakdown [MiB] | total  free  self \
model  context  compute  unaccounted |
0.01.000.001 I common_memory_breakdown_print: |   - CUDA0 (RTX 4090)   | \
24080 = 1 + (1 = 1 + 1 + 1) + 1 |
0.02.000.000 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free \
    self   model   context   compute    unaccounted |
0.02.000.001 I common_memory_breakdown_print: |   - CUDA0 (RTX 4090)   | 24080 = 17955 + ( 5896 = \
4155 +    1824 +     300) +         229 |
0.02.000.002 I common_memory_breakdown_print: |   - ROCm0 (Radeon (gfx1100)) |  16368 = 16000 + (\
0 = 0 + 0 + 0) + -5 |
0.02.000.003 I common_memory_breakdown_print: |   - Host                 |                  \
355 =   281 +       1 +      72                |
"""


def test_gpu_buffer_names_and_breakdown() -> None:
    r = parse_load_log(GPU_LOG)
    assert r.offloaded_layers == (33, 33)
    assert r.model_buffers == {
        "CPU_Mapped": mib("281.81"),
        "CUDA0": mib("4155.99"),
        "Vulkan0": mib("10.00"),
        "ROCm0": mib("20.00"),
    }
    assert r.output_buffers == {"CUDA_Host": mib("1.96")}
    assert r.kv_caches == (
        KVCacheLine(1024 * MIB, 32768, 8, 4, 1, "f16", 512 * MIB, "f16", 512 * MIB, "full"),
        KVCacheLine(400 * MIB, 5120, 40, 4, 1, "q8_0", 200 * MIB, "q8_0", 200 * MIB, "swa"),
    )
    assert r.kv_buffers == {"CUDA0": 1424 * MIB}  # summed over both iSWA caches
    assert r.recurrent_buffers == {"CUDA0": mib("16.50")}
    assert r.recurrent == (
        RecurrentLine(
            mib("16.50"), 4, 48, 4, "f32", mib("0.50"), "f32", 16 * MIB, None, None, None
        ),
    )
    # the DEBUG line (a --fit probe replayed at -v) is not counted
    assert r.compute_buffers == {"CUDA0": mib("300.01"), "CUDA_Host": mib("72.02")}
    assert (r.n_ctx, r.n_ctx_seq, r.n_seq_max, r.kv_unified) == (32768, 32768, 4, True)
    assert (r.n_slots, r.n_ctx_slot) == (4, 32768)
    # only the last table (shutdown), not the --fit projection before it
    assert r.breakdown == (
        BreakdownRow(
            "CUDA0",
            "RTX 4090",
            24080 * MIB,
            17955 * MIB,
            5896 * MIB,
            4155 * MIB,
            1824 * MIB,
            300 * MIB,
            229 * MIB,
        ),
        BreakdownRow("ROCm0", "Radeon (gfx1100)", 16368 * MIB, 16000 * MIB, 0, 0, 0, 0, -5 * MIB),
        host_row(355, 281, 1, 72),
    )
    assert r.bytes_by_kind() == {
        "model": sum(r.model_buffers.values()),
        "kv": 1424 * MIB,
        "recurrent": mib("16.50"),
        "compute": mib("300.01") + mib("72.02"),
        "output": mib("1.96"),
    }
    assert r.errors == ()


def test_recurrent_line_with_snapshots_and_ple() -> None:
    line = (
        "llama_memory_recurrent: size =    0.20 MiB (     1 cells,   4 layers,  1 seqs  2 rs_seq),"
        " R (f32):    0.01 MiB, S (f32):    0.19 MiB, P (f16):    0.00 MiB"
    )
    assert parse_load_log(line).recurrent == (
        RecurrentLine(mib("0.20"), 1, 4, 1, "f32", mib("0.01"), "f32", mib("0.19"), 2, "f16", 0),
    )


def test_default_verbosity_and_scalars_keep_first() -> None:
    text = (
        "srv    load_model: initializing, n_slots = 4, n_ctx_slot = 512, kv_unified = 'true'\n"
        "llama_context: n_ctx                 = 1024\n"
        "llama_context: n_ctx                 = 2048\n"  # a draft model's context, later
        "llama_context: flash_attn            = enabled\n"
    )
    r = parse_load_log(text)
    assert (r.n_slots, r.n_ctx_slot, r.kv_unified, r.n_ctx, r.flash_attn) == (
        4,
        512,
        True,
        1024,
        "enabled",
    )


def test_errors_need_level_e_or_a_fatal_phrase() -> None:
    text = (
        "0.00.001.000 W common_fit_params: failed to fit params to free device memory: x\n"
        "0.00.001.001 E llama_init_from_model: failed to initialize the context\n"
        "0.00.001.002 E srv    load_model: something else broke\n"
        "/src/llama.cpp/ggml/src/ggml.c:1234: GGML_ASSERT(ok) failed\n"
        "terminate called after throwing an instance of 'std::runtime_error'\n"
        "warning: no usable GPU found, --gpu-layers option will be ignored\n"
    )
    assert parse_load_log(text).errors == (
        "llama_init_from_model: failed to initialize the context",
        "srv    load_model: something else broke",
        "/src/llama.cpp/ggml/src/ggml.c:1234: GGML_ASSERT(ok) failed",
        "terminate called after throwing an instance of 'std::runtime_error'",
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n\x00\x1b[",
        "load_tensors: CPU model buffer size = " + "9" * 5000 + ".00 MiB",
        "llama_kv_cache: size = 1.00 MiB (" + "9" * 5000 + " cells,  1 layers,  1/1 seqs), "
        "K (f16): 0.50 MiB, V (f16): 0.50 MiB",
        "llama_context: n_ctx = " + "9" * 5000,
        "common_memory_breakdown_print: |   - Host | " + "9" * 5000 + " = 1 + 1 + 1 |",
        "load_tensors: CPU model buffer size = 1.2.3 MiB",
    ],
)
def test_hostile_lines(text: str) -> None:
    assert isinstance(parse_load_log(text), LoadReport)


@given(st.text())
def test_random_text_never_raises(text: str) -> None:
    assert isinstance(parse_load_log(text), LoadReport)


@given(st.lists(st.text(alphabet="0123456789. -|()/=+:,\n\x1bIWED[]abcfKVSRPMi", max_size=80)))
def test_random_log_shaped_text_never_raises(parts: list[str]) -> None:
    assert isinstance(parse_load_log("".join(parts)), LoadReport)


@given(st.sampled_from(sorted(TEXTS)), st.data())
def test_mutated_real_logs_never_raise(name: str, data: st.DataObject) -> None:
    text = TEXTS[name]
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 40)))
        text = text[:i] + data.draw(st.text(max_size=20)) + text[j:]
    assert isinstance(parse_load_log(text), LoadReport)


@given(st.sampled_from(sorted(SMOLLM2)), st.data())
def test_shuffled_and_digit_mutated_lines_never_raise(name: str, data: st.DataObject) -> None:
    lines = TEXTS[name].splitlines()
    keep = data.draw(st.lists(st.sampled_from(lines), max_size=60))
    digits = st.text(alphabet="0123456789.", min_size=1, max_size=30)
    mutated = [re.sub(r"\d+", lambda _m: data.draw(digits), line, count=3) for line in keep]
    assert isinstance(parse_load_log("\n".join(mutated)), LoadReport)


def test_repack_and_projector_buffers_count_as_weights_and_compute() -> None:
    """Lines a Q4_K_M load and a --mmproj projector print (seen running this build)."""
    log = "\n".join(
        [
            "0.00.021.689 I load_tensors:   CPU_Mapped model buffer size =     3.26 MiB",
            "0.00.021.712 I load_tensors:   CPU_REPACK model buffer size =     2.88 MiB",
            "0.00.045.664 I sched_reserve:        CPU compute buffer size =     8.02 MiB",
            "0.00.233.245 I load_hparams: model size:         2.02 MiB",
            "0.00.233.248 I load_hparams: metadata size:      0.01 MiB",
            "0.00.254.365 I reserve_compute_meta:        CPU compute buffer size =     0.21 MiB",
        ]
    )
    report = parse_load_log(log)
    assert report.model_buffers == {
        "CPU_Mapped": round(3.26 * MIB),
        "CPU_REPACK": round(2.88 * MIB),
        "mmproj": round(2.02 * MIB),
    }
    kinds = report.bytes_by_kind()
    assert kinds["model"] == round(3.26 * MIB) + round(2.88 * MIB) + round(2.02 * MIB)
    assert kinds["compute"] == round(8.02 * MIB) + round(0.21 * MIB)
