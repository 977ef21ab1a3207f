"""What a train worker is built from (`TrainWorker`'s config), typed: one name and one default per setting.

The driver builds it from the experiment config (`engine/actor_args.py` `train_worker_args`); tests and
benchmarks that make a TrainWorker themselves pass the same keys. A key that is not a field is refused with
its name, so a setting cannot be silently ignored at the actor edge. `trainer` holds the `TrainerConfig`
fields (`engine/train/trainer.py`), under the trainer's names.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class TrainWorkerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_dir: str
    run_id: str
    trainer: dict[str, Any] = Field(default_factory=dict, description="TrainerConfig fields")
    store: Any = Field(None, description="the weight store: its spec, or a store; None: no publishing")
    max_len: int | None = Field(None, ge=1, description="train batches cut to this many tokens")
    threads: int = Field(1, ge=1, description="torch threads: the role's cores")
    training: Literal["torch", "megatron"] = "torch"
    tensor_parallel: int = Field(1, ge=1)
    pipeline_parallel: int = Field(1, ge=1)
    rendezvous: str | None = Field(None, description="tcp://host:port where model-parallel ranks meet")
    faults: dict[str, Any] = Field(default_factory=dict, description="FaultsConfig (FaultyTrainWorker)")
    batches_dir: str | None = Field(
        None, description="save each training batch here (engine/train/batch_log.py): train.save_batches"
    )
