"""What a generation worker is built from (`GenerationWorker`'s config), typed: an unknown key is refused
by name. The driver builds it in `engine/experiment.py` (`Experiment._gen_cluster`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class GenerationWorkerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: dict[str, Any] = Field(description='the engine: {"kind": "vllm" | "hf" | ..., **its arguments}')
    run_id: str
    store: Any = Field(None, description="the weight store: its spec, or a store; None: no weight pulls")
    threads: int | None = Field(None, ge=1, description="torch threads of the engine; None: torch's default")
    kill_after_requests: int | None = Field(
        None, ge=1, description="fault injection: worker 0's process exits on its N-th request"
    )
