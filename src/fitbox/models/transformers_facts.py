"""What a Hugging Face model directory costs, from headers alone: weights and KV cache.

Weights are the tensor bytes that safetensors headers declare (tensor data is never read);
the KV cache per token comes from config.json, following the layout transformers' own
``DynamicCache`` builds: one K and one V per attention layer, sliding layers
(``layer_types``, else ``sliding_window`` on every layer) holding at most the window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from fitbox.models.safetensors_header import (
    DTYPE_BITS,
    BadSafetensors,
    SafetensorsHeader,
    SafetensorsTensor,
    is_count,
    read_safetensors_header,
)

__all__ = [  # the header's types and reader are safetensors_header.py's; importable here too
    "DTYPE_BITS",
    "BadModelDir",
    "BadSafetensors",
    "SafetensorsHeader",
    "SafetensorsTensor",
    "TransformersFacts",
    "adapter_bytes",
    "adapter_of",
    "kv_bytes",
    "read_safetensors_header",
    "read_transformers_facts",
]

TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")
# Fields transformers leaves out of a nested text_config when they equal the class
# defaults (llava-1.5 and gemma-3 configs on the Hub rely on these).
CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
    },
    "mistral": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
    },
    "qwen2": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "gemma3_text": {
        "hidden_size": 2304,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
    },
}
NESTED_TYPE = {"gemma3": "gemma3_text", "llava": "llama"}  # text model_type when unnamed
# Sliding-window period when a config has neither layer_types nor sliding_window_pattern:
# every period-th layer is full attention (configuration_<arch>.py in transformers).
SWA_PERIOD = {"gemma2": 2, "gemma3_text": 6, "gemma3": 6, "cohere2": 4}
SLIDING_TYPES = frozenset({"sliding_attention", "chunked_attention"})


class BadModelDir(ValueError):
    """A model directory fitbox cannot price; ``reason`` says what to fix."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class TransformersFacts:
    path: Path
    kind: str  # "decoder", "encoder-decoder", "diffusers", "weights-only"
    architecture: str | None
    weights_bytes: int
    dtype: str | None  # config.json torch_dtype / dtype, e.g. "bfloat16"
    n_layer: int  # decoder layers
    kv_bytes_per_token: int  # every KV-holding layer, uncapped (decoder self-attention)
    cross_kv_bytes_per_encoder_token: int
    n_ctx_train: int | None
    sliding_window: int | None  # set only when some layer slides
    swa_layers: tuple[bool, ...]
    is_mla: bool
    kv_layers: tuple[bool, ...] = ()  # layers holding a KV cache (not linear/SSM/shared)
    weight_files: tuple[Path, ...] = field(default=(), compare=False)


class _Attention(NamedTuple):  # TransformersFacts' fields from n_layer to kv_layers, in order
    n_layer: int
    kv_bytes_per_token: int
    cross_kv_bytes_per_encoder_token: int
    n_ctx_train: int | None
    sliding_window: int | None
    swa_layers: tuple[bool, ...]
    is_mla: bool
    kv_layers: tuple[bool, ...]


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise BadModelDir(f"cannot read {path}: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise BadModelDir(
            f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); re-download it"
        ) from None
    except (ValueError, RecursionError) as e:  # not UTF-8, absurd numbers or nesting
        raise BadModelDir(f"{path} is not readable JSON ({e}); re-download it") from None
    if not isinstance(data, dict):
        raise BadModelDir(f"{path} holds a JSON {type(data).__name__}, not an object")
    return data


def _snapshot(directory: Path) -> Path:
    """A Hugging Face cache entry (models--org--name) stands for its current snapshot."""
    snapshots = directory / "snapshots"
    if not snapshots.is_dir() or any(directory.glob("*.json")):
        return directory
    ref = directory / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    found = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not found:
        raise BadModelDir(f"{directory} is a Hugging Face cache entry with no snapshot")
    return found[-1]


def _weight_files(directory: Path, *, below: bool) -> list[Path]:
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if below:
        files = sorted(directory.rglob("*.safetensors"))
    elif single.exists() or single.is_symlink():
        files = [single]
    elif index.exists():
        weight_map = _load_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise BadModelDir(f"{index} has no weight_map of tensor name -> shard file")
        names = sorted(set(weight_map.values()))
        escaping = [n for n in names if Path(n).is_absolute() or ".." in Path(n).parts]
        if escaping:  # an index must not point outside its own model directory
            raise BadModelDir(f"{index} names shards outside the model directory: {escaping}")
        files = [directory / name for name in names]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise BadModelDir(
                f"{index.name} lists shards that are missing: {', '.join(missing)} "
                "(incomplete download?)"
            )
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = sorted(
            p.name for p in directory.rglob("*") if p.suffix in {".bin", ".pt", ".pth"}
        )
        hint = "expected model.safetensors, an index.json with shards, or *.safetensors"
        if pickles:
            hint = f"only pickle weights ({', '.join(pickles)}): fetch the *.safetensors files"
        raise BadModelDir(f"{directory} has no safetensors weights; {hint}")
    return files


def _weights_bytes(files: list[Path]) -> int:
    total = 0
    for f in files:
        if f.is_symlink() and not f.exists():
            raise BadModelDir(f"{f} is a symlink to a missing blob (incomplete download?)")
        try:
            total += read_safetensors_header(f).nbytes
        except BadSafetensors as e:
            raise BadModelDir(f"bad safetensors file {f}: {e.reason}") from e
    return total


def _get(cfg: dict[str, Any], *keys: str) -> int | None:
    """The first of ``keys`` that config sets (null counts as unset), as a count."""
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if not is_count(value):
            raise BadModelDir(f"config.json {key} is {value!r}, not a non-negative integer")
        return int(value)
    return None


def _need(cfg: dict[str, Any], *keys: str) -> int:
    value = _get(cfg, *keys)
    if not value:
        others = f" (nor {', '.join(keys[1:])})" if len(keys) > 1 else ""
        raise BadModelDir(
            f"config.json has no {keys[0]}{others} for model_type {cfg.get('model_type')!r} "
            f"(or it is 0): the config is incomplete or not a transformer's"
        )
    return value


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    for key in TEXT_CONFIG_KEYS:
        nested = cfg.get(key)
        if isinstance(nested, dict):
            model_type = nested.get("model_type") or NESTED_TYPE.get(str(cfg.get("model_type")))
            return {**CONFIG_DEFAULTS.get(str(model_type), {}), **nested}
    return cfg


def _layers(cfg: dict[str, Any], n_layer: int) -> tuple[tuple[bool, ...], tuple[bool, ...], int]:
    """(holds KV, slides) per layer, and the window, as transformers' DynamicCache decides."""
    window = _get(cfg, "sliding_window", "attention_chunk_size") or 0
    types = cfg.get("layer_types")
    period = cfg.get("sliding_window_pattern")
    if not (is_count(period) and period):
        period = SWA_PERIOD.get(str(cfg.get("model_type")))
    if isinstance(types, list) and types:
        if len(types) != n_layer:
            raise BadModelDir(f"config.json layer_types has {len(types)} entries, not {n_layer}")
        kv = [isinstance(t, str) and "attention" in t and t != "linear_attention" for t in types]
        swa = [t in SLIDING_TYPES for t in types]
    else:
        kv = [True] * n_layer
        if not window or cfg.get("use_sliding_window") is False:
            swa = [False] * n_layer
        elif period:
            swa = [(i + 1) % period != 0 for i in range(n_layer)]
        elif cfg.get("use_sliding_window") is True:  # qwen2: layers past max_window_layers
            swa = [i >= (_get(cfg, "max_window_layers") or 0) for i in range(n_layer)]
        else:  # mistral, phi3, ...: a window on every layer
            swa = [True] * n_layer
    shared = _get(cfg, "num_kv_shared_layers") or 0  # gemma3n reuses earlier layers' KV
    kv = [k and i < n_layer - shared for i, k in enumerate(kv)]
    swa = [s and bool(window) for s in swa]
    return tuple(kv), tuple(swa), window


def _decoder(cfg: dict[str, Any], kv_dtype_bytes: int) -> _Attention:
    n_layer = _need(cfg, "num_hidden_layers", "n_layer", "num_layers")
    is_mla = _get(cfg, "kv_lora_rank") is not None
    if is_mla:  # one latent "head" shared by K and V, plus the decoupled RoPE key
        per_layer = _need(cfg, "kv_lora_rank") + _need(cfg, "qk_rope_head_dim")
    else:
        heads = _need(cfg, "num_attention_heads", "n_head", "num_heads")
        kv_heads = _get(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv")
        if kv_heads is None:
            kv_heads = 1 if cfg.get("multi_query") is True else heads
        head_dim = _get(cfg, "head_dim") or _need(cfg, "hidden_size", "n_embd", "d_model") // heads
        per_layer = kv_heads * head_dim * 2
    kv, swa, window = _layers(cfg, n_layer)
    n_ctx = _get(cfg, "max_position_embeddings", "n_positions", "seq_length")
    per_token = per_layer * kv_dtype_bytes * sum(kv)
    return _Attention(n_layer, per_token, 0, n_ctx, window if any(swa) else None, swa, is_mla, kv)


def _encoder_decoder(cfg: dict[str, Any], kv_dtype_bytes: int) -> _Attention:
    n_layer = _need(cfg, "decoder_layers", "num_decoder_layers", "num_layers")
    heads = _need(cfg, "decoder_attention_heads", "num_heads", "num_attention_heads")
    head_dim = _get(cfg, "d_kv", "head_dim") or _need(cfg, "d_model", "hidden_size") // heads
    per_token = n_layer * heads * head_dim * 2 * kv_dtype_bytes  # cross-attention: the same
    n_ctx = _get(cfg, "max_target_positions", "max_position_embeddings", "n_positions")
    return _Attention(
        n_layer, per_token, per_token, n_ctx, None, (False,) * n_layer, False, (True,) * n_layer
    )


def read_transformers_facts(directory: str | Path, kv_dtype_bytes: int = 2) -> TransformersFacts:
    """Weights and KV cost of a Hugging Face model directory (or cache entry), from headers."""
    root = Path(directory)
    if not root.is_dir():
        raise BadModelDir(f"{root} is not a directory")
    root = _snapshot(root)
    config_path, index_path = root / "config.json", root / "model_index.json"
    config = _load_json(config_path) if config_path.exists() else None
    if index_path.exists() or config is None or "_class_name" in config:  # diffusers
        meta = _load_json(index_path) if index_path.exists() else config
        kind = "weights-only" if meta is None else "diffusers"
        shape = _Attention(0, 0, 0, None, None, (), False, ())
        files, dtype = _weight_files(root, below=True), None
        architecture = (meta or {}).get("_class_name")
    else:
        text = _text_config(config)
        if text.get("is_encoder_decoder") is True or config.get("is_encoder_decoder") is True:
            kind, shape = "encoder-decoder", _encoder_decoder(text, kv_dtype_bytes)
        else:
            kind, shape = "decoder", _decoder(text, kv_dtype_bytes)
        files = _weight_files(root, below=False)
        archs = config.get("architectures")
        architecture = archs[0] if isinstance(archs, list) and archs else config.get("model_type")
        dtype = next(
            (
                c[k]
                for c in (config, text)
                for k in ("torch_dtype", "dtype")
                if isinstance(c.get(k), str)
            ),
            None,
        )
    if not isinstance(architecture, str):
        architecture = None
    weights = _weights_bytes(files)
    return TransformersFacts(root, kind, architecture, weights, dtype, *shape, tuple(files))


def kv_bytes(
    facts: TransformersFacts, window: int, batch: int = 1, *, encoder_tokens: int = 0
) -> int:
    """KV cache bytes for ``batch`` sequences of ``window`` tokens (the context window).

    Sliding layers hold at most ``facts.sliding_window`` tokens, as transformers'
    sliding cache layers do; ``encoder_tokens`` adds encoder-decoder cross-attention.
    """
    if window < 0 or batch < 0 or encoder_tokens < 0:
        raise ValueError("window, batch and encoder_tokens must be non-negative")
    n_kv = sum(facts.kv_layers)
    per_layer = facts.kv_bytes_per_token // n_kv if n_kv else 0
    cap = min(window, facts.sliding_window) if facts.sliding_window else window
    tokens = sum(
        cap if swa else window
        for kv, swa in zip(facts.kv_layers, facts.swa_layers, strict=True)
        if kv
    )
    return batch * (per_layer * tokens + facts.cross_kv_bytes_per_encoder_token * encoder_tokens)


def adapter_of(directory: str | Path) -> Path | None:
    """The PEFT adapter a model folder's ``fitbox.json`` names (``adapter_dir``, relative to
    the folder or absolute), or None. A named adapter that is not there, or has no
    ``adapter_config.json``, is an error: the base model is never served in its place."""
    root = Path(directory)
    settings = root / "fitbox.json"
    if not settings.is_file():
        return None
    named = _load_json(settings).get("adapter_dir")
    if named is None:
        return None
    if not isinstance(named, str) or not named:
        raise BadModelDir(f"{settings}: adapter_dir must be a folder path, not {named!r}")
    adapter = (root / named).resolve()
    if not (adapter / "adapter_config.json").is_file():
        raise BadModelDir(
            f"{settings} names the adapter {adapter}, which has no "
            "adapter_config.json: fix adapter_dir or remove it"
        )
    return adapter


def adapter_bytes(directory: str | Path) -> int:
    """The bytes of the adapter's weights (they join the model's footprint)."""
    adapter = adapter_of(directory)
    if adapter is None:
        return 0
    return _weights_bytes(sorted(adapter.glob("*.safetensors")))
