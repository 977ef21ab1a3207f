"""Format-only pretraining: the base model that RL starts from, taught the answer *format* and nothing else.

A randomly initialised policy almost never writes a well-formed action, so GRPO gets no signal. Real RL
starts from a pretrained base model; this is a tiny, local stand-in. It is a short causal-LM run on
generated chat transcripts, framed exactly as the rollout frames them (`ChatFormat`, the envs' own
instructions and observations), with the loss on the assistant tokens only.

What the corpus contains, and why it teaches no solution:

No held-out problem of any task appears: random maps and questions come from the training side of the
text split at its largest share (`engine.envs.split.MAX_EVAL_FRACTION`).

* FrozenLake episodes (half of the examples), each on the standard 4x4 map or a random 4x4 map, played
  for up to `max_turns` turns by a policy that picks left/down/right/up **uniformly at random,
  independently of the observation**. Every assistant turn is `<answer>{move}</answer>` and the chat
  template's stop token (`<|im_end|>` for the local tokenizer); the observations are whatever the real env
  returns after that random move.
* reasoning-gym questions (the other half) from the integer-answer datasets in `QUESTION_SOURCES`,
  each answered `<answer>{n}</answer>` and the stop token, with `n` drawn **uniformly from 0..`max_answer`,
  independently of the question** (the true answer is never looked at).

Every target token is therefore independent of its context given the format: the loss-minimising model
answers in the right frame, with a uniform distribution over the allowed moves / numbers, and stops.
Which move reaches the goal, or which number is right, has to come from RL. (Random moves do
sometimes end on the goal, but the move distribution does not depend on that.) The flip side, measured:
the base model's move distribution is the same in every FrozenLake state (it has no reason to read the
grid), so RL first learns a state-blind bias (down/right, ~10% success at best on the 4x4 map) and only
slowly a policy that looks at where P is.
"""

from __future__ import annotations

import asyncio
import math
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from engine.envs.frozenlake import MOVES, FrozenLakeEnv
from engine.envs.reasoning_gym import ReasoningGymEnv
from engine.envs.split import MAX_EVAL_FRACTION
from engine.rollout.chat import ChatFormat

# Integer-answer reasoning-gym datasets whose questions frame the number examples (answers are random).
QUESTION_SOURCES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("leg_counting", {"min_animals": 1, "max_animals": 3, "max_instances": 3}),
    ("basic_arithmetic", {}),
    ("chain_sum", {}),
    ("gcd", {}),
    ("count_bits", {}),
)
_QUESTION_POOL = 2000  # entries per source dataset
_DATASET_SEED = 7  # the pretraining questions are other draws than a task's default dataset_seed=0

Example = tuple[list[int], list[float]]  # token ids, loss mask (1 on assistant tokens)


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 100  # ~1.5 min on 2 CPU cores; the format is learnt by ~60 (loss at its floor, ~0.22)
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 20  # linear warm-up steps, then cosine decay to 10% of `lr`
    max_turns: int = 10  # FrozenLake turns per example at most
    max_answer: int = 20  # random number answers are uniform in [0, max_answer]
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.max_turns < 1:
            raise ValueError(f"steps, batch_size and max_turns must be >= 1, got {self}")
        if self.lr <= 0 or self.warmup < 0 or self.max_answer < 0:
            raise ValueError(f"lr must be > 0, warmup and max_answer >= 0, got {self}")


def _answer(text: str, chat: ChatFormat) -> list[int]:
    return [*chat.tok.encode(f"<answer>{text}</answer>", add_special_tokens=False), chat.stop_id]


async def _frozenlake(chat: ChatFormat, rng: random.Random, config: PretrainConfig) -> Example:
    random_map = rng.random() < 0.5
    env = FrozenLakeEnv(random_map=random_map, eval_fraction=MAX_EVAL_FRACTION if random_map else 0.0)
    observation = await env.reset(rng.randrange(2**31))
    ids = chat.first(env.instructions, observation)
    mask = [0.0] * len(ids)
    turns = rng.randint(1, config.max_turns)
    for turn in range(turns):
        action = _answer(rng.choice(MOVES), chat)
        ids, mask = ids + action, mask + [1.0] * len(action)
        step = await env.step(chat.decode(action))
        if step.done or turn == turns - 1:
            break
        shown = chat.next(step.observation, action)
        ids, mask = ids + shown, mask + [0.0] * len(shown)
    return ids, mask


async def _question(chat: ChatFormat, rng: random.Random, envs: list[ReasoningGymEnv], top: int) -> Example:
    env = rng.choice(envs)
    prompt = chat.first(env.instructions, await env.reset(rng.randrange(_QUESTION_POOL)))
    action = _answer(str(rng.randint(0, top)), chat)
    return prompt + action, [0.0] * len(prompt) + [1.0] * len(action)


async def _corpus(chat: ChatFormat, n: int, config: PretrainConfig) -> list[Example]:
    rng = random.Random(config.seed)
    envs = [
        ReasoningGymEnv(
            name, size=_QUESTION_POOL, dataset_seed=_DATASET_SEED, eval_fraction=MAX_EVAL_FRACTION, **cfg
        )
        for name, cfg in QUESTION_SOURCES
    ]
    return [
        await (
            _frozenlake(chat, rng, config) if i % 2 == 0 else _question(chat, rng, envs, config.max_answer)
        )
        for i in range(n)
    ]


def format_corpus(chat: ChatFormat, n: int, config: PretrainConfig) -> list[Example]:
    """`n` examples (alternately a FrozenLake episode and a number question), reproducible from the seed.

    The envs' API is async; the corpus is built on a private event loop in a helper thread, so this works
    whether or not the caller is itself running an event loop (the Prefect driver is).
    """
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _corpus(chat, n, config)).result()


def _target_loss(model: PreTrainedModel, examples: list[Example], pad_id: int) -> tuple[Tensor, float]:
    """Summed cross-entropy of the masked (assistant) tokens of right-padded `examples`, and their count."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    masks = torch.zeros(input_ids.shape)
    for b, (ids, mask) in enumerate(examples):
        input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[b, : len(ids)] = 1
        masks[b, : len(ids)] = torch.tensor(mask)
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]  # predicts tokens 1..
    loss = F.cross_entropy(logits.transpose(1, 2), input_ids[:, 1:], reduction="none")
    return (loss * masks[:, 1:]).sum(), float(masks[:, 1:].sum())


def _steps(corpus: list[Example], config: PretrainConfig) -> list[list[list[Example]]]:
    """Per optimiser step, one micro-batch of each kind (FrozenLake, question), each of similar lengths.

    Both kinds in every step keep the gradient balanced between them; grouping by length within a kind
    avoids padding short examples to the longest episode.
    """
    half = max(1, config.batch_size // 2)
    rng = random.Random(config.seed + 1)
    per_kind = []
    for examples in (corpus[0::2], corpus[1::2]):
        ordered = sorted(examples, key=lambda e: len(e[0]))
        chunks = [ordered[i : i + half] for i in range(0, len(ordered), half)]
        rng.shuffle(chunks)
        per_kind.append(chunks)
    return [list(pair) for pair in zip(*per_kind, strict=True)]


def _lr_factor(step: int, config: PretrainConfig) -> float:
    if step < config.warmup:
        return (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


def pretrain(model: PreTrainedModel, chat: ChatFormat, config: PretrainConfig) -> list[float]:
    """Train `model` in place on a fresh format corpus; return each step's mean loss per target token.

    Deterministic for a given `config` and thread count; the global torch RNG is left as it was.
    """
    half = max(1, config.batch_size // 2)
    steps = _steps(format_corpus(chat, 2 * half * config.steps, config), config)
    pad_id = int(model.config.pad_token_id or 0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config))
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        for micro_batches in steps:
            parts = [_target_loss(model, mb, pad_id) for mb in micro_batches]
            loss = torch.stack([total for total, _ in parts]).sum() / max(1.0, sum(n for _, n in parts))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
    model.eval()
    return losses
