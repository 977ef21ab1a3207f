from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from engine.train.batch import build_train_batch, token_logprobs
from engine.types import Group, TrajStatus

# Trajectory 0: two turns. Sequence 10 11 12 [20 21] 13 [22]  (brackets: action tokens)
TWO_TURNS = [([10, 11, 12], [20, 21], [-0.5, -0.25], 3), ([13], [22], [-1.0], 4)]
# Trajectory 1: one turn. Sequence 10 11 12 [30]
ONE_TURN = [([10, 11, 12], [30], [-2.0], 4)]


@pytest.fixture
def group(make_group: Callable[..., Group]) -> Group:
    return make_group([(1.0, TWO_TURNS), (0.0, ONE_TURN)])


def test_two_turn_trajectory_layout_and_padding(group: Group) -> None:
    batch = build_train_batch([group], pad_token_id=63)
    assert batch.input_ids.tolist() == [[10, 11, 12, 20, 21, 13, 22], [10, 11, 12, 30, 63, 63, 63]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 1], [0, 0, 0, 1, 0, 0, 0]]
    assert batch.behavior_logprobs.tolist() == [[0, 0, 0, -0.5, -0.25, 0, -1.0], [0, 0, 0, -2.0, 0, 0, 0]]
    # rewards 1, 0: centred +-0.5, unbiased std sqrt(0.5)
    h = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert batch.advantages.tolist() == pytest.approx([h, -h])
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert batch.task == ["toy", "toy"]
    assert batch.start_version == [3, 4]
    assert batch.versions == [[3, 4], [4]]
    assert batch.truncated == [False, False]
    assert batch.traj_ids == ["g0-0", "g0-1"]
    assert all(t.device.type == "cpu" for t in (batch.input_ids, batch.loss_mask, batch.advantages))


def test_trainer_side_logprobs_read_the_builder_positions(group: Group) -> None:
    """Logits at t-1 that give token t exactly its behaviour log-prob reproduce the behaviour log-probs."""
    batch = build_train_batch([group])
    vocab = 40
    ids = batch.input_ids
    logits = torch.zeros(*ids.shape, vocab)
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            if batch.loss_mask[b, t]:
                p = math.exp(batch.behavior_logprobs[b, t].item())
                # p = e^x / (e^x + vocab - 1)  =>  x = log(p * (vocab - 1) / (1 - p))
                logits[b, t - 1, ids[b, t]] = math.log(p * (vocab - 1) / (1 - p))
    logprobs, entropy = token_logprobs(logits, ids)
    assert logprobs.shape == ids.shape
    assert torch.allclose(logprobs * batch.loss_mask, batch.behavior_logprobs, atol=1e-5)
    assert logprobs[:, 0].tolist() == [0.0, 0.0]
    # a uniform distribution over 40 tokens predicted every obs token: entropy log(40)
    assert entropy[0, 1].item() == pytest.approx(math.log(vocab), rel=1e-6)


def test_max_len_truncates_from_the_right_and_flags(group: Group) -> None:
    batch = build_train_batch([group], max_len=5)
    assert batch.input_ids.tolist() == [[10, 11, 12, 20, 21], [10, 11, 12, 30, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 0]]
    assert batch.behavior_logprobs[0].tolist() == [0, 0, 0, -0.5, -0.25]
    assert batch.truncated == [True, False]


def test_action_at_position_zero_carries_no_loss(make_group: Callable[..., Group]) -> None:
    g = make_group([(1.0, [([], [5, 6], [-0.1, -0.2], 0)]), (0.0, [([], [7, 8], [-0.3, -0.4], 0)])])
    batch = build_train_batch([g])
    assert batch.loss_mask.tolist() == [[0, 1], [0, 1]]
    assert torch.equal(batch.behavior_logprobs, torch.tensor([[0.0, -0.2], [0.0, -0.4]]))


def test_advantages_are_per_group(make_group: Callable[..., Group]) -> None:
    g1 = make_group([(1.0, ONE_TURN), (0.0, ONE_TURN)], group_id="a")
    g2 = make_group([(2.0, ONE_TURN), (2.0, ONE_TURN)], group_id="b")
    batch = build_train_batch([g1, g2], adv_scale="none")
    assert batch.advantages.tolist() == [0.5, -0.5, 0.0, 0.0]
    assert batch.traj_ids == ["a-0", "a-1", "b-0", "b-1"]


def test_rows_slices_every_field(make_group: Callable[..., Group]) -> None:
    g1 = make_group([(1.0, TWO_TURNS), (0.0, ONE_TURN)], group_id="a")
    batch = build_train_batch([g1])
    tail = batch.rows(1, 2)
    assert len(tail) == 1
    assert tail.input_ids.tolist() == [batch.input_ids[1].tolist()]
    assert tail.advantages.tolist() == [batch.advantages[1].item()]
    assert (tail.traj_ids, tail.task, tail.start_version, tail.versions, tail.truncated) == (
        ["a-1"],
        ["toy"],
        [4],
        [[4]],
        [False],
    )


def test_rejects_unscored_failed_uneven_and_misaligned(make_group: Callable[..., Group]) -> None:
    with pytest.raises(ValueError, match="no reward"):
        build_train_batch([make_group([(None, ONE_TURN), (1.0, ONE_TURN)])])
    failed = make_group([(0.0, ONE_TURN), (1.0, ONE_TURN)])
    failed.members[0].status = TrajStatus.FAILED
    with pytest.raises(ValueError, match="status failed"):
        build_train_batch([failed])
    with pytest.raises(ValueError, match="empty group"):
        build_train_batch([make_group([(0.0, ONE_TURN)], group_id="a"), make_group([], group_id="b")])
    with pytest.raises(ValueError, match="2 action ids but 1 action logprobs"):
        build_train_batch([make_group([(0.0, [([1], [2, 3], [-0.1], 0)])])])
    with pytest.raises(ValueError, match="max_len"):
        build_train_batch([make_group([(0.0, ONE_TURN)])], max_len=1)
    with pytest.raises(ValueError, match="groups is empty"):
        build_train_batch([])


def test_groups_of_different_sizes_are_each_normalised_over_their_own_members(
    make_group: Callable[..., Group],
) -> None:
    small = make_group([(r, ONE_TURN) for r in (1.0, 0.0)], group_id="s")
    large = make_group([(r, ONE_TURN) for r in (1.0, 0.0, 0.0, 0.0)], group_id="l")
    adv = build_train_batch([small, large]).advantages
    h = 0.5 / (math.sqrt(0.5) + 1e-6)  # rewards 1, 0: centred +-0.5, std sqrt(0.5)
    big, small_neg = 0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)  # rewards 1, 0, 0, 0: std 0.5
    assert adv.tolist() == pytest.approx([h, -h, big, small_neg, small_neg, small_neg])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    centred = torch.tensor([0.5, -0.5, 0.75, -0.25, -0.25, -0.25])
    batch_scaled = build_train_batch([small, large], adv_scale="batch").advantages
    assert torch.allclose(batch_scaled, centred / (rewards.std() + 1e-6))
