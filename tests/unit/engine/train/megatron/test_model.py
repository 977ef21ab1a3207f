"""MegatronLM (a Megatron-core GPTModel behind HF edges) against the HF model it was converted from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from engine.train.batch import build_train_batch
from engine.train.megatron.convert import to_hf
from engine.train.megatron.model import MegatronLM
from engine.train.trainer import TorchTrainer, TrainerConfig
from engine.types import Group
from tests.unit.engine.train.megatron.test_convert import LLAMA

PROMPT = [3, 9, 4, 7, 2]


@pytest.fixture(params=["qwen2", "llama"])
def hf_dir(request, tmp_path: Path, tiny_model: Callable[..., PreTrainedModel]) -> Path:
    """An HF model directory: the tiny tied Qwen2 with q/k/v biases, or SmolLM2's architecture made small."""
    if request.param == "qwen2":
        model = tiny_model(seed=1)
    else:
        torch.manual_seed(1)
        model = AutoModelForCausalLM.from_config(LLAMA)
    model.save_pretrained(tmp_path / request.param)
    return tmp_path / request.param


def _hf(path: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


def test_logits_equal_the_hf_models_on_a_right_padded_batch(hf_dir: Path) -> None:
    hf, mg = _hf(hf_dir), MegatronLM(hf_dir).eval()
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (3, 19))
    attn = torch.ones_like(ids)
    attn[1, 12:], attn[2, 5:] = 0, 0  # right padding
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=attn).logits
        got = mg(input_ids=ids, attention_mask=attn).logits
    real = attn.bool()
    assert got.shape == want.shape
    assert torch.allclose(got[real], want[real], atol=1e-4, rtol=0), (got[real] - want[real]).abs().max()


def test_weights_come_back_in_hf_names_saved_and_reloaded_exactly(hf_dir: Path, tmp_path: Path) -> None:
    hf, mg = _hf(hf_dir), MegatronLM(hf_dir)
    want = hf.state_dict()
    got = mg.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    mg.save_pretrained(tmp_path / "saved")
    again = _hf(tmp_path / "saved").state_dict()
    assert all(torch.equal(again[k], want[k]) for k in want)
    with pytest.raises(KeyError, match="missing"):
        mg.load_state_dict({k: v for k, v in want.items() if "norm" not in k})


def test_greedy_generation_equals_hf(hf_dir: Path) -> None:
    hf, mg = _hf(hf_dir), MegatronLM(hf_dir).eval()
    ids = torch.tensor([PROMPT])
    want = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    assert torch.equal(mg.generate(ids, max_new_tokens=6)[:, : want.shape[1]], want)


def _group(model: PreTrainedModel, make_group: Callable[..., Group]) -> Group:
    """Off-policy members of different lengths (behaviour log-probs shifted off the model's)."""
    members = []
    for k, (reward, act) in enumerate([(1.0, [5, 6, 9]), (0.0, [7]), (0.5, [8, 8, 3, 1]), (0.2, [11, 12])]):
        ids = torch.tensor([PROMPT + act])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0], dim=-1)
        lps = [float(logp[len(PROMPT) - 1 + j, a]) + 0.1 * (k - 1.5) for j, a in enumerate(act)]
        members.append((reward, [(PROMPT, act, lps, 0)]))
    return make_group(members)


def test_one_grpo_step_moves_the_weights_as_the_torch_trainer_does(
    hf_dir: Path, make_group: Callable[..., Group]
) -> None:
    config = TrainerConfig(lr=1e-3, micro_batch_size=2)
    torch_trainer = TorchTrainer(hf_dir, config)
    mega_trainer = TorchTrainer(MegatronLM(hf_dir), config)
    before = torch_trainer.state_dict()
    batch = build_train_batch([_group(torch_trainer.model, make_group)])
    a = torch_trainer.train_step(batch)
    b = mega_trainer.train_step(batch)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    # the gradients (clipped, as the optimiser got them), in HF layout
    grad_t = {k: p.grad for k, p in torch_trainer.model.named_parameters()}
    grad_m = to_hf({k: p.grad for k, p in mega_trainer.model.gpt.named_parameters()}, mega_trainer.model.arch)
    assert _relative({k: grad_m[k] - g for k, g in grad_t.items()}, grad_t) <= 1e-5
    # the weight deltas, where AdamW's first step g / (|g| + 1e-8) is not float noise scaled up to ±lr: a
    # gradient that is 0 in exact arithmetic (e.g. a key bias: softmax ignores it) is ~1e-9 either way
    after_t, after_m = torch_trainer.state_dict(), mega_trainer.state_dict()
    kept = {k: g.abs() > 1e-5 for k, g in grad_t.items()}
    delta_t = {k: (after_t[k] - before[k])[m] for k, m in kept.items()}
    delta_m = {k: (after_m[k] - before[k])[m] for k, m in kept.items()}
    assert sum(int(m.sum()) for m in kept.values()) > 0.5 * sum(m.numel() for m in kept.values())
    assert _relative({k: delta_m[k] - d for k, d in delta_t.items()}, delta_t) <= 1e-5


def _relative(diff: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """‖diff‖ / ‖ref‖ over all the tensors together."""
    return float(
        sum(d.pow(2).sum() for d in diff.values()).sqrt() / sum(r.pow(2).sum() for r in ref.values()).sqrt()
    )


# Tensor parallelism: two ranks under gloo, each a process with its slices, against the one-process models
TP_LLAMA = LLAMA.__class__(**{**LLAMA.to_dict(), "num_attention_heads": 4, "num_key_value_heads": 2})
TP_CONFIG = TrainerConfig(lr=1e-3, micro_batch_size=2, max_grad_norm=0.05)  # a norm that does clip


def _rank(rank: int, tp: int, address: str, dirs: list[str], out: str) -> None:
    """One tensor-parallel rank: logits, whole weights, one GRPO step and a checkpoint per model dir."""
    from engine.train.checkpoint import save_checkpoint

    torch.set_num_threads(1)
    for d in dirs:
        batch = torch.load(Path(d) / "batch.pt", weights_only=False)
        mg = MegatronLM(d, tp=tp, rank=rank, address=address)
        with torch.no_grad():
            logits = mg(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        trainer = TorchTrainer(mg, TP_CONFIG)
        before = trainer.state_dict()
        metrics = trainer.train_step(batch)
        after = trainer.state_dict()
        save_checkpoint(Path(out) / Path(d).name, trainer)
        if rank == 0:
            torch.save(dict(logits=logits, before=before, after=after, metrics=metrics), Path(d) / "tp.pt")


def test_two_tensor_parallel_ranks_compute_and_train_as_one_process(
    tmp_path: Path, tiny_model: Callable[..., PreTrainedModel], make_group: Callable[..., Group]
) -> None:
    import socket

    import torch.multiprocessing as mp

    from engine.train.checkpoint import load_checkpoint, save_checkpoint

    dirs = []
    for name, model in (("qwen2", tiny_model(seed=1)), ("llama", AutoModelForCausalLM.from_config(TP_LLAMA))):
        model.save_pretrained(tmp_path / name)
        torch.save(build_train_batch([_group(model.eval(), make_group)]), tmp_path / name / "batch.pt")
        dirs.append(str(tmp_path / name))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    ranks = [ctx.Process(target=_rank, args=(r, 2, address, dirs, str(tmp_path / "ck"))) for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=300)
    assert [p.exitcode for p in ranks] == [0, 0]

    for d in map(Path, dirs):
        batch, got = (
            torch.load(d / "batch.pt", weights_only=False),
            torch.load(d / "tp.pt", weights_only=False),
        )
        hf = _hf(d)
        with torch.no_grad():
            want = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        real = batch.attention_mask.bool()
        assert torch.allclose(got["logits"][real], want[real], atol=1e-4, rtol=0), d.name
        # the slices gathered are the HF weights bit for bit
        assert all(torch.equal(got["before"][k], v) for k, v in hf.state_dict().items()), d.name
        # one step: the same loss, whole-model gradient norm (clipped by it) and weight deltas as one process
        one = TorchTrainer(MegatronLM(d), TP_CONFIG)
        ref = one.train_step(batch)
        assert got["metrics"]["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-7), d.name
        assert got["metrics"]["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5), d.name
        assert ref["grad_norm"] > TP_CONFIG.max_grad_norm  # so the clip coefficient was exercised
        grads = to_hf({k: p.grad for k, p in one.model.gpt.named_parameters()}, one.model.arch)
        kept = {k: g.abs() > 1e-5 for k, g in grads.items()}  # as above: AdamW scales float noise to ±lr
        after = one.state_dict()
        delta_one = {k: (after[k] - got["before"][k])[m] for k, m in kept.items()}
        delta_tp = {k: (got["after"][k] - got["before"][k])[m] for k, m in kept.items()}
        assert _relative({k: delta_tp[k] - v for k, v in delta_one.items()}, delta_one) <= 1e-5, d.name
        # the checkpoint rank 0 wrote is whole: it resumes in one process with the weights and AdamW moments
        resumed = TorchTrainer(MegatronLM(d), TP_CONFIG)
        load_checkpoint(tmp_path / "ck" / d.name / "step-00000001", resumed)
        assert resumed.version == 1
        assert all(torch.equal(resumed.state_dict()[k], v) for k, v in got["after"].items()), d.name
        mine, theirs = one.optimizer_state()["state"], resumed.optimizer_state()["state"]
        assert mine.keys() == theirs.keys()
        for kind in ("exp_avg", "exp_avg_sq"):
            diff = {i: theirs[i][kind] - mine[i][kind] for i in mine}
            assert _relative(diff, {i: mine[i][kind] for i in mine}) <= 1e-5, (d.name, kind)
        save_checkpoint(tmp_path / "again" / d.name, resumed)  # and one process saves it in the same layout
