"""The diffusers runner for tests: its environment, a tiny random pipeline, the runner alone.

The environment is the one fitbox builds from the ``diffusers-engine`` extra, cached by
tests/support/task_engines.py under ``~/.cache/fitbox-tests/diffusers-<digest>`` (built once:
~3 minutes on two cores, torch's CPU wheel lies on disk). The pipeline
needs no network at all: ``MAKE_PIPELINE`` draws a seeded Stable Diffusion of a few
thousand weights (UNet2DConditionModel, AutoencoderKL, CLIPTextModel, a PNDM scheduler)
and a CLIP tokenizer whose vocabulary and merges are written here, and saves it with
``save_pretrained``: the folder a Hub download holds, ``model_index.json`` included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from fitbox.engines import task_child
from fitbox.engines.task_runners import runner_named

from .paths import CACHE
from .task_engines import _locked, runner_env

# The VAE halves the picture once per block past the first: two blocks, a scale of 2; the
# UNet's two blocks halve the latents once more, so a side must divide by 2 * 2 = 4 for
# the latents to round-trip (a multiple of 8 is what the runner asks for regardless).
MAKE_PIPELINE = r"""
import json, sys
from pathlib import Path
import torch
from diffusers import (AutoencoderKL, PNDMScheduler, StableDiffusionPipeline,
                       UNet2DConditionModel)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

out = Path(sys.argv[1])
work = out.with_name(out.name + ".tokenizer")
work.mkdir(parents=True, exist_ok=True)
# A byte-level BPE vocabulary small enough to write by hand: every printable ASCII letter
# alone and at a word's end, two merges, and CLIP's two specials.
letters = [chr(c) for c in range(33, 127)]
vocab = {}
for token in letters + [c + "</w>" for c in letters] + ["th", "the</w>"]:
    vocab[token] = len(vocab)
vocab["<|startoftext|>"] = len(vocab)
vocab["<|endoftext|>"] = len(vocab)
(work / "vocab.json").write_text(json.dumps(vocab))
(work / "merges.txt").write_text("#version: 0.2\nt h\nth e</w>\n")
tokenizer = CLIPTokenizer(str(work / "vocab.json"), str(work / "merges.txt"), model_max_length=16)

torch.manual_seed(0)
unet = UNet2DConditionModel(
    block_out_channels=(8, 16), layers_per_block=1, sample_size=32, in_channels=4,
    out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=16,
    attention_head_dim=2, norm_num_groups=4,
)
vae = AutoencoderKL(
    block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4,
    down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
    up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), norm_num_groups=4,
    sample_size=64,
)
text = CLIPTextModel(CLIPTextConfig(
    vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=2, max_position_embeddings=16, projection_dim=16,
    bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
    pad_token_id=vocab["<|endoftext|>"],
))
scheduler = PNDMScheduler(skip_prk_steps=True)
pipe = StableDiffusionPipeline(
    unet=unet, vae=vae, text_encoder=text, tokenizer=tokenizer, scheduler=scheduler,
    safety_checker=None, feature_extractor=None, requires_safety_checker=False,
)
pipe.save_pretrained(out, safe_serialization=True)
"""


def diffusers_python() -> Path:
    """The diffusers environment's interpreter (built on first use, then reused)."""
    return runner_env(runner_named("diffusers")) / "bin" / "python"


def tiny_pipeline(python: Path) -> Path:
    """The tiny random Stable Diffusion folder (MAKE_PIPELINE), built once per cache."""
    out = CACHE / "diffusers-models" / "tiny-sd"
    with _locked(out.with_suffix(".lock")):
        if not (out / "model_index.json").is_file():
            building = out.with_name(out.name + ".building")
            for stale in (building, building.with_name(building.name + ".tokenizer")):
                shutil.rmtree(stale, ignore_errors=True)
            subprocess.run(
                [str(python), "-c", MAKE_PIPELINE, str(building)],
                check=True,
                timeout=600,
                capture_output=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            shutil.rmtree(building.with_name(building.name + ".tokenizer"))
            shutil.rmtree(out, ignore_errors=True)
            os.rename(building, out)
    return out


# The runner called directly, in its environment's interpreter, as the task child calls it
# (the folder holding task_child goes last on sys.path), without the child's HTTP. Calls come
# as JSON lines on stdin ({"prompt", "size", "n", "seed", "steps"}); one JSON line answers
# each: the PNGs in base64 and the seconds generate() took, or the refusal's param and message.
DRIVE_RUNNER = r"""
import base64, json, sys, time
sys.path.append(sys.argv[1])
from pathlib import Path
from task_child.diffusers import DiffusersRunner, rule_from_folder
from task_child.replies import BadRequest
runner = DiffusersRunner()
held = runner.load(Path(sys.argv[2]), sys.argv[3])
print(json.dumps({"held": held, "by_device": runner.held, "sizes": runner.sizes.as_json(),
                  "from_folder": rule_from_folder(Path(sys.argv[2])).as_json(),
                  "seeds": runner.seeds}), flush=True)
for line in sys.stdin:
    call = json.loads(line)
    started = time.perf_counter()
    try:
        size = runner.sizes.parse(call.get("size"))
        pngs = runner.generate(call["prompt"], size, call.get("n", 1), call.get("seed"),
                               call.get("steps"))
    except BadRequest as exc:
        print(json.dumps({"param": exc.param, "message": str(exc)}), flush=True)
        continue
    print(json.dumps({"pngs": [base64.b64encode(p).decode() for p in pngs],
                      "seconds": time.perf_counter() - started,
                      "peak": runner.peak_bytes()}), flush=True)
"""


def drive_runner(
    python: Path, folder: Path, calls: list[dict[str, object]], device: str = "cpu"
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """What the runner said after loading ``folder``, and its answer to each of ``calls``."""
    engines = Path(task_child.__file__).parent.parent
    done = subprocess.run(
        [str(python), "-c", DRIVE_RUNNER, str(engines), str(folder), device],
        input="".join(json.dumps(call) + "\n" for call in calls),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return lines[0], lines[1:]
