"""Embeddings: sentence-transformers' own modules when the folder names them (modules.json:
its pooling and normalisation), else the mean of the last hidden states over real tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .chat import BadRequest


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
            return vectors.float().cpu().tolist(), tokens
        device = next(self.model.parameters()).device
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True)
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        return mean.float().cpu().tolist(), tokens
