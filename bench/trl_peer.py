"""TRL's `GRPOTrainer` on the task rollart trains, set up as a TRL user would, for `bench vs-trl`.

The prompts are the env's own first turn (its instructions as the system message, the problem as the user
turn: the same chat template renders them as rollart's `ChatFormat` does) and the reward function is the
same env's `step`: every completion gets its own env, reset to its problem and stepped with the reply. In
`waiting-env` each of those envs is wrapped in the same `LatencyEnv` (a seeded N(mu, sigma) ms sleep per
reset and per step); the reward function is async, so all of a batch's envs wait at once (TRL gathers it on
its own event loop), which is the best a single-turn TRL user can do. TRL generates with HF `generate` (no
vLLM on a CPU), takes one optimiser step per generation batch and trains every completion in one pass.

TRL is an optional peer (`pip install rollart[peers]`; `make install` has it): imported only here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from engine.envs.base import Env


@dataclass(frozen=True)
class PeerRun:
    """One system's run as `bench vs-trl` compares them (the TRL side; rollart's is built alike)."""

    model_dir: str
    env_args: dict[str, Any]
    prompts: int  # per step
    group_size: int
    completion_tokens: int
    lr: float
    temperature: float
    threads: int
    steps: int  # measured and warm-up steps together
    seed: int
    wait_ms: tuple[float, float] | None  # (mu, sigma) of each env call's sleep; None: no waiting


def _env(run: PeerRun, k: int | None = None) -> Env:
    """The task's env; the `k`-th built for the reward function waits as the setting says."""
    from engine.envs.latency import LatencyEnv
    from engine.envs.registry import make_env

    env = make_env("reasoning_gym", **run.env_args)
    if run.wait_ms is None or k is None:
        return env
    return LatencyEnv(env, run.wait_ms, run.wait_ms, seed=run.seed * 100_000 + k, time_scale=1e-3)


def dataset_rows(run: PeerRun) -> list[dict[str, Any]]:
    """One row per prompt the run will pose: the env's first turn as chat messages, and its problem seed."""
    env = _env(run)
    rows = []
    for i in range(run.steps * run.prompts):
        problem = run.seed * 1_000_003 + i
        obs = asyncio.run(env.reset(problem))
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": env.instructions},
                    {"role": "user", "content": obs},
                ],
                "problem": problem,
            }
        )
    return rows


def env_reward(run: PeerRun) -> Any:
    """TRL's reward function: the env's score of each completion, every env of a batch awaited at once."""
    built = iter(range(1, 1 << 62))

    async def reward(completions: list[Any], problem: list[int], **_: Any) -> list[float]:
        async def one(completion: Any, seed: int) -> float:
            env = _env(run, next(built))
            await env.reset(seed)
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            return float((await env.step(text)).reward)

        return list(await asyncio.gather(*(one(c, p) for c, p in zip(completions, problem, strict=True))))

    return reward


def _config(run: PeerRun, out_dir: str) -> Any:
    """TRL's GRPOConfig of `run`: a step is `prompts` prompts x G completions in one pass, fp32, CPU."""
    from trl import GRPOConfig

    completions = run.prompts * run.group_size
    return GRPOConfig(
        output_dir=out_dir,
        max_steps=run.steps,
        per_device_train_batch_size=completions,  # one step = `prompts` prompts x G completions, one pass
        gradient_accumulation_steps=1,
        num_generations=run.group_size,
        max_completion_length=run.completion_tokens,
        learning_rate=run.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        temperature=run.temperature,
        beta=0.0,
        num_iterations=1,
        max_grad_norm=1.0,
        use_cpu=True,
        bf16=False,
        seed=run.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def train(run: PeerRun, out_dir: str) -> dict[str, Any]:
    """Train `run.steps` GRPO steps with TRL; per step: wall, rollout (generate + score) and train seconds,
    completion tokens and mean reward; and the start-up seconds (trainer built, to the first step)."""
    import os

    import torch
    from datasets import Dataset

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOTrainer

    from engine.backends.threads import set_threads

    hf_logging.set_verbosity_error()
    threads = torch.get_num_threads()  # the caller's, restored after training
    # (in `bench all` a vLLM engine may have run in this process, which makes torch.set_num_threads a no-op)
    set_threads(run.threads)
    t_start = time.perf_counter()
    config = _config(run, out_dir)
    steps: list[dict[str, Any]] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            steps.append({"begin": time.perf_counter(), "rollout_s": 0.0, "tokens": 0})

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            steps[-1]["step_s"] = time.perf_counter() - steps[-1]["begin"]

    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(run.model_dir, dtype=torch.float32),
        processing_class=AutoTokenizer.from_pretrained(run.model_dir),
        reward_funcs=env_reward(run),
        args=config,
        train_dataset=Dataset.from_list(dataset_rows(run)),
        callbacks=[Timer()],
    )
    generate = trainer._generate_and_score_completions  # measured, not changed

    def timed(inputs: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(inputs)
        steps[-1]["rollout_s"] += time.perf_counter() - t0
        steps[-1]["tokens"] += int(out["completion_mask"].sum())
        return out

    trainer._generate_and_score_completions = timed  # type: ignore[method-assign]
    try:
        trainer.train()
    finally:
        set_threads(threads)  # the caller's setting back (a test process goes on)
    startup_s = steps[0]["begin"] - t_start
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    for step, reward in zip(steps, rewards, strict=True):
        del step["begin"]
        step["reward_mean"] = reward
        step["train_s"] = step["step_s"] - step["rollout_s"]
    return {"startup_s": startup_s, "warm_start": False, "steps": steps}
