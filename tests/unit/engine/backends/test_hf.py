from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from engine.backends.hf import HFBackend, top_p_filter
from engine.models.tiny import init_model, perturbed_weights
from engine.types import GenRequest, SamplingParams
from tests.waiting import settled


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedModel:
    """The tiny model with noise on its weights: a fresh init repeats one token, this one varies."""
    model = AutoModelForCausalLM.from_pretrained(init_model("tiny", tmp_path_factory.mktemp("tiny")))
    with torch.no_grad():
        for name, tensor in perturbed_weights(model, std=0.1, seed=1).items():
            model.get_parameter(name).copy_(tensor)
    return model.eval()


def prompt(i: int) -> list[int]:
    return [(37 * i + 11 * k) % 1000 + 3 for k in range(3 + 9 * i)]


def greedy(max_tokens: int, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)  # type: ignore[arg-type]


def reference_greedy(model: PreTrainedModel, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


def forward_logprobs(
    model: PreTrainedModel, ids: list[int], out: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of each generated token, from one plain forward over prompt + output."""
    with torch.no_grad():
        logits = model(torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1]
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp[torch.arange(len(out)), torch.tensor(out)]


async def test_concurrent_requests_of_different_lengths_all_complete(model: PreTrainedModel) -> None:
    backend = HFBackend(model, max_batch=8, eos_token_ids=[])
    reqs = [
        GenRequest(f"r{i}", prompt(i), SamplingParams(temperature=1.0, max_tokens=3 + 2 * i))
        for i in range(16)
    ]
    outs = await asyncio.gather(*(backend.generate(r) for r in reqs))
    await backend.close()
    for i, out in enumerate(outs):
        assert out.request_id == f"r{i}"
        assert len(out.token_ids) == len(out.logprobs) == 3 + 2 * i
        assert out.finish_reason == "length" and out.version == 0
        assert all(lp <= 0.0 for lp in out.logprobs)
        assert set(out.timings) == {"queue_s", "gen_s"}
    # max_batch=8: the last request waited for a slot, the first did not
    assert outs[15].timings["queue_s"] > outs[0].timings["queue_s"]


async def test_late_request_joins_while_a_long_one_runs(model: PreTrainedModel) -> None:
    backend = HFBackend(model, eos_token_ids=[])
    long = asyncio.create_task(backend.generate(GenRequest("long", prompt(5), greedy(150))))
    await backend.generate(GenRequest("warm", prompt(1), greedy(1)))  # `long` is now in the batch
    late = await backend.generate(GenRequest("late", prompt(2), greedy(5)))
    assert not long.done()  # the late request joined the running batch and finished first
    assert late.token_ids == reference_greedy(model, prompt(2), 5)
    assert (await long).token_ids == reference_greedy(model, prompt(5), 150)  # joins did not disturb it
    await backend.close()


async def test_greedy_equals_model_generate(model: PreTrainedModel) -> None:
    backend = HFBackend(model)
    outs = await asyncio.gather(
        *(backend.generate(GenRequest(f"g{i}", prompt(i), greedy(24))) for i in range(6))
    )
    await backend.close()
    for i, out in enumerate(outs):
        assert out.token_ids == reference_greedy(model, prompt(i), 24)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
async def test_logprobs_are_the_temperature_scaled_policy(model: PreTrainedModel, temperature: float) -> None:
    backend = HFBackend(model, eos_token_ids=[])
    sampling = SamplingParams(temperature=temperature, max_tokens=20, seed=4)
    outs = await asyncio.gather(
        *(backend.generate(GenRequest(f"l{i}", prompt(i), sampling)) for i in range(4))
    )
    await backend.close()
    for i, out in enumerate(outs):
        # greedy reports the unscaled policy (T treated as 1), sampling the T-scaled one
        expected = forward_logprobs(model, prompt(i), out.token_ids, temperature or 1.0)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=1e-4)


def test_top_p_filter_keeps_the_nucleus() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]).log()
    probs = top_p_filter(logits, torch.tensor([0.75, 1.0])).softmax(dim=-1)
    # row 0: the dropped tail 0.05 + 0.15 = 0.2 <= 1 - 0.75, so 0.5 and 0.3 remain, renormalised
    torch.testing.assert_close(probs[0], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(probs[1], torch.tensor([0.05, 0.15, 0.3, 0.5]))


async def test_top_p_logprobs_are_renormalised_over_the_nucleus(model: PreTrainedModel) -> None:
    backend = HFBackend(model, eos_token_ids=[])
    out = await backend.generate(
        GenRequest("p", prompt(3), SamplingParams(0.8, top_p=0.5, max_tokens=12, seed=1))
    )
    await backend.close()
    with torch.no_grad():
        logits = model(torch.tensor([prompt(3) + out.token_ids])).logits[0, len(prompt(3)) - 1 : -1] / 0.8
    kept = top_p_filter(logits, torch.full((len(out.token_ids),), 0.5)).log_softmax(dim=-1)
    expected = kept[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids)]
    assert torch.isfinite(expected).all()  # every sampled token was inside the nucleus
    torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=1e-4)


async def test_seeded_sampling_is_reproducible(model: PreTrainedModel) -> None:
    backend = HFBackend(model, eos_token_ids=[])

    def req(rid: str, seed: int) -> GenRequest:
        return GenRequest(rid, prompt(2), SamplingParams(temperature=1.0, max_tokens=30, seed=seed))

    alone = await backend.generate(req("a", 7))
    in_batch, *_ = await asyncio.gather(
        backend.generate(req("b", 7)), *(backend.generate(req(f"x{i}", 100 + i)) for i in range(5))
    )
    other_seed = await backend.generate(req("c", 8))
    await backend.close()
    assert in_batch.token_ids == alone.token_ids
    assert in_batch.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    assert other_seed.token_ids != alone.token_ids


async def test_load_weights_tags_version_and_uses_new_weights(model: PreTrainedModel) -> None:
    backend = HFBackend(copy.deepcopy(model))
    before = await backend.generate(GenRequest("v0", prompt(4), greedy(16)))
    new = perturbed_weights(model, std=0.05, seed=2)
    backend.load_weights(new.items(), version=1)
    after = await backend.generate(GenRequest("v1", prompt(4), greedy(16)))
    await backend.close()
    updated = copy.deepcopy(model)
    updated.load_state_dict(new, strict=False)
    assert (before.version, after.version) == (0, 1)
    assert before.token_ids == reference_greedy(model, prompt(4), 16)
    assert after.token_ids == reference_greedy(updated, prompt(4), 16)
    assert after.token_ids != before.token_ids


async def test_load_weights_mid_request_switches_to_new_weights(model: PreTrainedModel) -> None:
    backend = HFBackend(copy.deepcopy(model), eos_token_ids=[])
    running = asyncio.create_task(backend.generate(GenRequest("long", prompt(3), greedy(60))))
    await backend.generate(GenRequest("warm", prompt(1), greedy(2)))  # `long` has produced tokens
    new = perturbed_weights(model, std=0.05, seed=2)
    backend.load_weights(new.items(), version=1)
    out = await running
    await backend.close()
    updated = copy.deepcopy(model)
    updated.load_state_dict(new, strict=False)
    old_lp = forward_logprobs(model, prompt(3), out.token_ids, 1.0)
    new_lp = forward_logprobs(updated, prompt(3), out.token_ids, 1.0)
    got = torch.tensor(out.logprobs)
    switch = int((~torch.isclose(got, old_lp, atol=1e-4)).long().argmax())
    assert 1 <= switch < 60  # some tokens came from each version, in order, with a recomputed KV cache
    torch.testing.assert_close(got[:switch], old_lp[:switch], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[switch:], new_lp[switch:], atol=1e-4, rtol=1e-4)
    assert out.version == 0  # the version that produced the first token


async def test_stop_tokens_and_eos_end_with_stop(model: PreTrainedModel) -> None:
    free = reference_greedy(model, prompt(0), 30)
    cut = next(i for i in range(2, 30) if free[i] not in free[:i])
    backend = HFBackend(model, eos_token_ids=[free[cut]])
    by_eos = await backend.generate(GenRequest("eos", prompt(0), greedy(30)))
    await backend.close()
    backend = HFBackend(model, eos_token_ids=[])
    by_stop = await backend.generate(GenRequest("stop", prompt(0), greedy(30, stop_token_ids=[free[cut]])))
    await backend.close()
    for out in (by_eos, by_stop):
        assert out.token_ids == free[: cut + 1]  # the stop token is part of the output
        assert out.finish_reason == "stop"


async def test_abort_running_and_waiting_requests(model: PreTrainedModel) -> None:
    backend = HFBackend(model, max_batch=2, eos_token_ids=[])
    running = asyncio.create_task(backend.generate(GenRequest("run", prompt(1), greedy(500))))
    await backend.generate(GenRequest("warm", prompt(1), greedy(1)))
    blocker = asyncio.create_task(backend.generate(GenRequest("blocker", prompt(2), greedy(500))))
    waiting = asyncio.create_task(backend.generate(GenRequest("wait", prompt(2), greedy(5))))
    await settled()  # both tasks have registered their requests
    await backend.abort("wait")
    await backend.abort("run")
    await backend.abort("blocker")
    outs = await asyncio.gather(running, blocker, waiting)
    await backend.close()
    assert [o.finish_reason for o in outs] == ["abort"] * 3
    assert 1 <= len(outs[0].token_ids) < 500
    assert outs[2].token_ids == [] and outs[2].logprobs == []


async def test_a_failed_step_fails_its_requests_but_not_the_engine(
    model: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = HFBackend(model)
    forward = backend.model.forward

    def fails_at_decode(input_ids: torch.Tensor, **kwargs: object) -> object:
        if input_ids.shape[1] == 1:  # prefill passes, the first decode step raises
            raise RuntimeError("boom")
        return forward(input_ids=input_ids, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(backend.model, "forward", fails_at_decode)
        with pytest.raises(RuntimeError, match="boom"):
            await backend.generate(GenRequest("x", prompt(1), greedy(4)))
    out = await backend.generate(GenRequest("y", prompt(2), greedy(4)))
    await backend.close()
    assert out.token_ids == reference_greedy(model, prompt(2), 4)


async def test_bad_requests_are_rejected_with_a_reason(model: PreTrainedModel) -> None:
    backend = HFBackend(model)
    with pytest.raises(ValueError, match="empty prompt"):
        await backend.generate(GenRequest("e", [], greedy(4)))
    with pytest.raises(ValueError, match="does not fit the model's context of 2048"):
        await backend.generate(GenRequest("l", [5] * 2048, greedy(4)))
    norm = backend.model.get_parameter("model.norm.weight").detach().clone()
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        backend.load_weights([("model.norm.weight", norm + 1), ("nope", torch.zeros(1))], version=1)
    assert torch.equal(backend.model.get_parameter("model.norm.weight"), norm)  # nothing applied
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(128,\), got \(3,\)"):
        backend.load_weights([("model.norm.weight", torch.zeros(3))], version=1)
    await backend.close()
    assert backend.version == 0


async def test_bfloat16_holds_bfloat16_weights_casts_float32_updates_and_generates_like_the_model(
    model: PreTrainedModel,
) -> None:
    """`dtype: bfloat16` (what `auto` picks on a GPU): the trainer publishes float32 weights; the engine
    keeps its own precision and casts them as it loads."""
    backend = HFBackend(copy.deepcopy(model), dtype="bfloat16", eos_token_ids=[])
    assert {p.dtype for p in backend.model.parameters()} == {torch.bfloat16}
    published = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert {t.dtype for t in published.values()} == {torch.float32}
    backend.load_weights(published.items(), version=1)
    for name, tensor in published.items():
        assert torch.equal(backend.model.get_parameter(name), tensor.to(torch.bfloat16)), name
    out = await backend.generate(GenRequest("b", prompt(2), greedy(12)))
    await backend.close()
    assert out.version == 1
    assert out.token_ids == reference_greedy(copy.deepcopy(model).to(torch.bfloat16), prompt(2), 12)
    assert HFBackend(copy.deepcopy(model)).model.dtype == torch.float32  # auto, on a CPU
