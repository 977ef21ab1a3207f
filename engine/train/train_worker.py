"""TrainWorker: the ActorTrain role — GRPO steps, weight publishing, checkpoints.

config: the fields of `engine/train/worker_args.py` `TrainWorkerArgs` (an unknown key is refused). `training`:
"torch" (the HF model, default) or "megatron" (a Megatron-core GPTModel converted from it,
engine/train/megatron; weights still published and saved in HF names); `tensor_parallel` ×
`pipeline_parallel` Megatron ranks are the cluster's workers, rank r holding slice r mod tensor_parallel of
each layer of pipeline stage r div tensor_parallel, meeting at `rendezvous` ("tcp://host:port").
The ranks are called together (`engine.core.handles.RankGroup`): every rank takes each call and returns
the same result (the last pipeline stage's metrics and tokens reach every rank), and only rank 0 publishes
weights and writes checkpoints.
A training step takes whole GRPO groups (never partial ones), reports loss/clip/entropy/KL/grad-norm/
tokens-per-s plus the batch's rewards and staleness.

torch, transformers and the trainer are imported in the actor's process when it starts: the driver
imports this module only to name the actor class, and a run starts seconds sooner without them.
"""

from __future__ import annotations

import gc
import hashlib
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.decorators import register
from engine.core.worker import Role, Worker, device
from engine.train.worker_args import TrainWorkerArgs
from engine.types import Group
from infra.weightstore.factory import open_store, release_store

if TYPE_CHECKING:
    import torch

    from engine.train.trainer import ModelSource


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    """A content hash of a state dict (names, dtypes, shapes, bytes) to compare weights across runs."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


BUCKET_BYTES = 64 << 20  # the weight publisher's bucket size unless `publish` is given one


class TrainWorker(Worker):
    role = Role.ACTOR_TRAIN

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import torch

        from engine.models.tokenizer import load_tokenizer
        from engine.train.trainer import TorchTrainer, TrainerConfig
        from engine.weights.transfer import WeightPublisher

        self.args = conf = TrainWorkerArgs.model_validate(self.config)
        torch.set_num_threads(conf.threads)
        self.model_dir = conf.model_dir
        trainer_cfg = TrainerConfig(**conf.trainer)
        training = conf.training
        tp, pp = conf.tensor_parallel, conf.pipeline_parallel
        if tp * pp != self.world_size or (tp * pp > 1 and training != "megatron"):
            raise ValueError(
                f"tensor_parallel {tp} × pipeline_parallel {pp} needs training: megatron and {tp * pp} "
                f"workers (has {self.world_size})"
            )

        def policy() -> ModelSource:
            if training == "megatron":
                from engine.train.megatron.model import MegatronLM  # imports megatron-core: only when used

                return MegatronLM(self.model_dir, tp=tp, rank=self.rank, address=conf.rendezvous, pp=pp)
            return self.model_dir

        # The KL reference is the model training started from; it stays frozen (and is the same on resume).
        ref_model = policy() if trainer_cfg.kl_beta > 0 else None
        # on the GPU Ray gave this worker (a GPU pool on a machine with GPUs), else the CPU; model.dtype auto
        # then computes in bfloat16 on the GPU, float32 on the CPU (engine/precision.py)
        self.trainer = TorchTrainer(policy(), trainer_cfg, ref_model=ref_model, device=device())
        self.tokenizer = load_tokenizer(self.model_dir)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        store = conf.store if self.trainer.writes else None  # rank 0 publishes for all
        self.publisher = WeightPublisher(open_store(store), conf.run_id) if store else None

    def retire(self) -> bool:
        """Reusable when it is one torch process (Megatron ranks share process groups set up once): remove
        this run's weights from the store and hand the client back (kept open for a next run on the same
        store), drop the model and its optimiser; `reinit` builds them for the next run."""
        if self.args.training != "torch" or self.world_size > 1:
            return False
        if self.publisher is not None and self.args.store is not None:
            self.publisher.forget()
            release_store(self.args.store, self.publisher.store)
        del self.trainer, self.publisher
        gc.collect()
        return True

    @register
    def version(self) -> int:
        return self.trainer.version

    @register
    def train_step(self, groups: list[Group]) -> dict[str, float]:
        if not groups or any(not g.complete for g in groups):
            raise ValueError("train_step needs complete GRPO groups (a partial group is never trained)")
        version = self.trainer.version
        from engine.train.batch import build_train_batch

        batch = build_train_batch(groups, max_len=self.args.max_len, pad_token_id=self.pad_id)
        if self.args.batches_dir and self.trainer.writes:
            from engine.train.batch_log import save_batch

            save_batch(Path(self.args.batches_dir), version, batch, self.trainer.config)
        metrics = self.trainer.train_step(batch)
        rewards = [m.reward for g in groups for m in g.members if m.reward is not None]
        members = [m for g in groups for m in g.members]
        lags = [version - m.start_version for m in members]
        metrics.update(
            reward_mean=statistics.fmean(rewards),
            groups=len(groups),
            trajectories=len(rewards),
            staleness_max=max(lags),
            staleness_mean=statistics.fmean(lags),
            min_start_version=min(m.start_version for m in members),
            version_span_max=max(max(m.versions) - m.start_version for m in members),
            trained_at_version=version,
        )
        return metrics

    @register
    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.trainer.state_dict()

    @register
    def publish(self, bucket_bytes: int | None = None) -> dict[str, float]:
        """Publish the current weights as version `self.version()`: packed before this returns, pushed to
        the weight store in the background (`WeightPublisher.publish`), so training goes on while
        the store writes; the workers read each bucket as it lands."""
        state = self.trainer.state_dict()  # whole: with several ranks every rank takes part
        if not self.trainer.writes:
            return {}
        if self.publisher is None:
            raise RuntimeError("no weight store configured, cannot publish")
        if self.trainer.config.dtype == "bfloat16":
            import torch

            # every process computes in bfloat16 (model.dtype) and the workers hold bfloat16 weights: the
            # float32 master weights stay here, and half the bytes travel
            state = {k: t.to(torch.bfloat16) if t.is_floating_point() else t for k, t in state.items()}
        size = bucket_bytes or BUCKET_BYTES
        return self.publisher.publish(state, self.trainer.version, size)

    @register
    def weights_sha256(self) -> str:
        return weights_sha256(self.trainer.state_dict())

    @register
    def save(self, root: str, extra: dict[str, Any] | None = None, weights_only: bool = False) -> str:
        from engine.train.checkpoint import save_checkpoint

        return str(
            save_checkpoint(Path(root), self.trainer, self.tokenizer, extra=extra, weights_only=weights_only)
        )

    @register
    def load(self, path: str) -> dict[str, Any]:
        from engine.train.checkpoint import load_checkpoint

        return load_checkpoint(Path(path), self.trainer)

    @register
    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        return [self.trainer.greedy_generate(p, max_tokens) for p in prompts]
