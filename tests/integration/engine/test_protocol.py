"""The per-iteration protocol end to end in one process: tiny model, HF engine, FrozenLake, real trainer.

Scenario tests for staleness: with rollart α=1 no trained sample started more than one version before
the trainer's version; in areal mode long trajectories spanning 2+ versions do reach training.
"""

import asyncio

import pytest
import ray

from engine.envs.base import Env, EnvStep
from engine.envs.frozenlake import FrozenLakeEnv
from engine.evaluate import evaluate
from engine.models.tiny import init_model
from engine.models.tokenizer import load_tokenizer
from engine.protocol import Collaborators, IterationProtocol
from engine.rollout.chat import ChatFormat
from engine.rollout.env_manager import TurnLimits
from engine.rollout.gen_worker import GenerationWorker
from engine.rollout.proxy import GenSlot, LLMProxy
from engine.rollout.scheduler import TaskSpec
from engine.rollout.service import RolloutService
from engine.train.train_worker import TrainWorker
from engine.types import GenRequest, SamplingParams
from infra.weightstore import InMemoryStore


class SlowSeeds(Env):
    """FrozenLake whose every step takes `slow_s` for one seed in `every` (whole groups are slow)."""

    name = "slow-frozenlake"

    def __init__(self, slow_s: float, every: int):
        self.inner, self.slow_s, self.every, self.slow = FrozenLakeEnv(), slow_s, every, False
        self.instructions = self.inner.instructions

    async def reset(self, seed: int) -> str:
        self.slow = seed % self.every == 0
        return await self.inner.reset(seed)

    async def step(self, action: str) -> EnvStep:
        await asyncio.sleep(self.slow_s if self.slow else 0.0)
        return await self.inner.step(action)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(init_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0))


def build(model_dir: str, mode: str, alpha: int, slow_s: float = 0.0, every: int = 3):
    store = InMemoryStore()
    common = {"store": store, "run_id": "r"}
    trainer = TrainWorker(
        "train-0",
        0,
        1,
        "compute",
        "gpu-compute",
        {"model_dir": model_dir, "trainer": {"lr": 1e-3, "micro_batch_size": 32}, **common},
    )
    gen = GenerationWorker(
        "gen-0",
        0,
        1,
        "bandwidth",
        "gpu-bandwidth",
        {"backend": {"kind": "hf", "model_dir": model_dir, "max_batch": 64}, **common},
    )
    proxy = LLMProxy([GenSlot("gen-0", "gpu-bandwidth", gen, capacity=64)])
    task = TaskSpec("frozenlake", "frozenlake", {}, 1.0, 4, TurnLimits(8, 3, 512), "prefill-heavy")
    rollout = RolloutService(
        [task],
        model_dir,
        proxy,
        mode,
        alpha,
        concurrency=16,
        redundancy=0,
        batch_groups=2,
        seed=1,
        env_factory=lambda spec: SlowSeeds(slow_s, every),
    )
    return (
        IterationProtocol(
            Collaborators(rollout, proxy, trainer, [gen]), mode, batch_groups=2, get_batch_timeout_s=120
        ),
        trainer,
        gen,
        rollout,
    )


def record_batches(rollout: RolloutService, seeds: list[int] | None = None) -> list[str]:
    """The ids of the groups each batch hands the trainer, in order (and their problems into `seeds`)."""
    taken: list[str] = []
    get_batch = rollout.get_batch

    async def recording(*args, **kwargs):
        groups = await get_batch(*args, **kwargs)
        taken.extend(g.group_id for g in groups)
        if seeds is not None:
            seeds.extend(g.seed for g in groups)
        return groups

    rollout.get_batch = recording
    return taken


async def run_steps(proto: IterationProtocol, rollout: RolloutService, n: int) -> list[dict]:
    await proto.start()
    try:
        return [await proto.step() for _ in range(n)]
    finally:
        await rollout.stop()


@pytest.mark.parametrize(("mode", "alpha"), [("rollart", 1), ("areal", 1), ("rollart", 2), ("areal", 2)])
async def test_continuous_modes_train_every_sample_within_alpha_in_launch_order(model_dir, mode, alpha):
    # one group in four is slow (1 s per env step, several versions long): the trainer waits for it in
    # its turn instead of training the fast ones past it, and the admission starts nothing the bound
    # would have to drop
    proto, trainer, gen, rollout = build(model_dir, mode, alpha=alpha, slow_s=1.0, every=4)
    assert not ray.is_initialized()  # workers built in the driver must not start a Ray instance
    taken = record_batches(rollout)
    metrics = await run_steps(proto, rollout, 5)
    assert [m["version"] for m in metrics] == [1, 2, 3, 4, 5] and trainer.version() == 5
    assert all(m["trained_at_version"] - m["min_start_version"] <= alpha for m in metrics)
    assert max(m["staleness_max"] for m in metrics) >= 1  # rollout did run ahead of the trainer
    assert gen.version() == 4  # serving the weights the last batch was trained from
    stats = rollout.stats()
    assert stats["counts"].get("aborted_stale_in_flight", 0) == 0
    assert stats["buffer"].get("buffer_evicted_stale", 0) == 0
    assert taken == [f"g{i}" for i in range(10)]  # the first ten groups started, in order: none skipped


@pytest.mark.parametrize("mode", ["sync", "sync+", "one-off"])
async def test_wave_modes_bound_staleness(model_dir, mode):
    proto, trainer, _, rollout = build(model_dir, mode, alpha=0 if mode != "one-off" else 1)
    metrics = await run_steps(proto, rollout, 3)
    # one-off: the first batch came from v0 while at v0; later ones were generated one version behind
    assert [m["staleness_max"] for m in metrics] == ([0, 1, 1] if mode == "one-off" else [0, 0, 0])
    assert trainer.version() == 3


async def test_after_update_the_engine_greedy_output_equals_the_trainer(model_dir):
    proto, trainer, gen, rollout = build(model_dir, "rollart", alpha=1)
    await run_steps(proto, rollout, 2)
    assert await proto.serve_latest() == 2  # bring the engine to the trainer's latest weights
    prompts = [[1, 5, 9, 13, 200], [42, 7, 7, 300, 2, 11]]
    want = trainer.greedy(prompts, max_tokens=6)
    for i, p in enumerate(prompts):
        req = GenRequest(f"g{i}", p, SamplingParams(temperature=0.0, max_tokens=6))
        out = await gen.generate(req)
        assert out.version == trainer.version() == 2
        assert out.token_ids[: len(want[i])] == want[i]


@pytest.mark.parametrize(
    ("mode", "alpha", "bound"),
    [
        ("sync", 0, [0, 0]),
        ("sync+", 0, [0, 0]),
        ("one-off", 1, [0, 1]),
        ("areal", 1, [1, 1]),
        ("rollart", 1, [1, 1]),
    ],
)
async def test_a_resumed_run_keeps_the_mode_bound_and_goes_on_with_the_problem_sequence(
    model_dir, tmp_path, mode, alpha, bound
):
    """Two steps, a checkpoint (trainer + the scheduler's RNG and group count, as `save_checkpoint` writes
    it), then everything built again as a new process would and restored as `restore_checkpoint` does:
    the versions go on, the mode's bound holds from the first resumed step, and the problems go on
    instead of replaying the first run's."""
    proto, trainer, _, rollout = build(model_dir, mode, alpha)
    first: list[int] = []
    record_batches(rollout, first)
    await run_steps(proto, rollout, 2)
    saved = rollout.scheduler_state()
    path = trainer.save(str(tmp_path), {"step": 2, "scheduler": saved})

    proto, trainer, gen, rollout = build(model_dir, mode, alpha)
    assert trainer.load(path)["scheduler"] == saved
    rollout.restore_scheduler(saved)
    resumed: list[int] = []
    taken = record_batches(rollout, resumed)
    metrics = await run_steps(proto, rollout, 2)
    assert [m["version"] for m in metrics] == [3, 4]
    assert gen.version() == (4 if alpha == 0 else 3)  # on-policy modes sync at once, the others a step on
    stale = [m["staleness_max"] for m in metrics]
    assert all(s <= b for s, b in zip(stale, bound, strict=True)), stale  # as in a run never stopped
    assert all(m["trained_at_version"] - m["min_start_version"] <= alpha for m in metrics)
    assert int(taken[0][1:]) >= saved["next_group"]  # group ids go on past everything started before
    assert not set(resumed) & set(first), (first, resumed)  # a fresh RNG would replay these problems


@pytest.mark.parametrize("mode", ["sync", "sync+", "one-off", "areal", "rollart"])
async def test_final_evaluation_scores_the_last_trained_version(model_dir, mode):
    proto, trainer, _, rollout = build(model_dir, mode, alpha=0 if mode in ("sync", "sync+") else 1)
    await run_steps(proto, rollout, 2)
    assert await proto.serve_latest() == trainer.version() == 2
    held_out = TaskSpec(
        "lake",
        "frozenlake",
        {"random_map": True, "eval_fraction": 0.2},
        1.0,
        4,
        TurnLimits(3, 3, 512),
        "prefill-heavy",
        eval_problems=4,
    )
    chat = ChatFormat(load_tokenizer(model_dir))
    [res] = (await evaluate([held_out], chat, proto.c.proxy)).values()
    assert res["versions"] == [2] and res["n_eval"] == 4
