"""Placement of transformers folders (issue #16): the 4bit rung of a folder its engine
quantizes as it loads, the MoE expert split priced from the safetensors header, and the
rungs the child cannot take. Header tests write real safetensors files; the core runs on a
declared simulated GPU inventory (tests/core_builders.gpu: ``simulated=True``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fitbox.core.ask import Ask, Candidate
from fitbox.core.decide import decide
from fitbox.core.decision import Place, Refuse
from fitbox.core.types import Rung, Snapshot
from fitbox.engines.seam import Abilities, LaunchIntent
from fitbox.engines.tf import build_argv
from fitbox.models.hf_folders import folder_facts
from fitbox.models.transformers_layout import ABSMAX_BYTES, FOUR_BIT_BLOCK
from tests.support.core_builders import GiB, gpu, host, model
from tests.support.hf_models import LLAMA, write_config, write_safetensors

CORES = tuple(range(8))
E, F, V, LAYERS, EXPERTS = 64, 128, 256, 2, 4  # hidden, expert FFN, vocab, layers, experts


def f32_llama(tmp_path: Path) -> Path:
    """A 2-layer float32 llama folder: the linear weights of each layer, norms, embeddings
    and a separate head."""
    config = {
        **LLAMA,
        "hidden_size": E,
        "intermediate_size": F,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": V,
        "torch_dtype": "float32",
    }
    tensors: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("F32", [V, E])}
    for il in range(LAYERS):
        p = f"model.layers.{il}."
        tensors |= {
            p + "self_attn.q_proj.weight": ("F32", [E, E]),
            p + "self_attn.k_proj.weight": ("F32", [32, E]),
            p + "self_attn.v_proj.weight": ("F32", [32, E]),
            p + "self_attn.o_proj.weight": ("F32", [E, E]),
            p + "mlp.gate_proj.weight": ("F32", [F, E]),
            p + "mlp.up_proj.weight": ("F32", [F, E]),
            p + "mlp.down_proj.weight": ("F32", [E, F]),
            p + "input_layernorm.weight": ("F32", [E]),
        }
    tensors |= {"model.norm.weight": ("F32", [E]), "lm_head.weight": ("F32", [V, E])}
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", tensors)
    return tmp_path


def test_four_bit_weights_are_half_a_byte_per_linear_weight_plus_block_scales(
    tmp_path: Path,
) -> None:
    facts = folder_facts(f32_llama(tmp_path))
    linear = LAYERS * (E * E * 2 + 32 * E * 2 + F * E * 3)  # elements bitsandbytes packs
    kept = (V * E * 2 + LAYERS * E + E) * 4  # embeddings, head, norms: f32 as in the file
    assert facts.shape.weights_bytes == linear * 4 + kept
    per_block = -(-E * E // FOUR_BIT_BLOCK)  # every matrix here is a whole number of blocks
    assert per_block * FOUR_BIT_BLOCK == E * E
    assert facts.four_bit_weights == linear // 2 + linear // FOUR_BIT_BLOCK * ABSMAX_BYTES + kept
    assert facts.layout is None  # dense: no expert split to price


def test_a_mixture_of_experts_folder_prices_its_experts_apart(tmp_path: Path) -> None:
    config = {
        **LLAMA,
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": E,
        "intermediate_size": F,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": V,
        "num_local_experts": EXPERTS,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": True,
    }
    tensors: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [V, E])}
    for il in range(LAYERS):
        p = f"model.layers.{il}."
        tensors |= {
            p + "self_attn.q_proj.weight": ("BF16", [E, E]),
            p + "block_sparse_moe.gate.weight": ("BF16", [EXPERTS, E]),
        }
        for e in range(EXPERTS):
            for w in ("w1", "w2", "w3"):
                shape = [E, F] if w == "w2" else [F, E]
                tensors[p + f"block_sparse_moe.experts.{e}.{w}.weight"] = ("BF16", shape)
    tensors["model.norm.weight"] = ("BF16", [E])
    write_config(tmp_path, config)
    write_safetensors(tmp_path / "model.safetensors", tensors)
    facts = folder_facts(tmp_path)
    assert facts.layout is not None and facts.expert_count == EXPERTS
    assert facts.layout.routed_bytes == (EXPERTS * 3 * F * E * 2,) * LAYERS
    assert facts.layout.layer_bytes == ((E * E + EXPERTS * E) * 2,) * LAYERS  # router stays
    assert facts.layout.input_bytes == V * E * 2 and facts.layout.output_tied
    assert facts.layout.output_bytes == E * 2  # the final norm; the head is the embeddings
    laid = facts.layout
    assert (
        sum(laid.layer_bytes) + sum(laid.routed_bytes) + laid.input_bytes + laid.output_bytes
    ) == facts.shape.weights_bytes


def tf_folder(key: str, weights: int, *, four_bit: bool, moe: bool = False) -> Candidate:
    """A full-precision folder as box/asks.py hands it over: no partial offload, and 4-bit
    bytes only when its engine can quantize (a quarter of the weights here)."""
    return replace(
        model(key, weights, quant="BF16", moe=moe),
        partial_offload=False,
        four_bit_weights=weights // 4 if four_bit else None,
    )


def place(snapshot: Snapshot, ask: Ask) -> Place:
    decision = decide(snapshot, ask)
    assert isinstance(decision, Place), decision
    return decision


def reasons(decision: Place) -> dict[str, str]:
    return {r.rung.value: r.reason.value for r in decision.rejected}


def test_the_four_bit_rung_loads_the_same_folder_quantized_when_the_engine_can() -> None:
    snap = Snapshot((gpu(0, 6 * GiB), host(64 * GiB)), (), cores=CORES)
    decision = place(snap, Ask("m", (tf_folder("tf", 12 * GiB, four_bit=True),)))
    assert (decision.rung, decision.artifact, decision.load_in_4bit) == (Rung.FOUR_BIT, "tf", True)
    assert decision.where == "gpu0/4bit"  # its measured facts are filed apart
    gpu_part = dict(decision.footprint)["gpu0"]
    assert gpu_part.weights == 3 * GiB and gpu_part.total <= 6 * GiB


def test_without_four_bit_in_the_engine_the_rung_is_not_offered_and_says_why() -> None:
    snap = Snapshot((gpu(0, 6 * GiB), host(64 * GiB)), (), cores=CORES)
    decision = place(snap, Ask("m", (tf_folder("tf", 12 * GiB, four_bit=False),)))
    why = next(r for r in decision.rejected if r.rung is Rung.FOUR_BIT)
    assert why.reason.value == "no_four_bit_variant" and "cannot quantize" in why.detail
    assert decision.rung is Rung.RAM_ONLY and not decision.load_in_4bit
    # the child loads a folder whole: no layer count is split between GPU and RAM
    partial = decide(
        snap,
        Ask("m", (tf_folder("tf", 12 * GiB, four_bit=False),), rungs=(Rung.MAX_RAM, Rung.MAX_GPU)),
    )
    assert isinstance(partial, Refuse)
    assert {r.rung.value: r.reason.value for r in partial.rejected} == {
        "max-ram": "no_partial_offload",
        "max-gpu": "no_partial_offload",
    }


def test_at_4bit_a_folder_loads_quantized_in_ram_where_no_gpu_can_take_it() -> None:
    """bitsandbytes quantizes on the CPU too: asked for the 4bit rung alone (``@4bit``) on
    a box without a GPU, the folder is placed in host RAM at its 4-bit bytes, with a RAM
    claim of cores. Offered beside other rungs it is not: such a box loads folders whole."""
    snap = Snapshot((host(64 * GiB),), (), cores=CORES)
    folder = replace(tf_folder("tf", 12 * GiB, four_bit=True), on_gpus=False)
    pinned = place(snap, Ask("m", (folder,), rungs=(Rung.FOUR_BIT,)))
    assert (pinned.rung, pinned.device, pinned.load_in_4bit) == (Rung.FOUR_BIT, "host", True)
    assert pinned.gpu_layers == 0 and dict(pinned.footprint)["host"].weights == 3 * GiB
    assert len(pinned.cores) > 1  # weights in RAM: a claim of cores, not one for a GPU
    whole = place(snap, Ask("m", (folder,)))
    assert whole.rung is Rung.RAM_ONLY and not whole.load_in_4bit


def test_at_4bit_refused_says_why_the_engine_cannot_quantize() -> None:
    snap = Snapshot((host(64 * GiB),), (), cores=CORES)
    why = "bitsandbytes is not in the engine environment (/e/bin/python)"
    folder = replace(tf_folder("tf", 12 * GiB, four_bit=False), on_gpus=False, no_four_bit=why)
    refused = decide(snap, Ask("m", (folder,), rungs=(Rung.FOUR_BIT,)))
    assert isinstance(refused, Refuse)
    (rejected,) = refused.rejected
    assert rejected.reason.value == "no_four_bit_variant" and why in rejected.detail


def test_a_measured_four_bit_load_prices_the_next_four_bit_decision() -> None:
    from fitbox.core.ask import MeasuredFit
    from fitbox.core.types import Footprint

    snap = Snapshot((gpu(0, 6 * GiB), host(64 * GiB)), (), cores=CORES)
    first = place(snap, Ask("m", (tf_folder("tf", 12 * GiB, four_bit=True),)))
    held = Footprint(int(3.5 * GiB), 0, GiB, 0)
    measured = replace(
        tf_folder("tf", 12 * GiB, four_bit=True),
        measured=(
            MeasuredFit("gpu0/4bit", first.window, "f16", "f16", held),
            MeasuredFit("gpu0", first.window, "f16", "f16", Footprint(13 * GiB, 0, 0, 0)),
        ),
    )
    again = place(snap, Ask("m", (measured,), window=first.window))
    assert again.rung is Rung.FOUR_BIT and dict(again.footprint)["gpu0"] == held


def test_the_expert_split_keeps_a_folders_experts_in_ram_on_a_simulated_gpu() -> None:
    snap = Snapshot((gpu(0, 6 * GiB), host(64 * GiB)), (), cores=CORES)
    assert all(d.simulated for d in snap.devices if d.id == "gpu0")
    decision = place(snap, Ask("m", (tf_folder("moe", 12 * GiB, four_bit=False, moe=True),)))
    assert decision.rung is Rung.MOE_SPLIT and decision.experts_in_ram
    assert decision.bytes_on("gpu0") <= 6 * GiB < decision.bytes_on("host")


def test_the_child_is_launched_quantized_or_with_its_experts_in_ram(tmp_path: Path) -> None:
    base = LaunchIntent(
        model_path=tmp_path, alias="m", window=512, parallel=1, gpu_layers=99, port=1, gpus=(0,)
    )
    plain = build_argv(Path("/py"), base)
    assert "--load-in-4bit" not in plain and "--experts-in-ram" not in plain
    assert plain[plain.index("--device") + 1] == "cuda"
    quantized = build_argv(Path("/py"), replace(base, load_in_4bit=True))
    assert "--load-in-4bit" in quantized
    split = build_argv(Path("/py"), replace(base, experts_in_ram=True))
    assert "--experts-in-ram" in split and split[split.index("--device") + 1] == "auto"


def test_asks_offer_four_bit_only_when_the_engine_says_it_can(tmp_path: Path) -> None:
    from fitbox.box.asks import candidate
    from fitbox.models.catalog import Artifact

    facts = folder_facts(f32_llama(tmp_path))
    artifact = Artifact(name="m", path=tmp_path, facts=facts, format="transformers")
    can = candidate(artifact, (), abilities=Abilities(True, partial_offload=False))
    cannot = candidate(artifact, (), abilities=Abilities(False, partial_offload=False))
    assert can.four_bit_weights == facts.four_bit_weights and not can.partial_offload
    assert cannot.four_bit_weights is None
    assert candidate(artifact, ()).partial_offload  # a GGUF engine's default


def test_props_say_what_the_child_holds_now_beside_its_budget() -> None:
    from fitbox.engines.tf import held_from_props

    props = {
        "weights": {"total": 1000, "by_device": {"cpu": 1000}},
        "n_ctx": 512,
        "rss_bytes_after_load": 1300,
        "kv_bytes_now": 40,
    }
    held = held_from_props(props, kv_budget=500)
    assert held is not None and (held.weights, held.kv, held.compute) == (1000, 500, 300)
    assert held.now == 1000 + 300 + 40  # the cache grew to 40 of its 500 so far
    assert held_from_props({**props, "kv_bytes_now": None}, 500).now is None  # type: ignore[union-attr]
