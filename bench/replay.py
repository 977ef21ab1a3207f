"""`rollart replay`: train the untrained model again on batches runs saved, in an order you choose, and score
the weights on the held-out questions, to tell what a run learned from apart from when it trained it.

Batches come from `train.save_batches` (a run's `batches/`, or `rollart bench time-to-score --batches-to`):
`--batches NAME=DIR` names a run's. A schedule (`--schedule`, repeatable) is a comma list of `NAME:STEPS`
items, STEPS one step or a range: `sync:1-8` is run `sync`'s batches as it trained them, `sync:1,sync:1-7`
the same one step late, `sync:1-2,fast:3-10` one run's first two then another's. Step k is the batch the
run trained at version k - 1 (`v<k-1>.pt`). Every schedule starts from the config's model with the trainer
config the batches were saved with (`trainer.json`, the same for every run a schedule reads, or it is
refused) and a new optimiser; the weights are scored every `--score-every` steps and after the last, greedy,
on the config's held-out questions (`bench/checkpoint_scores.py`), beside the untrained model's score and the
best constant answer's. Replaying a run's own batches in order should give its curve again: the check that
a replay says something about the run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import report
from bench.checkpoint_scores import HeldOutScorer
from bench.time_to_score import Settings

if TYPE_CHECKING:
    from engine.train.trainer import TrainerConfig

LOGGED = ("loss", "clip_frac", "ratio_mean", "grad_norm")  # per replayed step, from the trainer's stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="the experiment config the batches were trained under (model, held-out task)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--batches", action="append", required=True, metavar="NAME=DIR", help="a run's saved batches"
    )
    p.add_argument("--schedule", action="append", required=True, help="e.g. 'a:1-2,b:3-10' (repeatable)")
    p.add_argument("--score-every", type=report.at_least(int, 1), default=1, help="steps between scores")
    p.add_argument("--eval-problems", type=report.at_least(int, 1), default=120, help="held-out questions")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON here (and a PNG beside it)")


def sources(items: list[str]) -> dict[str, Path]:
    """'NAME=DIR' items → {NAME: DIR}; each DIR must hold `trainer.json` (`train.save_batches` writes it)."""
    out: dict[str, Path] = {}
    for item in items:
        name, sep, directory = item.partition("=")
        if not sep or not name or ":" in name or "," in name:
            raise ValueError(f"--batches {item!r}: expected NAME=DIR, NAME without ':' or ','")
        if name in out:
            raise ValueError(f"--batches {item!r}: {name!r} is named twice")
        if not (Path(directory) / "trainer.json").is_file():
            raise ValueError(f"--batches {item!r}: {directory} has no trainer.json (not a saved-batches dir)")
        out[name] = Path(directory)
    return out


def schedule(text: str, runs: dict[str, Path]) -> list[tuple[str, int]]:
    """'a:1-2,b:3' → [('a', 1), ('a', 2), ('b', 3)]; every batch must be on disk."""
    out: list[tuple[str, int]] = []
    for item in text.split(","):
        name, _, steps = item.strip().partition(":")
        first, _, last = steps.partition("-")
        if name not in runs:
            raise ValueError(
                f"--schedule {text!r}: {item!r} names no --batches run (known: {', '.join(runs)})"
            )
        if not first.isdigit() or not (last or first).isdigit() or not 1 <= int(first) <= int(last or first):
            raise ValueError(f"--schedule {text!r}: {item!r} is not NAME:K or NAME:K-L with 1 <= K <= L")
        for step in range(int(first), int(last or first) + 1):
            if not batch_path(runs[name], step).is_file():
                raise ValueError(f"--schedule {text!r}: run {name!r} saved no batch for step {step}")
            out.append((name, step))
    return out


def batch_path(directory: Path, step: int) -> Path:
    return directory / f"v{step - 1:05d}.pt"


def trainer_config(order: list[tuple[str, int]], runs: dict[str, Path]) -> TrainerConfig:
    """The trainer config every run in the schedule saved its batches with; refused if they differ."""
    from engine.train.batch_log import load_trainer_config

    configs = {name: load_trainer_config(runs[name]) for name, _ in order}
    first = next(iter(configs.values()))
    for name, config in configs.items():
        if config != first:
            diff = {k for k, v in dataclasses.asdict(config).items() if dataclasses.asdict(first)[k] != v}
            raise ValueError(f"--schedule mixes trainer configs: run {name!r} differs in {sorted(diff)}")
    return first


def replay(
    model_dir: str, order: list[tuple[str, int]], runs: dict[str, Path], score_every: int, out: Path
) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """Train a fresh trainer on the schedule's batches; save the weights at every scored step.
    Returns each step's record and the saved weights' directory by step."""
    from engine.train.batch_log import load_batch
    from engine.train.trainer import TorchTrainer

    trainer = TorchTrainer(model_dir, trainer_config(order, runs))
    log, saved = [], {}
    for step, (name, k) in enumerate(order, 1):
        stats = trainer.train_step(load_batch(batch_path(runs[name], k)))
        log.append({"step": step, "batch": f"{name}:{k}", **{key: stats.get(key) for key in LOGGED}})
        print(f"  step {step} ({name}:{k}): loss {stats['loss']:.4f}", flush=True)
        if step % score_every == 0 or step == len(order):
            saved[step] = str(out / f"step{step}")
            trainer.hf_model().save_pretrained(saved[step])
    return log, saved


def _plot(curves: list[dict[str, Any]], before: float, baseline: float, path: str | None) -> str:
    fig, ax = report.new_figure()
    for c in curves:
        steps = [0] + [int(s) for s in c["held_out"]]
        ax.plot(steps, [before, *c["held_out"].values()], marker="o", label=c["schedule"])
    ax.axhline(baseline, color="k", linestyle=":", label=f"constant answer {baseline:.2f}")
    ax.set(xlabel="replayed step", ylabel="held-out success", title="replayed batches")
    ax.legend(fontsize=7)
    return report.save_figure(fig, path, "replay.png")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.actor_args import task_specs
    from engine.config import load_config
    from engine.evaluate import majority_baseline
    from engine.experiment import Experiment

    try:  # every item read and refused, naming it, before any training
        runs = sources(args.batches)
        orders = {text: schedule(text, runs) for text in args.schedule}
        for order in orders.values():
            trainer_config(order, runs)
    except ValueError as e:
        raise SystemExit(f"replay: {e}") from None
    s = Settings(config=args.file, overrides=tuple(args.overrides), eval_problems=args.eval_problems)
    cfg = load_config(Path(args.file), [*s.overrides, f"tasks.0.eval_problems={s.eval_problems}"])
    baseline = asyncio.run(majority_baseline(task_specs(cfg)[0]))["success"]
    scorer, rows, curves = HeldOutScorer(s), [], []
    with asyncio.Runner() as scoring, tempfile.TemporaryDirectory(prefix="rollart-replay-") as tmp:
        model_dir = Experiment(cfg, run_dir=Path(tmp) / "run").prepare_model()  # the runs' starting weights
        try:
            before = scoring.run(scorer.scores([model_dir]))[model_dir]
            for i, (text, order) in enumerate(orders.items()):
                print(f"schedule {text}: {len(order)} steps", flush=True)
                log, saved = replay(model_dir, order, runs, args.score_every, Path(tmp) / f"s{i}")
                scores = scoring.run(scorer.scores(list(saved.values())))
                for record in log:
                    path = saved.get(record["step"])
                    rows.append({"schedule": text, **record, "held_out": scores[path] if path else None})
                curves.append({"schedule": text, "held_out": {step: scores[p] for step, p in saved.items()}})
                for path in saved.values():
                    shutil.rmtree(path)
        finally:
            scoring.run(scorer.close())
    note = (
        f"held-out exact success on {s.eval_problems} questions: untrained {before:.3f}, best constant "
        f"answer {baseline:.3f}. Each schedule from the untrained weights with a new optimiser.\n"
    )
    steps = sorted({step for c in curves for step in c["held_out"]})  # schedules differ in length
    table = [
        {"schedule": c["schedule"], **{f"step {k}": c["held_out"].get(k, "—") for k in steps}} for c in curves
    ]
    report.print_table("Replayed batches", table, note)
    payload = {
        "rows": rows,
        "curves": curves,
        "note": note,
        "config": {
            "file": args.file,
            "overrides": list(s.overrides),
            "batches": {k: str(v) for k, v in runs.items()},
        },
        "before": before,
        "baseline": baseline,
        "png": _plot(curves, before, baseline, args.json),
    }
    report.write_json(args.json, json.loads(json.dumps(payload)))
    return payload
