"""A benchmark's options as `rollart bench NAME` parses them, for the benchmarks' unit tests."""

import argparse
from collections.abc import Callable


def bench_parser(add_arguments: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """`--quick`, `--json` (the options every benchmark gets from the CLI) and the benchmark's own."""
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    add_arguments(p)
    return p
