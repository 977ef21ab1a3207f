from __future__ import annotations

import math

import pytest
import torch

from engine.train.grpo import group_advantages, policy_loss

# Per-token importance ratios used throughout: above the band, below it, inside it twice.
RATIOS = [1.5, 0.5, 1.1, 0.9]


def _logprobs(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    behavior = torch.full((len(ratios), len(ratios[0])), -1.0, dtype=torch.float64)
    logprobs = behavior + torch.tensor(ratios, dtype=torch.float64).log()
    return logprobs.requires_grad_(), behavior


# ---- group_advantages ------------------------------------------------------------------------------


def test_group_std_is_unbiased_and_flat_group_is_exactly_zero() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0]), group_size=4, eps=0.0)
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.866025
    h = 0.5 / math.sqrt(1 / 3)
    assert torch.allclose(adv[:4], torch.tensor([h, -h, -h, h]))
    assert torch.equal(adv[4:], torch.zeros(4))


def test_group_eps_is_added_to_the_std() -> None:
    adv = group_advantages(torch.tensor([0.0, 2.0]), group_size=2)
    expected = 1.0 / (math.sqrt(2.0) + 1e-6)
    assert adv.tolist() == pytest.approx([-expected, expected], rel=1e-7)


def test_flat_group_of_non_representable_floats_is_zero() -> None:
    adv = group_advantages(torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7]), group_size=3)
    assert torch.equal(adv, torch.zeros(6))


def test_batch_scale_divides_by_the_batch_std() -> None:
    # centred per group: [-0.5, 0.5, 0, 0]; unbiased std of [0, 1, 3, 3] is sqrt(6.75 / 3) = 1.5
    adv = group_advantages(torch.tensor([0.0, 1.0, 3.0, 3.0]), group_size=2, eps=0.0, scale="batch")
    assert adv.tolist() == pytest.approx([-1 / 3, 1 / 3, 0.0, 0.0])


def test_no_scale_only_centres() -> None:
    adv = group_advantages(torch.tensor([0.0, 1.0, 5.0, 3.0]), group_size=2, scale="none")
    assert adv.tolist() == [-0.5, 0.5, 1.0, -1.0]


def test_group_of_one_gets_zero_and_int_rewards_are_accepted() -> None:
    assert torch.equal(group_advantages(torch.tensor([3, 7]), group_size=1), torch.zeros(2))
    assert group_advantages(torch.tensor([0, 1, 2]), group_size=3, eps=0.0).tolist() == [-1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rewards": torch.zeros(2, 2), "group_size": 2}, "rewards"),
        ({"rewards": torch.zeros(5), "group_size": 2}, "group_size"),
        ({"rewards": torch.zeros(4), "group_size": 0}, "group_size"),
        ({"rewards": torch.zeros(4), "group_size": 2, "scale": "global"}, "scale"),
        ({"rewards": torch.zeros(4), "group_size": 2, "eps": -1.0}, "eps"),
    ],
)
def test_group_advantages_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        group_advantages(**kwargs)


# ---- policy_loss -----------------------------------------------------------------------------------


def test_clipping_positive_advantage_clips_only_above_the_band() -> None:
    logprobs, behavior = _logprobs([RATIOS])
    loss, stats = policy_loss(logprobs, behavior, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 4))
    # per token: -min(1.5, 1.28) = -1.28 (clipped), -0.5, -1.1, -0.9
    assert loss.item() == pytest.approx(-(1.28 + 0.5 + 1.1 + 0.9) / 4)
    assert stats["clip_frac"] == pytest.approx(0.25)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["kl"] == 0.0
    loss.backward()
    # the clipped token has no gradient; the others get d(-rho*A)/dlogprob / N = -rho / 4
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -0.5 / 4, -1.1 / 4, -0.9 / 4])


def test_clipping_negative_advantage_clips_only_below_the_band() -> None:
    logprobs, behavior = _logprobs([RATIOS])
    loss, stats = policy_loss(logprobs, behavior, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 4))
    # per token: -min(-1.5, -1.28) = 1.5, -min(-0.5, -0.8) = 0.8 (clipped), 1.1, 0.9
    assert loss.item() == pytest.approx((1.5 + 0.8 + 1.1 + 0.9) / 4)
    assert stats["clip_frac"] == pytest.approx(0.25)
    loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([1.5 / 4, 0.0, 1.1 / 4, 0.9 / 4])


def test_custom_clip_band() -> None:
    logprobs, behavior = _logprobs([RATIOS])
    loss, stats = policy_loss(
        logprobs, behavior, torch.tensor([1.0]), torch.ones(1, 4), clip_low=0.05, clip_high=0.05
    )
    # -min(1.5, 1.05), -0.5, -min(1.1, 1.05), -0.9
    assert loss.item() == pytest.approx(-(1.05 + 0.5 + 1.05 + 0.9) / 4)
    assert stats["clip_frac"] == pytest.approx(0.5)


def test_token_mean_and_seq_mean_with_masks() -> None:
    logprobs, behavior = _logprobs([RATIOS, RATIOS, RATIOS])
    adv = torch.tensor([1.0, -1.0, 5.0])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]])
    # row 0 sums to -3.78 over 4 tokens; row 1 to 1.5 + 0.8 + 1.1 = 3.4 over 3; row 2 has no tokens
    token_loss, stats = policy_loss(logprobs, behavior, adv, mask, agg="token-mean")
    assert token_loss.item() == pytest.approx((-3.78 + 3.4) / 7)
    assert stats["clip_frac"] == pytest.approx(2 / 7)
    assert stats["ratio_mean"] == pytest.approx((4.0 + 3.1) / 7)
    seq_loss, _ = policy_loss(logprobs, behavior, adv, mask, agg="seq-mean")
    assert seq_loss.item() == pytest.approx((-3.78 / 4 + 3.4 / 3) / 2)


def test_per_token_advantages() -> None:
    logprobs, behavior = _logprobs([RATIOS])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, stats = policy_loss(logprobs, behavior, adv, torch.ones(1, 4))
    # -1.28 (clipped above), 0.8 (clipped below), -1.1, 0.9
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 1.1 + 0.9) / 4)
    assert stats["clip_frac"] == pytest.approx(0.5)


def test_on_policy_loss_is_minus_mean_advantage() -> None:
    logprobs = torch.randn(2, 3)
    loss, stats = policy_loss(logprobs, logprobs.clone(), torch.tensor([2.0, -0.5]), torch.ones(2, 3))
    assert loss.item() == pytest.approx(-(2.0 * 3 - 0.5 * 3) / 6)
    assert stats == {"clip_frac": 0.0, "ratio_mean": pytest.approx(1.0), "kl": 0.0}


def test_kl_term_uses_k3_estimator() -> None:
    logprobs = torch.zeros(1, 4)
    ln2 = math.log(2.0)
    ref = torch.tensor([[0.0, ln2, -ln2, 0.0]])
    # k3 = exp(d) - d - 1: 0, 2 - ln2 - 1, 0.5 + ln2 - 1, 0 -> sums to 0.5, mean 0.125
    mask = torch.ones(1, 4)
    loss, stats = policy_loss(logprobs, logprobs, torch.zeros(1), mask, ref_logprobs=ref, kl_beta=0.1)
    assert loss.item() == pytest.approx(0.0125)
    assert stats["kl"] == pytest.approx(0.125)
    loss0, stats0 = policy_loss(logprobs, logprobs, torch.zeros(1), mask, ref_logprobs=ref)
    assert loss0.item() == 0.0
    assert stats0["kl"] == pytest.approx(0.125)


def test_no_masked_tokens_gives_zero_loss_not_nan() -> None:
    logprobs, behavior = _logprobs([RATIOS])
    for agg in ("token-mean", "seq-mean"):
        loss, stats = policy_loss(logprobs, behavior, torch.ones(1), torch.zeros(1, 4), agg=agg)
        assert loss.item() == 0.0
        assert stats["clip_frac"] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"logprobs": torch.zeros(4)}, "logprobs"),
        ({"behavior_logprobs": torch.zeros(2, 5)}, "behavior_logprobs"),
        ({"mask": torch.ones(2, 3)}, "mask"),
        ({"advantages": torch.zeros(3)}, "advantages"),
        ({"clip_low": 1.0}, "clip_low"),
        ({"clip_high": -0.1}, "clip_high"),
        ({"agg": "sum"}, "agg"),
        ({"kl_beta": -1.0}, "kl_beta"),
        ({"kl_beta": 0.1}, "ref_logprobs"),
        ({"ref_logprobs": torch.zeros(2, 3)}, "ref_logprobs"),
    ],
)
def test_policy_loss_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    args = {
        "logprobs": torch.zeros(2, 4),
        "behavior_logprobs": torch.zeros(2, 4),
        "advantages": torch.zeros(2),
        "mask": torch.ones(2, 4),
    }
    with pytest.raises(ValueError, match=match):
        policy_loss(**{**args, **kwargs})


def _stale(adv: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two tokens a sample generated two versions ago: one whose probability has since risen by 60%, one
    unchanged; the current policy (= the proximal one, one optimiser step per batch) scores them."""
    logprobs = torch.log(torch.tensor([[0.8, 0.5]])).requires_grad_()
    behaviour = torch.log(torch.tensor([[0.5, 0.5]]))
    return logprobs, behaviour, torch.tensor([adv])


def test_clipping_to_the_behaviour_policy_stops_learning_on_tokens_that_already_moved() -> None:
    logprobs, behaviour, adv = _stale(1.0)
    loss, stats = policy_loss(logprobs, behaviour, adv, torch.ones(1, 2))
    loss.backward()
    assert logprobs.grad[0, 0] == 0.0 and stats["clip_frac"] == 0.5  # ratio 1.6 > 1.28: clipped, no gradient
    assert logprobs.grad[0, 1] == pytest.approx(-0.5)  # -A * ratio / 2 tokens


def test_clipping_to_the_proximal_policy_learns_from_every_token_weighted_by_its_staleness() -> None:
    logprobs, behaviour, adv = _stale(1.0)
    loss, stats = policy_loss(logprobs, behaviour, adv, torch.ones(1, 2), proximal_logprobs=logprobs.detach())
    loss.backward()
    # the gradient of -A * w * ratio with ratio = 1 at the proximal point: w = 1.6, then 1.0, over 2 tokens
    assert logprobs.grad[0].tolist() == pytest.approx([-0.8, -0.5])
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["is_weight_mean"] == pytest.approx(1.3) and stats["is_truncated_frac"] == 0.0
    capped, capped_stats = policy_loss(
        logprobs, behaviour, adv, torch.ones(1, 2), proximal_logprobs=logprobs.detach(), is_cap=1.2
    )
    assert capped_stats["is_weight_mean"] == pytest.approx(1.1) and capped_stats["is_truncated_frac"] == 0.5
    assert capped.item() == pytest.approx(-(1.2 + 1.0) / 2)


def test_on_policy_the_two_centres_give_the_same_loss_and_gradient() -> None:
    logprobs = torch.log(torch.tensor([[0.3, 0.6, 0.9]])).requires_grad_()
    adv, mask = torch.tensor([-0.7]), torch.tensor([[1.0, 1.0, 0.0]])
    plain, _ = policy_loss(logprobs, logprobs.detach(), adv, mask)
    (g_plain,) = torch.autograd.grad(plain, logprobs)
    decoupled, _ = policy_loss(logprobs, logprobs.detach(), adv, mask, proximal_logprobs=logprobs.detach())
    (g_decoupled,) = torch.autograd.grad(decoupled, logprobs)
    assert float(plain) == pytest.approx(float(decoupled)) and torch.allclose(g_plain, g_decoupled)
