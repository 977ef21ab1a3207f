"""Chat framing from the tokenizer's own chat template, as token deltas, so a multi-turn context grows by
appending (prefix-cache friendly) and any chat model's markup works, not one hard-coded format.

RL trains on the context the policy actually saw: `first + action + next + action + ...`, each action the
model's own token ids, never re-tokenised text. A chat template renders whole conversations, so the deltas
are derived from it by rendering probe conversations:

* `first`: the template's rendering of [system?, user] with the generation prompt;
* the assistant-turn close: what the template renders after an assistant message's content
  (`<|im_end|>\\n` for ChatML, `<|eot_id|>` for Llama 3); its first special token is the stop token;
* `next`: the rest of the close (all of it when generation was cut off before the stop token), then
  render(base + [user], generation prompt) minus render(base), where base ends with an assistant message.

That only holds if the template is incremental: earlier turns render the same whatever follows, and
deltas tokenised on their own give the ids of the whole rendering. Construction proves it on 3-turn probe
conversations (with and without a system message, actions stopped and cut off) and raises ValueError at
the first differing token otherwise (templates that strip earlier reasoning, render only the last user
turn, or a tokenizer without a template): a silently mis-tokenised context would train the policy on
inputs it never sees at inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from jinja2 import TemplateError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Message = dict[str, str]

# Rendered and tokenised texts kept per ChatFormat (an env's observations often repeat: its instructions,
# a synthetic env's every turn, a task's questions across a group's G members): a bound on what is kept.
CACHED_TEXTS = 4096

# Probe texts: plain words tokenise the same in any context; the <think> tags expose templates that strip
# or reformat reasoning in assistant messages.
_PROBE_SYSTEM = "Probe instructions."
_PROBE_USERS = ("First probe observation.", "Second probe observation?", "Third probe observation!")
_PROBE_ACTIONS = (
    "<think>first probe thought</think>first probe answer",
    "<think>second probe thought</think>second probe answer",
)


def _msg(role: str, content: str) -> Message:
    return {"role": role, "content": content}


def _first_difference(a: Sequence, b: Sequence) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


class ChatFormat:
    """One tokenizer's chat template as token deltas; generation stops at `stop_id`, the end of a turn."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tok = tokenizer
        # first's and next's tokenised renderings by their texts (tuples: a caller gets its own list)
        self._opening = lru_cache(maxsize=CACHED_TEXTS)(self._opening_ids)
        self._user_turn = lru_cache(maxsize=CACHED_TEXTS)(self._user_turn_ids)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer has no chat template: its chat framing is unknown")
        try:
            self._base = [_msg("user", _PROBE_USERS[0]), _msg("assistant", _PROBE_ACTIONS[0])]
            self._base_text = self._render(self._base, generation_prompt=False)
            content_at = self._base_text.rfind(_PROBE_ACTIONS[0])
            if content_at < 0:
                raise ValueError(
                    "chat template cannot be rendered incrementally: it does not render assistant content "
                    f"verbatim ({_PROBE_ACTIONS[0]!r} is missing from {self._base_text!r})"
                )
            close_text = self._base_text[content_at + len(_PROBE_ACTIONS[0]) :]
            self.stop_id, self._close_ids = self._close(close_text)
            self._after_stop = self._close_ids[self._close_ids.index(self.stop_id) + 1 :]
            self._prove()
        except TemplateError as e:
            raise ValueError(f"chat template fails on a probe conversation: {e}") from e

    def _enc(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def _render(self, messages: list[Message], generation_prompt: bool) -> str:
        return str(
            self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        )

    def _close(self, text: str) -> tuple[int, list[int]]:
        """The stop token and the ids of `text`, what the template renders after an assistant's content."""
        ids = self._enc(text)
        special = {i for i, t in self.tok.added_tokens_decoder.items() if t.special}
        stop = next((i for i in ids if i in special), self.tok.eos_token_id)
        if stop not in ids:
            raise ValueError(
                f"chat template cannot be rendered incrementally: it closes an assistant turn with {text!r}, "
                "neither a special token nor eos, so a generation that stops cannot continue as it renders"
            )
        return int(stop), ids

    def first(self, instructions: str, observation: str) -> list[int]:
        """The opening context: the system message (only if `instructions`), the user turn, the prompt."""
        return list(self._opening(instructions, observation))

    def next(self, observation: str, last_action_ids: list[int]) -> list[int]:
        """Context tokens after an action: close the assistant turn, then the new user turn and the prompt."""
        close = self._after_stop if last_action_ids[-1:] == [self.stop_id] else self._close_ids
        return close + list(self._user_turn(observation))

    def _opening_ids(self, instructions: str, observation: str) -> tuple[int, ...]:
        system = [_msg("system", instructions)] if instructions else []
        return tuple(self._enc(self._render([*system, _msg("user", observation)], generation_prompt=True)))

    def _user_turn_ids(self, observation: str) -> tuple[int, ...]:
        """The new user turn and the generation prompt, after a closed assistant turn."""
        text = self._render([*self._base, _msg("user", observation)], generation_prompt=True)
        if not text.startswith(self._base_text):
            at = _first_difference(text, self._base_text)
            raise ValueError(
                "chat template cannot be rendered incrementally: a new user turn changes the earlier ones "
                f"at character {at}: {self._base_text[at : at + 40]!r} becomes {text[at : at + 40]!r}"
            )
        return tuple(self._enc(text[len(self._base_text) :]))

    def decode(self, action_ids: list[int]) -> str:
        return str(self.tok.decode(action_ids, skip_special_tokens=True))

    def _prove(self) -> None:
        """Raise ValueError unless the deltas of 3-turn probes equal the template's whole rendering's ids."""
        for instructions in (_PROBE_SYSTEM, ""):
            for stopped in (True, False):
                actions = [self._enc(a) + ([self.stop_id] if stopped else []) for a in _PROBE_ACTIONS]
                deltas = self.first(instructions, _PROBE_USERS[0])
                messages = [_msg("system", instructions)] if instructions else []
                messages.append(_msg("user", _PROBE_USERS[0]))
                for action, content, user in zip(actions, _PROBE_ACTIONS, _PROBE_USERS[1:], strict=True):
                    deltas += action + self.next(user, action)
                    messages += [_msg("assistant", content), _msg("user", user)]
                whole = list(
                    self.tok.apply_chat_template(
                        messages, tokenize=True, add_generation_prompt=True, return_dict=False
                    )
                )
                if deltas != whole:
                    at = _first_difference(deltas, whole)
                    probe = f"{'with' if instructions else 'without'} a system message, actions " + (
                        "ending with the stop token" if stopped else "cut off"
                    )
                    before = self.tok.decode(whole[max(0, at - 8) : at])
                    raise ValueError(
                        f"chat template cannot be rendered incrementally ({probe}): the deltas diverge from "
                        f"the whole rendering at token {at}, after {before!r}: "
                        f"the template gives tokens {self._pieces(whole[at : at + 6])}, "
                        f"the deltas give {self._pieces(deltas[at : at + 6])}"
                    )

    def _pieces(self, ids: list[int]) -> list[str]:
        """Each token's text: where a boundary tokenises differently, the joined text alone hides it."""
        return [str(self.tok.decode([i])) for i in ids]
