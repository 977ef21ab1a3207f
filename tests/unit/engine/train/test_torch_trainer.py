from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from engine.train.batch import TrainBatch, build_train_batch, token_logprobs
from engine.train.trainer import TorchTrainer, TrainerConfig
from engine.types import Group

PROMPT = [1, 2, 3]


@torch.no_grad()
def _next_logprob(model: PreTrainedModel, context: list[int], token: int, temperature: float = 1.0) -> float:
    """log p(token | context) from the last position, computed independently of the batch alignment."""
    logits = model(input_ids=torch.tensor([context])).logits[0, -1] / temperature
    return torch.log_softmax(logits, dim=-1)[token].item()


def _on_policy_group(
    model: PreTrainedModel,
    make_group: Callable[..., Group],
    actions: list[tuple[float, list[int], list[int]]],
    temperature: float = 1.0,
) -> Group:
    """A group whose behaviour log-probs are the model's own: `(reward, obs_ids, action_ids)` each."""
    members = []
    for reward, obs, act in actions:
        lps = [_next_logprob(model, obs + act[:k], act[k], temperature) for k in range(len(act))]
        members.append((reward, [(obs, act, lps, 0)]))
    return make_group(members)


@pytest.fixture
def model(tiny_model: Callable[..., PreTrainedModel]) -> PreTrainedModel:
    return tiny_model(seed=0)


def test_positive_advantage_tokens_gain_probability_until_the_clip(
    model: PreTrainedModel, make_group: Callable[..., Group]
) -> None:
    group = _on_policy_group(model, make_group, [(1.0, PROMPT, [5, 6]), (0.0, PROMPT, [7, 8])])
    batch = build_train_batch([group])
    p5, p7 = math.exp(_next_logprob(model, PROMPT, 5)), math.exp(_next_logprob(model, PROMPT, 7))
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-2, clip_to="behaviour"))

    first = trainer.train_step(batch)
    # on-policy: every ratio is 1, so the loss is -mean(A) over tokens = 0 (two tokens at +a, two at -a),
    # up to float32 noise in the recomputed log-probs (~1e-7 relative, seen at 1.8e-7 on another machine);
    # 1e-5 is still 4 orders of magnitude below the clipped floor asserted below
    assert first["loss"] == pytest.approx(0.0, abs=1e-5)
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first["clip_frac"] == 0.0
    assert first["tokens"] == 10 and first["action_tokens"] == 4
    assert 0 < first["entropy"] <= math.log(64)
    assert first["grad_norm"] > 0
    losses = [trainer.train_step(batch)["loss"] for _ in range(9)]

    # a = 0.5 / std([1, 0]) = 1/sqrt(2). Once every token is clipped the loss sits at its floor
    # mean(-1.28a, -1.28a, 0.8a, 0.8a) = -0.24a and stops moving.
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert losses[-1] == pytest.approx(-0.24 * a, rel=1e-5)
    assert min(losses) >= -0.24 * a - 1e-6
    assert math.exp(_next_logprob(model, PROMPT, 5)) > 1.28 * p5
    assert math.exp(_next_logprob(model, PROMPT, 7)) < 0.8 * p7


def test_version_counts_optimiser_steps(model: PreTrainedModel, make_group: Callable[..., Group]) -> None:
    batch = build_train_batch([_on_policy_group(model, make_group, [(1.0, PROMPT, [5]), (0.0, PROMPT, [7])])])
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-3, micro_batch_size=1))
    assert trainer.version == 0
    versions = [trainer.train_step(batch)["version"] for _ in range(3)]
    assert versions == [1.0, 2.0, 3.0]
    assert trainer.version == 3


def _mixed_batch(model: PreTrainedModel, make_group: Callable[..., Group]) -> TrainBatch:
    """Five trajectories of different lengths, off-policy (behaviour log-probs shifted) so some clip."""
    actions = [
        (1.0, PROMPT, [5, 6, 9]),
        (0.0, [*PROMPT, 4], [7]),
        (0.5, PROMPT, [8, 8]),
        (0.2, [1], [11, 12, 13, 14]),
        (0.9, PROMPT, [15]),
    ]
    batch = build_train_batch([_on_policy_group(model, make_group, actions)])
    shift = torch.tensor([-0.4, 0.3, 0.1, -0.05, 0.5])[:, None] * batch.loss_mask
    batch.behavior_logprobs += shift
    return batch


@pytest.mark.parametrize("clip_to", ["behaviour", "proximal"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(
    model: PreTrainedModel, make_group: Callable[..., Group], agg: str, clip_to: str
) -> None:
    batch = _mixed_batch(model, make_group)
    results = []
    for micro in (5, 2, 1):
        cfg = TrainerConfig(
            lr=1e-2, micro_batch_size=micro, agg=agg, max_grad_norm=0.5, clip_to=clip_to, is_cap=1.2
        )
        trainer = TorchTrainer(copy.deepcopy(model), cfg)
        stats = trainer.train_step(batch)
        grads = [p.grad.clone() for p in trainer.model.parameters()]
        results.append((stats, grads, list(trainer.model.parameters())))
    (full_stats, full_grads, full_params), *others = results
    # the shifted behaviour log-probs are stale: clipped around them, importance-weighted around the proximal
    corrected = ("clip_frac",) if clip_to == "behaviour" else ("is_weight_mean", "is_truncated_frac")
    assert all(full_stats[key] > 0 for key in corrected)
    for stats, grads, params in others:
        for key in ("loss", "ratio_mean", "entropy", "grad_norm", "tokens", "action_tokens", *corrected):
            assert stats[key] == pytest.approx(full_stats[key], rel=1e-5, abs=1e-7), key
        for g, g_full in zip(grads, full_grads, strict=True):
            assert torch.allclose(g, g_full, rtol=1e-4, atol=1e-7)
        # Adam's first step moves each weight by about lr * sign(gradient): an entry whose gradient is at
        # float noise (~1e-8) can move either way, so only entries with a gradient above it are compared.
        for p, p_full, g_full in zip(params, full_params, full_grads, strict=True):
            real = g_full.abs() > 1e-6
            assert torch.allclose(p[real], p_full[real], rtol=0, atol=1e-5)


def test_in_one_update_a_batch_only_the_default_behaviour_band_clips_its_stale_tokens(
    model: PreTrainedModel, make_group: Callable[..., Group]
) -> None:
    batch = _mixed_batch(model, make_group)  # behaviour log-probs 0.05-0.5 nats off the model's
    assert TrainerConfig().clip_to == "behaviour"
    plain = TorchTrainer(copy.deepcopy(model), TrainerConfig(lr=1e-2)).train_step(batch)
    decoupled = TorchTrainer(copy.deepcopy(model), TrainerConfig(lr=1e-2, clip_to="proximal")).train_step(
        batch
    )
    # the decoupled band is centred on the weights the one update starts from: every ratio is 1, nothing
    # clips however far the tokens moved since they were generated; the behaviour band stops those past it
    assert decoupled["clip_frac"] == 0.0 and decoupled["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert plain["clip_frac"] > 0.0 and plain["ratio_mean"] != pytest.approx(1.0, abs=1e-2)


def test_kl_to_reference_is_zero_at_start_and_grows(
    model: PreTrainedModel, make_group: Callable[..., Group]
) -> None:
    batch = build_train_batch([_on_policy_group(model, make_group, [(1.0, PROMPT, [5]), (0.0, PROMPT, [7])])])
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-2, kl_beta=0.5), ref_model=copy.deepcopy(model))
    kls = [trainer.train_step(batch)["kl"] for _ in range(3)]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)
    assert 0 < kls[1] < kls[2]
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())


def test_state_dict_is_a_cpu_snapshot_with_hf_names(
    model: PreTrainedModel, make_group: Callable[..., Group]
) -> None:
    batch = build_train_batch([_on_policy_group(model, make_group, [(1.0, PROMPT, [5]), (0.0, PROMPT, [7])])])
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-2))
    snapshot = trainer.state_dict()
    assert list(snapshot) == list(model.state_dict())
    assert "lm_head.weight" in snapshot and "model.embed_tokens.weight" in snapshot
    assert all(t.device.type == "cpu" for t in snapshot.values())
    before = snapshot["model.embed_tokens.weight"].clone()
    trainer.train_step(batch)
    assert torch.equal(snapshot["model.embed_tokens.weight"], before)
    assert not torch.equal(trainer.state_dict()["model.embed_tokens.weight"], before)


def test_greedy_generate_returns_the_argmax_continuation(model: PreTrainedModel) -> None:
    trainer = TorchTrainer(model)
    expected, context = [], list(PROMPT)
    with torch.no_grad():
        for _ in range(4):
            token = int(model(input_ids=torch.tensor([context])).logits[0, -1].argmax())
            expected.append(token)
            context.append(token)
    assert trainer.greedy_generate(PROMPT, max_tokens=4) == expected


def test_loads_a_local_model_directory(model: PreTrainedModel, tmp_path: Path) -> None:
    model.save_pretrained(tmp_path / "m")
    trainer = TorchTrainer(tmp_path / "m")
    for (name, a), b in zip(model.state_dict().items(), trainer.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="does not exist"):
        TorchTrainer(tmp_path / "missing")


def test_rejects_bad_configs_and_empty_batches(
    model: PreTrainedModel, make_group: Callable[..., Group]
) -> None:
    with pytest.raises(ValueError, match="ref_model is required"):
        TorchTrainer(model, TrainerConfig(kl_beta=0.1))
    with pytest.raises(ValueError, match="only used when kl_beta > 0"):
        TorchTrainer(model, ref_model=model)
    for field, value in [
        ("lr", 0.0),
        ("micro_batch_size", 0),
        ("max_grad_norm", -1.0),
        ("betas", (0.9, 1.0)),
    ]:
        with pytest.raises(ValueError, match=field):
            TrainerConfig(**{field: value})
    batch = build_train_batch([make_group([(1.0, [([], [5], [-1.0], 0)]), (0.0, [([], [7], [-1.0], 0)])])])
    with pytest.raises(ValueError, match="no action tokens"):
        TorchTrainer(model).train_step(batch)


def test_trainer_scores_tokens_at_the_rollout_temperature(
    model: PreTrainedModel, make_group: Callable[..., Group]
) -> None:
    # behaviour log-probs sampled at T=2 are on-policy for a trainer at T=2 (ratio 1), not for one at T=1
    group = _on_policy_group(
        model, make_group, [(1.0, PROMPT, [5, 6]), (0.0, PROMPT, [7, 8])], temperature=2.0
    )
    batch = build_train_batch([group])

    def stats(temperature: float) -> dict[str, float]:
        cfg = TrainerConfig(lr=1e-9, temperature=temperature, clip_to="proximal")  # it logs the IS weights
        return TorchTrainer(copy.deepcopy(model), cfg).train_step(batch)

    hot, cold = stats(2.0), stats(1.0)
    assert hot["is_weight_mean"] == pytest.approx(1.0, abs=1e-5)  # behaviour = proximal: weight 1
    assert abs(cold["is_weight_mean"] - 1.0) > 1e-3
    with pytest.raises(ValueError, match="temperature must be > 0"):
        TrainerConfig(temperature=0.0)


def test_learning_rate_warms_up_linearly_then_holds(
    model: PreTrainedModel, make_group: Callable[..., Group]
) -> None:
    batch = build_train_batch([_on_policy_group(model, make_group, [(1.0, PROMPT, [5]), (0.0, PROMPT, [7])])])
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-3, warmup_steps=4))
    lrs = [trainer.train_step(batch)["lr"] for _ in range(6)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert TrainerConfig(lr=1e-3).lr_at(0) == 1e-3  # no warm-up by default
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        TrainerConfig(warmup_steps=-1)


@torch.no_grad()
def test_scoring_action_tokens_only_equals_scoring_every_position(
    model: PreTrainedModel, make_group: Callable[..., Group]
) -> None:
    group = _on_policy_group(model, make_group, [(1.0, PROMPT, [5, 6, 9]), (0.0, [4, 4], [7])], 0.7)
    batch = build_train_batch([group])
    trainer = TorchTrainer(model, TrainerConfig(temperature=0.7))
    ids, attn, mask = batch.input_ids, batch.attention_mask, batch.loss_mask
    logprobs, entropy = trainer._scored(model, ids, attn, mask)
    full, full_entropy = token_logprobs(model(input_ids=ids, attention_mask=attn).logits / 0.7, ids)
    on = mask > 0
    assert int(on.sum()) == 4
    assert torch.allclose(logprobs[on], full[on], atol=1e-5)
    assert torch.allclose(entropy[on], full_entropy[on], atol=1e-5)
    assert not logprobs[~on].any() and not entropy[~on].any()
    assert torch.allclose(logprobs[on], batch.behavior_logprobs[on], atol=1e-5)  # the engine's own numbers


def test_bfloat16_autocasts_the_forward_and_keeps_float32_weights_and_optimiser_state(
    tiny_model: Callable[..., PreTrainedModel], make_group: Callable[..., Group]
) -> None:
    """`dtype: bfloat16` (what `auto` picks on a GPU), here on the CPU: the decoder's matmuls run in
    bfloat16, the master weights, gradients and Adam moments stay float32, and the step's loss and update
    match float32 training to bfloat16's precision."""
    reference = tiny_model(seed=0)
    batch = build_train_batch(
        [_on_policy_group(reference, make_group, [(1.0, PROMPT, [5, 6]), (0.0, PROMPT, [7])])]
    )
    seen: dict[str, set[torch.dtype]] = {"float32": set(), "bfloat16": set()}
    results = {}
    for dtype in ("float32", "bfloat16"):
        trainer = TorchTrainer(tiny_model(seed=0), TrainerConfig(lr=1e-2, dtype=dtype, clip_to="behaviour"))
        proj = trainer.model.model.layers[0].mlp.down_proj
        hook = proj.register_forward_hook(lambda _m, _i, out, d=dtype: seen[d].add(out.dtype))
        results[dtype] = (trainer.train_step(batch), trainer)
        hook.remove()
    assert seen == {"float32": {torch.float32}, "bfloat16": {torch.bfloat16}}
    fp32, bf16 = (results[d][0] for d in ("float32", "bfloat16"))
    trainer = results["bfloat16"][1]
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    assert bf16["loss"] == pytest.approx(fp32["loss"], abs=2e-2)
    assert bf16["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=5e-2)
    delta = {
        d: torch.cat(
            [
                (p - q).flatten()
                for p, q in zip(results[d][1].model.parameters(), reference.parameters(), strict=True)
            ]
        )
        for d in ("float32", "bfloat16")
    }
    cos = torch.nn.functional.cosine_similarity(delta["float32"], delta["bfloat16"], dim=0)
    assert cos > 0.95  # the same update direction


def test_auto_on_a_cpu_trains_in_float32(model: PreTrainedModel) -> None:
    assert TorchTrainer(model, TrainerConfig()).dtype == "float32"
