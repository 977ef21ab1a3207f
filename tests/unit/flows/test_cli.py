import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def rollart(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, capture_output=True, text=True)


def test_config_show_prints_resolved_yaml():
    r = rollart("config", "show", "configs/frozenlake.yaml", "--set", "train.steps=7")
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load(r.stdout)
    assert resolved["train"]["steps"] == 7
    assert resolved["train"]["clip_high"] == 0.28  # defaults are printed too
    assert resolved["tasks"][0]["env"] == "frozenlake"


def test_bad_config_exits_2_naming_every_problem_without_traceback(tmp_path):
    cfg = yaml.safe_load((ROOT / "configs/frozenlake.yaml").read_text())
    cfg["train"]["lr"] = -1
    cfg["tasks"][0]["env"] = "chess_master"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = rollart("config", "show", str(path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert "config error: train.lr: Input should be greater than 0" in lines
    assert any(
        line.startswith("config error: tasks[0].env: unknown environment 'chess_master'") for line in lines
    )
    assert len(lines) == 2
    assert "Traceback" not in r.stderr and r.stdout == ""
