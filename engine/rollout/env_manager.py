"""EnvManager: one environment's loop, `reset → (generate → step)*`, one trajectory at a time (§6.1).

Nothing here waits for other environments. Every turn keeps the exact token delta, the behaviour
log-probs, the policy version and timings. Max turns and max context end a trajectory as TRUNCATED
(flagged, not an error); a first observation too long for even one turn, env errors and timeouts end
it as FAILED with the reason; `should_abort` is consulted after every generation (the per-step
staleness bound), and the task can be cancelled at any await point (redundant members) — the caller
then marks it ABORTED.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from engine.envs.base import Env
from engine.rollout.chat import ChatFormat
from engine.types import (
    Failure,
    FailureReason,
    GenOutput,
    GenRequest,
    SamplingParams,
    Trajectory,
    TrajStatus,
    Turn,
)

AbortCheck = Callable[[Trajectory, int], Failure | None]  # (trajectory, version just served) -> why


class Generator(Protocol):
    async def generate(self, request: GenRequest) -> GenOutput: ...


@dataclass(frozen=True)
class TurnLimits:
    max_turns: int
    max_tokens: int  # generation budget per turn
    max_context: int  # tokens; the next turn must fit prompt + max_tokens
    temperature: float = 1.0
    env_timeout_s: float = 60.0
    # Text every reply starts with, prefilled after the generation prompt (e.g. "<answer>"): part of the
    # context, not of the trained action; the env reads prefix + generated text.
    response_prefix: str = ""


def _never(_traj: Trajectory, _version: int) -> Failure | None:
    return None


T = TypeVar("T")


async def _timed(aw: Awaitable[T], timeout_s: float) -> tuple[T, float]:
    t0 = time.perf_counter()
    async with asyncio.timeout(timeout_s):  # not wait_for: on 3.11 it can swallow a cancellation
        out = await aw
    return out, time.perf_counter() - t0


class EnvManager:
    def __init__(
        self,
        env: Env,
        chat: ChatFormat,
        generator: Generator,
        limits: TurnLimits,
        profile: str,
        should_abort: AbortCheck = _never,
    ):
        self.env, self.chat, self.gen, self.limits = env, chat, generator, limits
        self.profile = profile
        self.should_abort = should_abort
        prefix = limits.response_prefix
        self._prefix_ids = list(chat.tok.encode(prefix, add_special_tokens=False)) if prefix else []

    async def run(self, traj: Trajectory) -> Trajectory:
        """Play one episode into `traj` (mutated and returned). Raises only CancelledError."""
        t0 = time.perf_counter()
        try:
            await self._play(traj)
        except TimeoutError:
            self._end(traj, TrajStatus.FAILED, Failure(FailureReason.ENV_TIMEOUT))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken env or engine fails this trajectory, never the run
            failure = Failure(FailureReason.EPISODE_ERROR, str(e)[:200], type(e).__name__)
            self._end(traj, TrajStatus.FAILED, failure)
        finally:
            traj.timings["total_s"] = time.perf_counter() - t0
        return traj

    @staticmethod
    def _end(traj: Trajectory, status: TrajStatus, failure: Failure | None = None) -> None:
        traj.status = status
        if failure:
            traj.failure = failure

    @staticmethod
    def _truncate(traj: Trajectory, why: str) -> None:
        traj.status = TrajStatus.TRUNCATED
        traj.info["truncated"] = why

    def _request(self, traj: Trajectory, turn_no: int, context: list[int]) -> GenRequest:
        """Turn `turn_no`'s generation request: `context` continued under the sampling limits."""
        lim = self.limits
        return GenRequest(
            request_id=f"{traj.traj_id}/{turn_no}",
            prompt_ids=context,
            sampling=SamplingParams(
                temperature=lim.temperature, max_tokens=lim.max_tokens, stop_token_ids=[self.chat.stop_id]
            ),
            task=traj.task,
            profile=self.profile,
            trajectory_id=traj.traj_id,
        )

    async def _play(self, traj: Trajectory) -> None:
        lim = self.limits
        obs, env_s = await _timed(self.env.reset(traj.seed), lim.env_timeout_s)
        traj.timings["env_s"] = env_s
        obs_ids = self.chat.first(self.env.instructions, str(obs)) + self._prefix_ids
        if len(obs_ids) + lim.max_tokens > lim.max_context:  # not one turn fits: nothing to learn from
            return self._end(
                traj,
                TrajStatus.FAILED,
                Failure(
                    FailureReason.OBSERVATION_TOO_LONG,
                    f"{len(obs_ids)} prompt tokens + {lim.max_tokens} to generate "
                    f"> max_context {lim.max_context}",
                ),
            )
        context = list(obs_ids)
        for turn_no in range(lim.max_turns):
            if len(context) + lim.max_tokens > lim.max_context:
                return self._truncate(traj, "max_context")
            t_gen = time.perf_counter()
            # no timeout here: the proxy/engine own retries
            out = await self.gen.generate(self._request(traj, turn_no, context))
            gen_s = time.perf_counter() - t_gen
            if out.finish_reason == "abort":
                return self._end(traj, TrajStatus.ABORTED, Failure(FailureReason.GENERATION_ABORTED))
            if traj.start_version < 0:
                traj.start_version = out.version
            action = lim.response_prefix + self.chat.decode(out.token_ids)  # the reply as the env reads it
            turn = Turn(
                observation=str(obs),
                obs_ids=obs_ids,
                action_text=action,
                action_ids=out.token_ids,
                action_logprobs=out.logprobs,
                version=out.version,
                gen_s=gen_s,
            )
            traj.turns.append(turn)
            stale = self.should_abort(traj, out.version)
            if stale:
                return self._end(traj, TrajStatus.ABORTED, stale)
            step, turn.env_s = await _timed(self.env.step(action), lim.env_timeout_s)
            turn.env_reward = float(step.reward)
            traj.timings["env_s"] += turn.env_s
            traj.timings["gen_s"] = traj.timings.get("gen_s", 0.0) + gen_s
            if step.done:
                traj.info.update(step.info)
                return self._end(traj, TrajStatus.DONE)
            obs = step.observation
            obs_ids = self.chat.next(str(obs), out.token_ids) + self._prefix_ids
            context = [*context, *out.token_ids, *obs_ids]  # one copy: `a + b + c` makes two, each O(context)
        return self._truncate(traj, "max_turns")
