"""GRPO math: group-relative advantages and the clipped, importance-weighted policy loss.

The loss is taken against the *behaviour* log-probs recorded at generation time (whatever policy version
produced each token), so stale or mixed-version trajectories from asynchronous rollout are corrected by
the per-token importance ratio. The clip band is asymmetric (DAPO-style "clip-higher": the upper edge is
wider so low-probability tokens with positive advantage can still grow).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AdvScale = Literal["group", "batch", "none"]
LossAgg = Literal["token-mean", "seq-mean"]

_SCALES = ("group", "batch", "none")
_AGGS = ("token-mean", "seq-mean")


def group_advantages(
    rewards: Tensor, group_size: int, eps: float = 1e-6, scale: AdvScale = "group"
) -> Tensor:
    """Advantage of each sample relative to its group: `(r − group mean) / (std + eps)`.

    `rewards` is 1-D and ordered group by group (`group_size` consecutive entries per group). The std is
    the unbiased (n−1) one, of the group (`scale="group"`) or of the whole batch (`"batch"`); `"none"`
    only centres. A group whose rewards are all equal carries no learning signal and gets exactly 0
    (this also covers `group_size == 1`, whose unbiased std is undefined).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (ordered group by group), got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a multiple of group_size={group_size}")
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {_SCALES}, got {scale!r}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if group_size == 1 or rewards.numel() == 0:
        return torch.zeros_like(rewards)  # every group is trivially flat

    groups = rewards.view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale == "group":
        adv = centred / (groups.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        adv = centred / (rewards.std() + eps)
    else:
        adv = centred
    flat = (groups == groups[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(adv), adv).reshape(-1)


def policy_loss(
    logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: LossAgg = "token-mean",
    ref_logprobs: Tensor | None = None,
    kl_beta: float = 0.0,
    proximal_logprobs: Tensor | None = None,
    is_cap: float = 2.0,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate loss `−min(ρ·A, clip(ρ, 1−clip_low, 1+clip_high)·A)` per token, aggregated.

    Without `proximal_logprobs`: `ρ = exp(logprobs − behavior_logprobs)`, the clip band around the policy
    that generated the tokens. With them (decoupled PPO, as in AReaL): `ρ = exp(logprobs − proximal)`, the
    band around the policy the step starts from, and each token's term is weighted by the behaviour
    correction `w = min(exp(proximal − behavior_logprobs), is_cap)` (truncated importance sampling). For a
    sample generated k versions ago the first form clips every token whose probability already moved by
    more than the band since then, so a stale sample stops pushing where the policy already moved; the
    second corrects staleness by w, but with one optimiser step per batch ρ = 1 where it starts: its band
    never clips, and a stale token the last update already moved is pushed on (on the quickstart task
    rollart stalled so; the first form did not: README, time to a score). On-policy both are one loss.

    Tensors are `(B, T)`; `advantages` is `(B,)` (one per
    sequence) or `(B, T)` (per token); `mask` selects the tokens that count (1/True on action tokens).

    `agg="token-mean"` sums over all masked tokens of the batch and divides by their count (long
    sequences weigh more); `"seq-mean"` averages within each sequence, then over the sequences that have
    at least one masked token (a sequence with none is left out rather than producing NaN). With no
    masked token at all the loss is 0 (still attached to the graph).

    With `kl_beta > 0` the loss adds `kl_beta · KL(π‖π_ref)` per token, estimated with Schulman's k3
    estimator `exp(ref − lp) − (ref − lp) − 1` (unbiased, always ≥ 0), aggregated like the policy term.

    Stats (floats, over masked tokens): `clip_frac` — share of tokens where the clipped term was the
    one chosen (ρ above 1+clip_high with A > 0, or below 1−clip_low with A < 0), `ratio_mean`, `kl`,
    and with a proximal policy `is_weight_mean` and `is_truncated_frac` (tokens whose w hit `is_cap`).
    """
    _check_loss_args(logprobs, behavior_logprobs, advantages, mask, clip_low, clip_high, agg)
    _check_correction_args(logprobs, ref_logprobs, kl_beta, proximal_logprobs, is_cap)
    weights = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    anchor = behavior_logprobs if proximal_logprobs is None else proximal_logprobs.detach()
    ratio = torch.exp(logprobs - anchor)
    unclipped, clipped = _surrogate_terms(ratio, adv, clip_low, clip_high)
    per_token = -torch.minimum(unclipped, clipped)
    raw_w = behaviour_w = None
    if proximal_logprobs is not None:
        raw_w, behaviour_w = _behaviour_weights(proximal_logprobs, behavior_logprobs, is_cap)
        per_token = per_token * behaviour_w
    kl = _k3_kl(logprobs, ref_logprobs) if ref_logprobs is not None else None
    if kl is not None and kl_beta > 0:
        per_token = per_token + kl_beta * kl
    loss = _aggregate(per_token, weights, agg)
    return loss, _loss_stats(weights, ratio, unclipped, clipped, kl, raw_w, behaviour_w, is_cap)


def _surrogate_terms(ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """The surrogate's two per-token terms: `ρ·A` and `clip(ρ, 1−clip_low, 1+clip_high)·A`."""
    return ratio * adv, torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv


def _behaviour_weights(
    proximal_logprobs: Tensor, behavior_logprobs: Tensor, is_cap: float
) -> tuple[Tensor, Tensor]:
    """The truncated importance weights of decoupled PPO: the raw behaviour correction
    `exp(proximal − behavior_logprobs)` (no gradient) and the same capped at `is_cap`."""
    raw_w = torch.exp(proximal_logprobs.detach() - behavior_logprobs)
    return raw_w, raw_w.clamp(max=is_cap)


def _k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token KL(π‖π_ref) by Schulman's k3 estimator `exp(ref − lp) − (ref − lp) − 1` (unbiased, ≥ 0)."""
    log_r = ref_logprobs - logprobs
    return torch.exp(log_r) - log_r - 1.0


def _loss_stats(
    weights: Tensor,
    ratio: Tensor,
    unclipped: Tensor,
    clipped: Tensor,
    kl: Tensor | None,
    raw_w: Tensor | None,
    behaviour_w: Tensor | None,
    is_cap: float,
) -> dict[str, float]:
    """`policy_loss`'s stats, means over the masked tokens (its docstring says what each one is)."""
    with torch.no_grad():
        count = weights.sum().clamp(min=1.0)
        stats = {
            "clip_frac": float(((clipped < unclipped).to(weights.dtype) * weights).sum() / count),
            "ratio_mean": float((ratio * weights).sum() / count),
            "kl": float((kl * weights).sum() / count) if kl is not None else 0.0,
        }
        if raw_w is not None and behaviour_w is not None:
            stats["is_weight_mean"] = float((behaviour_w * weights).sum() / count)
            stats["is_truncated_frac"] = float(((raw_w > is_cap).to(weights.dtype) * weights).sum() / count)
    return stats


def _aggregate(per_token: Tensor, weights: Tensor, agg: LossAgg) -> Tensor:
    if agg == "token-mean":
        return (per_token * weights).sum() / weights.sum().clamp(min=1.0)
    counts = weights.sum(dim=1)
    seq_loss = (per_token * weights).sum(dim=1) / counts.clamp(min=1.0)
    valid = (counts > 0).to(per_token.dtype)
    return (seq_loss * valid).sum() / valid.sum().clamp(min=1.0)


def _check_loss_args(
    logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    agg: str,
) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    if behavior_logprobs.shape != shape:
        raise ValueError(
            f"behavior_logprobs shape {tuple(behavior_logprobs.shape)} != logprobs shape {tuple(shape)}"
        )
    if mask.shape != shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != logprobs shape {tuple(shape)}")
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(
            f"advantages must be (B,)={tuple(shape[:1])} or (B, T)={tuple(shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if agg not in _AGGS:
        raise ValueError(f"agg must be one of {_AGGS}, got {agg!r}")


def _check_correction_args(
    logprobs: Tensor,
    ref_logprobs: Tensor | None,
    kl_beta: float,
    proximal_logprobs: Tensor | None,
    is_cap: float,
) -> None:
    """The KL term's and the behaviour correction's arguments (`_check_loss_args` checks the others)."""
    if kl_beta < 0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}")
    if kl_beta > 0 and ref_logprobs is None:
        raise ValueError("ref_logprobs is required when kl_beta > 0")
    for name, other in (("ref_logprobs", ref_logprobs), ("proximal_logprobs", proximal_logprobs)):
        if other is not None and other.shape != logprobs.shape:
            raise ValueError(f"{name} shape {tuple(other.shape)} != logprobs shape {tuple(logprobs.shape)}")
    if is_cap < 1:
        raise ValueError(f"is_cap must be >= 1, got {is_cap}")
