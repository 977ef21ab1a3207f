"""`bench proxy-overhead` without Ray or vLLM: settings, the alternating order, rows and JSON on fakes."""

import argparse
import itertools
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from bench import proxy_overhead
from bench.proxy_overhead import FULL, PATHS, QUICK, TARGET, add_arguments, summarize, take_turns
from bench.report import pick_settings
from tests.unit.bench.cli import bench_parser


def parser() -> argparse.ArgumentParser:
    return bench_parser(add_arguments)


def test_full_measures_five_times_quick_three_with_the_same_requests():
    assert pick_settings(parser().parse_args([]), FULL, QUICK) == FULL
    assert pick_settings(parser().parse_args(["--quick"]), FULL, QUICK) == QUICK
    assert (FULL.repeats, QUICK.repeats) == (5, 3) and QUICK.requests < FULL.requests
    assert replace(QUICK, requests=FULL.requests, repeats=FULL.repeats) == FULL  # each request alike
    got = pick_settings(parser().parse_args(["--quick", "--max-tokens", "8", "--size", "tiny"]), FULL, QUICK)
    assert (got.max_tokens, got.size, got.requests) == (8, "tiny", QUICK.requests)


@pytest.mark.parametrize(
    "argv", [["--requests", "0"], ["--repeats", "0"], ["--size", "huge"], ["--seed", "-2"]]
)
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)
    assert "error: argument" in capsys.readouterr().err


async def test_the_paths_take_turns_and_the_first_one_alternates(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(proxy_overhead.time, "perf_counter", lambda: float(next(ticks)))  # 1 s a measurement
    s = replace(FULL, requests=3, max_tokens=4, repeats=4)
    calls: list[tuple[str, str]] = []

    def path(name: str, tokens: int):
        async def send(req):
            calls.append((name, req.request_id.rsplit("-", 1)[0]))
            assert req.sampling.max_tokens == 4 and req.sampling.temperature == 0.0
            return SimpleNamespace(token_ids=[1] * tokens)

        return send

    direct, proxy = await take_turns((path("d", 4), path("p", 2)), s)
    tags = [c for i, c in enumerate(calls) if i % 3 == 0]  # one per measurement of 3 requests: path-repeat
    assert tags == [("d", "warm-0"), ("p", "warm-1"), ("d", "0-0"), ("p", "1-0"), ("p", "1-1"), ("d", "0-1"),
                    ("d", "0-2"), ("p", "1-2"), ("p", "1-3"), ("d", "0-3")]  # fmt: skip
    assert len(calls) == 3 * 10
    assert direct == [{"tokens": 12, "seconds": 1.0, "tokens_per_s": 12.0}] * 4
    assert proxy == [{"tokens": 6, "seconds": 1.0, "tokens_per_s": 6.0}] * 4


def measurements(tokens_per_s: list[float]) -> list[dict[str, float]]:
    return [{"tokens": 1000, "seconds": 1000 / t, "tokens_per_s": t} for t in tokens_per_s]


@pytest.mark.parametrize(
    ("proxy", "ratio", "verdict"),
    [
        ([95.0, 99.0, 90.0, 84.0, 95.0], (0.95, 0.8, 1.0), "undecided"),  # the interval straddles 0.9
        ([95.0, 104.5, 90.0, 94.5, 95.0], (0.95, 0.9, 1.0), "met"),  # at or above 0.9 all through
        ([85.0, 88.0, 76.5, 88.2, 84.55], (0.85, 0.8, 0.89), "not met"),  # all below 0.9
    ],
)
def test_rows_are_medians_with_intervals_and_the_ratio_is_paired_by_repeat(proxy, ratio, verdict):
    rows, got = summarize(measurements([100.0, 110.0, 90.0, 105.0, 95.0]), measurements(proxy))
    assert [(r["path"], r["runs"], r["tokens"]) for r in rows] == [(p, 5, 1000) for p in PATHS]
    direct = rows[0]
    assert (direct["tokens_per_s"], direct["ci_low"], direct["ci_high"]) == (100.0, 90.0, 110.0)
    assert direct["seconds"] == 10.0  # the median of the measured seconds
    assert (got["ratio"], got["ratio_ci_low"], got["ratio_ci_high"]) == pytest.approx(ratio)
    assert got["target"] == TARGET and got["verdict"] == verdict


def test_the_json_carries_clock_seeds_rows_with_intervals_and_the_ratio(monkeypatch, tmp_path):
    def fake_paths(s):
        return measurements([100.0 + k for k in range(s.repeats)]), measurements([95.0] * s.repeats)

    monkeypatch.setattr(proxy_overhead, "_measure_paths", fake_paths)
    out = tmp_path / "po.json"
    payload = proxy_overhead.run(parser().parse_args(["--quick", "--json", str(out), "--seed", "3"]))
    assert payload["clock"] == "wall" and payload["seeds"] == [3]
    assert [(r["path"], r["runs"]) for r in payload["rows"]] == [(p, 3) for p in PATHS]
    assert [(r["tokens_per_s"], r["ci_low"], r["ci_high"]) for r in payload["rows"]] == [
        (101.0, 100.0, 102.0),
        (95.0, 95.0, 95.0),
    ]
    assert payload["ratio"] == pytest.approx(95 / 101) and payload["verdict"] == "met"
    assert (payload["ratio_ci_low"], payload["ratio_ci_high"]) == pytest.approx((95 / 102, 95 / 100))
    assert "target >= 0.9: met" in payload["note"]
    assert payload["config"] == {**vars(replace(QUICK, seed=3)), "quick": True}
    assert len(payload["all"]["direct"]) == len(payload["all"]["proxy"]) == 3
    assert json.loads(out.read_text()) == payload


def test_registered_with_the_cli():
    from flows.cli import _parser

    args = _parser().parse_args(["bench", "proxy-overhead", "--quick", "--repeats", "4"])
    assert (args.name, args.quick, args.repeats, args.requests) == ("proxy-overhead", True, 4, None)
