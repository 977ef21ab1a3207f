"""A byte-level BPE tokenizer trained locally on a small built-in corpus (no model hub needed).

The tiny models this project trains on a CPU need a tokenizer whose vocabulary fits the tasks: English
words, digits and arithmetic, FrozenLake-style grids ("S F F F"), the moves left/down/right/up (either
case, each one token) inside `<answer>…</answer>`, and JSON-ish punctuation. Byte-level BPE means any
text, including unicode the corpus never saw, still encodes and decodes exactly. Training is
deterministic: the corpus comes from a seeded RNG and BPE merges are chosen by count, so the same
arguments give the same vocabulary.

`load_tokenizer` reads any model directory's tokenizer back the light way (see there).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, TokenizersBackend

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|endoftext|>"
SPECIAL_TOKENS = [PAD, IM_START, IM_END]

# Qwen-style chat framing: `<|im_start|>{role}\n{content}<|im_end|>\n` per message; the generation prompt
# opens an assistant turn. Generation stops at `<|im_end|>` (the tokenizer's eos token).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_WORD_TEXT = (
    "the a an of to and in is it you that he was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use each which she do how their if will "
    "up other about out many then them these so some her would make like him into time has look two more "
    "write go see number no way could people my than first water been call who oil its now find long down "
    "day did get come made may part move step goal hole frozen lake grid agent reach avoid fall safe path "
    "start end answer reward think action left right up down valid invalid game win lose try again next "
    "state observation player position row column cell wall box target push solve puzzle count sum total "
    "add subtract multiply divide equals result value question because therefore so first second last"
)
_WORDS = _WORD_TEXT.split()
_ACTIONS = ["Left", "Down", "Right", "Up"]
_ROLES = ["system", "user", "assistant"]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", "?", "!", ",", ":", ";"])


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    op = rng.choice(["+", "-", "*", "/"])
    value = {"+": a + b, "-": a - b, "*": a * b, "/": round(a / max(b, 1), 2)}[op]
    return rng.choice([f"{a} {op} {b} = {value}", f"What is {a}{op}{b}? <answer>{value}</answer>"])


def _grid(rng: random.Random) -> str:
    size = rng.choice([3, 4, 5, 8])
    cells = [[rng.choice("FFFFH") for _ in range(size)] for _ in range(size)]
    cells[0][0], cells[-1][-1] = "S", "G"
    r, c = rng.randrange(size), rng.randrange(size)
    cells[r][c] = "P"
    sep = rng.choice([" ", ""])
    return "\n".join(sep.join(row) for row in cells)


def _action(rng: random.Random) -> str:
    act = rng.choice(_ACTIONS)
    act = rng.choice([act, act.lower()])  # the envs ask for lowercase moves: make those one token too
    return rng.choice(
        [
            f"<answer>{act}</answer>",
            f"I think the best move is {act}. <answer>{act}</answer>",
            f'{{"action": "{act}", "step": {rng.randint(0, 99)}, "done": {rng.choice(["true", "false"])}}}',
            f"[{', '.join(repr(rng.choice(_ACTIONS)) for _ in range(rng.randint(1, 4)))}]",
        ]
    )


def _chat(rng: random.Random) -> str:
    role = rng.choice(_ROLES)
    return f"{IM_START}{role}\n{_sentence(rng)}{IM_END}\n"


def corpus(lines: int = 6000, seed: int = 0) -> Iterator[str]:
    """Yield `lines` pieces of training text drawn from every generator above, reproducibly."""
    rng = random.Random(seed)
    makers = [_sentence, _arithmetic, _grid, _action, _chat]
    for i in range(lines):
        yield makers[i % len(makers)](rng)


def train_tokenizer(vocab_size: int = 1024, seed: int = 0) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the built-in corpus; return a HF tokenizer with the chat template set.

    Digits are split one per token (as Qwen does) so arithmetic stays learnable by a tiny model.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed=seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )


def load_tokenizer(model_dir: str | Path) -> Any:
    """The tokenizer of a model directory, as its `tokenizer.json` defines it.

    `AutoTokenizer` picks a class from the model type through transformers' auto registry, which imports
    torch and every model's config (~8 s on 2 cores): a start-up cost for the processes that only tokenize
    (the driver, the rollout service). It also rebuilds the pre-tokenizer a class prescribes (Qwen2's
    regex) over the one the file holds. A directory with `tokenizer.json` (every model rollart builds or
    imports has one) is read as that file says; one without goes through `AutoTokenizer`.
    """
    path = Path(model_dir)
    if (path / "tokenizer.json").exists():
        return TokenizersBackend.from_pretrained(str(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
