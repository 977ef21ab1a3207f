"""engine.train.packed: the shared prompt decoded once and the replies packed, with the batch forward's
states and gradients."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedModel

from engine.train.packed import decode


def _shapes(decoder: torch.nn.Module) -> list[tuple[int, ...]]:
    """The `input_ids` shape of every later call of `decoder`."""
    calls: list[tuple[int, ...]] = []
    decoder.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    return calls


def _states_and_grads(
    model: PreTrainedModel, weights: torch.Tensor, run: Callable[[], torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The hidden states `run` returns and the parameters' gradients of their `weights`-weighted sum."""
    model.zero_grad(set_to_none=True)
    hidden = run()
    (hidden * weights).sum().backward()
    return hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_shared_prompt_is_decoded_once_and_the_replies_packed_with_the_same_states_and_gradients(
    tiny_model: Callable[..., PreTrainedModel], attention: str
) -> None:
    """Rows that share a prefix (a GRPO group's prompt) decode it once and their replies without padding;
    nothing a loss sees changes."""
    model = tiny_model(seed=0)
    model.set_attn_implementation(attention)
    decoder = model.get_decoder()
    torch.manual_seed(1)
    ids = torch.randint(3, 60, (5, 20))
    ids[:, :9] = ids[0, :9]  # a 9-token prompt, then five different replies of different lengths
    attn = torch.ones_like(ids)
    attn[1, 14:] = 0
    attn[3, 11:] = 0
    ids[attn == 0] = 0
    weights = torch.randn(5, 20, model.config.hidden_size) * attn[..., None]

    calls = _shapes(decoder)
    packed, packed_grads = _states_and_grads(model, weights, lambda: decode(decoder, ids, attn))
    # one sequence: the prompt once, then the 11 + 5 + 11 + 2 + 11 tokens after it, and no padding
    assert calls == [(1, 9 + 40)]
    plain, plain_grads = _states_and_grads(
        model, weights, lambda: decoder(input_ids=ids, attention_mask=attn).last_hidden_state
    )
    on = attn.bool()
    assert torch.allclose(packed[on], plain[on], atol=1e-5)
    assert packed_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        assert torch.allclose(packed_grads[name], grad, atol=1e-5, rtol=1e-4), name


@torch.no_grad()
def test_rows_share_only_what_the_row_above_has_and_one_row_takes_the_plain_forward(
    tiny_model: Callable[..., PreTrainedModel],
) -> None:
    decoder = tiny_model(seed=0).get_decoder()
    calls = _shapes(decoder)
    # two groups' prompts (rows 0-1 and 2-4); row 2 equals row 1 after its first token: it shares nothing
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 9], [4, 6, 9, 9], [4, 6, 9, 9], [4, 6, 9, 2]])
    attn = torch.ones_like(ids)
    attn[1, 3] = 0
    hidden = decode(decoder, ids, attn)
    # two segments side by side: 4 + 1 and 4 + 0 + 1 tokens (an identical row adds nothing)
    assert calls == [(2, 5)]
    plain = decoder(input_ids=ids, attention_mask=attn).last_hidden_state
    on = attn.bool()
    assert torch.allclose(hidden[on], plain[on], atol=1e-5)
    calls.clear()
    one_row = torch.tensor([[5, 6, 7, 8]])
    decode(decoder, one_row, torch.ones_like(one_row))
    assert calls == [(1, 4)]


@torch.no_grad()
def test_an_attention_that_takes_no_ready_mask_gets_the_plain_forward(
    tiny_model: Callable[..., PreTrainedModel],
) -> None:
    model = tiny_model(seed=0)
    model.set_attn_implementation("flex_attention")  # its masks are block masks that HF builds itself
    decoder = model.get_decoder()
    calls = _shapes(decoder)
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 9]])
    hidden = decode(decoder, ids, torch.ones_like(ids))
    assert calls == [(2, 4)]
    model.set_attn_implementation("sdpa")
    assert torch.allclose(hidden, decoder(input_ids=ids).last_hidden_state, atol=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_groups_of_one_micro_batch_are_packed_side_by_side_with_the_same_states_and_gradients(
    tiny_model: Callable[..., PreTrainedModel], attention: str
) -> None:
    """Three groups (prompts of 14, 12 and 16 tokens, the first 3 a system prompt they all share; replies
    of different lengths) decode as three packed segments in one batch, the shorter two padded: attention
    scores pairs within a group only, and the padding changes nothing a loss sees. Without the loss mask
    to mark the prompts, the shared system prompt chains the groups into one sequence."""
    model = tiny_model(seed=0)
    model.set_attn_implementation(attention)
    decoder = model.get_decoder()
    torch.manual_seed(3)
    ids = torch.randint(3, 60, (7, 20))
    ids[3, 3], ids[5, 3] = ids[0, 3] + 1, ids[0, 3] + 2  # each group's question differs from the last's
    ids[:3, :14] = ids[0, :14]
    ids[3:5, :12] = ids[3, :12]
    ids[5:, :16] = ids[5, :16]
    ids[:, :3] = ids[0, :3]
    attn = torch.ones_like(ids)
    attn[1, 17:] = 0
    attn[4, 14:] = 0
    attn[6, 18:] = 0
    ids[attn == 0] = 0
    actions = attn.clone()
    actions[:3, :14], actions[3:5, :12], actions[5:, :16] = 0, 0, 0
    weights = torch.randn(7, 20, model.config.hidden_size) * attn[..., None]

    calls = _shapes(decoder)
    with torch.no_grad():  # the system prompt once, each group's question and replies after it
        chained = decode(decoder, ids, attn)
    assert calls == [(1, 29 + 19 + 19)]
    calls.clear()
    packed, packed_grads = _states_and_grads(model, weights, lambda: decode(decoder, ids, attn, actions))
    # segments of 14 + 6 + 3 + 6, 12 + 8 + 2 and 16 + 4 + 2 tokens
    assert calls == [(3, 29)]
    plain, plain_grads = _states_and_grads(
        model, weights, lambda: decoder(input_ids=ids, attention_mask=attn).last_hidden_state
    )
    on = attn.bool()
    assert torch.isfinite(packed).all()
    assert torch.allclose(packed[on], plain[on], atol=1e-5)
    assert torch.allclose(chained[on], plain[on], atol=1e-5)
    assert packed_grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        assert torch.isfinite(packed_grads[name]).all(), name
        # float32 sums in another order (seen: 3e-7 of the gradient's largest entry, up to ~600); a wrong
        # mask or position is off by a sizeable fraction of it
        scale = float(grad.abs().max())
        assert torch.allclose(packed_grads[name], grad, atol=1e-5 * scale, rtol=1e-4), name


@torch.no_grad()
def test_rows_that_packing_would_make_more_work_take_the_plain_forward(
    tiny_model: Callable[..., PreTrainedModel],
) -> None:
    """Packing scores every pair of a segment. Two 120-token rows of a model with 18,720 weights outside its
    embedding that share only their first token pack into one 239-token segment whose 57,121 pairs cost
    more than the 28,800 of the rows apart; sharing a 100-token prompt they pack into 140 tokens, less work;
    sharing nothing they would be two segments of 120, the rows themselves: the plain forward."""
    decoder = tiny_model(seed=0).get_decoder()
    calls = _shapes(decoder)
    torch.manual_seed(2)
    ids = torch.randint(3, 60, (2, 120))
    ids[1, 1] = ids[0, 1] + 1
    ids[1, 0] = ids[0, 0]  # one token shared
    decode(decoder, ids, torch.ones_like(ids))
    ids[1, :100] = ids[0, :100]
    decode(decoder, ids, torch.ones_like(ids))
    ids[1, 0] = ids[0, 0] + 1  # nothing shared
    hidden = decode(decoder, ids, torch.ones_like(ids))
    assert calls == [(2, 120), (1, 140), (2, 120)]
    assert torch.allclose(hidden, decoder(input_ids=ids).last_hidden_state, atol=1e-5)
