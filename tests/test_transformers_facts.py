"""Hugging Face model directories priced from headers: safetensors written by hand here."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from fitbox.models.transformers_facts import (
    DTYPE_BITS,
    BadModelDir,
    BadSafetensors,
    TransformersFacts,
    kv_bytes,
    read_safetensors_header,
    read_transformers_facts,
)

from .support.hf_models import (
    LLAMA,
    LLAMA_BYTES,
    LLAMA_TENSORS,
    llama_dir,
    write_config,
    write_raw,
    write_safetensors,
)

# --- safetensors headers ---


def test_header_reads_tensors_and_metadata(tmp_path: Path) -> None:
    n = write_safetensors(tmp_path / "m.safetensors", LLAMA_TENSORS, {"format": "pt"})
    header = read_safetensors_header(tmp_path / "m.safetensors")
    assert header.metadata == {"format": "pt"}
    assert header.nbytes == n == LLAMA_BYTES
    emb = header.tensors["model.embed_tokens.weight"]
    assert (emb.dtype, emb.shape, emb.nbytes) == ("F16", (1000, 512), 1000 * 512 * 2)


@pytest.mark.parametrize("dtype", sorted(DTYPE_BITS))
def test_every_dtype_is_sized(tmp_path: Path, dtype: str) -> None:
    write_safetensors(tmp_path / "m.safetensors", {"x": (dtype, [2, 4]), "e": (dtype, [0, 5])})
    header = read_safetensors_header(tmp_path / "m.safetensors")
    assert header.tensors["x"].nbytes == DTYPE_BITS[dtype]  # 8 elements of `bits` bits
    assert header.tensors["e"].nbytes == 0
    if DTYPE_BITS[dtype] % 8 == 0:
        write_safetensors(tmp_path / "s.safetensors", {"s": (dtype, [])})
        scalar = read_safetensors_header(tmp_path / "s.safetensors").tensors["s"]
        assert (scalar.shape, scalar.nbytes) == ((), DTYPE_BITS[dtype] // 8)


def test_header_never_reads_tensor_data(tmp_path: Path) -> None:
    # A 64 GiB tensor in a sparse file: only the header is read.
    path = write_raw(
        tmp_path / "big.safetensors",
        {"w": {"dtype": "BF16", "shape": [2**17, 2**18], "data_offsets": [0, 2**36]}},
        0,
    )
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size + 2**36)
    assert read_safetensors_header(path).nbytes == 2**36


def bad_header(tmp_path: Path, header: object, data_len: int = 64, raw: bytes | None = None) -> str:
    path = write_raw(tmp_path / "bad.safetensors", header, data_len, raw=raw)
    with pytest.raises(BadSafetensors) as info:
        read_safetensors_header(path)
    assert info.value.path == path
    assert isinstance(info.value, ValueError)
    return info.value.reason


def test_short_file(tmp_path: Path) -> None:
    (tmp_path / "bad.safetensors").write_bytes(b"\x01\x02\x03")
    with pytest.raises(BadSafetensors, match="3 bytes, shorter than the 8-byte prefix"):
        read_safetensors_header(tmp_path / "bad.safetensors")


def test_absurd_header_length(tmp_path: Path) -> None:
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(BadSafetensors, match="header length 1099511627776 is absurd"):
        read_safetensors_header(tmp_path / "bad.safetensors")


def test_header_length_past_end_of_file(tmp_path: Path) -> None:
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 500) + b"{}")
    with pytest.raises(BadSafetensors, match="header length 500 runs past the end of the 10-byte"):
        read_safetensors_header(tmp_path / "bad.safetensors")


def test_invalid_json(tmp_path: Path) -> None:
    assert "not valid JSON" in bad_header(tmp_path, None, raw=b'{"x": {"dtype": ')


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b'{"x": 1' + b"9" * 5000 + b"}"])
def test_hostile_json(tmp_path: Path, raw: bytes) -> None:
    assert "not valid JSON" in bad_header(tmp_path, None, raw=raw)


def test_header_not_utf8(tmp_path: Path) -> None:
    assert "not UTF-8" in bad_header(tmp_path, None, raw=b'{"\xff": 1}')


@pytest.mark.parametrize("header", [[1, 2], "F16", 3])
def test_json_not_an_object(tmp_path: Path, header: object) -> None:
    assert "not an object" in bad_header(tmp_path, header)


def test_unknown_dtype(tmp_path: Path) -> None:
    header = {"x": {"dtype": "F12", "shape": [2], "data_offsets": [0, 3]}}
    assert bad_header(tmp_path, header) == "tensor 'x' has unknown dtype 'F12'"


def test_offsets_disagree_with_shape(tmp_path: Path) -> None:
    header = {"x": {"dtype": "F16", "shape": [3, 3], "data_offsets": [0, 10]}}
    reason = bad_header(tmp_path, header)
    assert reason == "tensor 'x' data_offsets span 10 bytes but F16 [3, 3] needs 18"


def test_offsets_past_end_of_file(tmp_path: Path) -> None:
    header = {"x": {"dtype": "F32", "shape": [16], "data_offsets": [32, 96]}}
    reason = bad_header(tmp_path, header, data_len=64)
    assert "tensor 'x' data_offsets [32, 96] run past the end of the file" in reason
    assert "holds 64 bytes" in reason


def test_overlapping_tensors(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F16", "shape": [3, 3], "data_offsets": [0, 18]},
        "b": {"dtype": "F16", "shape": [3, 3], "data_offsets": [10, 28]},
        "empty": {"dtype": "F16", "shape": [0], "data_offsets": [5, 5]},
    }
    assert bad_header(tmp_path, header) == "tensors 'a' [0, 18] and 'b' [10, 28] overlap"


def test_a_tensor_inside_another_overlaps(tmp_path: Path) -> None:
    header = {
        "big": {"dtype": "U8", "shape": [40], "data_offsets": [0, 40]},
        "mid": {"dtype": "U8", "shape": [4], "data_offsets": [20, 24]},
        "small": {"dtype": "U8", "shape": [4], "data_offsets": [30, 34]},
    }
    assert "'big' [0, 40] and 'mid' [20, 24] overlap" in bad_header(tmp_path, header)


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("F16", "is str, not an object"),
        ({"dtype": "F16", "shape": [-1], "data_offsets": [0, 0]}, "shape [-1] is not a list"),
        ({"dtype": "F16", "shape": [2.0], "data_offsets": [0, 4]}, "shape [2.0] is not a list"),
        ({"dtype": "F16", "shape": [2], "data_offsets": [4]}, "data_offsets [4] are not [begin"),
        ({"dtype": "F16", "shape": [2], "data_offsets": [4, 0]}, "span -4 bytes"),
        ({"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}, "F4 [3] is 12 bits"),
        ({"dtype": None, "shape": [2], "data_offsets": [0, 4]}, "unknown dtype None"),
    ],
)
def test_malformed_entries(tmp_path: Path, entry: object, words: str) -> None:
    assert words in bad_header(tmp_path, {"x": entry})


def test_duplicate_tensor_names(tmp_path: Path) -> None:
    raw = (
        b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},'
        b' "x": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}'
    )
    assert bad_header(tmp_path, None, raw=raw) == "header names 'x' twice"


def test_metadata_must_be_strings(tmp_path: Path) -> None:
    assert "__metadata__" in bad_header(tmp_path, {"__metadata__": {"n": 3}})


def test_empty_header_is_fine(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "e.safetensors", {}, 0)
    assert read_safetensors_header(path).nbytes == 0


# --- decoders ---


def test_llama_gqa(tmp_path: Path) -> None:
    facts = read_transformers_facts(llama_dir(tmp_path))
    assert facts.kind == "decoder"
    assert facts.architecture == "LlamaForCausalLM"
    assert facts.weights_bytes == LLAMA_BYTES
    assert facts.dtype == "bfloat16"
    assert facts.n_layer == 4
    assert facts.kv_bytes_per_token == 4 * 2 * 64 * 2 * 2 == 2048
    assert facts.cross_kv_bytes_per_encoder_token == 0
    assert facts.n_ctx_train == 4096
    assert facts.sliding_window is None
    assert facts.swa_layers == (False,) * 4
    assert not facts.is_mla
    assert facts.weight_files == (tmp_path / "model.safetensors",)
    assert kv_bytes(facts, 1000) == 2048 * 1000
    assert kv_bytes(facts, 1000, batch=3) == 3 * 2048 * 1000
    assert read_transformers_facts(tmp_path, kv_dtype_bytes=1).kv_bytes_per_token == 1024


def test_explicit_head_dim_and_new_dtype_key(tmp_path: Path) -> None:
    # Qwen3 writes head_dim != hidden_size // heads, and recent transformers write "dtype".
    config = {**LLAMA, "model_type": "qwen3", "head_dim": 128, "dtype": "float16"}
    del config["torch_dtype"]
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    facts = read_transformers_facts(tmp_path)
    assert facts.kv_bytes_per_token == 4 * 2 * 128 * 2 * 2
    assert facts.dtype == "float16"


def test_no_kv_heads_means_mha_and_null_head_dim_is_derived(tmp_path: Path) -> None:
    config = {**LLAMA, "num_key_value_heads": None, "head_dim": None}
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    assert read_transformers_facts(tmp_path).kv_bytes_per_token == 4 * 8 * 64 * 2 * 2


def test_mistral_window_on_every_layer(tmp_path: Path) -> None:
    write_config(tmp_path, {**LLAMA, "model_type": "mistral", "sliding_window": 256})
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    facts = read_transformers_facts(tmp_path)
    assert facts.sliding_window == 256
    assert facts.swa_layers == (True,) * 4
    assert kv_bytes(facts, 100) == 2048 * 100
    assert kv_bytes(facts, 4096) == 2048 * 256


def test_qwen2_window_off(tmp_path: Path) -> None:
    config = {
        **LLAMA,
        "model_type": "qwen2",
        "sliding_window": 32768,
        "use_sliding_window": False,
        "max_window_layers": 2,
    }
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    facts = read_transformers_facts(tmp_path)
    assert facts.sliding_window is None
    assert facts.swa_layers == (False,) * 4
    write_config(tmp_path, {**config, "use_sliding_window": True})
    assert read_transformers_facts(tmp_path).swa_layers == (False, False, True, True)


GEMMA3_TEXT = {
    "model_type": "gemma3_text",
    "hidden_size": 640,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "sliding_window": 512,
    "max_position_embeddings": 32768,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
}


def test_gemma3_nested_text_config_with_sliding_layers(tmp_path: Path) -> None:
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": GEMMA3_TEXT,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
        "torch_dtype": "bfloat16",
        "mm_tokens_per_image": 256,
    }
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("BF16", [8, 8])})
    facts = read_transformers_facts(tmp_path)
    assert facts.architecture == "Gemma3ForConditionalGeneration"
    assert facts.n_layer == 6
    assert facts.kv_bytes_per_token == 6 * 1 * 256 * 2 * 2 == 6144
    assert facts.swa_layers == (True,) * 5 + (False,)
    assert facts.sliding_window == 512
    assert facts.n_ctx_train == 32768
    assert facts.dtype == "bfloat16"
    per_layer = 1024
    assert kv_bytes(facts, 4096) == per_layer * (5 * 512 + 4096)
    assert kv_bytes(facts, 300, batch=2) == 2 * per_layer * 6 * 300


def test_gemma3_partial_text_config_takes_class_defaults(tmp_path: Path) -> None:
    # google/gemma-3-4b-it's config.json: the text_config leaves out what equals defaults
    # (8 heads, 4 KV heads, head_dim 256, sliding_window_pattern 6, 131072 positions).
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16",
    }
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("BF16", [8])})
    facts = read_transformers_facts(tmp_path)
    assert facts.kv_bytes_per_token == 34 * 4 * 256 * 2 * 2
    assert facts.n_ctx_train == 131072
    assert facts.sliding_window == 1024
    full = [i for i, swa in enumerate(facts.swa_layers) if not swa]
    assert full == [5, 11, 17, 23, 29]


def test_gemma2_alternates_without_layer_types(tmp_path: Path) -> None:
    config = {**LLAMA, "model_type": "gemma2", "head_dim": 256, "sliding_window": 4096}
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    assert read_transformers_facts(tmp_path).swa_layers == (True, False, True, False)


def test_sliding_window_pattern_field(tmp_path: Path) -> None:
    config = {**LLAMA, "model_type": "cohere2", "sliding_window": 64, "sliding_window_pattern": 2}
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    assert read_transformers_facts(tmp_path).swa_layers == (True, False, True, False)


def test_hybrid_layer_types_hold_kv_only_in_attention_layers(tmp_path: Path) -> None:
    types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    write_config(tmp_path, {**LLAMA, "model_type": "qwen3_next", "layer_types": types})
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    facts = read_transformers_facts(tmp_path)
    assert facts.kv_layers == (False, False, False, True)
    assert facts.kv_bytes_per_token == 2 * 64 * 2 * 2
    assert kv_bytes(facts, 10) == 512 * 10


def test_llava_partial_llama_text_config(tmp_path: Path) -> None:
    # llava-hf/llava-1.5-7b-hf: the llama text_config relies on LlamaConfig's defaults.
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "text_config": {
            "architectures": ["LlamaForCausalLM"],
            "max_position_embeddings": 4096,
            "model_type": "llama",
            "rms_norm_eps": 1e-05,
            "torch_dtype": "float16",
            "vocab_size": 32064,
        },
    }
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    facts = read_transformers_facts(tmp_path)
    assert facts.kv_bytes_per_token == 32 * 32 * 128 * 2 * 2  # 512 KiB per token
    assert facts.n_ctx_train == 4096
    assert facts.dtype == "float16"  # from the text_config when the top level has none


def test_internvl_llm_config(tmp_path: Path) -> None:
    config = {
        "architectures": ["InternVLChatModel"],
        "model_type": "internvl_chat",
        "llm_config": {**LLAMA, "model_type": "qwen2", "use_sliding_window": False},
    }
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    assert read_transformers_facts(tmp_path).kv_bytes_per_token == 2048


DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 1024,
    "num_hidden_layers": 3,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
}


def test_deepseek_mla(tmp_path: Path) -> None:
    write_config(tmp_path, DEEPSEEK_V3)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F8_E4M3", [64, 64])})
    facts = read_transformers_facts(tmp_path)
    assert facts.is_mla
    assert facts.kv_bytes_per_token == 3 * (512 + 64) * 2 == 3456
    assert facts.weights_bytes == 64 * 64
    assert facts.n_ctx_train == 163840
    assert kv_bytes(facts, 1000) == 3456 * 1000


def test_deepseek_vl2_language_config(tmp_path: Path) -> None:
    config = {"model_type": "deepseek_vl_v2", "language_config": DEEPSEEK_V3}
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [4])})
    facts = read_transformers_facts(tmp_path)
    assert facts.is_mla and facts.kv_bytes_per_token == 3456
    assert facts.architecture == "deepseek_vl_v2"  # no architectures: the model_type


# --- encoder-decoders ---


def test_t5(tmp_path: Path) -> None:
    config = {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "is_encoder_decoder": True,
        "d_model": 512,
        "d_kv": 64,
        "d_ff": 2048,
        "num_heads": 8,
        "num_layers": 6,
        "num_decoder_layers": 4,
        "n_positions": 512,
        "vocab_size": 32128,
    }
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"shared.weight": ("F32", [10, 512])})
    facts = read_transformers_facts(tmp_path)
    assert facts.kind == "encoder-decoder"
    assert facts.n_layer == 4
    assert facts.kv_bytes_per_token == 4 * 8 * 64 * 2 * 2 == 8192
    assert facts.cross_kv_bytes_per_encoder_token == 8192
    assert facts.n_ctx_train == 512
    assert facts.weights_bytes == 10 * 512 * 4
    assert kv_bytes(facts, 100, encoder_tokens=300) == 8192 * 400
    del config["num_decoder_layers"]  # old t5 configs: the decoder mirrors the encoder
    write_config(tmp_path, config)
    assert read_transformers_facts(tmp_path).n_layer == 6


def test_whisper(tmp_path: Path) -> None:
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "is_encoder_decoder": True,
        "d_model": 384,
        "encoder_layers": 4,
        "encoder_attention_heads": 6,
        "decoder_layers": 4,
        "decoder_attention_heads": 6,
        "max_source_positions": 1500,
        "max_target_positions": 448,
        "num_hidden_layers": 4,
        "torch_dtype": "float32",
    }
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F32", [384])})
    facts = read_transformers_facts(tmp_path)
    assert facts.kind == "encoder-decoder"
    assert facts.kv_bytes_per_token == 4 * 6 * 64 * 2 * 2 == 6144
    assert facts.cross_kv_bytes_per_encoder_token == 6144
    assert facts.n_ctx_train == 448
    assert kv_bytes(facts, 448, batch=2, encoder_tokens=1500) == 2 * 6144 * (448 + 1500)


# --- layouts ---


def test_sharded_with_index(tmp_path: Path) -> None:
    write_config(tmp_path, LLAMA)
    a = write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("F16", [100, 10])})
    b = write_safetensors(
        tmp_path / "model-00002-of-00002.safetensors", {"b": ("F32", [7]), "c": ("I64", [3])}
    )
    # Mistral repos ship consolidated.safetensors next to the shards: the index decides.
    write_safetensors(tmp_path / "consolidated.safetensors", {"a": ("F16", [100, 10])})
    index = {
        "metadata": {"total_size": a + b},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors",
        },
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    facts = read_transformers_facts(tmp_path)
    assert facts.weights_bytes == a + b == 2000 + 28 + 24
    assert len(facts.weight_files) == 2


def test_missing_shard(tmp_path: Path) -> None:
    write_config(tmp_path, LLAMA)
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("F16", [4])})
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(BadModelDir, match=r"missing: model-00002-of-00002\.safetensors"):
        read_transformers_facts(tmp_path)


def test_index_without_weight_map(tmp_path: Path) -> None:
    write_config(tmp_path, LLAMA)
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(BadModelDir, match="no weight_map"):
        read_transformers_facts(tmp_path)


def test_loose_safetensors_files(tmp_path: Path) -> None:
    write_config(tmp_path, LLAMA)
    a = write_safetensors(tmp_path / "part-a.safetensors", {"a": ("F16", [8])})
    b = write_safetensors(tmp_path / "part-b.safetensors", {"b": ("F16", [8])})
    assert read_transformers_facts(tmp_path).weights_bytes == a + b


def hf_cache(tmp_path: Path) -> tuple[Path, Path]:
    """models--org--name with blobs, a snapshot of symlinks and refs/main, as hub writes it."""
    repo = tmp_path / "hub" / "models--org--tiny-llama"
    staging = tmp_path / "staging"
    write_config(staging, LLAMA)
    write_safetensors(staging / "model.safetensors", LLAMA_TENSORS)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, name in enumerate(["config.json", "model.safetensors"]):
        blob = repo / "blobs" / f"blob{i}"
        (staging / name).rename(blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return repo, snapshot


def test_hf_cache_layout(tmp_path: Path) -> None:
    repo, snapshot = hf_cache(tmp_path)
    for where in (snapshot, repo):
        facts = read_transformers_facts(where)
        assert facts.path == snapshot
        assert facts.weights_bytes == LLAMA_BYTES
        assert facts.kv_bytes_per_token == 2048


def test_hf_cache_dangling_symlink(tmp_path: Path) -> None:
    repo, snapshot = hf_cache(tmp_path)
    (repo / "blobs" / "blob1").unlink()
    with pytest.raises(BadModelDir, match="symlink to a missing blob"):
        read_transformers_facts(snapshot)


def test_diffusers(tmp_path: Path) -> None:
    index = {
        "_class_name": "StableDiffusionPipeline",
        "_diffusers_version": "0.30.0",
        "unet": ["diffusers", "UNet2DConditionModel"],
        "text_encoder": ["transformers", "CLIPTextModel"],
    }
    write_config(tmp_path, index, "model_index.json")
    write_config(tmp_path / "unet", {"_class_name": "UNet2DConditionModel"})
    u = write_safetensors(
        tmp_path / "unet" / "diffusion_pytorch_model.safetensors",
        {"conv.weight": ("F16", [32, 4, 3, 3])},
    )
    t = write_safetensors(tmp_path / "text_encoder" / "model.safetensors", {"e": ("F32", [77])})
    v = write_safetensors(
        tmp_path / "vae" / "diffusion_pytorch_model.safetensors", {"d": ("BF16", [9])}
    )
    facts = read_transformers_facts(tmp_path)
    assert facts.kind == "diffusers"
    assert facts.architecture == "StableDiffusionPipeline"
    assert facts.weights_bytes == u + t + v
    assert facts.kv_bytes_per_token == 0 == facts.n_layer
    assert facts.swa_layers == () and facts.n_ctx_train is None
    assert kv_bytes(facts, 4096) == 0
    one = read_transformers_facts(tmp_path / "unet")  # one component, its config diffusers'
    assert (one.kind, one.architecture, one.weights_bytes) == (
        "diffusers",
        "UNet2DConditionModel",
        u,
    )


def test_weights_only(tmp_path: Path) -> None:
    a = write_safetensors(tmp_path / "adapter_model.safetensors", {"a": ("F32", [16])})
    b = write_safetensors(tmp_path / "sub" / "extra.safetensors", {"b": ("U8", [5])})
    facts = read_transformers_facts(tmp_path)
    assert facts == TransformersFacts(
        tmp_path, "weights-only", None, a + b, None, 0, 0, 0, None, None, (), False
    )


# --- bad directories ---


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(BadModelDir, match="is not a directory"):
        read_transformers_facts(tmp_path / "nope")


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(BadModelDir, match=r"no safetensors weights; expected model\.safetensors"):
        read_transformers_facts(tmp_path)


def test_pickle_only_weights(tmp_path: Path) -> None:
    write_config(tmp_path, LLAMA)
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK")
    with pytest.raises(BadModelDir, match=r"only pickle weights \(pytorch_model.bin\)"):
        read_transformers_facts(tmp_path)


def test_broken_config_json(tmp_path: Path) -> None:
    llama_dir(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(BadModelDir, match=r"config.json is not valid JSON \(line 1"):
        read_transformers_facts(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(BadModelDir, match="holds a JSON list, not an object"):
        read_transformers_facts(tmp_path)
    (tmp_path / "config.json").write_bytes(b'{"model_type": "\xff"}')
    with pytest.raises(BadModelDir, match="not readable JSON"):
        read_transformers_facts(tmp_path)
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BadModelDir, match="not readable JSON"):
        read_transformers_facts(tmp_path)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_hidden_layers": None}, "no num_hidden_layers (nor n_layer, num_layers)"),
        ({"num_attention_heads": 0}, "no num_attention_heads"),
        ({"num_key_value_heads": "two"}, "num_key_value_heads is 'two', not a non-negative"),
        ({"num_hidden_layers": True}, "num_hidden_layers is True"),
        ({"layer_types": ["full_attention"]}, "layer_types has 1 entries, not 4"),
    ],
)
def test_config_fields_that_make_no_sense(
    tmp_path: Path, change: dict[str, Any], words: str
) -> None:
    llama_dir(tmp_path)
    write_config(tmp_path, {**LLAMA, **change})
    with pytest.raises(BadModelDir) as info:
        read_transformers_facts(tmp_path)
    assert words in info.value.reason


def test_bad_safetensors_in_a_model_dir(tmp_path: Path) -> None:
    write_config(tmp_path, LLAMA)
    header = {"x": {"dtype": "F16", "shape": [3, 3], "data_offsets": [0, 10]}}
    write_raw(tmp_path / "model.safetensors", header, 10)
    with pytest.raises(BadModelDir) as info:
        read_transformers_facts(tmp_path)
    assert "model.safetensors" in info.value.reason
    assert "data_offsets span 10 bytes but F16 [3, 3] needs 18" in info.value.reason
    assert isinstance(info.value.__cause__, BadSafetensors)


def test_truncated_safetensors_in_a_model_dir(tmp_path: Path) -> None:
    llama_dir(tmp_path)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(BadModelDir, match="run past the end of the file"):
        read_transformers_facts(tmp_path)


def test_kv_bytes_rejects_negative_sizes(tmp_path: Path) -> None:
    facts = read_transformers_facts(llama_dir(tmp_path))
    with pytest.raises(ValueError, match="non-negative"):
        kv_bytes(facts, -1)


def test_an_index_cannot_point_outside_its_directory(tmp_path: Path) -> None:
    import json as _json

    from fitbox.models.transformers_facts import BadModelDir, read_transformers_facts

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(
        _json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 1,
                "num_attention_heads": 1,
                "hidden_size": 8,
                "max_position_embeddings": 16,
            }
        )
    )
    (model / "model.safetensors.index.json").write_text(
        _json.dumps({"weight_map": {"w": "../../etc/passwd"}})
    )
    with pytest.raises(BadModelDir, match="outside the model directory"):
        read_transformers_facts(model)
