"""A zoo of tiny GGUFs, one per memory-relevant feature, that a real llama-server loads.

Each writer follows one architecture's ``load_arch_hparams``/``load_arch_tensors`` in
llama.cpp's ``src/models/<arch>.cpp`` (the file its docstring names), writes F32 tensors
only, and reuses the tokenizer recipe of :mod:`tests.ggufs` (every printable ASCII
character is a NORMAL token, no byte tokens), so the result is a few hundred KB.

- :func:`write_gqa_per_layer`: ``deci``, per-layer ``attention.head_count_kv`` (one layer 0).
- :func:`write_swa`: ``gemma2``, sliding-window attention on every other layer (iSWA cache).
- :func:`write_moe`: ``qwen2moe``, routed experts (3-D ``ffn_*_exps``) plus a shared expert.
- :func:`write_hybrid`: ``lfm2``, short-conv recurrent layers mixed with attention layers.

The default head dim is 32, so q8_0/q4_0 KV caches (block 32) work with flash attention.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from .ggufs import SPECIALS, WORDS, add_tokenizer

TOKENS = SPECIALS + WORDS


class _Model:
    """A GGUFWriter with the shared header, tokenizer and random F32 weights."""

    def __init__(self, path: Path, arch: str, *, n_layer: int, n_embd: int, n_ctx: int, seed: int):
        self.path = path
        self.n_vocab = len(TOKENS)
        self.n_embd = n_embd
        self.rng = np.random.default_rng(seed)
        self.writer = GGUFWriter(str(path), arch)
        w = self.writer
        w.add_name(path.stem)
        w.add_block_count(n_layer)
        w.add_context_length(n_ctx)
        w.add_embedding_length(n_embd)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_file_type(0)  # all F32
        add_tokenizer(w, TOKENS)

    def weight(self, name: str, *ggml_shape: int) -> None:
        """A random tensor; ``ggml_shape`` is in llama.cpp's order (ne0 first)."""
        shape = tuple(reversed(ggml_shape))
        self.writer.add_tensor(name, (self.rng.standard_normal(shape) * 0.02).astype(np.float32))

    def ones(self, name: str, n: int) -> None:
        self.writer.add_tensor(name, np.ones(n, dtype=np.float32))

    def embeddings(self, *, output: bool = True, norm_name: str = "output_norm.weight") -> None:
        self.weight("token_embd.weight", self.n_embd, self.n_vocab)
        self.ones(norm_name, self.n_embd)
        if output:
            self.weight("output.weight", self.n_embd, self.n_vocab)

    def attention(self, i: int, n_q: int, n_kv: int, n_out: int | None = None) -> None:
        """``blk.i.attn_{q,k,v,output}``: ``n_q``/``n_kv`` are head count × head dim."""
        self.weight(f"blk.{i}.attn_q.weight", self.n_embd, n_q)
        self.weight(f"blk.{i}.attn_k.weight", self.n_embd, n_kv)
        self.weight(f"blk.{i}.attn_v.weight", self.n_embd, n_kv)
        self.weight(f"blk.{i}.attn_output.weight", n_q if n_out is None else n_out, self.n_embd)

    def ffn(self, i: int, n_ff: int, suffix: str = "") -> None:
        """``blk.i.ffn_{gate,up,down}<suffix>`` (SwiGLU)."""
        self.weight(f"blk.{i}.ffn_gate{suffix}.weight", self.n_embd, n_ff)
        self.weight(f"blk.{i}.ffn_up{suffix}.weight", self.n_embd, n_ff)
        self.weight(f"blk.{i}.ffn_down{suffix}.weight", n_ff, self.n_embd)

    def finish(self) -> Path:
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_tensors_to_file()
        self.writer.close()
        return self.path


def write_gqa_per_layer(
    path: Path,
    *,
    n_embd: int = 128,
    n_head: int = 4,
    n_head_kv: Sequence[int] = (4, 2, 1, 0),
    n_ff: int = 256,
    n_ctx: int = 4096,
    seed: int = 0,
) -> Path:
    """Per-layer KV heads: ``deci.attention.head_count_kv`` is an array, one entry a layer.

    Follows ``src/models/deci.cpp`` (Nemotron-NAS). The ``llama`` architecture reads the same
    array but sizes every layer's K/V weights from layer 0 (``LLAMA_LOAD_LOCALS``), so a
    differing layer fails with "wrong shape"; ``deci`` sizes each layer with
    ``n_embd_k_gqa(i)``. A 0 entry (with ``n_head`` > 0) is a "linear attention" layer: only
    ``attn_output`` {n_embd, n_embd}, no K/V weights, yet the KV cache still gives it a
    zero-width slot. Head dim is ``n_embd / n_head`` (32 by default).
    """
    head_dim = n_embd // n_head
    m = _Model(path, "deci", n_layer=len(n_head_kv), n_embd=n_embd, n_ctx=n_ctx, seed=seed)
    m.writer.add_feed_forward_length(n_ff)
    m.writer.add_head_count(n_head)
    m.writer.add_head_count_kv(list(n_head_kv))
    m.writer.add_rope_dimension_count(head_dim)
    m.embeddings()
    for i, kv in enumerate(n_head_kv):
        m.ones(f"blk.{i}.attn_norm.weight", n_embd)
        if kv == 0:
            m.weight(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        else:
            m.attention(i, n_head * head_dim, kv * head_dim)
        m.ones(f"blk.{i}.ffn_norm.weight", n_embd)
        m.ffn(i, n_ff)
    return m.finish()


def write_swa(
    path: Path,
    *,
    n_embd: int = 128,
    n_layer: int = 4,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 256,
    n_ctx: int = 8192,
    sliding_window: int = 128,
    swa_pattern: int | None = None,
    seed: int = 0,
) -> Path:
    """Sliding-window attention on interleaved layers: the engine builds an iSWA KV cache.

    Follows ``src/models/gemma2.cpp``: ``gemma2.attention.sliding_window`` sets ``n_swa``
    (default 4096) and ``load_swa_pattern(ml, 2)`` makes even layers SWA and odd layers
    full (``is_swa(il) = il % p < p - 1``); ``swa_pattern`` writes
    ``gemma2.attention.sliding_window_pattern`` to change the period. The output head is
    tied to ``token_embd``; each layer adds ``post_attention_norm`` and ``post_ffw_norm``.
    """
    head_dim = n_embd // n_head
    m = _Model(path, "gemma2", n_layer=n_layer, n_embd=n_embd, n_ctx=n_ctx, seed=seed)
    m.writer.add_feed_forward_length(n_ff)
    m.writer.add_head_count(n_head)
    m.writer.add_head_count_kv(n_head_kv)
    m.writer.add_sliding_window(sliding_window)
    if swa_pattern is not None:
        m.writer.add_sliding_window_pattern(swa_pattern)
    m.writer.add_attn_logit_softcapping(50.0)
    m.writer.add_final_logit_softcapping(30.0)
    m.embeddings(output=False)
    for i in range(n_layer):
        m.ones(f"blk.{i}.attn_norm.weight", n_embd)
        m.attention(i, n_head * head_dim, n_head_kv * head_dim)
        m.ones(f"blk.{i}.post_attention_norm.weight", n_embd)
        m.ones(f"blk.{i}.ffn_norm.weight", n_embd)
        m.ffn(i, n_ff)
        m.ones(f"blk.{i}.post_ffw_norm.weight", n_embd)
    return m.finish()


def write_moe(
    path: Path,
    *,
    n_embd: int = 128,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 64,
    n_ff_shexp: int = 128,
    n_ctx: int = 4096,
    seed: int = 0,
) -> Path:
    """Mixture of experts with routed 3-D expert tensors and one shared expert.

    Follows ``src/models/qwen2moe.cpp``: ``qwen2moe.expert_count``,
    ``qwen2moe.expert_used_count``, ``qwen2moe.expert_feed_forward_length`` and
    ``qwen2moe.expert_shared_feed_forward_length``. Per layer: the router
    ``ffn_gate_inp`` {n_embd, n_expert}, routed ``ffn_{gate,up,down}_exps``
    {n_embd, n_ff_exp, n_expert} (down: {n_ff_exp, n_embd, n_expert}), and the shared
    expert ``ffn_{gate,up,down}_shexp`` with its gate ``ffn_gate_inp_shexp`` {n_embd}.
    qwen2moe needs n_head × head_dim == n_embd (``wq``/``wo`` are {n_embd, n_embd}).
    """
    head_dim = n_embd // n_head
    m = _Model(path, "qwen2moe", n_layer=n_layer, n_embd=n_embd, n_ctx=n_ctx, seed=seed)
    m.writer.add_feed_forward_length(n_ff_shexp)
    m.writer.add_head_count(n_head)
    m.writer.add_head_count_kv(n_head_kv)
    m.writer.add_rope_dimension_count(head_dim)
    m.writer.add_expert_count(n_expert)
    m.writer.add_expert_used_count(n_expert_used)
    m.writer.add_expert_feed_forward_length(n_ff_exp)
    m.writer.add_expert_shared_feed_forward_length(n_ff_shexp)
    m.embeddings()
    for i in range(n_layer):
        m.ones(f"blk.{i}.attn_norm.weight", n_embd)
        m.attention(i, n_embd, n_head_kv * head_dim)
        m.ones(f"blk.{i}.ffn_norm.weight", n_embd)
        m.weight(f"blk.{i}.ffn_gate_inp.weight", n_embd, n_expert)
        m.weight(f"blk.{i}.ffn_gate_exps.weight", n_embd, n_ff_exp, n_expert)
        m.weight(f"blk.{i}.ffn_up_exps.weight", n_embd, n_ff_exp, n_expert)
        m.weight(f"blk.{i}.ffn_down_exps.weight", n_ff_exp, n_embd, n_expert)
        m.weight(f"blk.{i}.ffn_gate_inp_shexp.weight", n_embd)
        m.ffn(i, n_ff_shexp, "_shexp")
    return m.finish()


def write_hybrid(
    path: Path,
    *,
    n_embd: int = 128,
    n_head: int = 4,
    layer_kv_heads: Sequence[int] = (0, 0, 2, 0, 0, 2),
    n_ff: int = 256,
    l_cache: int = 3,
    n_ctx: int = 4096,
    seed: int = 0,
) -> Path:
    """A hybrid model: short-convolution recurrent layers plus attention layers.

    Follows ``src/models/lfm2.cpp`` (LFM2): ``lfm2.attention.head_count_kv`` is a per-layer
    array and a 0 marks a recurrent (short-conv) layer (``is_recr_impl[il] =
    n_head_kv(il) == 0``); ``lfm2.shortconv.l_cache`` is the conv width, so each recurrent
    layer keeps an F32 state of ``n_embd * (l_cache - 1)`` per sequence
    (``llama_hparams::n_embd_r``). The output norm is named ``token_embd_norm``; attention
    layers carry ``attn_q_norm``/``attn_k_norm`` {head_dim}; conv layers carry
    ``shortconv.{conv,in_proj,out_proj}``.
    """
    head_dim = n_embd // n_head
    m = _Model(path, "lfm2", n_layer=len(layer_kv_heads), n_embd=n_embd, n_ctx=n_ctx, seed=seed)
    m.writer.add_feed_forward_length(n_ff)
    m.writer.add_head_count(n_head)
    m.writer.add_head_count_kv(list(layer_kv_heads))
    m.writer.add_rope_dimension_count(head_dim)
    m.writer.add_shortconv_l_cache(l_cache)
    m.embeddings(norm_name="token_embd_norm.weight")
    for i, kv in enumerate(layer_kv_heads):
        m.ones(f"blk.{i}.attn_norm.weight", n_embd)
        if kv == 0:
            m.weight(f"blk.{i}.shortconv.conv.weight", l_cache, n_embd)
            m.weight(f"blk.{i}.shortconv.in_proj.weight", n_embd, 3 * n_embd)
            m.weight(f"blk.{i}.shortconv.out_proj.weight", n_embd, n_embd)
        else:
            m.ones(f"blk.{i}.attn_q_norm.weight", head_dim)
            m.ones(f"blk.{i}.attn_k_norm.weight", head_dim)
            m.attention(i, n_embd, kv * head_dim)
        m.ones(f"blk.{i}.ffn_norm.weight", n_embd)
        m.ffn(i, n_ff)
    return m.finish()


def write_mamba2_hybrid(
    path: Path,
    *,
    n_embd: int = 128,
    n_head: int = 4,
    layer_kv_heads: Sequence[int] = (0, 0, 2, 0),
    n_ff: int = 256,
    d_state: int = 64,
    n_ssm_head: int = 8,
    n_group: int = 1,
    d_conv: int = 4,
    n_ctx: int = 4096,
    seed: int = 0,
) -> Path:
    """A hybrid with Mamba-2 layers, whose recurrent state is large enough to see in logs.

    Follows ``src/models/granite-hybrid.cpp`` (Granite 4.0-H): a 0 in
    ``granitehybrid.attention.head_count_kv`` marks a Mamba-2 layer. ``ssm.inner_size`` must
    be ``2 * n_embd``; ``ssm.time_step_rank`` is the SSM head count. Per recurrent layer and
    sequence the state is F32 R = ``(d_conv - 1) * (d_inner + 2 * n_group * d_state)`` and
    S = ``d_state * d_inner`` (``llama_hparams::n_embd_r``/``n_embd_s``).
    """
    head_dim = n_embd // n_head
    d_inner = 2 * n_embd
    d_xbc = d_inner + 2 * n_group * d_state
    arch = "granitehybrid"
    m = _Model(path, arch, n_layer=len(layer_kv_heads), n_embd=n_embd, n_ctx=n_ctx, seed=seed)
    w = m.writer
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(list(layer_kv_heads))
    w.add_rope_dimension_count(head_dim)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_ssm_head)
    w.add_ssm_group_count(n_group)
    m.embeddings()
    for i, kv in enumerate(layer_kv_heads):
        m.ones(f"blk.{i}.attn_norm.weight", n_embd)
        if kv == 0:
            m.weight(f"blk.{i}.ssm_in.weight", n_embd, d_inner + d_xbc + n_ssm_head)
            m.weight(f"blk.{i}.ssm_conv1d.weight", d_conv, d_xbc)
            # optional to the loader, but mamba-base.cpp adds it unconditionally (else SIGSEGV)
            w.add_tensor(f"blk.{i}.ssm_conv1d.bias", np.zeros(d_xbc, dtype=np.float32))
            m.ones(f"blk.{i}.ssm_dt.bias", n_ssm_head)
            w.add_tensor(f"blk.{i}.ssm_a", -np.ones((n_ssm_head, 1), dtype=np.float32))
            w.add_tensor(f"blk.{i}.ssm_d", np.ones((n_ssm_head, 1), dtype=np.float32))
            w.add_tensor(
                f"blk.{i}.ssm_norm.weight", np.ones((n_group, d_inner // n_group), np.float32)
            )
            m.weight(f"blk.{i}.ssm_out.weight", d_inner, n_embd)
        else:
            m.attention(i, n_embd, kv * head_dim)
        m.ones(f"blk.{i}.ffn_norm.weight", n_embd)
        m.ffn(i, n_ff)
    return m.finish()


WRITERS: dict[str, Callable[[Path], Path]] = {
    "gqa-per-layer": write_gqa_per_layer,
    "swa": write_swa,
    "moe": write_moe,
    "hybrid": write_hybrid,
    "mamba2-hybrid": write_mamba2_hybrid,
}
