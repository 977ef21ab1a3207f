import subprocess
import sys

import pytest

from engine.envs.frozenlake import FrozenLakeEnv
from engine.envs.reasoning_gym import ReasoningGymEnv
from engine.envs.registry import ENV_NAMES, make_env


def test_env_names():
    assert ENV_NAMES == ("frozenlake", "reasoning_gym", "gem", "synthetic", "code")


def test_registry_import_loads_no_env_package():
    code = (
        "import sys, engine.envs.registry\n"
        "print(sorted(m for m in ('gymnasium', 'reasoning_gym', 'gem', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_make_env_builds_adapters_with_their_args():
    env = make_env("frozenlake", map_name="8x8", invalid_penalty=-1.0)
    assert isinstance(env, FrozenLakeEnv) and env.invalid_penalty == -1.0
    assert len((await env.reset(0)).split("\n")) == 9
    rg_env = make_env("reasoning_gym", dataset="basic_arithmetic", size=3, min_terms=2, max_terms=2)
    assert isinstance(rg_env, ReasoningGymEnv)


def test_unknown_env_lists_the_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown environment 'frozen_lake' \(did you mean 'frozenlake'\?\); known: "
    ):
        make_env("frozen_lake")


def test_bad_env_args_name_the_argument():
    with pytest.raises(
        TypeError, match=r"'frozenlake'.*'slippery'; accepted arguments: is_slippery, map_name"
    ):
        make_env("frozenlake", slippery=True)
    with pytest.raises(TypeError, match=r"'reasoning_gym'.*missing a required argument: 'dataset'"):
        make_env("reasoning_gym", size=3)
    with pytest.raises(TypeError, match="bogus"):
        make_env("reasoning_gym", dataset="basic_arithmetic", size=3, bogus=1)
    with pytest.raises(ValueError, match="map_name"):
        make_env("frozenlake", map_name="3x3")
