"""Faults on local Ray: a generation worker killed mid-run, env crashes and hangs, reward errors, a start
of the actors that fails partway.

The run must finish its steps; every trained group is whole; the killed worker is restarted by Ray and the
requests it held are served by the other one; every dropped and retried thing is counted. A failed start
leaves nothing held, so its retry (the `start_actors` task's) starts.

The runs pass their processes on (`WarmWorkers`, engine/core/warm.py), so each also checks that a worker
rebuilt for a run, and restarted by Ray after a crash in it, serves that run.
"""

import pytest
import ray

from engine.config import load_config
from engine.core.warm import WarmWorkers
from engine.experiment import Experiment
from engine.rollout.ledger import unended
from tests.integration.runs import G, ray_for, start, steps, tiny_config


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One Ray for the module's runs (the same pools), and the processes they pass on."""
    with ray_for(tiny_config(tmp_path_factory.mktemp("ray"), "ray")), WarmWorkers() as kept:
        yield kept


def test_worker_kill_env_and_reward_faults_the_run_finishes_whole(tmp_path, warm):
    # Seed 2117 draws its faults early, so no timing decides whether they happen: the first env built
    # crashes at its first step, the second hangs there (its 1 s env timeout fails it), and the first
    # score call errors. (Seed 1's first crash was in the 16th env: a run that built fewer envs saw none.)
    faults = {
        "seed": 2117,
        "env_step_crash": 0.1,
        "env_hang": 0.05,
        "reward_error": 0.2,
        "gen_kill_after_requests": 8,
    }
    exp = Experiment(load_config(data=tiny_config(tmp_path, "faults", faults=faults)), warm=warm)
    try:
        start(exp)
        gen0, gen1 = (w.actor for w in exp.clusters["gen"].workers)
        pid0 = ray.get(gen0.ping.remote())["pid"]
        metrics = steps(exp, 3)
        stats = ray.get(exp.rollout.stats.remote())
        proxy = ray.get(exp.proxy.summary.remote())

        assert [m["version"] for m in metrics] == [1, 2, 3]  # every step asked was done
        assert all(m["staleness_max"] <= 1 for m in metrics)  # rollart's bound (α = 1) through the kill
        assert all(m["groups"] == 2 and m["trajectories"] == 2 * G for m in metrics)  # whole groups only
        # gen-0 died once (on its 8th request), Ray restarted it, its requests were retried on gen-1
        assert set(proxy["worker_failures"]) == {"gen-0"} and proxy["retried"] >= 1
        assert ray.get(gen0.ping.remote())["pid"] != pid0
        assert ray.get(gen0.version.remote()) == ray.get(gen1.version.remote()) == 2  # rejoined, in sync
        c = stats["counts"]
        assert c["member_failed_InjectedEnvCrash"] >= 1 and c["member_failed_env_timeout"] >= 1
        assert stats["reward"]["retries"] >= 1
        failed = sum(v for k, v in c.items() if k.startswith("member_failed_"))
        assert c["trajectories_failed"] == failed  # every failure counted with its reason
        assert unended(c) == 0 and c["trajectories_started"] > 0  # nothing lost
    finally:
        exp.teardown()


def test_a_start_of_the_actors_that_fails_partway_frees_its_pool_units_and_a_retry_starts(tmp_path, warm):
    exp = Experiment(load_config(data=tiny_config(tmp_path, "restart")), warm=warm)
    calls = []
    real_proxy = exp._start_proxy

    def proxy_fails_once():  # the train and generation clusters were requested by then
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected: the proxy did not start")
        return real_proxy()

    exp._start_proxy = proxy_fails_once
    try:
        exp.provision()
        exp.prepare_model()
        exp.start_weight_store()
        with pytest.raises(RuntimeError, match="injected"):
            exp.start_actors()
        assert {pool: used for pool, (used, _) in exp.rm.usage().items()} == {
            "compute": 0,
            "bandwidth": 0,
            "cpu": 0,
        }
        assert exp.clusters == {} and exp.proxy is None
        reused = warm.reused
        exp.start_actors()  # what the task's retry does: the same pools, now free
        assert len(calls) == 2 and len(exp.clusters["gen"].workers) == 2
        assert warm.reused - reused >= 3  # at least the failed start's trainer and generation workers
        assert ray.get(exp.trainer.version.remote()) == 0
    finally:
        exp.teardown()


@pytest.mark.parametrize(
    ("mode", "bound"),
    [("sync", [0, 0, 0]), ("sync+", [0, 0, 0]), ("one-off", [0, 1, 1]), ("areal", [0, 1, 1])],
)
def test_a_restarted_sole_worker_serves_the_newest_weights_not_the_initial_ones(tmp_path, mode, bound, warm):
    """One generation worker: it dies during step 2; Ray restarts it and it must load the newest published
    weights before serving, or the retried requests would be answered by v0 weights. Each mode's
    guarantee holds through the kill (on-policy stays on-policy; one-off and areal stay within 1)."""
    cfg = tiny_config(
        tmp_path,
        f"rejoin-{mode.replace('+', 'plus')}",
        faults={"seed": 1, "gen_kill_after_requests": 12},
        train={"mode": mode, "alpha": 0 if mode.startswith("sync") else 1},
    )
    cfg["resources"]["roles"]["actor_gen"] = {"pool": "bandwidth", "count": 1}
    exp = Experiment(load_config(data=cfg), warm=warm)
    try:
        start(exp)
        (gen0,) = (w.actor for w in exp.clusters["gen"].workers)
        pid0 = ray.get(gen0.ping.remote())["pid"]
        metrics = steps(exp, 3)
        proxy = ray.get(exp.proxy.summary.remote())
        assert set(proxy["worker_failures"]) == {"gen-0"} and ray.get(gen0.ping.remote())["pid"] != pid0
        assert [m["version"] for m in metrics] == [1, 2, 3]
        stale = [m["staleness_max"] for m in metrics]
        assert all(s <= b for s, b in zip(stale, bound, strict=True)), stale  # the mode's bound, kill or not
    finally:
        exp.teardown()
