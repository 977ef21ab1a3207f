import json
from pathlib import Path

from flows.observe import plot


def test_plot_draws_each_task_and_skips_a_run_without_metrics(tmp_path: Path) -> None:
    assert plot(tmp_path) is None  # nothing trained yet: no picture, no error
    rows = [
        {
            "step": s,
            "reward_mean": 0.1 * s,
            "tokens_per_s_rollout": 100.0,
            "rollout/frozenlake/success": s % 2,
        }
        | ({"rollout/reasoning_gym/leg_counting/success": 0.5} if s % 3 else {})
        for s in range(1, 13)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = plot(tmp_path)
    assert out == tmp_path / "progress.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
