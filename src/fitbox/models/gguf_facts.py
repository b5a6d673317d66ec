"""What a GGUF model is, as placement needs it: its shape, from the header alone.

The per-architecture rules (which layers are sliding-window, which are recurrent) mirror
llama.cpp's ``src/models/<arch>.cpp`` loaders in the build fitbox runs; FORMULAS.md cites
each one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from gguf.constants import LlamaFileType

from fitbox.core.projector import ProjectorShape, aligned
from fitbox.core.repack import MUL_MAT, MUL_MAT_ID, WeightTensor
from fitbox.core.sizing import ModelShape
from fitbox.core.split import Layout
from fitbox.models.gguf_header import ArrayLength, GGUFHeader, TensorInfo, read_header, type_name
from fitbox.models.identity import identity_of

# Architectures whose GGUF files are projectors (vision/audio encoders), never models.
PROJECTOR_ARCHES = frozenset({"clip", "mmproj"})
# Encoder architectures served through /v1/embeddings (llama-server --embeddings).
EMBEDDING_ARCHES = frozenset(
    {
        "bert",
        "nomic-bert",
        "nomic-bert-moe",
        "jina-bert-v2",
        "jina-bert-v3",
        "modern-bert",
        "neo-bert",
        "eurobert",
        "gemma-embedding",
        "t5encoder",
    }
)
# Models llama.cpp builds no KV cache for (llama-model.cpp create_memory: res = nullptr).
NO_KV_ARCHES = EMBEDDING_ARCHES - {"t5encoder"}

# load_swa_pattern(ml, period, dense_first) defaults per architecture; a GGUF's own
# %arch.attention.sliding_window_pattern (period or per-layer bools) wins.
SWA_DEFAULTS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "cohere2moe": (4, True),
    "gpt-oss": (2, False),
    "llama4": (4, False),
    "exaone4": (4, False),
    "exaone-moe": (4, False),
    "olmo2": (4, False),
    "afmoe": (4, False),
    "modern-bert": (3, True),
    "smallthinker": (4, True),
    "plamo3": (8, False),
    "mellum": (4, False),
    "muse-glimmer": (4, False),
    "laguna": (4, True),
}
PURE_RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
RECURRENT_WHERE_NO_KV = frozenset(
    {"jamba", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe"}
)
RECURRENT_BY_INTERVAL = frozenset({"qwen3next", "qwen35", "qwen35moe"})
ALL_LAYERS_BOTH = frozenset({"falcon-h1"})  # attention and SSM side by side in every layer

POOLING_RANK = 4  # llama.h LLAMA_POOLING_TYPE_RANK: a reranker's classifier output
_LAYER = re.compile(r"^blk\.(\d+)\.")
_ROUTED = re.compile(r"\.ffn_(gate|up|down|gate_up)_(ch)?exps\b")  # common.h: --cpu-moe
_SHARED = re.compile(r"\.ffn_(gate|up|down)_shexp\b")
# Weights the graph reads with something other than a matrix product (llama-arch.cpp
# LLM_TENSOR_INFOS: GET_ROWS, SSM_CONV, IM2COL, SSM_SCAN, SCALE, ...): never repacked.
_NOT_MATMUL = re.compile(
    r"(^|\.)(token_embd|position_embd|token_types|per_layer_token_embd|nextn\.embed_tokens"
    r"|attn_rel_b|attn_compressor_ape|indexer_compressor_ape|ffn_gate_tid2eid|d2t|markov_w1"
    r"|selector_predecessor|selector_successor|ssm_conv1d|shortconv\.conv|conv1d|ssm_a"
    r"|time_mix_first|attn_sinks|ffn_act)\.weight$"
)


@dataclass(frozen=True)
class GGUFFacts:
    path: Path
    architecture: str
    name: str
    file_type: int | None
    quant: str  # "Q4_K_M", "F16", ... from general.file_type, else the dominant tensor type
    is_projector: bool
    is_embedding: bool
    shape: ModelShape
    expert_count: int = 0
    expert_used_count: int = 0
    bytes_by_layer: tuple[int, ...] = field(default=(), compare=False)
    unknown_architecture: bool = False
    layout: Layout | None = field(default=None, compare=False)
    projector: ProjectorShape | None = None  # a vision projector file's own shape
    n_params: int = 0  # every tensor's elements (llama_model_n_params; /v1/models meta)
    is_reranker: bool = False  # pooling type rank: served through /v1/rerank
    vision: bool = False  # a vision-language transformers folder (a GGUF's eyes: its mmproj)
    # a full-precision folder's weights once quantized to 4-bit as it loads (bitsandbytes,
    # models/transformers_layout.py); None: nothing quantizes it in place (a GGUF file)
    four_bit_weights: int | None = None


def _int(header: GGUFHeader, key: str, default: int = 0) -> int:
    value = header.get(key, default)
    return int(value) if isinstance(value, int | float | bool) else default


def _per_layer(header: GGUFHeader, key: str, n_layer: int, default: int) -> tuple[int, ...]:
    value = header.get(key)
    if isinstance(value, list):
        values = [int(v) for v in value[:n_layer]]
        return tuple(values + [default] * (n_layer - len(values)))
    if isinstance(value, int | float):
        return (int(value),) * n_layer
    return (default,) * n_layer


def swa_layers(header: GGUFHeader, arch: str, n_layer: int) -> tuple[bool, ...]:
    """llama_hparams::set_swa_pattern, or the GGUF's own per-layer array."""
    if _int(header, f"{arch}.attention.sliding_window") <= 0:
        return (False,) * n_layer
    pattern = header.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        flags = [bool(v) for v in pattern[:n_layer]]
        return tuple(flags + [False] * (n_layer - len(flags)))
    period, dense_first = SWA_DEFAULTS.get(arch, (-1, False))
    if isinstance(pattern, int):
        period = pattern
    if period < 0:  # the architecture's loader never reads a pattern: no SWA layers
        return (False,) * n_layer
    if dense_first:
        return tuple(period == 0 or il % period != 0 for il in range(n_layer))
    return tuple(period == 0 or il % period < period - 1 for il in range(n_layer))


def recurrent_layers(header: GGUFHeader, arch: str, kv_heads: tuple[int, ...]) -> tuple[bool, ...]:
    n_layer = len(kv_heads)
    if arch in PURE_RECURRENT or arch in ALL_LAYERS_BOTH:
        return (True,) * n_layer
    if arch in RECURRENT_WHERE_NO_KV:
        return tuple(h == 0 for h in kv_heads)
    if arch in RECURRENT_BY_INTERVAL:
        listed = header.get(f"{arch}.attention.recurrent_layers")
        if isinstance(listed, list):
            return tuple(bool(v) for v in listed[:n_layer])
        interval = _int(header, f"{arch}.full_attention_interval", 4) or 4
        return tuple((il + 1) % interval != 0 for il in range(n_layer))
    return (False,) * n_layer


def recurrent_widths(header: GGUFHeader, arch: str, n_embd: int) -> tuple[int, int]:
    """(n_embd_r, n_embd_s): llama_hparams::n_embd_r / n_embd_s for the families fitbox knows."""
    wkv = _int(header, f"{arch}.wkv.head_size")
    if wkv:  # RWKV
        return _int(header, f"{arch}.token_shift_count", 2) * n_embd, n_embd * wkv
    l_cache = _int(header, f"{arch}.shortconv.l_cache")
    if l_cache:  # LFM2 short convolutions
        return n_embd * (l_cache - 1), 0
    d_conv = _int(header, f"{arch}.ssm.conv_kernel")
    d_inner = _int(header, f"{arch}.ssm.inner_size")
    d_state = _int(header, f"{arch}.ssm.state_size")
    n_group = _int(header, f"{arch}.ssm.group_count")
    n_conv = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    return n_conv, d_state * d_inner


def ssm_values(header: GGUFHeader, arch: str) -> int:
    """Mamba-style scans hold ~3 x d_inner + 2 x groups x d_state + dt_rank f32 values per
    token beyond a transformer layer (fitted on a Mamba-2 hybrid, FORMULAS.md §Compute)."""
    d_inner = _int(header, f"{arch}.ssm.inner_size")
    if not d_inner:
        return 0
    return (
        3 * d_inner
        + 2 * _int(header, f"{arch}.ssm.group_count") * _int(header, f"{arch}.ssm.state_size")
        + _int(header, f"{arch}.ssm.time_step_rank")
    )


def tensor_kind(name: str) -> str:
    if _ROUTED.search(name):
        return "routed_experts"
    if _SHARED.search(name):
        return "shared_experts"
    if name.startswith("token_embd"):
        return "embeddings"
    if name.startswith("output.") or name == "output":
        return "output"
    if ".attn_" in name or ".ssm_" in name or ".time_mix" in name:
        return "attention"
    if ".ffn_" in name:
        return "dense_ffn"
    return "other"


def _bytes_by(
    tensors: tuple[TensorInfo, ...], n_layer: int
) -> tuple[dict[str, int], tuple[int, ...]]:
    kinds: dict[str, int] = {}
    layers = [0] * n_layer
    for t in tensors:
        kind = tensor_kind(t.name)
        kinds[kind] = kinds.get(kind, 0) + t.n_bytes
        match = _LAYER.match(t.name)
        if match and int(match.group(1)) < n_layer:
            layers[int(match.group(1))] += t.n_bytes
    return kinds, tuple(layers)


def layout_of(tensors: tuple[TensorInfo, ...], n_layer: int) -> Layout:
    """Which bytes are the input layer, each repeating layer (routed experts apart), and the
    output layer: what llama.cpp places per device (core/split.py)."""
    layer, routed = [0] * n_layer, [0] * n_layer
    input_bytes = output_bytes = 0
    has_output = False
    for t in tensors:
        match = _LAYER.match(t.name)
        if match and int(match.group(1)) < n_layer:
            target = routed if _ROUTED.search(t.name) else layer
            target[int(match.group(1))] += t.n_bytes
        elif t.name.startswith("output"):
            output_bytes += t.n_bytes
            has_output = has_output or t.name == "output.weight"
        else:  # token embeddings and the like: the input layer, always on the CPU
            input_bytes += t.n_bytes
    return Layout(tuple(layer), tuple(routed), input_bytes, output_bytes, not has_output)


def weight_tensors(tensors: tuple[TensorInfo, ...], n_layer: int) -> tuple[WeightTensor, ...]:
    """Each tensor with its layer (-1 input, n_layer output, as ``layout_of`` counts them),
    ggml type, rows and the op that reads it: what the repack rule needs (core/repack.py).
    A file without ``output.weight`` gets the engine's duplicate of ``token_embd`` as the
    output matrix (TENSOR_DUPLICATED): mapped once, but repacked as a copy of its own."""
    out: list[WeightTensor] = []
    for t in tensors:
        match = _LAYER.match(t.name)
        if match and int(match.group(1)) < n_layer:
            layer = int(match.group(1))
        else:
            layer = n_layer if t.name.startswith("output") else -1
        dims = max((i + 1 for i, n in enumerate(t.shape) if n > 1), default=1)
        if _ROUTED.search(t.name):
            op = MUL_MAT_ID
        elif t.name.endswith(".weight") and dims > 1 and not _NOT_MATMUL.search(t.name):
            op = MUL_MAT
        else:
            op = ""  # a norm, a bias, an embedding lookup, a convolution
        rows = t.shape[1] if len(t.shape) > 1 else 1
        out.append(WeightTensor(layer, type_name(t.type), rows, dims, op, t.offset, t.n_bytes))
    names = {t.name for t in tensors}
    embd = next(
        (w for t, w in zip(tensors, out, strict=True) if t.name == "token_embd.weight"), None
    )
    if "output.weight" not in names and embd is not None:
        out.append(replace(embd, layer=n_layer, op=MUL_MAT, duplicate=True))
    return tuple(out)


def quant_name(file_type: Any, tensors: tuple[TensorInfo, ...]) -> str:
    if isinstance(file_type, int):
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    by_type: dict[int, int] = {}
    for t in tensors:
        by_type[t.type] = by_type.get(t.type, 0) + t.n_bytes
    if not by_type:
        return "unknown"
    return type_name(max(by_type, key=lambda k: by_type[k]))


def projector_shape(header: GGUFHeader) -> ProjectorShape | None:
    """A vision projector's facts (tools/mtmd/clip.cpp load_hparams: ``clip.vision.*``)."""
    if not header.get("clip.has_vision_encoder"):
        return None
    names = {t.name for t in header.tensors}
    return ProjectorShape(
        weights_bytes=sum(aligned(t.n_bytes) for t in header.tensors),
        projector_type=str(
            header.get("clip.projector_type", header.get("clip.vision.projector_type", ""))
        ),
        image_size=_int(header, "clip.vision.image_size"),
        patch_size=_int(header, "clip.vision.patch_size"),
        n_embd=_int(header, "clip.vision.embedding_length"),
        n_ff=_int(header, "clip.vision.feed_forward_length"),
        n_layer=_int(header, "clip.vision.block_count"),
        class_token="v.class_embd" in names,
        n_merge=_int(header, "clip.vision.projector.scale_factor"),
        pinpoints=bool(header.get("clip.vision.image_grid_pinpoints")),
    )


def facts_from_header(path: Path, header: GGUFHeader) -> GGUFFacts:
    arch = str(header.get("general.architecture", "unknown"))
    n_layer = _int(header, f"{arch}.block_count")
    kinds, per_layer = _bytes_by(header.tensors, n_layer)
    file_type = header.get("general.file_type")
    return GGUFFacts(
        path=path,
        architecture=arch,
        name=str(header.get("general.name", path.stem)),
        file_type=int(file_type) if isinstance(file_type, int) else None,
        quant=quant_name(file_type, header.tensors),
        is_projector=arch in PROJECTOR_ARCHES,
        is_embedding=arch in EMBEDDING_ARCHES or f"{arch}.pooling_type" in header.fields,
        shape=_shape(header, arch, n_layer, kinds),
        expert_count=_int(header, f"{arch}.expert_count"),
        expert_used_count=_int(header, f"{arch}.expert_used_count"),
        bytes_by_layer=per_layer,
        unknown_architecture=n_layer == 0,
        layout=layout_of(header.tensors, n_layer),
        projector=projector_shape(header) if arch in PROJECTOR_ARCHES else None,
        n_params=sum(math.prod(t.shape) for t in header.tensors),
        is_reranker=_int(header, f"{arch}.pooling_type", -1) == POOLING_RANK,
    )


def _shape(
    header: GGUFHeader, arch: str, n_layer: int, weights_by_kind: dict[str, int]
) -> ModelShape:
    """The dimensions sizing reads (core/sizing.py), from the ``<arch>.*`` keys."""
    n_embd = _int(header, f"{arch}.embedding_length")
    heads = _per_layer(header, f"{arch}.attention.head_count", n_layer, 0)
    n_head = max(heads, default=0)
    kv_key = f"{arch}.attention.head_count_kv"
    kv_heads = _per_layer(header, kv_key, n_layer, 0) if kv_key in header.fields else heads
    head_dim = n_embd // n_head if n_head else 0
    tokens = header.get("tokenizer.ggml.tokens")
    n_vocab = _int(header, f"{arch}.vocab_size") or (
        tokens.length if isinstance(tokens, ArrayLength) else len(tokens or [])
    )
    n_embd_r, n_embd_s = recurrent_widths(header, arch, n_embd)
    key_length = _int(header, f"{arch}.attention.key_length", head_dim)
    value_length = _int(header, f"{arch}.attention.value_length", head_dim)
    return ModelShape(
        weights_bytes=sum(t.n_bytes for t in header.tensors),
        n_layer=n_layer,
        n_ctx_train=_int(header, f"{arch}.context_length"),
        n_embd=n_embd,
        n_vocab=n_vocab,
        n_head=n_head,
        kv_heads=kv_heads,
        key_length=key_length,
        value_length=value_length,
        n_swa=_int(header, f"{arch}.attention.sliding_window"),
        swa_layers=swa_layers(header, arch, n_layer),
        key_length_swa=_int(header, f"{arch}.attention.key_length_swa", key_length),
        value_length_swa=_int(header, f"{arch}.attention.value_length_swa", value_length),
        is_mla=bool(
            _int(header, f"{arch}.attention.key_length_mla")
            and _int(header, f"{arch}.attention.value_length_mla")
        ),
        has_kv_cache=arch not in NO_KV_ARCHES,
        recurrent_layers=recurrent_layers(header, arch, kv_heads),
        n_embd_r=n_embd_r,
        n_embd_s=n_embd_s,
        n_ff=_widest_feed_forward(header, arch, n_layer),
        ssm_values=ssm_values(header, arch),
        weights_by_kind=weights_by_kind,
        tensors=weight_tensors(header.tensors, n_layer),
    )


def _widest_feed_forward(header: GGUFHeader, arch: str, n_layer: int) -> int:
    """The widest of a dense layer's FFN, the routed experts used together, and the shared
    expert."""
    return max(
        max(_per_layer(header, f"{arch}.feed_forward_length", n_layer, 0), default=0),
        _int(header, f"{arch}.expert_feed_forward_length")
        * max(_int(header, f"{arch}.expert_used_count"), 1),
        _int(header, f"{arch}.expert_shared_feed_forward_length"),
    )


@lru_cache(maxsize=1024)
def _cached(path: Path, size: int, mtime_ns: int) -> GGUFFacts:
    return facts_from_header(path, read_header(path))


def read_facts(path: Path) -> GGUFFacts:
    """Facts for one file, cached by (path, size, mtime): a changed file is read again."""
    found = identity_of(path)
    return _cached(path, found.size, found.mtime_ns)
