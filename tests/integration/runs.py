"""A run small enough for a CPU test, shared by the tests that start one on local Ray."""

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from engine.config import load_config
from engine.experiment import Experiment

G = 2  # group size


def tiny_config(tmp_path, name: str, **sections) -> dict:
    """A run that takes seconds on a CPU: the tiny model on the HF backend, a 2-turn synthetic task."""
    cfg = {
        "name": name,
        "run_root": str(tmp_path / "runs"),
        "model": {"init_size": "tiny", "max_context": 256},
        "tasks": [
            {"env": "synthetic", "env_args": {"turns": 2}, "group_size": G, "max_turns": 3, "max_tokens": 4}
        ],
        "rollout": {"concurrency": 8, "env_timeout_s": 1.0, "reward_timeout_s": 0.5, "reward_retries": 2},
        "train": {"steps": 3, "batch_groups": 2, "micro_batch": 8, "checkpoint_every": 1, "mode": "rollart"},
        "resources": {
            "pools": [
                {"name": "compute", "kind": "gpu-compute", "capacity": 1},
                {"name": "bandwidth", "kind": "gpu-bandwidth", "capacity": 2},
                {"name": "cpu", "kind": "cpu", "capacity": 2},
            ],
            "roles": {
                "actor_train": {"pool": "compute"},
                "actor_gen": {"pool": "bandwidth", "count": 2},
                "reward": {"pool": "cpu"},
            },
        },
        "backends": {"generation": "hf", "weight_store": "ray"},
    }
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


@contextmanager
def ray_for(cfg: dict) -> Iterator[None]:
    """The local Ray a run of `cfg` starts (its pools as resources, the run's worker environment), kept up
    for several runs: each run's `Experiment` finds it up, uses it and leaves it up (`release_ray`)."""
    exp = Experiment(load_config(data=cfg))
    exp.provision()
    try:
        yield
    finally:
        exp.release_ray()
        exp.store.close()


def start(exp: Experiment) -> None:
    """Everything before the first step, in the order the train flow runs it."""
    exp.provision()
    exp.prepare_model()
    exp.start_weight_store()
    exp.start_actors()


def steps(exp: Experiment, n: int) -> list[dict]:
    """`n` training steps, then the rollout stopped: their metrics."""
    proto = exp.protocol()

    async def run() -> list[dict]:
        await proto.start()
        return [await proto.step() for _ in range(n)]

    metrics = asyncio.run(run())
    ray.get(exp.rollout.stop.remote())
    return metrics
