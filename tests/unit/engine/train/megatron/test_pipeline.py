"""Pipeline parallelism for MegatronLM: stage slicing, refusals, and two gloo ranks (stages) in their own
processes against the one-process model."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from engine.config import ConfigError, load_config
from engine.train.batch import TrainBatch, build_train_batch
from engine.train.megatron.convert import Arch, to_hf, to_megatron
from engine.train.megatron.model import MegatronLM
from engine.train.megatron.pipeline import Stage, from_stage, to_stage
from engine.train.train_worker import TrainWorker
from engine.train.trainer import TorchTrainer, TrainerConfig
from engine.types import Group
from tests.unit.engine.train.megatron.test_convert import LLAMA, QWEN2, _random_state
from tests.unit.engine.train.megatron.test_model import PROMPT, _group, _hf, _relative

FROZENLAKE = Path(__file__).resolve().parents[5] / "configs" / "frozenlake.yaml"
# four layers, so a stage holds two and renumbers them (global 2, 3 are the second stage's 0, 1)
PP_LLAMA = LLAMA.__class__(**{**LLAMA.to_dict(), "num_hidden_layers": 4})
# a norm that does clip; a KL term against another model, so the reference's own pipeline pass counts
PP_CONFIG = TrainerConfig(lr=1e-3, micro_batch_size=2, max_grad_norm=0.05, kl_beta=0.1)


@pytest.mark.parametrize("config", [QWEN2, PP_LLAMA], ids=["qwen2-tied", "llama-untied"])
def test_stages_hold_their_layers_renumbered_and_give_back_the_whole_model(config) -> None:
    arch = Arch.of(config)
    full = to_megatron(_random_state(config), arch)
    first, last = (to_stage(full, Stage.of(arch, 2, s)) for s in range(2))
    per = arch.layers // 2
    assert {k.split(".")[2] for k in first if k.startswith("decoder.layers.")} == {str(i) for i in range(per)}
    assert torch.equal(
        last["decoder.layers.0.mlp.linear_fc1.weight"], full[f"decoder.layers.{per}.mlp.linear_fc1.weight"]
    )
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" not in first
    assert "decoder.final_layernorm.weight" in last and "embedding.word_embeddings.weight" not in last
    # a tied head is a copy of the embedding on the last stage, left out again when the stages are joined
    head = full["embedding.word_embeddings.weight" if arch.tied else "output_layer.weight"]
    assert last["output_layer.weight"] is head
    joined = {**from_stage(first, Stage.of(arch, 2, 0)), **from_stage(last, Stage.of(arch, 2, 1))}
    assert joined.keys() == full.keys() and all(joined[k] is v for k, v in full.items())


def test_a_pipeline_size_not_dividing_the_layers_is_refused_with_the_numbers(
    tmp_path: Path, tiny_model: Callable[..., PreTrainedModel]
) -> None:
    tiny_model().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="pipeline_parallel 3 must divide the model's 2 decoder layers"):
        MegatronLM(tmp_path, pp=3)


def test_a_megatron_policy_needs_a_megatron_kl_reference(
    tmp_path: Path, tiny_model: Callable[..., PreTrainedModel]
) -> None:
    tiny_model().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="a policy that runs its own micro-batches"):
        TorchTrainer(MegatronLM(tmp_path), TrainerConfig(kl_beta=0.1), ref_model=tmp_path)


def test_an_hf_policy_refuses_a_megatron_kl_reference(
    tmp_path: Path, tiny_model: Callable[..., PreTrainedModel]
) -> None:
    # the trainer scores an HF policy's reference itself, through HF-only calls a MegatronLM lacks
    tiny_model().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="a reference that runs its own micro-batches"):
        TorchTrainer(tmp_path, TrainerConfig(kl_beta=0.1), ref_model=MegatronLM(tmp_path))


def test_pipeline_parallel_needs_the_megatron_backend_and_as_many_workers() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(FROZENLAKE, ["backends.pipeline_parallel=2"])
    assert e.value.problems == [
        "backends: pipeline_parallel 2 needs training: megatron (torch is one process)"
    ]
    with pytest.raises(ConfigError) as e:
        load_config(FROZENLAKE, ["backends.training=megatron", "backends.pipeline_parallel=0"])
    assert e.value.problems == ["backends.pipeline_parallel: Input should be greater than or equal to 1"]
    cfg = load_config(
        FROZENLAKE,
        ["backends.training=megatron", "backends.pipeline_parallel=2", "backends.tensor_parallel=2"],
    )
    assert (cfg.backends.pipeline_parallel, cfg.resources.roles["actor_train"].count) == (2, 1)
    config = {"model_dir": "unused", "run_id": "r", "training": "megatron", "pipeline_parallel": 2}
    with pytest.raises(
        ValueError, match=r"pipeline_parallel 2 needs training: megatron and 2 workers \(has 1\)"
    ):
        TrainWorker("train-0", 0, 1, "compute", "gpu-compute", config)


def _rank(rank: int, tp: int, address: str, dirs: list[str]) -> None:
    """One rank of two pipeline stages (of `tp` tensor-parallel ranks each): logits, whole weights, one GRPO
    step, greedy tokens and a checkpoint per model dir; then the one-process model's checkpoint loaded."""
    from engine.train.checkpoint import load_checkpoint, save_checkpoint

    torch.set_num_threads(1)
    for d in map(Path, dirs):
        batch = torch.load(d / "batch.pt", weights_only=False)
        mg = MegatronLM(d, tp=tp, rank=rank, address=address, pp=2)
        with torch.no_grad():
            logits = mg(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        trainer = TorchTrainer(mg, PP_CONFIG, ref_model=MegatronLM(d / "ref", tp=tp, rank=rank, pp=2))
        before = trainer.state_dict()
        metrics = trainer.train_step(batch)
        after = trainer.state_dict()
        greedy = trainer.greedy_generate(PROMPT, 6)
        save_checkpoint(d / "pp-ck", trainer)
        load_checkpoint(d / "one-ck" / "step-00000001", trainer)
        loaded = dict(weights=trainer.state_dict(), adam=trainer.optimizer_state())
        got = dict(logits=logits, before=before, after=after, metrics=metrics, greedy=greedy, loaded=loaded)
        torch.save(got, d / f"rank{rank}.pt")


def _one_process(d: Path, batch: TrainBatch) -> dict:
    """The one-process run the stages are held to (its loss checked against the torch backend's):
    logits, weights before and after one step, its metrics, gradients, AdamW state, greedy tokens, and
    its checkpoint in `d / "one-ck"`."""
    from engine.train.checkpoint import save_checkpoint

    one = TorchTrainer(MegatronLM(d), PP_CONFIG, ref_model=MegatronLM(d / "ref"))
    with torch.no_grad():
        want = dict(logits=one.model(input_ids=batch.input_ids).logits, before=one.state_dict())
    want["metrics"] = one.train_step(batch)
    want["grads"] = to_hf({k: p.grad for k, p in one.model.gpt.named_parameters()}, one.model.arch)
    want.update(after=one.state_dict(), adam=one.optimizer_state(), greedy=one.greedy_generate(PROMPT, 6))
    save_checkpoint(d / "one-ck", one)
    hf = TorchTrainer(d, PP_CONFIG, ref_model=d / "ref").train_step(batch)
    for key in ("loss", "kl", "grad_norm"):
        assert want["metrics"][key] == pytest.approx(hf[key], rel=1e-5), (d.name, key)
    return want


def _spawn(tp: int, dirs: list[str]) -> None:
    """Run `_rank` in `2 * tp` processes meeting on a loopback port; all must succeed."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    ranks = [ctx.Process(target=_rank, args=(r, tp, address, dirs)) for r in range(2 * tp)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=300)
    assert [p.exitcode for p in ranks] == [0] * 2 * tp


@pytest.mark.parametrize(("tp", "names"), [(1, ("qwen2", "llama")), (2, ("qwen2",))], ids=["pp2", "tp2-pp2"])
def test_two_pipeline_stages_compute_and_train_as_one_process(
    tp: int,
    names: tuple[str, ...],
    tmp_path: Path,
    tiny_model: Callable[..., PreTrainedModel],
    make_group: Callable[..., Group],
) -> None:
    from engine.train.checkpoint import load_checkpoint

    models = {
        "qwen2": lambda: (tiny_model(seed=1), tiny_model(seed=2)),
        "llama": lambda: tuple(AutoModelForCausalLM.from_config(PP_LLAMA) for _ in range(2)),
    }
    refs, dirs = {}, []
    for name in names:
        (model, ref), d = models[name](), tmp_path / name
        model.save_pretrained(d)
        ref.save_pretrained(d / "ref")
        batch = build_train_batch([_group(model.eval(), make_group)])
        torch.save(batch, d / "batch.pt")
        refs[name] = _one_process(d, batch)
        dirs.append(str(d))
    _spawn(tp, dirs)
    for d in map(Path, dirs):
        want, got = refs[d.name], torch.load(d / "rank0.pt", weights_only=False)
        last = torch.load(d / f"rank{2 * tp - 1}.pt", weights_only=False)  # the last stage's last rank
        _same_step(d, want, got, last)
        # the one-process checkpoint, loaded by the stages: its weights and AdamW state, whole again
        assert all(torch.equal(got["loaded"]["weights"][k], v) for k, v in want["after"].items()), d.name
        _same_adam(got["loaded"]["adam"], want["adam"], exact=True)
        # the stages' checkpoint (stage 0 wrote it, whole) resumes in one process
        resumed = TorchTrainer(MegatronLM(d), PP_CONFIG, ref_model=MegatronLM(d / "ref"))
        load_checkpoint(d / "pp-ck" / "step-00000001", resumed)
        assert all(torch.equal(resumed.state_dict()[k], v) for k, v in got["after"].items()), d.name
        _same_adam(resumed.optimizer_state(), want["adam"], exact=False)


def _same_step(d: Path, want: dict, got: dict, last: dict) -> None:
    """The first stage's results (`got`) and the last stage's (`last`) against the one-process run's."""
    real = torch.load(d / "batch.pt", weights_only=False).attention_mask.bool()
    # the last stage's logits (the first stage gets them from it) are the one-process model's
    for logits in (got["logits"], last["logits"]):
        assert torch.allclose(logits[real], want["logits"][real], atol=1e-4, rtol=0), d.name
    # the stages' weights gathered are the HF weights bit for bit
    assert all(torch.equal(got["before"][k], v) for k, v in _hf(d).state_dict().items()), d.name
    # one step: every stage reports the one-process loss, KL and clipped gradient norm
    assert want["metrics"]["kl"] > 1e-3 and want["metrics"]["grad_norm"] > PP_CONFIG.max_grad_norm
    for key in ("loss", "kl", "entropy", "clip_frac", "grad_norm"):
        assert got["metrics"][key] == last["metrics"][key], (d.name, key)
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-5, abs=1e-7), (d.name, key)
    kept = {k: g.abs() > 1e-5 for k, g in want["grads"].items()}  # as test_model: AdamW scales noise to ±lr
    delta_one = {k: (want["after"][k] - want["before"][k])[m] for k, m in kept.items()}
    delta_pp = {k: (got["after"][k] - got["before"][k])[m] for k, m in kept.items()}
    assert _relative({k: delta_pp[k] - v for k, v in delta_one.items()}, delta_one) <= 1e-5, d.name
    assert got["greedy"] == last["greedy"] == want["greedy"] and len(want["greedy"]) == 6, d.name


def _same_adam(got: dict, want: dict, exact: bool) -> None:
    """The same AdamW state: parameter indices and group, step counts, moments (bit for bit, or within a
    relative 1e-5 over all parameters)."""
    assert got["param_groups"] == want["param_groups"]
    mine, theirs = want["state"], got["state"]
    assert mine.keys() == theirs.keys() and all(torch.equal(theirs[i]["step"], mine[i]["step"]) for i in mine)
    for kind in ("exp_avg", "exp_avg_sq"):
        if exact:
            assert all(torch.equal(theirs[i][kind], mine[i][kind]) for i in mine), kind
        else:
            diff = {i: theirs[i][kind] - mine[i][kind] for i in mine}
            assert _relative(diff, {i: mine[i][kind] for i in mine}) <= 1e-5, kind
