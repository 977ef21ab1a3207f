"""Benchmarks that reproduce the paper's experiments as ratios measured side by side in one run.

Each module exposes `add_arguments(parser)` and `run(args) -> dict` (the JSON it writes); the CLI
`rollart bench NAME` wires them up. They are not timed tests: they print a table, write `--json PATH`
and, where a picture helps, a PNG next to it.
"""

BENCHMARKS: dict[str, str] = {
    "rollout-granularity": "bench.rollout_granularity",
    "proxy-overhead": "bench.proxy_overhead",
    "affinity": "bench.affinity",
    "pd": "bench.pd",
    "serverless": "bench.serverless",
    "redundancy": "bench.redundancy",
    "scale": "bench.scale",
    "all": "bench.all",  # runs the others and writes report.md
}
