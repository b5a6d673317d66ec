"""Embeddings: sentence-transformers' own modules when the folder names them (modules.json:
its pooling and normalisation), else the mean of the last hidden states over real tokens.

``encoding_format: base64`` is each vector's little-endian float32 bytes, as OpenAI sends
them. ``dimensions`` below the model's own is honoured as OpenAI does it (the first
``dimensions`` values, scaled back to length 1) only for a model trained to keep its meaning
in its first values: a folder whose model card names Matryoshka training (sentence-
transformers' MatryoshkaLoss writes it there). Any other model's cut vectors would be worse
than asked, so it is refused naming the field.
"""

from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .refusal import BadRequest, NonFinite


@dataclass(frozen=True)
class EmbeddingRequest:
    texts: list[str]
    base64: bool
    dimensions: int | None


def embedding_request(body: dict[str, Any]) -> EmbeddingRequest:
    fmt = body.get("encoding_format")
    if fmt not in (None, "float", "base64"):
        raise BadRequest("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise BadRequest("'dimensions' must be a whole number of at least 1", "dimensions")
    return EmbeddingRequest(inputs(body), fmt == "base64", dimensions)


def matryoshka(folder: Path) -> bool:
    """Whether the folder's model card says it was trained for shorter vectors."""
    try:
        return "matryoshka" in (folder / "README.md").read_text(errors="replace").lower()
    except OSError:
        return False


def inputs(body: dict[str, Any]) -> list[str]:
    value = body.get("input")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise BadRequest(
            "'input' must be a string or a non-empty list of strings "
            "(token arrays are not read by this engine)",
            "input",
        )
    return value


class Embedder:
    def __init__(self, folder: Path, device: str, model: Any = None, tokenizer: Any = None):
        self.sentence: Any = None
        self.matryoshka = matryoshka(folder)
        self.model, self.tokenizer = model, tokenizer
        if (folder / "modules.json").is_file():
            from sentence_transformers import SentenceTransformer

            self.sentence = SentenceTransformer(str(folder), device=device)
            self.model, self.tokenizer = self.sentence, self.sentence.tokenizer

    def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """One vector per text, and how many tokens they were."""
        import torch

        tokens = sum(len(self.tokenizer(t)["input_ids"]) for t in texts)
        if self.sentence is not None:
            vectors = self.sentence.encode(texts, convert_to_tensor=True)
            return _finite(vectors).float().cpu().tolist(), tokens
        device = next(self.model.parameters()).device
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True)
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        return _finite(mean).float().cpu().tolist(), tokens

    def shaped(self, vector: list[float], asked: EmbeddingRequest) -> list[float] | str:
        """One vector as the call asked for it: cut to ``dimensions``, as floats or base64."""
        if asked.dimensions is not None and asked.dimensions != len(vector):
            if asked.dimensions > len(vector):
                raise BadRequest(
                    f"'dimensions' is {asked.dimensions}; this model's vectors have {len(vector)}",
                    "dimensions",
                )
            if not self.matryoshka:
                raise BadRequest(
                    f"this model's vectors have {len(vector)} dimensions and it was not "
                    "trained to be cut shorter (no Matryoshka training in its model card); "
                    f"leave out 'dimensions' or send {len(vector)}",
                    "dimensions",
                )
            vector = vector[: asked.dimensions]
            norm = math.sqrt(sum(x * x for x in vector)) or 1.0
            vector = [x / norm for x in vector]
        if asked.base64:
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return vector


def _finite(vectors: Any) -> Any:
    import torch

    if not bool(torch.isfinite(vectors).all()):
        raise NonFinite("vectors")  # corrupt weights: never a vector of NaN as JSON
    return vectors
