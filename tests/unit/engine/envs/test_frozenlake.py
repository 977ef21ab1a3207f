import pytest
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

from engine.envs.frozenlake import FrozenLakeEnv, parse_action

PROMPT = "Move: left, down, right or up?"
START = ["PFFF", "FHFH", "FFFH", "HFFG"]


def with_player(rows: list[str], r: int, c: int) -> list[str]:
    rows = list(rows)
    rows[r] = rows[r][:c] + "P" + rows[r][c + 1 :]
    return rows


async def test_first_observation_is_the_standard_map_one_line_per_row():
    env = FrozenLakeEnv()
    assert await env.reset(0) == "\n".join([*START, PROMPT])
    assert env.grid == START


async def test_optimal_path_reaches_goal_with_reward_one():
    env = FrozenLakeEnv()
    await env.reset(0)
    standard = ["SFFF", "FHFH", "FFFH", "HFFG"]
    path = [("D", (1, 0)), ("d", (2, 0)), ("right", (2, 1)), ("RIGHT", (2, 2)), ("down", (3, 2))]
    for action, (r, c) in path:
        step = await env.step(action)
        assert (step.reward, step.done, step.info) == (0.0, False, {"invalid": False})
        assert step.observation == "\n".join([*with_player(standard, r, c), PROMPT])
    last = await env.step("<answer>r</answer>")
    assert (last.reward, last.done) == (1.0, True)
    assert last.info == {"invalid": False, "success": True}
    assert last.observation == "SFFF\nFHFH\nFFFH\nHFFP"  # a finished episode asks for no move


async def test_hole_ends_episode_without_reward():
    env = FrozenLakeEnv()
    await env.reset(0)
    await env.step("right")
    step = await env.step("down")  # (1, 1) is a hole
    assert (step.reward, step.done, step.info["success"]) == (0.0, True, False)
    assert env.grid[1] == "FPFH"
    with pytest.raises(RuntimeError, match="reset"):
        await env.step("down")


async def test_walking_into_a_wall_is_a_valid_move_that_stays_put():
    env = FrozenLakeEnv()
    await env.reset(0)
    step = await env.step("up")
    assert (step.reward, step.done, step.info) == (0.0, False, {"invalid": False})
    assert env.grid == START


@pytest.mark.parametrize(
    "action",
    [
        "",
        "   \n\t",
        "jump",
        "go left",
        "x" * 1_000_000,
        "<answer></answer>",
        "<answer>down",  # unclosed tag: the whole text, whose first word is "answer"
        "<answer>down</answer> then <answer>fly</answer>",
        "\udcff\udcfe\x00",  # lone surrogates (undecodable bytes) and a NUL
        "ｌｅｆｔ",  # fullwidth letters are not ASCII "left"
        "🙂🙂",
        "léft",
        "go_left",
        "0",
    ],
)
async def test_unparseable_actions_are_invalid_moves_with_penalty(action: str):
    env = FrozenLakeEnv()
    await env.reset(0)
    await env.step("down")
    before = env.grid
    step = await env.step(action)
    assert (step.reward, step.done, step.info) == (-0.1, False, {"invalid": True})
    assert env.grid == before
    assert step.observation == "\n".join(["Invalid move.", *before, PROMPT])


async def test_invalid_penalty_is_configurable():
    env = FrozenLakeEnv(invalid_penalty=-0.5)
    await env.reset(0)
    assert (await env.step("?")).reward == -0.5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Down.", 1),
        (" UP!", 3),
        ("l", 0),
        ("_down", 1),  # underscores separate words too
        ("\udcff\x00right", 2),
        ("<answer>R</answer>", 2),
        ("<answer>up</answer><answer>down</answer>", 1),
    ],
)
def test_parse_action_reads_first_word_of_the_answer(text: str, expected: int):
    assert parse_action(text) == expected


async def test_observations_carry_no_ansi_codes():
    for env in (FrozenLakeEnv(map_name="8x8"), FrozenLakeEnv(random_map=True, map_size=5)):
        observations = [await env.reset(3)]
        for action in ["right", "down", "?", "right", "down"]:
            step = await env.step(action)
            observations.append(step.observation)
            if step.done:
                break
        assert all("\x1b" not in o and "[" not in o for o in observations)


async def test_8x8_map_has_eight_rows_of_eight():
    env = FrozenLakeEnv(map_name="8x8")
    rows = (await env.reset(0)).split("\n")
    map_8x8 = ["SFFFFFFF", "FFFFFFFF", "FFFHFFFF", "FFFFFHFF", "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG"]
    assert rows == [*with_player(map_8x8, 0, 0), PROMPT]


async def test_random_map_differs_across_seeds_and_is_reproducible():
    env, twin = (
        FrozenLakeEnv(random_map=True, map_size=6, frozen_p=0.7),
        FrozenLakeEnv(random_map=True, map_size=6, frozen_p=0.7),
    )
    grids = {}
    for seed in range(5):
        await env.reset(seed)
        await twin.reset(seed)
        assert env.grid == twin.grid
        assert env.grid == with_player(generate_random_map(size=6, p=0.7, seed=seed), 0, 0)
        grids[seed] = tuple(env.grid)
    assert len(set(grids.values())) == 5
    await env.reset(2)
    assert tuple(env.grid) == grids[2]


async def test_slippery_moves_are_reproducible_per_seed():
    async def positions(seed: int) -> list[list[str]]:
        env = FrozenLakeEnv(is_slippery=True)
        await env.reset(seed)
        out = []
        for _ in range(6):
            step = await env.step("right")
            out.append(env.grid)
            if step.done:
                break
        return out

    assert await positions(7) == await positions(7)
    runs = [await positions(s) for s in range(6)]
    assert len({str(r) for r in runs}) > 1  # slipping sends the same plan different ways


async def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="reset"):
        await FrozenLakeEnv().step("down")


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"map_name": "5x5"}, "map_name"),
        ({"random_map": True, "map_size": 1}, "map_size"),
        ({"random_map": True, "frozen_p": 0.0}, "frozen_p"),
    ],
)
def test_bad_options_name_the_option(kwargs: dict, word: str):
    with pytest.raises(ValueError, match=word):
        FrozenLakeEnv(**kwargs)
