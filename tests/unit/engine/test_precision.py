from __future__ import annotations

import pytest

from engine.config import ConfigError, load_config
from engine.precision import resolve_dtype


@pytest.mark.parametrize(
    ("setting", "device", "want"),
    [
        ("auto", "cuda", "bfloat16"),
        ("auto", "cuda:1", "bfloat16"),
        ("auto", "cpu", "float32"),
        ("float32", "cuda", "float32"),
        ("bfloat16", "cpu", "bfloat16"),
    ],
)
def test_auto_is_bfloat16_on_a_gpu_and_float32_on_a_cpu(setting: str, device: str, want: str) -> None:
    assert resolve_dtype(setting, device) == want


def test_an_unknown_dtype_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"float16.*auto, float32, bfloat16"):
        resolve_dtype("float16", "cuda")
    with pytest.raises(ConfigError, match=r"model\.dtype"):
        load_config(data={"name": "x", "tasks": [{"env": "frozenlake"}], "model": {"dtype": "float16"}})
