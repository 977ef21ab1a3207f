"""Selection bias: is what gets trained a fair sample of what was started?

An asynchronous mode that trains the groups that finish first, or aborts the ones that run long, trains
short episodes more often than they occur. `SelectionBias` tallies, per task and since the start of the
run, every trajectory that ended (done, truncated, failed or aborted: the *started* population, each
counted once when it ends) beside every trajectory handed to the trainer, and reports for both the mean
turns, mean generated tokens and success rate (success over the episodes that finished), plus the share
of all generated tokens that went into aborted trajectories. Trained and started means that differ by
more than noise mean the mode selects by speed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from engine.types import Group, Trajectory, TrajStatus

_FINISHED = (TrajStatus.DONE, TrajStatus.TRUNCATED)


@dataclass
class _Tally:
    episodes: int = 0
    turns: int = 0
    tokens: int = 0
    finished: int = 0
    successes: int = 0

    def add(self, t: Trajectory) -> None:
        self.episodes += 1
        self.turns += len(t.turns)
        self.tokens += t.num_action_tokens
        if t.status in _FINISHED:
            self.finished += 1
            self.successes += bool(t.info.get("success"))

    def means(self, prefix: str) -> dict[str, float]:
        n = max(self.episodes, 1)
        out = {f"{prefix}_mean_turns": self.turns / n, f"{prefix}_mean_tokens": self.tokens / n}
        if self.finished:
            out[f"{prefix}_success"] = self.successes / self.finished
        return out


class SelectionBias:
    """Cumulative per-task tallies of started (ended) and trained trajectories."""

    def __init__(self) -> None:
        self._started: dict[str, _Tally] = defaultdict(_Tally)
        self._trained: dict[str, _Tally] = defaultdict(_Tally)
        self._tokens = 0
        self._aborted_tokens = 0

    def ended(self, trajectories: Iterable[Trajectory]) -> None:
        for t in trajectories:
            self._started[t.task].add(t)
            self._tokens += t.num_action_tokens
            if t.status == TrajStatus.ABORTED:
                self._aborted_tokens += t.num_action_tokens

    def trained(self, groups: Iterable[Group]) -> None:
        for g in groups:
            for m in g.members:
                self._trained[m.task].add(m)

    def metrics(self) -> dict[str, float]:
        """`bias/<task>/{trained,started}_{mean_turns,mean_tokens,success}` and `bias/aborted_token_frac`."""
        out: dict[str, float] = {"bias/aborted_token_frac": self._aborted_tokens / max(self._tokens, 1)}
        for task in sorted(self._started.keys() | self._trained.keys()):
            for prefix, tally in (("trained", self._trained[task]), ("started", self._started[task])):
                out.update({f"bias/{task}/{k}": v for k, v in tally.means(prefix).items()})
        return out
