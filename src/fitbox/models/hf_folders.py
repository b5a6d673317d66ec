"""Hugging Face model folders as catalog artifacts: their names and the shape placement reads.

A folder is named by its directory, except a Hugging Face cache snapshot
(``models--owner--repo/snapshots/<rev>``), which is the model ``owner/repo``. Its shape for
the core is read from ``config.json`` (transformers_facts.py does the KV layout), so a
transformers model is placed by the same rules as a GGUF until its first load measures it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fitbox.core.sizing import ModelShape
from fitbox.models.folder_judge import EngineSupport, judge
from fitbox.models.gguf_facts import GGUFFacts
from fitbox.models.safetensors_header import read_safetensors_header
from fitbox.models.transformers_facts import (
    BadModelDir,
    _get,
    _load_json,
    _need,
    _text_config,
    _weight_files,
    adapter_bytes,
    read_transformers_facts,
)
from fitbox.models.transformers_layout import TensorBytes, four_bit_bytes, layout
from fitbox.models.vision import is_vision_config

FORMAT = "transformers"
# config.json dtypes, as a quant tag a name may pin (``model@F32``)
DTYPE_TAGS = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2}
# The routed experts of a mixture of experts, and how many each token passes through.
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERT_USED_KEYS = ("num_experts_per_tok", "moe_top_k")
# Encoders served through /v1/embeddings (a sentence-transformers folder is one too).
EMBEDDING_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "mpnet", "distilbert", "nomic_bert", "modernbert", "electra"}
)


def folder_name(path: Path) -> str:
    """``owner/repo`` for a cache snapshot, else the folder's own name."""
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        owner_repo = path.parent.parent.name.removeprefix("models--")
        owner, _, repo = owner_repo.partition("--")
        return f"{owner}/{repo}" if repo else owner
    if path.name.startswith("models--"):
        owner, _, repo = path.name.removeprefix("models--").partition("--")
        return f"{owner}/{repo}" if repo else owner
    return path.name


def is_snapshot_entry(path: Path) -> bool:
    """Whether ``path`` is a snapshot another (newer, or ``refs/main``) one supersedes."""
    snapshots = path.parent
    if snapshots.name != "snapshots" or not snapshots.parent.name.startswith("models--"):
        return False
    ref = snapshots.parent / "refs" / "main"
    if ref.is_file():
        return ref.read_text().strip() != path.name
    newest = max((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return newest != path


def _is_embedding(root: Path, config: dict[str, Any]) -> bool:
    if (root / "modules.json").is_file():
        return True
    return str(config.get("model_type")) in EMBEDDING_TYPES


def folder_facts(path: Path) -> GGUFFacts:
    """What placement needs of a model folder; raises BadModelDir with the fix."""
    facts = read_transformers_facts(path)
    if facts.kind != "decoder":
        raise BadModelDir(
            f"a {facts.kind} model: the transformers engine serves chat "
            "(causal LM) and embedding folders"
        )
    root = facts.path
    config = _load_json(root / "config.json")
    text = _text_config(config)
    quant = DTYPE_TAGS.get(facts.dtype or "", (facts.dtype or "F32").upper())
    embedding = _is_embedding(root, config)
    heads = _need(text, "num_attention_heads", "n_head", "num_heads")
    n_embd = _need(text, "hidden_size", "n_embd", "d_model")
    kv_heads = _get(text, "num_key_value_heads", "num_kv_heads", "n_head_kv") or heads
    head_dim = _get(text, "head_dim") or n_embd // heads
    extra = adapter_bytes(root)  # an adapter stays in its own dtype, never quantized
    tensors = TensorBytes.read(facts.weight_files)
    experts, used = _get(text, *EXPERT_KEYS) or 0, _get(text, *EXPERT_USED_KEYS) or 0
    placed = layout(tensors, facts.n_layer)
    n_ff = _get(text, "intermediate_size", "n_inner", "ffn_dim") or 0
    if experts:  # a token passes its experts' FFNs, not the dense width
        n_ff = max((_get(text, "moe_intermediate_size") or n_ff) * max(used, 1), n_ff)
    shape = ModelShape(
        weights_bytes=facts.weights_bytes + extra,
        n_layer=facts.n_layer,
        n_ctx_train=facts.n_ctx_train or 0,
        n_embd=n_embd,
        n_vocab=_get(text, "vocab_size") or 0,
        n_head=heads,
        kv_heads=tuple(kv_heads if kv else 0 for kv in facts.kv_layers) or (kv_heads,),
        key_length=head_dim,
        value_length=head_dim,
        n_swa=facts.sliding_window or 0,
        swa_layers=facts.swa_layers,
        is_mla=facts.is_mla,
        has_kv_cache=not embedding,
        n_ff=n_ff,
    )
    full_precision = quant in DTYPE_BYTES
    return GGUFFacts(
        path=root,
        architecture=facts.architecture or "unknown",
        name=folder_name(path),
        file_type=None,
        quant=quant,
        is_projector=False,
        is_embedding=embedding,
        shape=shape,
        expert_count=experts,
        expert_used_count=used,
        vision=is_vision_config(config),
        layout=placed if any(placed.routed_bytes) else None,
        four_bit_weights=four_bit_bytes(tensors) + extra if full_precision else None,
    )


def folder_problem(root: Path, support: EngineSupport | None) -> str | None:
    """Why the folder ``root`` (priced by ``folder_facts``) cannot be served: its code, its
    architecture, its tokenizer or its weights (models/folder_judge.py); None: it can."""
    config = _load_json(root / "config.json")
    headers = [read_safetensors_header(f) for f in _weight_files(root, below=False)]
    return judge(root, config, headers, support)
