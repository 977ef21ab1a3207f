"""Turn scored GRPO groups into padded training tensors, and read per-token log-probs back out of logits.

Alignment contract (the builder and the trainer must agree, so both halves live here): every tensor is
indexed by *token position*. `loss_mask[b, t]`, `behavior_logprobs[b, t]` describe token
`input_ids[b, t]`, and `token_logprobs(logits, input_ids)[b, t]` is that token's log-prob, which a causal
LM reads from the logits at position `t − 1`. Position 0 has no context, so it never carries loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.train.grpo import AdvScale, group_advantages
from engine.types import Group, Trajectory, TrajStatus

_TRAINABLE = (TrajStatus.DONE, TrajStatus.TRUNCATED)


@dataclass
class TrainBatch:
    """One training batch, right-padded, on the CPU. Row `b` is one trajectory."""

    input_ids: Tensor  # (B, T) long: per turn, obs_ids then action_ids
    attention_mask: Tensor  # (B, T) long: 1 on real tokens, 0 on padding
    loss_mask: Tensor  # (B, T) float: 1 on action tokens only
    behavior_logprobs: Tensor  # (B, T) float: rollout-time log-prob on action tokens, 0 elsewhere
    advantages: Tensor  # (B,) float: group-relative advantage of each trajectory
    rewards: Tensor  # (B,) float: the reward the advantages came from
    traj_ids: list[str]
    task: list[str]
    start_version: list[int]
    versions: list[list[int]]  # policy version of each turn
    truncated: list[bool]  # True where `max_len` cut the sequence

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, start: int, stop: int) -> TrainBatch:
        """Rows `[start, stop)` as a batch of their own (for micro-batching)."""
        return TrainBatch(
            input_ids=self.input_ids[start:stop],
            attention_mask=self.attention_mask[start:stop],
            loss_mask=self.loss_mask[start:stop],
            behavior_logprobs=self.behavior_logprobs[start:stop],
            advantages=self.advantages[start:stop],
            rewards=self.rewards[start:stop],
            traj_ids=self.traj_ids[start:stop],
            task=self.task[start:stop],
            start_version=self.start_version[start:stop],
            versions=self.versions[start:stop],
            truncated=self.truncated[start:stop],
        )


def build_train_batch(
    groups: Sequence[Group],
    max_len: int | None = None,
    pad_token_id: int = 0,
    adv_scale: AdvScale = "group",
    adv_eps: float = 1e-6,
) -> TrainBatch:
    """Concatenate each trajectory's turns into one sequence and compute GRPO advantages per group.

    Groups may differ in size (tasks may set their own G); each is normalised over its own members, and
    every member must have a reward. Sequences are right-padded to the longest, or cut to `max_len` from
    the right (flagged in `truncated`; cut action tokens simply carry no loss).
    """
    if not groups:
        raise ValueError("groups is empty: nothing to build a batch from")
    if max_len is not None and max_len < 2:
        raise ValueError(f"max_len must be >= 2 (a context token and a target), got {max_len}")
    sizes = [len(g.members) for g in groups]
    if 0 in sizes:
        raise ValueError(f"empty group(s): {[g.group_id for g in groups if not g.members]}")
    members = [m for g in groups for m in g.members]
    for m in members:
        _check_member(m)
    rewards = torch.tensor([float(m.reward) for m in members], dtype=torch.float32)  # type: ignore[arg-type]
    advantages = _advantages(rewards, sizes, adv_eps, adv_scale)

    rows = [_flatten(m) for m in members]
    longest = max(len(ids) for ids, _, _ in rows)
    width = longest if max_len is None else min(longest, max_len)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    behavior = torch.zeros(shape, dtype=torch.float32)
    truncated = []
    for b, (ids, is_action, lps) in enumerate(rows):
        n = min(len(ids), width)
        truncated.append(len(ids) > width)
        input_ids[b, :n] = torch.tensor(ids[:n], dtype=torch.long)
        attention_mask[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(is_action[:n], dtype=torch.float32)
        behavior[b, :n] = torch.tensor(lps[:n], dtype=torch.float32)
    loss_mask[:, 0] = 0.0  # no logits predict the first token
    behavior[:, 0] = 0.0
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behavior_logprobs=behavior,
        advantages=advantages,
        rewards=rewards,
        traj_ids=[m.traj_id for m in members],
        task=[m.task for m in members],
        start_version=[m.start_version for m in members],
        versions=[m.versions for m in members],
        truncated=truncated,
    )


def _advantages(rewards: Tensor, sizes: list[int], eps: float, scale: AdvScale) -> Tensor:
    """GRPO advantages of `rewards` ordered group by group, the groups of `sizes` members."""
    if len(set(sizes)) == 1:
        return group_advantages(rewards, group_size=sizes[0], eps=eps, scale=scale)
    per_group = "none" if scale == "batch" else scale  # batch scale: centre per group, one batch std
    centred = torch.cat(
        [group_advantages(r, group_size=len(r), eps=eps, scale=per_group) for r in rewards.split(sizes)]
    )
    return centred / (rewards.std() + eps) if scale == "batch" else centred


def token_logprobs(logits: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per-position log-prob of `input_ids` and entropy of the distribution that predicted it.

    `logits` is `(B, T, V)` from a causal LM over `input_ids` `(B, T)`; both outputs are `(B, T)` with
    column 0 set to 0 (see the module's alignment contract). Computed in float32; the entropy carries
    no gradient (it is a statistic, not part of the loss).
    """
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    zero = picked.new_zeros(picked.shape[0], 1)
    return torch.cat([zero, picked], dim=1), torch.cat([zero, entropy], dim=1)


def _check_member(m: Trajectory) -> None:
    if m.status not in _TRAINABLE:
        raise ValueError(
            f"trajectory {m.traj_id} has status {m.status.value}; only done/truncated ones train"
        )
    if m.reward is None:
        raise ValueError(f"trajectory {m.traj_id} has no reward; score it before building a batch")
    for i, turn in enumerate(m.turns):
        if len(turn.action_logprobs) != len(turn.action_ids):
            raise ValueError(
                f"trajectory {m.traj_id} turn {i}: {len(turn.action_ids)} action ids but "
                f"{len(turn.action_logprobs)} action logprobs"
            )
    if not any(t.obs_ids or t.action_ids for t in m.turns):
        raise ValueError(f"trajectory {m.traj_id} has no tokens")


def _flatten(m: Trajectory) -> tuple[list[int], list[float], list[float]]:
    ids: list[int] = []
    is_action: list[float] = []
    lps: list[float] = []
    for turn in m.turns:
        ids += turn.obs_ids + turn.action_ids
        is_action += [0.0] * len(turn.obs_ids) + [1.0] * len(turn.action_ids)
        lps += [0.0] * len(turn.obs_ids) + list(turn.action_logprobs)
    return ids, is_action, lps
