"""Unknown backend names (issue 7 item 5): refused at config load, naming the field and the choices."""

import pytest

from engine.backends import make_backend
from engine.config import ConfigError, load_config


def test_unknown_backend_names_are_config_errors_naming_field_and_choices():
    with pytest.raises(ConfigError) as e:
        load_config(
            data={"tasks": [{"env": "synthetic"}]},
            overrides=[
                "backends.generation=vlm",
                "backends.weight_store=redis",
                "backends.training=jax",
                "backends.sandbox=process",  # no unsandboxed runner exists: refused, not ignored
                "backends.serverless=lambda",  # no Lambda invocation exists here: refused, not ignored
            ],
        )
    assert sorted(e.value.problems) == [
        "backends.generation: Input should be 'vllm', 'hf' or 'modelled'",
        "backends.sandbox: Input should be 'bwrap' or 'kubernetes'",
        "backends.serverless: Input should be 'ray-serve'",
        "backends.training: Input should be 'torch' or 'megatron'",
        "backends.weight_store: Input should be 'mooncake' or 'ray'",
    ]


def test_the_backend_factory_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown generation backend 'tgi'; known: vllm, hf, modelled"):
        make_backend("tgi")
