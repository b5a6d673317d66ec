"""Tiny GGUF files written with the gguf package, that a real llama-server loads.

The recipe is ../shared/reference/llama-server.md §5.2: llama architecture, SPM tokenizer
with ASCII-only NORMAL tokens (byte tokens make the random model emit text the chat parser
rejects), F32 tensors.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, PoolingType, TokenType

SPECIALS = ["<unk>", "<s>", "</s>"]
CONTROL = {"<s>", "</s>", "<|im_start|>", "<|im_end|>"}  # never sampled back as text
# Every printable ASCII character is a token: SPM falls back to <0xXX> byte tokens for a
# character it lacks, and this vocabulary has none, so tokenizing it would throw.
CHARS = [c for c in string.printable if c not in string.whitespace or c == "\n"]
WORDS = (
    [*CHARS, "\u2581"]
    + ["\u2581" + w for w in ("the", "a", "is", "of", "and", "to", "in", "hi", "ok", "yes", "no")]
    + ["<|im_start|>", "<|im_end|>"]
)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def add_tokenizer(writer: GGUFWriter, tokens: list[str]) -> None:
    """An SPM vocabulary of plain tokens (control tokens typed CONTROL) and a chat template."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 3 + [-float(i) for i in range(len(tokens) - 3)])
    writer.add_token_types(
        [
            TokenType.UNKNOWN if i == 0 else TokenType.CONTROL if t in CONTROL else TokenType.NORMAL
            for i, t in enumerate(tokens)
        ]
    )
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)


def write_tiny_llama(
    path: Path,
    *,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx: int = 512,
    extra_vocab: int = 0,
    with_tokenizer: bool = True,
    seed: int = 0,
    tied: bool = False,
    arch: str = "llama",
    reranker: bool = False,
) -> Path:
    """Write a loadable llama-architecture GGUF. ``extra_vocab`` pads the vocabulary (and so
    the embedding and output tensors) to make the file as large as a test needs; ``tied``
    leaves out ``output.weight`` (the engine then uses ``token_embd`` as the output).
    ``arch="qwen3"``: the same with the Q/K norms Qwen3 adds; ``reranker``: a
    Qwen3-Reranker-like one (rank pooling, a one-label classifier head ``cls.output``),
    which llama-server serves with ``--reranking``."""
    rng = np.random.default_rng(seed)
    tokens = SPECIALS + WORDS + [f"w{i}" for i in range(extra_vocab)]
    n_vocab = len(tokens)
    head_dim = n_embd // n_head
    writer = GGUFWriter(str(path), arch)
    writer.add_name(path.stem)
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(0)  # all F32
    if reranker:
        writer.add_pooling_type(PoolingType.RANK)
        writer.add_classifier_output_labels(["yes"])
    if with_tokenizer:
        add_tokenizer(writer, tokens)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    if not tied:
        writer.add_tensor("output.weight", weight(n_vocab, n_embd))
    if reranker:
        writer.add_tensor("cls.output.weight", weight(1, n_embd))
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(n_head * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_head * head_dim))
        if arch == "qwen3":
            for norm in ("attn_q_norm", "attn_k_norm"):
                writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(head_dim, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_projector(path: Path) -> Path:
    """A GGUF that says it is a CLIP projector: never listed as a model."""
    writer = GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_tensor("v.patch_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def two_models_one_at_a_time(root: Path, smollm2: Path) -> int:
    """SmolLM2 and a generated llama under ``root``; returns a RAM cap that holds one of them
    at a time, even at the smallest window the core would shrink a model to."""
    from fitbox.core import sizing
    from fitbox.models.gguf_facts import read_facts

    root.mkdir(parents=True, exist_ok=True)
    (root / smollm2.name).symlink_to(smollm2)
    write_tiny_llama(root / "tiny.gguf", extra_vocab=50_000)
    sizes = [sizing.footprint(read_facts(p).shape, 512, 1).total for p in root.iterdir()]
    return max(sizes) + min(sizes) // 2


def write_vision_projector(
    path: Path,
    *,
    n_embd_text: int,
    image_size: int = 64,
    patch_size: int = 8,
    n_embd: int = 128,
    n_head: int = 4,
    n_ff: int = 512,
    n_layer: int = 2,
    seed: int = 0,
) -> Path:
    """A loadable LLaVA-style (``mlp``) CLIP projector for ``--mmproj`` (tools/mtmd/clip.cpp
    load_hparams/load_tensors): a ViT of ``n_layer`` blocks over (image/patch)^2 patches
    plus a class token, and a two-layer MLP into the text model's ``n_embd_text``."""
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "clip")
    writer.add_name(path.stem)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", n_ff)
    writer.add_uint32("clip.vision.block_count", n_layer)
    writer.add_uint32("clip.vision.projection_dim", n_embd_text)
    writer.add_uint32("clip.vision.attention.head_count", n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_file_type(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def norm(name: str, n: int) -> None:
        writer.add_tensor(f"{name}.weight", np.ones(n, dtype=np.float32))
        writer.add_tensor(f"{name}.bias", np.zeros(n, dtype=np.float32))

    def linear(name: str, n_in: int, n_out: int) -> None:
        writer.add_tensor(f"{name}.weight", weight(n_out, n_in))
        writer.add_tensor(f"{name}.bias", np.zeros(n_out, dtype=np.float32))

    n_pos = (image_size // patch_size) ** 2 + 1
    writer.add_tensor("v.class_embd", weight(n_embd))
    writer.add_tensor("v.patch_embd.weight", weight(n_embd, 3, patch_size, patch_size))
    writer.add_tensor("v.position_embd.weight", weight(n_pos, n_embd))
    norm("v.pre_ln", n_embd)
    for i in range(n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            linear(f"v.blk.{i}.{part}", n_embd, n_embd)
        norm(f"v.blk.{i}.ln1", n_embd)
        norm(f"v.blk.{i}.ln2", n_embd)
        linear(f"v.blk.{i}.ffn_up", n_embd, n_ff)
        linear(f"v.blk.{i}.ffn_down", n_ff, n_embd)
    linear("mm.0", n_embd, n_embd_text)
    linear("mm.2", n_embd_text, n_embd_text)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
