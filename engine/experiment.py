"""Experiment: builds one run's long-lived pieces on Ray from an `ExperimentConfig` (the composition root).

Each step is its own method so the Prefect tasks can wrap them one by one (provision, model, weight
store, actors, checkpoint restore) and retry each on its own. Every role's workers are built by a `Cluster`
where the `ResourceManager` binds them: trainer (`actor_train`), generation (`actor_gen`) and the env loops
(`environment`); the LLMProxy routes generation between them. The actors live in a Ray namespace per run
and die with the driver; a resumed run starts new ones and restores their state from the checkpoint.
Runs in sequence on one Ray may share a `WarmWorkers` (engine/core/warm.py): the trainer's, the
generation workers' and the rollout's processes then pass from one run to the next, rebuilt from each
run's config, and so do the LLMProxy and the Mooncake master (engine/weights/run_store.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engine.actor_args import rollout_args, store_bytes, threads, trainer_args
from engine.config import ExperimentConfig
from engine.config.resources import Role
from engine.core.cluster import Cluster
from engine.core.handles import wait_gone
from engine.core.nodes import missing_pools, rendezvous
from engine.core.resources import ResourceManager, ray_resource
from engine.core.warm import WarmWorkers, retired
from engine.envs.base import Env
from engine.faults import FaultyTrainWorker
from engine.protocol import Collaborators, IterationProtocol
from engine.rollout.gen_worker import GenerationWorker
from engine.rollout.gen_worker_args import GenerationWorkerArgs
from engine.rollout.proxy import GenSlot, LLMProxy
from engine.rollout.reward import ScoreFn, env_return
from engine.rollout.reward_worker import RewardWorker
from engine.rollout.rollout_worker import RolloutWorker
from engine.rollout.scheduler import TaskSpec
from engine.rollout.service import default_env_factory
from engine.train.train_worker import TrainWorker
from engine.train.worker_args import TrainWorkerArgs
from engine.weights.run_store import RunWeightStore
from infra.local_ray import init_local_ray, node_address, sigterm_kept
from infra.metadata import MetadataStore

PROXY_KEY = "llm-proxy"  # what a WarmWorkers files a retired LLMProxy under (it lives beside the driver)
GEN_MAX_RESTARTS = 4  # Ray restarts a generation worker whose process died this often
# The run's processes: no usage reporting, and Mooncake's glog and vLLM's INFO lines (dozens per worker)
# stay out of the user's terminal; warnings and errors show. (Each Mooncake client advertises its own node's
# address: infra/weightstore/mooncake.py.)
WORKER_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "GLOG_minloglevel": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}


class Experiment:
    def __init__(self, cfg: ExperimentConfig, run_dir: Path | None = None, warm: WarmWorkers | None = None):
        self.cfg = cfg
        self.warm = warm
        self.run_dir = Path(run_dir or cfg.run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = cfg.name
        self.namespace = f"rollart-{cfg.name}"
        self.store = MetadataStore(cfg.metadata_url(self.run_dir))
        self.rm = ResourceManager(cfg.resources.pools, self.store, run=self.run_id)
        self.model_dir = ""
        self.store_spec: dict[str, Any] | None = None
        self.weights: RunWeightStore | None = None  # the weight store's service (start_weight_store)
        self._ray: Any = None  # the context of the Ray this run started or joined (None: Ray was up)
        self.clusters: dict[str, Cluster] = {}
        self.proxy: Any = None
        self.judges: dict[str, Any] = {}  # task -> its JudgeEndpoint (engine/rollout/judge_endpoints.py)
        self._own_serve = False  # whether this run started Serve (then its teardown stops it)

    # -- provisioning ------------------------------------------------------------------------------
    def provision(self) -> dict[str, Any]:
        """Start Ray on loopback (`infra/local_ray.py`) with the pools as custom resources, or join the
        cluster at `RAY_ADDRESS`, whose nodes offer the pools (`engine/core/nodes.py`; a pool it lacks is
        refused, naming it). The workers' output goes to Ray's log files (`worker_logs`), not to this
        process: the run's own lines stay readable."""
        if not ray.is_initialized():
            address = os.environ.get("RAY_ADDRESS")
            with sigterm_kept():  # a Prefect runner's cancel stays a cancel (infra/local_ray.py)
                if address:
                    self._ray = ray.init(
                        address=address,
                        namespace=self.namespace,
                        log_to_driver=False,
                        runtime_env={"env_vars": WORKER_ENV},
                    )
                else:
                    self._ray = init_local_ray(
                        log_to_driver=False,
                        num_cpus=os.cpu_count(),
                        resources=self.rm.ray_resources,
                        include_dashboard=False,
                        namespace=self.namespace,
                        runtime_env={"env_vars": WORKER_ENV},
                    )
            if not address:
                # A fresh cluster: no worker of this run is alive, so bindings still marked active were
                # left by a driver killed before its teardown (resume after a crash); free their pools.
                for stale in self.store.bindings(self.run_id, state="active"):
                    self.store.set_binding(stale.id, state="dead")
        missing = missing_pools(self.rm.ray_resources, ray.cluster_resources())
        if missing:
            raise ValueError(
                "resources.pools: the Ray cluster lacks what the run needs: " + "; ".join(missing)
            )
        logs = Path(self._ray.address_info["session_dir"]) / "logs" if self._ray is not None else None
        return {
            "pools": {p.name: p.capacity for p in self.cfg.resources.pools},
            "ray_resources": ray.cluster_resources(),
            "worker_logs": str(logs) if logs else None,
        }

    def prepare_model(self) -> str:
        """The model directory: the configured one (imported first from `model.import_from` while it has
        no config.json, so a rerun reuses it), or a tiny model built locally (no hub).
        """
        # torch and transformers are imported only to import or build a model: the driver needs neither
        if self.cfg.model.path:
            from engine.models.importer import import_model, resolve_model_path

            source, path = self.cfg.model.import_from, Path(self.cfg.model.path)
            if source and not (path / "config.json").exists():
                import_model(source, path)
            self.model_dir = resolve_model_path(self.cfg.model.path)
        else:
            out = self.run_dir / "model-init"
            if not (out / "config.json").exists():
                from engine.models.tiny import init_model

                model = self.cfg.model
                init_model(model.init_size, out, seed=model.init_seed, pretrain_steps=model.pretrain_steps)
            self.model_dir = str(out)
        return self.model_dir

    def start_weight_store(self) -> dict[str, Any]:
        kind, segment = self.cfg.backends.weight_store, self.cfg.backends.weight_store_bytes
        if kind == "mooncake":
            os.environ.update(WORKER_ENV)  # the master's glog lines stay out of the terminal
            segment = segment or store_bytes(Path(self.model_dir))
        self.weights = RunWeightStore(kind, self._host(), self.run_dir, self.namespace, segment, self.warm)
        self.store_spec = self.weights.start()
        return dict(self.store_spec)

    # -- actors ------------------------------------------------------------------------------------
    def deploy_reward(self) -> dict[str, Any]:
        """Each task's scoring: its env's rule in the rollout actor, or an LLM judge on a scale-to-zero
        endpoint, deployed here (once; on the reward role's pool) and removed by `teardown`."""
        judged = [t for t in self.cfg.tasks if t.reward.kind == "llm-judge"]
        if judged and not self.judges:
            from engine.rollout.judge_endpoints import deploy_judges  # Ray Serve: only for a judge
            from infra.serve import serve_running

            role = self.cfg.resources.roles["reward"]
            self._own_serve = self._own_serve or not serve_running()
            self.judges = deploy_judges(
                judged,
                prefix=self.namespace,
                policy_dir=self.model_dir or self.prepare_model(),
                host=self._host(),
                pool=(role.pool, self.rm.kind(role.pool)),
                replica_options={"num_cpus": 0, "resources": {ray_resource(role.pool): role.units}},
            )
            for task, e in self.judges.items():  # the reward role: no actor of its own, its judge serverless
                self.clusters[f"reward-{task}"] = Cluster(
                    f"reward-{task}",
                    RewardWorker,
                    self.rm,
                    role.model_copy(update={"count": 0}),
                    serverless_urls={"judge": e.url},
                    serverless_token=e.token,
                    serverless_timeout_s=self.cfg.rollout.reward_timeout_s,
                    serverless_retries=0,  # the rollout's RewardScorer retries, with its counts
                    namespace=self.namespace,
                )
        return {
            "endpoints": {task: e.report() for task, e in self.judges.items()},
            "scoring": {
                t.name: f"llm-judge at {self.judges[t.name].url}" if t.name in self.judges else "env rule"
                for t in self.cfg.tasks
            },
        }

    def start_actors(self, env_factory: Callable[[TaskSpec], Env] = default_env_factory) -> dict[str, Any]:
        """`env_factory` builds each trajectory's env (picklable: it travels to the rollout actor)."""
        common = {"store": self.store_spec, "run_id": self.run_id}
        self.deploy_reward()
        score = self._score()
        try:
            self.clusters["train"] = self._train_cluster(common)
            self.clusters["gen"] = self._gen_cluster(common)
            self.proxy = self._start_proxy()
            self.clusters["rollout"] = self._rollout_cluster(env_factory, score)
            if self.warm is not None:  # what this run did not take holds resources it may need
                self.warm.drain()
            for c in self.clusters.values():  # all roles were requested at once: their imports overlap
                c.ready()
        except BaseException:  # a retry starts from nothing: this attempt's actors stopped, its units free
            self._stop_actors()
            raise
        return {
            "train": self.cfg.backends.tensor_parallel * self.cfg.backends.pipeline_parallel,
            "gen": len(self.clusters["gen"].workers),
            "rollout": self.cfg.resources.roles["environment"].pool,
            "namespace": self.namespace,
        }

    def _train_cluster(self, common: dict[str, Any]) -> Cluster:
        """The one trainer, requested (not awaited): as many ranks as its tensor × pipeline parallelism."""
        cfg, tp, pp = self.cfg, self.cfg.backends.tensor_parallel, self.cfg.backends.pipeline_parallel
        return Cluster(
            "train",
            FaultyTrainWorker if cfg.faults.trainer_faults else TrainWorker,
            self.rm,
            cfg.resources.roles["actor_train"].model_copy(update={"count": tp * pp}),
            worker_config=TrainWorkerArgs(  # checked here, on the driver, before any actor starts
                model_dir=self.model_dir,
                trainer=trainer_args(cfg),
                max_len=cfg.model.max_context,
                threads=self._threads("actor_train"),
                training=cfg.backends.training,
                tensor_parallel=tp,
                pipeline_parallel=pp,
                rendezvous=rendezvous() if tp * pp > 1 else None,
                faults=cfg.faults.model_dump(),
                batches_dir=str(self.run_dir / "batches") if cfg.train.save_batches else None,
                **common,
            ).model_dump(),
            namespace=self.namespace,
            wait=False,
            warm=self.warm,
        )

    def _gen_cluster(self, common: dict[str, Any]) -> Cluster:
        """The generation workers, requested (not awaited), each on the configured generation backend."""
        cfg = self.cfg
        backend: dict[str, Any] = {"kind": cfg.backends.generation, "model_dir": self.model_dir}
        if cfg.backends.generation in ("hf", "vllm"):
            backend["dtype"] = cfg.model.dtype
        if cfg.backends.generation == "vllm":
            backend.update(
                max_model_len=cfg.model.max_context, max_batch=cfg.rollout.concurrency, seed=cfg.train.seed
            )
        return Cluster(
            "gen",
            GenerationWorker,
            self.rm,
            cfg.resources.roles["actor_gen"],
            worker_config=GenerationWorkerArgs(  # checked here, on the driver, before any actor starts
                backend=backend,
                threads=self._threads("actor_gen"),
                kill_after_requests=cfg.faults.gen_kill_after_requests,
                **common,
            ).model_dump(),
            max_concurrency=1024,
            namespace=self.namespace,
            max_restarts=GEN_MAX_RESTARTS,
            wait=False,
            warm=self.warm,
        )

    def _start_proxy(self) -> Any:
        """The LLMProxy, beside the driver (a lost node takes only its pools' workers with it). It routes
        generation by workload profile to a pool of the matching kind, as `GenerationWorker.generate`
        declares (`@hw_mapping`), sticky per trajectory."""
        gen, capacity = self.clusters["gen"], self.cfg.rollout.concurrency
        tag = gen.hw_tag("generate")
        slots = [
            GenSlot(w.binding.worker, w.kind, w.actor, capacity=capacity, pool=w.binding.pool)
            for w in gen.workers
        ]
        node = ray.get_runtime_context().get_node_id()
        control = {
            "namespace": self.namespace,
            "max_concurrency": 100_000,
            "num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
        }
        kept = self.warm.take(PROXY_KEY) if self.warm is not None else None
        if kept is not None:  # the last run's proxy process, rebuilt for this run
            ray.get(kept.reinit.remote(slots, tag_name=tag))
            return kept
        if self.warm is None:  # named so that `teardown` returns once it is gone (kept ones live on)
            control["name"] = "llm-proxy"
        return ray.remote(LLMProxy).options(**control).remote(slots, tag_name=tag)

    def _rollout_cluster(self, env_factory: Callable[[TaskSpec], Env], score: ScoreFn) -> Cluster:
        """The environment role's actor (env loops, scheduler, sample buffer), requested (not awaited)."""
        return Cluster(
            "rollout",
            RolloutWorker,
            self.rm,
            self.cfg.resources.roles["environment"],
            worker_config=rollout_args(self.cfg, self.model_dir, self.proxy, env_factory, score),
            max_concurrency=100_000,
            namespace=self.namespace,
            wait=False,
            warm=self.warm,
        )

    def _score(self) -> ScoreFn:
        if not self.judges:
            return env_return
        from engine.rollout.judge_endpoints import judge_scores

        return judge_scores({t: self.clusters[f"reward-{t}"].serverless_client("judge") for t in self.judges})

    def _host(self) -> str:
        """Where the run's reachable services listen (`network.host`; auto: this node's Ray address)."""
        host = self.cfg.network.host
        return node_address() if host == "auto" else host

    def _threads(self, role: Role) -> int:
        rc = self.cfg.resources.roles[role]
        pool = next(p for p in self.cfg.resources.pools if p.name == rc.pool)
        return threads(rc.threads, self.cfg.train.mode, pool.cores)

    @property
    def rollout(self) -> Any:
        """The environment role's actor (env loops, scheduler, sample buffer), None before `start_actors`."""
        c = self.clusters.get("rollout")
        return c.workers[0].actor if c is not None and c.workers else None

    @property
    def trainer(self) -> Any:
        """The trainer's ranks (one, or its tensor- and pipeline-parallel processes) behind one handle,
        whose `@register` methods (`TrainWorker`) every rank takes."""
        return self.clusters["train"].ranks()

    def protocol(self) -> IterationProtocol:
        gen = [w.actor for w in self.clusters["gen"].workers]
        return IterationProtocol(
            Collaborators(self.rollout, self.proxy, self.trainer, gen),
            self.cfg.train.mode,
            self.cfg.train.batch_groups,
            get_batch_timeout_s=600,
            restart_wait_s=self.cfg.rollout.worker_restart_wait_s,
        )

    # -- teardown ----------------------------------------------------------------------------------
    def teardown(self) -> None:
        """Stop this run's actors and weight store. Returns once its named actors are gone, so the same
        experiment can start again at once on a Ray that stays up (a notebook's, a cluster's, a test's)."""
        if self.rollout is not None:
            ray.get(self.rollout.stop.remote())
        self._stop_actors()
        if self.weights is not None:
            self.weights.stop()
        if self.judges or self._own_serve:
            from engine.rollout.judge_endpoints import undeploy_judges

            undeploy_judges(self.judges)
            self.judges = {}
            if self._own_serve:
                from ray import serve

                serve.shutdown()
                self._own_serve = False

    def _stop_actors(self) -> None:
        """Kill the proxy and every cluster's workers, or retire them into the run's WarmWorkers; free all
        pool units this run holds (a worker whose cluster was still being built when it failed holds one
        too). Without a WarmWorkers, returns once the named proxy is gone."""
        proxy, self.proxy = self.proxy, None
        if proxy is not None:
            if self.warm is not None and retired(proxy.retire.remote()):
                self.warm.give(PROXY_KEY, proxy)
            else:
                ray.kill(proxy)
        for c in self.clusters.values():
            c.begin_retiring()
        for c in self.clusters.values():
            c.shutdown()
        self.clusters.clear()
        if proxy is not None and self.warm is None:
            wait_gone(self.namespace, ["llm-proxy"])
        self.rm.release_all()

    def release_ray(self) -> None:
        """Shut down the Ray this run started, or leave the cluster it joined; a Ray that was up before
        the run stays up for whoever started it."""
        if self._ray is not None:
            ray.shutdown()
            self._ray = None
