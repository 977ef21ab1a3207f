"""`rollart eval`: score a run's checkpoint on its held-out problems, beside the constant-answer baseline.

The same pieces as training (pools, model, generation workers behind the LLMProxy), no rollout: the
checkpoint is loaded into the trainer, verified against its recorded hash, published and served, then
evaluated greedily. The result goes to `runs/<name>/eval-step<N>.json` and is returned.
"""

from __future__ import annotations

import json
from typing import Any

from prefect import flow

from engine.config import load_config
from engine.experiment import Experiment
from tasks.checkpoint import checkpoint_record, load_checkpoint
from tasks.evaluate import baselines, evaluate_held_out
from tasks.setup import prepare_model, provision_pools, start_actors


@flow(name="rollart-eval", validate_parameters=False)
async def evaluate_run(
    config: str, overrides: list[str] | None = None, checkpoint: int | None = None
) -> dict:
    """`checkpoint`: the step of the checkpoint to score; None = the latest one, or the base model if the
    experiment has none yet."""
    exp = Experiment(load_config(config, overrides))
    if checkpoint is not None:
        checkpoint_record(exp, checkpoint)  # a step the experiment never saved: refused before any start-up
    try:
        provision_pools(exp)
        prepare_model(exp)
        start_actors(exp)
        has_any = exp.store.latest_checkpoint(exp.run_id) is not None
        step = load_checkpoint(exp, checkpoint)["step"] if checkpoint is not None or has_any else 0
        proto = exp.protocol()
        await proto.serve_trainer()
        base = await baselines(exp)
        results: dict[str, Any] = await evaluate_held_out(exp, proto)
        for name, res in results.items():
            res.update(baseline=base[name]["success"], baseline_answer=base[name]["answer"])
        out = {"checkpoint_step": step, "model_dir": exp.model_dir, "eval": results}
        (exp.run_dir / f"eval-step{step}.json").write_text(json.dumps(out, indent=2))
        return out
    finally:
        try:
            exp.teardown()
        finally:
            exp.release_ray()
