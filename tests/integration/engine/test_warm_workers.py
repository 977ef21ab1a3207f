"""Runs in sequence sharing a `WarmWorkers` (engine/core/warm.py) on local Ray: the next run takes the last
run's trainer, generation and rollout processes, each rebuilt from its own config — its own initial weights
at version 0, weights under its own run id through the Mooncake master the runs share (the last run's keys
removed), and after a crash Ray's restart rebuilds it as that run's worker too — and a run that needs
another kind of worker kills the idle ones instead of waiting for their resources."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import ray

from bench.async_runs import LatencyEnvs, RunSettings, experiment_data
from engine.config import load_config
from engine.core.warm import WarmWorkers
from engine.experiment import Experiment
from engine.models.tiny import init_model
from engine.weights.transfer import latest_key
from infra.weightstore.factory import open_store

S = RunSettings(
    group_size=2, batch_groups=2, turns=2, max_tokens=4, env_ms=5, env_sigma_ms=0, warmup=0, steps=2
)


def _start(data: dict[str, Any], warm: WarmWorkers) -> Experiment:
    exp = Experiment(load_config(data=data), warm=warm)
    exp.provision()
    exp.prepare_model()
    exp.start_weight_store()
    exp.start_actors(env_factory=LatencyEnvs(S.env_ms, S.env_sigma_ms, S.seed))
    return exp


def _pids(exp: Experiment) -> dict[str, int]:
    roles = ("train", "gen", "rollout")
    infos = ray.get([exp.clusters[r].workers[0].actor.ping.remote() for r in roles])
    return {r: i["pid"] for r, i in zip(roles, infos, strict=True)}


def _steps(exp: Experiment, n: int) -> list[dict[str, Any]]:
    proto = exp.protocol()

    async def drive() -> list[dict[str, Any]]:
        await proto.start()
        return [await proto.step() for _ in range(n)]

    return asyncio.run(drive())


def test_the_next_run_takes_the_last_runs_processes_and_starts_from_its_own_state(tmp_path: Path) -> None:
    last, model = (str(init_model("tiny", tmp_path / f"model-{k}", seed=k)) for k in (1, 0))
    root = str(tmp_path / "runs")
    try:  # the Ray the first run starts is this test's: never left to the next module
        with WarmWorkers() as warm:
            first = _start(experiment_data(S, "rollart", 1, last, root), warm)  # another model, another mode
            try:
                pids, proxy = _pids(first), first.proxy
                assert [m["trained_at_version"] for m in _steps(first, 2)] == [0, 1]
                ended = ray.get(first.trainer.weights_sha256.remote())
            finally:
                first.teardown()
            assert (warm.retired, warm.idle()) == (4, 4)  # trainer, generation, rollout and the LLMProxy

            # the reused generation worker dies on its 6th request (step 1 of 2): Ray restarts it as this
            # run's worker (`latest_args`), not as the first run's, whose model, weights and store are gone
            killing = experiment_data(S, "sync+", 0, model, root) | {"faults": {"gen_kill_after_requests": 6}}
            second = _start(killing, warm)
            try:
                assert _pids(second) == pids and warm.reused == 4 and warm.idle() == 0
                assert second.proxy._actor_id == proxy._actor_id  # the same proxy, routing only this run's
                assert ray.get(second.proxy.summary.remote())["requests"] == 0
                gen = second.clusters["gen"].workers[0].actor
                assert ray.get([second.trainer.version.remote(), gen.version.remote()]) == [0, 0]
                initial = ray.get(second.trainer.weights_sha256.remote())
                assert initial != ended  # its own model, not where the last run ended
                assert [m["trained_at_version"] for m in _steps(second, 2)] == [0, 1]
                assert _pids(second)["gen"] != pids["gen"]  # it died and came back
                assert ray.get(gen.version.remote()) == 2  # this run's weights, through this run's store
                assert second.store_spec is not None and first.store_spec is not None
                assert second.store_spec["master_addr"] == first.store_spec["master_addr"]  # the same master
                with open_store(second.store_spec) as store:
                    assert not store.exists(latest_key(first.run_id))  # the first run's trainer removed them
                    assert store.exists(latest_key(second.run_id))
            finally:
                second.teardown()
            assert warm.idle() == 3  # a restarted incarnation is not reused

            faulty = experiment_data(S, "sync+", 0, model, root) | {"faults": {"trainer_error_at_step": 9}}
            third = _start(
                faulty, warm
            )  # a FaultyTrainWorker: the idle TrainWorker is killed, not waited for
            try:
                got = _pids(third)
                assert got["train"] != pids["train"] and got["rollout"] == pids["rollout"]
                assert warm.idle() == 0
                started = ray.get(third.trainer.weights_sha256.remote())
                assert started == initial  # a new process, the same start
            finally:
                third.teardown()
    finally:
        ray.shutdown()
