"""Tiny models and hand-made trajectories for the training tests (no hub, no tokenizer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from engine.types import Group, Trajectory, TrajStatus, Turn

VOCAB = 64


@pytest.fixture
def tiny_model() -> Callable[..., PreTrainedModel]:
    """Factory: a 2-layer, hidden-32 Qwen2 causal LM with weights drawn from `seed`."""

    def build(seed: int = 0) -> PreTrainedModel:
        config = Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            tie_word_embeddings=True,
        )
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)

    return build


@pytest.fixture
def make_group() -> Callable[..., Group]:
    """Factory: a DONE group from `(reward, turns)` pairs.

    A turn is `(obs_ids, action_ids, action_logprobs, version)`.
    """

    def build(
        members: Sequence[tuple[float | None, Sequence[tuple[list[int], list[int], list[float], int]]]],
        group_id: str = "g0",
        task: str = "toy",
    ) -> Group:
        trajs = []
        for i, (reward, turns) in enumerate(members):
            traj = Trajectory(traj_id=f"{group_id}-{i}", group_id=group_id, task=task, seed=0, reward=reward)
            traj.turns = [
                Turn(observation="", obs_ids=o, action_text="", action_ids=a, action_logprobs=lp, version=v)
                for o, a, lp, v in turns
            ]
            traj.start_version = traj.turns[0].version if traj.turns else -1
            traj.status = TrajStatus.DONE
            trajs.append(traj)
        return Group(group_id=group_id, task=task, seed=0, size=len(trajs), members=trajs)

    return build
