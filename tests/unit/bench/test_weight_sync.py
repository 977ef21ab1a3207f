import argparse
import math

import pytest

from bench.report import pick_settings
from bench.weight_sync import FULL, QUICK, MiB, add_arguments, hidden_fraction, layer_shapes, summarize


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    add_arguments(p)
    return p


def test_options_override_the_quick_or_full_base():
    assert pick_settings(parser().parse_args([]), FULL, QUICK) == FULL
    got = pick_settings(
        parser().parse_args(["--quick", "--stores", "ray", "--model-mb", "4,8", "--window-s", "0"]),
        FULL,
        QUICK,
    )
    assert (got.stores, got.model_mb, got.bucket_mb, got.window_s) == (("ray",), (4, 8), QUICK.bucket_mb, 0.0)


@pytest.mark.parametrize(
    "argv", [["--stores", "s3"], ["--model-mb", "0"], ["--bucket-mb", "x"], ["--steps", "0"]]
)
def test_bad_options_are_refused(argv):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)


@pytest.mark.parametrize("mb", [1, 16, 128, 512])
def test_layer_shapes_fill_the_size_with_whole_layers(mb):
    shapes = layer_shapes(mb * MiB)
    nbytes = 4 * sum(math.prod(s) for s in shapes)
    assert len(shapes) % 9 == 0  # q k v o, gate up down, two norms
    assert 0.75 * mb * MiB <= nbytes <= 1.25 * mb * MiB


def test_hidden_fraction_by_hand():
    # push 0.1 + 0.1, pull 0.4 + 0.4, the second pull waited 0.1 -> 1 - 0.1 / 1.0
    assert hidden_fraction([0.1, 0.1], [0.4, 0.4], [0.0, 0.1]) == pytest.approx(0.9)
    assert hidden_fraction([0.5], [0.5], [0.5]) == 0.5  # half of it waited for


def test_summarize_means_per_step():
    steps = [
        {"push_s": 0.2, "pull_s": 0.6, "exposed_s": 0.0, "bytes": 64 * MiB, "buckets": 4.0},
        {"push_s": 0.4, "pull_s": 0.8, "exposed_s": 0.2, "bytes": 64 * MiB, "buckets": 4.0},
    ]
    row = summarize("mooncake", 64, 16, 1.0, steps)
    assert row == {
        "store": "mooncake",
        "model_mb": 64,
        "bucket_mb": 16,
        "bytes": 64 * MiB,
        "buckets": 4,
        "push_s": pytest.approx(0.3),
        "pull_s": pytest.approx(0.7),
        "exposed_pull_s": pytest.approx(0.1),
        "hidden_fraction": pytest.approx(1 - 0.2 / 2.0),
        "window_s": 1.0,
    }


def test_registered_with_the_cli():
    from flows.cli import _parser

    args = _parser().parse_args(["bench", "weight-sync", "--json", "w.json", "--bucket-mb", "8"])
    assert (args.name, args.quick, args.json, args.bucket_mb) == ("weight-sync", False, "w.json", (8,))
