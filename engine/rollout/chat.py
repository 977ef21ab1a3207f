"""Chat framing as token deltas, so a multi-turn context grows by appending (prefix-cache friendly).

The markup is the Qwen-style template the local tokenizer ships with:
`<|im_start|>{role}\\n{content}<|im_end|>\\n`, the assistant turn opened by `<|im_start|>assistant\\n`.
Each observation delta closes the previous assistant turn when generation did not (hit max tokens).
"""

from __future__ import annotations

from typing import Any

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class ChatFormat:
    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        ids = tokenizer.convert_tokens_to_ids([IM_START, IM_END])
        if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids:
            raise ValueError(f"tokenizer lacks the chat special tokens {IM_START} / {IM_END}")
        self.im_start_id, self.im_end_id = ids
        self.newline_ids = self._enc("\n")

    def _enc(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def first(self, instructions: str, observation: str) -> list[int]:
        system = f"{IM_START}system\n{instructions}{IM_END}\n" if instructions else ""
        return self._enc(f"{system}{IM_START}user\n{observation}{IM_END}\n{IM_START}assistant\n")

    def next(self, observation: str, last_action_ids: list[int]) -> list[int]:
        """Context tokens after an action: close the assistant turn, then the new user turn."""
        close = [] if last_action_ids[-1:] == [self.im_end_id] else [self.im_end_id]
        return close + self._enc(f"\n{IM_START}user\n{observation}{IM_END}\n{IM_START}assistant\n")

    def decode(self, action_ids: list[int]) -> str:
        return self.tok.decode(action_ids, skip_special_tokens=True)
