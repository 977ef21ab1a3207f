"""Held-out evaluation of a run as a Prefect task: the newest weights, the baseline, the overlap count.

The generation workers are first brought to the trainer's newest version (`serve_latest`), so an
evaluation after the last step scores the last trained weights in every mode. `overlap` counts the
held-out problems whose text was also rolled out in training, by this run or an earlier part of it
(`trained_problems.json` in the run directory keeps the ids across resumes); it must be 0.
"""

from __future__ import annotations

import json
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from engine.actor_args import task_specs
from engine.core.handles import acall
from engine.evaluate import evaluate, majority_baseline
from engine.experiment import Experiment
from engine.models.tokenizer import load_tokenizer
from engine.protocol import IterationProtocol
from engine.rollout.chat import ChatFormat
from engine.rollout.service import ProxyClient


def trained_problems(exp: Experiment, new: dict[str, list[str]]) -> dict[str, set[str]]:
    """Merge `new` problem ids into the run's record and return all of them per task."""
    path = exp.run_dir / "trained_problems.json"
    seen: dict[str, set[str]] = (
        {k: set(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}
    )
    for name, ids in new.items():
        seen.setdefault(name, set()).update(ids)
    path.write_text(json.dumps({k: sorted(v) for k, v in seen.items()}))
    return seen


@task(name="baselines", timeout_seconds=600, cache_policy=NO_CACHE)
async def baselines(exp: Experiment) -> dict[str, dict[str, Any]]:
    """The best constant answer per evaluated task (no model involved)."""
    return {s.name: await majority_baseline(s) for s in task_specs(exp.cfg) if s.eval_problems}


@task(name="evaluate", timeout_seconds=3600, cache_policy=NO_CACHE)
async def evaluate_held_out(exp: Experiment, proto: IterationProtocol) -> dict[str, dict[str, Any]]:
    """Per task: success, lenient, partial, reward, n_eval, overlap, and the version evaluated."""
    specs = task_specs(exp.cfg)
    if not any(s.eval_problems for s in specs):
        return {}
    version = await proto.serve_latest()
    chat = ChatFormat(load_tokenizer(exp.model_dir))
    results = await evaluate(specs, chat, ProxyClient(exp.proxy))
    seen = trained_problems(exp, await acall(exp.rollout.problems))
    for name, res in results.items():
        res["overlap"] = len(set(res.pop("problems")) & seen.get(name, set()))
        res["version"] = version
    return results
