"""What a run tells its user: lines in the terminal and in the Prefect UI, and the run's artifacts.

A line goes to the terminal (rich, one line per step) and to the current flow run's logs on the Prefect
server, which the UI shows under the run; it skips Prefect's console handler, so the terminal shows it
once. Artifacts follow Prefect's convention of one key per run whose versions are its history:

    <run>-metrics   a table of the step's metrics, one version per step
    <run>-progress  the share of the run's steps done, updated after each step
    <run>-summary   markdown at the end: held-out success before and after, beside the best constant
                    answer, wall time, and where the TensorBoard logs and the plot are
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    acreate_markdown_artifact,
    acreate_progress_artifact,
    aupdate_progress_artifact,
)
from prefect.logging.handlers import APILogHandler
from rich.console import Console
from rich.text import Text

console = Console(soft_wrap=True)  # one line per step, whatever the terminal width


def _ui_logger() -> logging.Logger:
    logger = logging.getLogger("rollart")
    if not any(isinstance(h, APILogHandler) for h in logger.handlers):
        logger.addHandler(APILogHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False  # not through Prefect's console handler: the terminal has the rich line
    return logger


def say(markup: str) -> None:
    """One line for the user: the terminal, and the logs of the flow run this is called in."""
    console.print(markup)
    _ui_logger().info(Text.from_markup(markup).plain)


def slug(s: str) -> str:
    """`s` as an artifact key (lowercase letters, digits and dashes)."""
    return "".join(c if c.isalnum() else "-" for c in s.lower())


async def start_progress(run_id: str, done: int, last: int) -> UUID:
    return await acreate_progress_artifact(
        progress=100.0 * done / last,
        key=f"{slug(run_id)}-progress",
        description=f"steps of {run_id} trained, of {last}",
    )


async def update_progress(artifact_id: UUID, done: int, last: int) -> None:
    await aupdate_progress_artifact(artifact_id, 100.0 * done / last)


def _score(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


async def summary_artifact(run_id: str, run_dir: Path, summary: dict[str, Any]) -> None:
    rows = [
        f"| {task} | {_score(e['before'])} | {_score(e['after'])} | {_score(e['baseline'])} "
        f"(always {e['baseline_answer']!r}) | {_score(e['lenient_before'])} → {_score(e['lenient_after'])} "
        f"| {e['n_eval']} | {e['overlap']} |"
        for task, e in summary["eval"].items()
    ]
    markdown = "\n".join(
        [
            f"# {run_id}: {summary['steps_this_run']} steps to step {summary['steps']} "
            f"in {summary['wall_s']:.0f} s",
            "",
            "Held-out problems, greedy, exact match (lenient: the right answer anywhere in the reply).",
            "",
            "| task | before | after | constant-answer baseline | lenient | held out | overlap |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Model `{summary['model']}`. Run directory `{run_dir}`: TensorBoard logs in `tensorboard/`, "
            "the plot in `progress.png`, every step in `metrics.jsonl`.",
        ]
    )
    await acreate_markdown_artifact(markdown, key=f"{slug(run_id)}-summary", description=f"{run_id}: results")
