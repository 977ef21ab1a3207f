"""Where a run's numbers go: metrics.jsonl, eval.jsonl (held-out evaluations), TensorBoard events, a
version of the run's Prefect table artifact per iteration, and a PNG of success, reward and throughput
at the end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from prefect.artifacts import acreate_table_artifact


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class MetricsSink:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / "metrics.jsonl"
        self.tb = SummaryWriter(str(run_dir / "tensorboard"))

    async def write(self, step: int, metrics: dict[str, Any], artifact_key: str | None = None) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}, default=str) + "\n")
        for k, v in _scalars(metrics).items():
            self.tb.add_scalar(k, v, step)
        self.tb.flush()
        if artifact_key:
            rows = [{"metric": k, "value": round(v, 6)} for k, v in sorted(_scalars(metrics).items())]
            await acreate_table_artifact(rows, key=artifact_key, description=f"metrics of step {step}")

    async def write_eval(self, step: int, results: dict[str, dict[str, Any]]) -> None:
        """One held-out evaluation: a row of eval.jsonl and `eval/TASK/METRIC` scalars."""
        row = {name: _scalars(r) for name, r in results.items()}
        with (self.path.parent / "eval.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, **row}) + "\n")
        for name, values in row.items():
            for k, v in values.items():
                self.tb.add_scalar(f"eval/{name}/{k}", v, step)
        self.tb.flush()

    def close(self) -> None:
        self.tb.close()


def read_eval(run_dir: Path) -> list[dict[str, Any]]:
    """The run's held-out evaluations in step order (a resumed run may have redone a step: last wins)."""
    path = run_dir / "eval.jsonl"
    if not path.exists():
        return []
    rows = {
        r["step"]: r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    }
    return [rows[s] for s in sorted(rows)]


def plot(run_dir: Path) -> Path | None:
    """Per-task rollout success, held-out success, reward and throughput -> run_dir/progress.png.

    Success per task is the share of that task's trajectories finished in the step that reached their goal,
    smoothed over the last 10 steps (a step finishes only a few of each)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    from matplotlib.figure import Figure  # no pyplot: leaves the caller's (e.g. a notebook's) backend alone

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    fig = Figure(figsize=(20, 3.5))
    ax0, axe, ax1, ax2 = fig.subplots(1, 4)
    tasks = sorted({k.split("/", 1)[1].rsplit("/", 1)[0] for r in rows for k in r if k.endswith("/success")})
    for task in tasks:
        seen = [(r["step"], r[f"rollout/{task}/success"]) for r in rows if f"rollout/{task}/success" in r]
        smooth = [
            sum(v for _, v in seen[max(0, i - 9) : i + 1]) / len(seen[max(0, i - 9) : i + 1])
            for i in range(len(seen))
        ]
        ax0.plot([s for s, _ in seen], smooth, label=task)
    ax0.set(xlabel="step", ylabel="success (10-step mean)", title="rollout success per task", ylim=(0, 1))
    if tasks:
        ax0.legend(fontsize=8)
    curve = read_eval(run_dir)
    for task in sorted({k for r in curve for k in r if k != "step"}):
        seen = [(r["step"], r[task]["success"]) for r in curve if task in r]
        axe.plot([s for s, _ in seen], [v for _, v in seen], marker="o", label=task)
    axe.set(xlabel="step", ylabel="exact-match success", title="held-out problems (greedy)", ylim=(0, 1))
    if curve:
        axe.legend(fontsize=8)
    ax1.plot(steps, [r.get("reward_mean", float("nan")) for r in rows], marker=".")
    ax1.set(xlabel="step", ylabel="mean reward of the trained batch", title="reward")
    ax2.plot(steps, [r.get("tokens_per_s_rollout", float("nan")) for r in rows], marker=".", label="rollout")
    ax2.set(xlabel="step", ylabel="generated tokens / s", title="throughput")
    fig.tight_layout()
    out = run_dir / "progress.png"
    fig.savefig(out, dpi=100)
    return out
