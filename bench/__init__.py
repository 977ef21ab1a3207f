"""Benchmarks that reproduce the paper's experiments as ratios measured side by side in one run.

Each module exposes `add_arguments(parser)` and `run(args) -> dict` (the JSON it writes); the CLI
`rollart bench NAME` wires them up. They are not timed tests: they print a table, write `--json PATH`
and, where a picture helps, a PNG next to it.
"""

BENCHMARKS: dict[str, str] = {
    "rollout-granularity": "bench.rollout_granularity",
    "proxy-overhead": "bench.proxy_overhead",
    "faults": "bench.faults",
    "async-modes": "bench.async_modes",
    "alpha-sweep": "bench.alpha_sweep",
    "time-to-score": "bench.time_to_score",
    "weight-sync": "bench.weight_sync",
    "affinity": "bench.affinity",
    "pd": "bench.pd",
    "serverless": "bench.serverless",
    "redundancy": "bench.redundancy",
    "scale": "bench.scale",
    "vs-trl": "bench.vs_trl",  # rollart beside TRL's GRPOTrainer (needs the peers extra: trl)
    "all": "bench.all",  # runs the others and writes report.md
}
