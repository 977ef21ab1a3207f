"""Test doubles for the rollout control plane: a scripted generator and a tokenizer fixture."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import cache

from engine.models.tokenizer import train_tokenizer
from engine.types import GenOutput, GenRequest


@cache
def tokenizer():
    return train_tokenizer(vocab_size=512, seed=0)


class ScriptedGenerator:
    """Answers turn k of every trajectory with `actions(k)` (+ <|im_end|>), after `delay_s`."""

    def __init__(self, actions: Callable[[int], str], version: int = 0, delay_s: float = 0.0):
        self.tok = tokenizer()
        self.actions, self.version, self.delay_s = actions, version, delay_s
        self.requests: list[GenRequest] = []
        self.end_id = self.tok.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, req: GenRequest) -> GenOutput:
        self.requests.append(req)
        await asyncio.sleep(self.delay_s)
        turn = int(req.request_id.rsplit("/", 1)[1])
        ids = [*self.tok.encode(self.actions(turn), add_special_tokens=False), self.end_id]
        ids = ids[: req.sampling.max_tokens]
        return GenOutput(
            req.request_id,
            ids,
            [-0.5] * len(ids),
            self.version,
            "stop" if ids[-1] == self.end_id else "length",
        )
