"""Records that cross actor boundaries: generation requests/outputs, turns, trajectories, groups.

Everything here is a plain dataclass (picklable, cheap to send through Ray). Tensors never live here;
they travel as Ray object refs or through the weight store.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Profile(enum.StrEnum):
    """Workload tag of a task: which hardware pool its generation prefers (paper §4)."""

    PREFILL_HEAVY = "prefill-heavy"  # many turns, long contexts, short actions -> compute-optimised
    DECODE_HEAVY = "decode-heavy"  # few turns, long generations -> bandwidth-optimised


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 32
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None


@dataclass
class GenRequest:
    """One generation call: the full context as token ids (the engine reuses cached prefixes)."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    task: str = ""
    profile: str = Profile.DECODE_HEAVY.value
    trajectory_id: str = ""  # requests of one trajectory stick to one worker (prefix-cache reuse)


@dataclass
class GenOutput:
    request_id: str
    token_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each generated token under `version`
    version: int  # policy version of the weights that produced these tokens
    finish_reason: str  # "stop" | "length" | "abort"
    worker: str = ""
    timings: dict[str, float] = field(default_factory=dict)


class TrajStatus(enum.StrEnum):
    RUNNING = "running"
    DONE = "done"  # env said done
    TRUNCATED = "truncated"  # hit max turns or max context (flagged, not an error)
    ABORTED = "aborted"  # cancelled: redundant member, or started too long ago (staleness bound)
    FAILED = "failed"  # env/reward/generation failure; never reaches a batch


@dataclass
class Turn:
    """One (observation, action) exchange. Token ids are the exact delta appended to the context."""

    observation: str
    obs_ids: list[int]  # context tokens added before the action (observation + chat framing)
    action_text: str
    action_ids: list[int]
    action_logprobs: list[float]
    version: int
    env_reward: float = 0.0
    gen_s: float = 0.0
    env_s: float = 0.0


@dataclass
class Trajectory:
    traj_id: str
    group_id: str
    task: str
    seed: int
    start_version: int = -1  # version of the first generated turn; -1 until then
    turns: list[Turn] = field(default_factory=list)
    status: TrajStatus = TrajStatus.RUNNING
    reward: float | None = None  # score from the reward stage
    failure: str = ""  # reason, when FAILED or ABORTED
    info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def versions(self) -> list[int]:
        return [t.version for t in self.turns]

    @property
    def env_return(self) -> float:
        return sum(t.env_reward for t in self.turns)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(t.action_ids) for t in self.turns)


@dataclass
class Group:
    """A GRPO group: G trajectories of the same task and seed. Trained whole or not at all."""

    group_id: str
    task: str
    seed: int
    size: int
    members: list[Trajectory] = field(default_factory=list)

    @property
    def start_version(self) -> int:
        return min((m.start_version for m in self.members), default=-1)

    @property
    def complete(self) -> bool:
        return len(self.members) >= self.size
