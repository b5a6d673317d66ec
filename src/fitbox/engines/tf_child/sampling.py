"""From one step's logits to one token per choice: penalties, bias, then greedy or a draw.

``repetition_penalty`` is transformers' (every token of the prompt and the reply: a
positive logit divided by it, a negative one multiplied); ``presence_penalty`` and
``frequency_penalty`` are OpenAI's (the reply's tokens: ``logit -= presence * seen +
frequency * count``). A draw applies temperature, then top-k, top-p and min-p, with the
call's ``seed`` (the same seed, the same choices). Temperature 0 is the argmax, so a greedy
reply is ``generate``'s token for token.
"""

from __future__ import annotations

from typing import Any

from .request import Sampling


class Penalties:
    """The penalties and bias of one call, kept per choice as its tokens arrive."""

    def __init__(self, sampling: Sampling, prompt: Any, rows: int, torch: Any) -> None:
        self.sampling, self.torch = sampling, torch
        self.seen: Any = None  # (rows, vocab) tokens seen, for the repetition penalty
        self.counts: Any = None  # (rows, vocab) reply tokens, for presence and frequency
        self.prompt = prompt[0].tolist() if sampling.repetition_penalty != 1.0 else []
        self.rows = rows

    def _tables(self, vocab: int, device: Any) -> None:
        torch = self.torch
        if self.counts is None:
            self.counts = torch.zeros((self.rows, vocab), dtype=torch.float32, device=device)
            self.seen = torch.zeros((self.rows, vocab), dtype=torch.bool, device=device)
            if self.prompt:
                self.seen[:, self.prompt] = True

    def apply(self, scores: Any) -> Any:
        s = self.sampling
        self._tables(scores.shape[-1], scores.device)
        if s.repetition_penalty != 1.0:
            penalised = self.torch.where(
                scores > 0, scores / s.repetition_penalty, scores * s.repetition_penalty
            )
            scores = self.torch.where(self.seen, penalised, scores)
        if s.frequency_penalty or s.presence_penalty:
            scores = scores - s.frequency_penalty * self.counts
            scores = scores - s.presence_penalty * (self.counts > 0).float()
        for token, bias in s.logit_bias.items():
            if 0 <= token < scores.shape[-1]:
                scores[:, token] += bias
        return scores

    def saw(self, tokens: list[int], live: list[int]) -> None:
        for row in live:
            self.counts[row, tokens[row]] += 1
            self.seen[row, tokens[row]] = True


def choose(scores: Any, sampling: Sampling, rng: Any) -> list[int]:
    """One token per row of ``scores`` (rows, vocab)."""
    import torch

    if sampling.temperature <= 0:
        return [int(t) for t in torch.argmax(scores, dim=-1).tolist()]
    scores = scores / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(scores, min(sampling.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True, dim=-1)
        drop = torch.cumsum(sorted_p, dim=-1) - sorted_p >= sampling.top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    if sampling.min_p > 0:
        floor = probs.max(dim=-1, keepdim=True).values * sampling.min_p
        probs = probs.masked_fill(probs < floor, 0.0)
    return [int(t) for t in torch.multinomial(probs.cpu(), 1, generator=rng)[:, 0].tolist()]


def entry(tokenizer: Any, logprobs: Any, token: int, top: int) -> dict[str, Any]:
    """OpenAI's logprobs entry for ``token`` drawn from the row ``logprobs`` (the model's
    own distribution, before penalties and grammar), with its ``top`` alternatives."""
    import torch

    def one(tok: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([tok])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    made = one(token, float(logprobs[token]))
    alternatives: list[dict[str, Any]] = []
    if top:
        best = torch.topk(logprobs, top)
        alternatives = [
            one(int(t), float(v)) for v, t in zip(best.values, best.indices, strict=True)
        ]
    return made | {"top_logprobs": alternatives}
