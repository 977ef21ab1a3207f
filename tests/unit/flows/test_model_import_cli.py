"""`rollart model import` on the tiny model's directory: a usable copy, or exit 2 with one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

from engine.models.tiny import init_model
from flows.cli import main


def test_model_import_copies_an_hf_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = init_model("tiny", tmp_path / "tiny", seed=0)
    out = tmp_path / "imported"
    assert main(["model", "import", str(source), "--out", str(out), "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out == f"model written to {out}\n"
    weights = load_file(out / "model.safetensors")
    assert weights.keys() == load_file(source / "model.safetensors").keys()
    assert {str(w.dtype) for w in weights.values()} == {"torch.bfloat16"}
    text = "<answer>down</answer> 12 legs"
    imported, original = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(source)
    assert imported.chat_template == original.chat_template
    assert imported(text).input_ids == original(text).input_ids


def test_model_import_refuses_a_bad_source_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "import", "no_such_package_for_rollart", "--out", str(tmp_path / "m")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("rollart model import: cannot import 'no_such_package_for_rollart': ")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
