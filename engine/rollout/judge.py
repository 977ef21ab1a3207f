"""An LLM judge as a reward function, servable on a scale-to-zero endpoint (paper §6.2).

The judge reads `judge_payload(traj)` (JSON, no token ids), asks a model "Task: … Answer: … Is the answer
correct?" and turns the greedy reply into a score:

- **Verdict by text**, not by log-probs: the reply's first word decides — "yes" → 1.0, "no" → 0.0, and
  anything else → 0.0 (a judge that does not say yes has not accepted the answer). A `GenerationBackend`
  reports the log-prob of the sampled token only, not of the alternative, so a P(yes)/(P(yes)+P(no)) score
  is not available through it. Generation is greedy, so the same payload always gets the same score.
- **Task** is the first observation (the problem statement, head kept) and **answer** the last action
  (tail kept), each cut to `max_field_chars` so a long trajectory still fits the judge's context.

`make_judge(model_dir)` is the factory a Serve replica calls once (`infra.serve.deploy_function`), so the
model is loaded once per replica, not per call; `serverless_scorer(client)` is the `RewardScorer` score
function that calls such an endpoint. On the CPU default the judge is the random-init tiny model, whose
verdicts mean nothing: what is real is the path — a model loaded once per replica, scoring over HTTP.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.rollout.reward import ScoreFn, judge_payload
from engine.types import GenRequest, SamplingParams, Trajectory
from infra.serverless import ServerlessClient

if TYPE_CHECKING:
    from engine.backends.base import GenerationBackend

_VERDICT = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
SCORES = {"yes": 1.0, "no": 0.0}


def verdict_score(reply: str) -> float:
    """1.0 if the reply starts with "yes", else 0.0 (see the module docstring)."""
    match = _VERDICT.match(reply)
    return SCORES[match.group(1).lower()] if match else 0.0


class LLMJudge:
    """Scores a `judge_payload` with greedy generation on any `GenerationBackend`."""

    def __init__(
        self, backend: GenerationBackend, tokenizer: Any, max_tokens: int = 4, max_field_chars: int = 1000
    ) -> None:
        self.backend, self.tokenizer = backend, tokenizer
        self.max_tokens, self.max_field_chars = max_tokens, max_field_chars

    def prompt(self, payload: dict[str, Any]) -> str:
        """The judge's question as chat-template text, ending where the model's reply begins."""
        turns = payload.get("turns") or []
        if not turns:
            raise ValueError(f"judge: trajectory of task {payload.get('task')!r} has no turns to judge")
        task = turns[0]["observation"][: self.max_field_chars]
        answer = turns[-1]["action"][-self.max_field_chars :]
        question = (
            f"Task ({payload['task']}): {task}\nAnswer: {answer}\nIs the answer correct? Reply yes or no."
        )
        messages = [{"role": "user", "content": question}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    async def __call__(self, payload: dict[str, Any]) -> float:
        prompt_ids = self.tokenizer.encode(self.prompt(payload), add_special_tokens=False)
        request = GenRequest(
            request_id=f"judge-{uuid.uuid4().hex}",
            prompt_ids=list(prompt_ids),
            sampling=SamplingParams(temperature=0.0, max_tokens=self.max_tokens),
            task="judge",
        )
        out = await self.backend.generate(request)
        return verdict_score(self.tokenizer.decode(out.token_ids, skip_special_tokens=True))


def make_judge(model_dir: str | Path, max_tokens: int = 4) -> LLMJudge:
    """Load the judge model and tokenizer from `model_dir` (HF format) onto the CPU HF backend (imported here,
    in the replica: a process that only calls the endpoint never loads torch)."""
    from engine.backends.hf import HFBackend
    from engine.models.tokenizer import load_tokenizer

    return LLMJudge(HFBackend(model_dir), load_tokenizer(str(model_dir)), max_tokens=max_tokens)


def serverless_scorer(client: ServerlessClient) -> ScoreFn:
    """A `RewardScorer` score function that sends `judge_payload(traj)` to a judge endpoint."""

    async def score(traj: Trajectory) -> float:
        return float(await client.acall(judge_payload(traj)))

    return score
