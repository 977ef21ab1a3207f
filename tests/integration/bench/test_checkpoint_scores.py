"""`bench time-to-score`'s scorer: one vLLM engine, built by the first call (or in the background from
`begin`), scores checkpoints in every later call on the same event loop, with other loops (the training
runs') in between."""

import asyncio
from dataclasses import replace

import pytest

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


def test_an_engine_built_in_the_background_is_the_one_that_scores_and_a_failed_build_is_raised(tmp_path):
    model = str(init_model("tiny", tmp_path / "tiny"))
    scorer = HeldOutScorer(replace(QUICK, eval_problems=8))
    with asyncio.Runner() as scoring:
        try:
            scorer.begin(model)
            scorer.begin(model)  # building already: no second engine
            scorer.wait()
            assert scorer.started == 1 and scorer._engine is not None
            scores = scoring.run(scorer.scores([model]))
            assert (scorer.started, scorer.versions) == (1, 1) and 0.0 <= scores[model] <= 1.0
        finally:
            scoring.run(scorer.close())
    broken = HeldOutScorer(replace(QUICK, eval_problems=8))
    broken.begin(str(tmp_path / "no-such-model"))
    with pytest.raises(Exception, match="no-such-model"):
        broken.wait()
    assert broken.started == 0
    asyncio.run(broken.close())  # nothing to close, nothing raised
