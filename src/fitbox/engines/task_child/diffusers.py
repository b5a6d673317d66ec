"""The diffusers runner: /v1/images/generations from a diffusers text-to-image folder (its
``model_index.json`` names the pipeline; ``unet/``, ``vae/``, a text encoder beside it).

It runs in the diffusers environment's own child (pyproject's ``diffusers-engine`` extra);
diffusers and torch are imported here only. Its surface, apart from the child's protocol:

- ``DiffusersRunner.load(folder, device)`` → the bytes its weights hold, counted once per
  storage (``extra_props`` says it beside the child's RSS);
- ``sizes`` → what it can make (``SizeRule``: each side a multiple of ``multiple`` within
  ``[multiple, largest]``), so a size it cannot make is refused by name before a step runs;
- ``generate(prompt, size, n, seed, steps)`` → ``n`` PNG files of exactly ``size``.

The same rule is read from the folder's JSON files without torch (``rule_from_folder``, all
stdlib): fitbox's door refuses a size with it before the model is placed at all.
"""

from __future__ import annotations

import base64
import importlib
import inspect
import io
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .replies import BadRequest, Route, Whole

IMAGES = "/v1/images/generations"
# Every Stable Diffusion-style pipeline's check_inputs refuses a side that is not a multiple
# of 8, whatever its VAE's own scale; a VAE that scales by more (16 for some) needs that.
PIPELINE_MULTIPLE = 8
# A side up to twice the one the UNet was drawn for: the pipelines make larger pictures, but
# their memory grows with the square of the side and their pictures repeat past it.
LARGEST_OVER_NATIVE = 2
DEFAULT_STEPS = 30
MAX_STEPS = 150


@dataclass(frozen=True)
class SizeRule:
    """The sizes a pipeline makes: each side a multiple of ``multiple``, from ``multiple`` to
    ``largest``; ``native`` is the side it was trained at (what ``size=auto`` means)."""

    multiple: int
    native: int
    largest: int

    def parse(self, size: object) -> tuple[int, int]:
        """``"WxH"`` or ``auto``/None (the native square) as (width, height), or why not."""
        if size is None or size == "auto":
            return self.native, self.native
        width, sep, height = str(size).partition("x")
        if not (isinstance(size, str) and sep and width.isdigit() and height.isdigit()):
            example = f"{self.native}x{self.native}"
            raise BadRequest(
                f"size {size!r} is not WIDTHxHEIGHT ({example}) or auto", "size", "invalid_size"
            )
        return self.check(int(width), int(height))

    def check(self, width: int, height: int) -> tuple[int, int]:
        for side in (width, height):
            if side % self.multiple or not self.multiple <= side <= self.largest:
                raise BadRequest(
                    f"size {width}x{height} cannot be made by this model: each side must "
                    f"be a multiple of {self.multiple} from {self.multiple} to "
                    f"{self.largest} (its native size is {self.native}x{self.native})",
                    "size",
                    "invalid_size",
                )
        return width, height

    def as_json(self) -> dict[str, int]:
        return {"multiple": self.multiple, "native": self.native, "largest": self.largest}


def rule_of(vae_scale: int, sample_size: object) -> SizeRule:
    """The sizes from the VAE's scale (pixels per latent) and the UNet's latent side (an int,
    or a [height, width] pair: its larger side)."""
    latent = max(sample_size) if isinstance(sample_size, (list, tuple)) else sample_size
    latent = latent if isinstance(latent, int) and latent > 0 else 64
    multiple = max(PIPELINE_MULTIPLE, vae_scale)
    native = max(multiple, latent * vae_scale // multiple * multiple)
    return SizeRule(multiple, native, native * LARGEST_OVER_NATIVE)


def rule_from_folder(folder: Path) -> SizeRule:
    """The same rule from the folder's files: the VAE halves a picture once per block past
    its first (diffusers' ``vae_scale_factor``); the UNet's ``sample_size`` is its latent side
    (raises OSError or ValueError for a folder without them)."""
    vae = json.loads((folder / "vae" / "config.json").read_text())
    unet = json.loads((folder / "unet" / "config.json").read_text())
    scale = 2 ** (len(vae.get("block_out_channels", [0])) - 1)
    return rule_of(scale, unet.get("sample_size", 64))


def counted_bytes(modules: list[Any]) -> dict[str, int]:
    """Bytes of every parameter and buffer of ``modules`` by device, counted once per storage
    (a text encoder's tied head is one storage, as the allocator holds it)."""
    seen: set[tuple[str, int]] = set()
    by_device: dict[str, int] = {}
    for module in modules:
        tensors = [t for _, t in module.named_parameters(remove_duplicate=False)]
        tensors += [t for _, t in module.named_buffers(remove_duplicate=False)]
        for tensor in tensors:
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if tensor.device.type == "meta" or key in seen:
                continue
            seen.add(key)
            by_device[str(tensor.device)] = by_device.get(str(tensor.device), 0) + storage.nbytes()
    return by_device


class DiffusersRunner:
    """One pipeline folder: ``load`` once, then ``generate`` one call at a time."""

    def __init__(self) -> None:
        self.pipe: Any = None
        self.device = "cpu"
        self.sizes = SizeRule(PIPELINE_MULTIPLE, PIPELINE_MULTIPLE, PIPELINE_MULTIPLE)
        self.held: dict[str, int] = {}
        self.seeds = False  # whether the pipeline takes a generator (a seed) at all

    def load(self, folder: Path, device: str) -> int:
        """Load ``folder`` on ``device`` (cpu, cuda); the bytes its weights hold there. On a
        GPU the weights load in float16 (half the bytes; the pipelines are made for it); on
        a CPU in float32, where half precision is slow or missing for some ops."""
        import torch

        diffusers = importlib.import_module("diffusers")
        transformers = importlib.import_module("transformers")
        # the child's output is its load log: no progress bars drawn over it
        diffusers.utils.logging.disable_progress_bar()
        transformers.utils.logging.disable_progress_bar()
        dtype = torch.float16 if device.startswith("cuda") else torch.float32
        pipe = diffusers.AutoPipelineForText2Image.from_pretrained(
            str(folder), dtype=dtype, local_files_only=True
        ).to(device)
        pipe.set_progress_bar_config(disable=True)
        self.pipe, self.device = pipe, device
        self.seeds = "generator" in inspect.signature(pipe.__call__).parameters
        modules = [m for m in pipe.components.values() if isinstance(m, torch.nn.Module)]
        self.held = counted_bytes(modules)
        denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
        sample = getattr(denoiser.config, "sample_size", 64) if denoiser is not None else 64
        self.sizes = rule_of(int(getattr(pipe, "vae_scale_factor", 8)), sample)
        return sum(self.held.values())

    def generate(
        self,
        prompt: str,
        size: tuple[int, int],
        n: int = 1,
        seed: int | None = None,
        steps: int | None = None,
    ) -> list[bytes]:
        """``n`` PNG files of ``prompt`` at ``size`` (width, height); the same seed, size and
        steps give the same files on the same device."""
        import torch

        if not prompt.strip():
            raise BadRequest("prompt is empty: say what the image should show", "prompt")
        width, height = self.sizes.check(*size)
        extra: dict[str, Any] = {}
        if seed is not None:
            if not self.seeds:
                raise BadRequest("this pipeline takes no seed", "seed", "unsupported_value")
            extra["generator"] = torch.Generator(device=self.device).manual_seed(seed)
        with torch.inference_mode():
            images = self.pipe(
                prompt=prompt,
                width=width,
                height=height,
                num_images_per_prompt=n,
                num_inference_steps=steps or DEFAULT_STEPS,
                output_type="pil",
                **extra,
            ).images
        return [_png(image) for image in images]

    def peak_bytes(self) -> int:
        """What the process held at its busiest: the GPU allocator's peak on a GPU, the
        resident high-water mark on a CPU (Linux counts ru_maxrss in KiB)."""
        if self.device.startswith("cuda"):
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _png(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _int_field(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"{name} must be an integer from {low} to {high}", name)
    return value


class Images:
    """The child's runner (engines/task_child/replies.py ``Runner``): one route, the PNGs in
    OpenAI's ``b64_json`` shape (fitbox's door writes them out for ``url``)."""

    def __init__(self, model: str, device: str) -> None:
        self.runner = DiffusersRunner()
        self.runner.load(Path(model), device)
        self.routes: dict[str, Route] = {IMAGES: self.generations}
        self.measured: dict[str, float] = {}

    def extra_props(self) -> dict[str, Any]:
        runner = self.runner
        return {
            "sizes": runner.sizes.as_json(),
            "seeds": runner.seeds,
            "weights_bytes": sum(runner.held.values()),
            "weights_by_device": runner.held,
            "peak_bytes": runner.peak_bytes(),
        }

    def generations(self, body: dict[str, Any]) -> Whole:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be the text of the image to make", "prompt")
        size = self.runner.sizes.parse(body.get("size"))
        # n_images from fitbox's door (its n is not the box's to read as slots), n from a
        # client calling the child directly (the bench)
        n = _int_field(body, "n_images", 1, 10) or _int_field(body, "n", 1, 10) or 1
        started = time.perf_counter()
        pngs = self.runner.generate(
            prompt,
            size,
            n,
            _int_field(body, "seed", 0, 2**63 - 1),
            _int_field(body, "steps", 1, MAX_STEPS),
        )
        ms = (time.perf_counter() - started) * 1000
        self.measured.update(pixels=float(size[0] * size[1] * len(pngs)), images=len(pngs))
        data = [{"b64_json": base64.b64encode(png).decode()} for png in pngs]
        # llama-server's timings object, last (fitbox reads a reply's tail for it), with its
        # images as the "tokens": the speed book keeps ms an image, the queue's ETA images
        # a second; fitbox's door leaves it out of the client's reply
        timings = {"predicted_n": len(pngs), "predicted_ms": ms, "predicted_per_token_ms": ms / n}
        reply = {"created": int(time.time()), "data": data, "timings": timings}
        return Whole(json.dumps(reply).encode(), "application/json")


def load(model: str, device: str, threads: int) -> Images:
    if threads:
        import torch

        torch.set_num_threads(threads)
    return Images(model, device)
