"""Env names and a lazy factory.

`engine.config` imports `ENV_NAMES` to validate task configs, so this module imports nothing heavy:
each adapter (gymnasium, reasoning-gym, GEM) is imported only when `make_env` builds one.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from engine.envs.base import Env, unknown_choice

_ADAPTERS: dict[str, tuple[str, str]] = {
    "frozenlake": ("engine.envs.frozenlake", "FrozenLakeEnv"),
    "reasoning_gym": ("engine.envs.reasoning_gym", "ReasoningGymEnv"),
    "gem": ("engine.envs.gem", "GemEnv"),
    "synthetic": ("engine.envs.synthetic", "SyntheticEnv"),
    "code": ("engine.envs.code", "CodeEnv"),
}
ENV_NAMES: tuple[str, ...] = tuple(_ADAPTERS)
SPLIT_ENVS: tuple[str, ...] = ("frozenlake", "reasoning_gym")  # envs with a held-out split by text
SANDBOX_ENVS: tuple[str, ...] = ("code",)  # envs that run model-written code: they take `sandbox`


def make_env(name: str, **env_args: Any) -> Env:
    """Build the env `name` from its task's `env_args`.

    Raises ValueError for an unknown name, TypeError naming the argument for an unknown or missing one
    (the adapters raise ValueError for bad values themselves).
    """
    if name not in _ADAPTERS:
        raise unknown_choice("environment", name, ENV_NAMES)
    module, cls_name = _ADAPTERS[name]
    cls: type[Env] = getattr(importlib.import_module(module), cls_name)
    signature = inspect.signature(cls)
    try:
        signature.bind(**env_args)
    except TypeError as e:
        accepted = [p for p, v in signature.parameters.items() if v.kind is not v.VAR_KEYWORD]
        raise TypeError(f"environment {name!r}: {e}; accepted arguments: {', '.join(accepted)}") from None
    return cls(**env_args)
