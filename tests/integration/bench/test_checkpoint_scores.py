"""`bench time-to-score`'s scorer: one vLLM engine, built by the first call, scores checkpoints in every later
call on the same event loop, with other loops (the training runs') in between."""

import asyncio
from dataclasses import replace

from bench.checkpoint_scores import HeldOutScorer
from bench.time_to_score import QUICK
from engine.models.tiny import init_model


def test_one_engine_scores_every_call_and_the_same_weights_score_alike(tmp_path):
    model = str(init_model("tiny", tmp_path / "tiny"))
    scorer = HeldOutScorer(replace(QUICK, eval_problems=8))
    with asyncio.Runner() as scoring:
        try:
            first = scoring.run(scorer.scores([model]))
            asyncio.run(asyncio.sleep(0))  # a run's own event loop, between two scorings
            second = scoring.run(scorer.scores([model, model]))
            assert (scorer.started, scorer.versions) == (1, 3)
        finally:
            scoring.run(scorer.close())
    assert 0.0 <= first[model] <= 1.0 and second == first  # greedy: the same weights, the same answers
    assert scorer._engine is None
