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


class FailureReason(enum.StrEnum):
    """Why a trajectory ended FAILED or ABORTED (`Failure.reason`)."""

    EPISODE_ERROR = "episode_error"  # FAILED: the env or the generation engine raised mid-episode
    ENV_INIT = "env_init"  # FAILED: the env could not be built
    ENV_TIMEOUT = "env_timeout"  # FAILED: an env reset or step took too long
    OBSERVATION_TOO_LONG = "observation_too_long"  # FAILED: not one turn fits the context
    REWARD_FAILED = "reward_failed"  # FAILED: the scorer kept failing
    REWARD_NOT_FINITE = "reward_not_finite"  # FAILED: NaN or infinite score
    GENERATION_ABORTED = "generation_aborted"  # ABORTED by the engine
    STALE = "stale"  # ABORTED: started too long ago for the next batch (staleness bound)
    REDUNDANT = "redundant"  # ABORTED: the group's first G members are known without it
    GROUP_DROPPED = "group_dropped"  # ABORTED: its group was dropped whole (`detail` says why)
    SHUTDOWN = "shutdown"  # ABORTED: the rollout stopped
    CANCELLED_BEFORE_START = "cancelled_before_start"  # ABORTED before its episode began


@dataclass(frozen=True)
class Failure:
    """Why a trajectory ended FAILED or ABORTED: the `reason` code branches on and counts, and the text a
    person reads. `error` is the type name of the exception behind it, where one was raised."""

    reason: FailureReason
    detail: str = ""  # e.g. the exception's message, or the versions behind a stale abort
    error: str = ""

    @property
    def counted_as(self) -> str:
        """The scheduler counts a failed member as `member_failed_<this>`: an error raised mid-episode by
        its exception's type (which fault it is), any other failure by its reason."""
        return self.error if self.reason is FailureReason.EPISODE_ERROR else self.reason.value

    def __str__(self) -> str:
        """`reason: error: detail`, leaving out what is empty; an error raised mid-episode is named by its
        exception alone (`RuntimeError: sandbox died`)."""
        head = "" if self.reason is FailureReason.EPISODE_ERROR else self.reason.value
        return ": ".join(part for part in (head, self.error, self.detail) if part)


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
    failure: Failure | None = None  # when FAILED or ABORTED
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
