"""The Prefect driver on a temporary server: iterations as flow runs, retries, S3 checkpoints, resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import ray
import yaml

from tests.integration.runs import ray_for
from tests.services import free_port, wait_port

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def s3_endpoint():
    port = free_port()
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, 30, "moto_server")
        url = f"http://127.0.0.1:{port}"
        os.environ.update(
            AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1"
        )
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket="ckpt")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module", autouse=True)
def local_ray(tmp_path_factory):
    """One Ray for the module's runs, as a notebook's `ray.init` would be: each run leaves it up."""
    with ray_for(config(tmp_path_factory.mktemp("ray"), "http://127.0.0.1:1", steps=1)):
        yield


def config(tmp_path, s3: str, steps: int) -> dict:
    cfg = yaml.safe_load((ROOT / "configs" / "frozenlake.yaml").read_text())
    cfg.update(name="flowtest", run_root=str(tmp_path / "runs"))
    cfg["model"]["pretrain_steps"] = 0  # a random tiny model: the flow machinery is under test, not learning
    cfg["tasks"] = [dict(cfg["tasks"][0], group_size=2, max_turns=3, eval_problems=3, eval_samples=1)]
    cfg["rollout"].update(concurrency=8, redundancy=0)
    cfg["train"].update(steps=steps, batch_groups=2, checkpoint_every=1, micro_batch=8)
    cfg["backends"].update(
        generation="hf", weight_store="ray", checkpoint_uri="s3://ckpt/flowtest", s3_endpoint_url=s3
    )
    return cfg


async def test_two_iterations_checkpoint_to_s3_with_retries_then_resume(
    prefect_home, s3_endpoint, tmp_path, monkeypatch
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactFilter, LogFilter
    from prefect.logging.handlers import APILogHandler

    from flows.train import RunExists, train
    from infra.metadata import MetadataStore
    from infra.objectstore import S3Dirs

    calls = {"n": 0}
    real_upload = S3Dirs.upload_dir

    def flaky_upload(self, local, uri):  # the S3 endpoint errors twice, then works
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ConnectionError("S3 endpoint down")
        return real_upload(self, local, uri)

    monkeypatch.setattr(S3Dirs, "upload_dir", flaky_upload)
    summary = await train(config(tmp_path, s3_endpoint, steps=2))
    assert ray.is_initialized()  # the run found Ray up (the module's): it left it up for its owner
    # Prefect's machinery per iteration (not the work): bounded in seconds, so at real step lengths it is a
    # small fraction (~2% of the quickstart's ~5 s steps); ~0.1 s on a quiet machine, 0.12 s seen under load
    assert summary["steps_this_run"] == 2 and summary["flow_overhead_s_mean"] < 0.5
    lake = summary["eval"]["frozenlake"]
    assert (lake["n_eval"], lake["overlap"], lake["version"], lake["baseline"]) == (3, 0, 2, 0.0)
    assert lake["before"] is not None and [p["step"] for p in summary["eval_curve"]] == [0, 2]

    async with get_client() as client:
        # this experiment's runs (the temporary server is shared by every test module in the session)
        runs = [r for r in await client.read_flow_runs() if r.name.startswith("flowtest")]
        iteration_runs = [r for r in runs if r.parameters.get("step") is not None]
        assert len(iteration_runs) == 2 and all(r.state.is_completed() for r in iteration_runs)
        tasks = await client.read_task_runs()
        kinds = {t.name.rsplit("-", 1)[0] for t in tasks}
        for expected in (
            "provision_pools",
            "warmup_sandboxes",
            "deploy_reward",
            "start_actors",
            "restore_checkpoint",
            "get_batch",
            "sync_weights",
            "train_step",
            "publish_weights",
            "save_checkpoint",
            "baselines",
            "evaluate",
        ):
            assert expected in kinds, kinds
        saves = [t for t in tasks if t.name.startswith("save_checkpoint")]
        assert any(t.run_count == 3 for t in saves)  # failed twice, retried, succeeded

        # what a user sees in the UI: runs named by experiment and step, their logs, one key per artifact
        driver = next(r for r in runs if r.parameters.get("step") is None)
        assert driver.name == "flowtest"
        assert sorted(r.name for r in iteration_runs) == ["flowtest step 1", "flowtest step 2"]
        await APILogHandler.aflush()
        logs = [log.message for log in await client.read_logs(LogFilter(flow_run_id={"any_": [driver.id]}))]
        assert any(m.startswith("step    2/2  reward") for m in logs), logs
        assert any(m.startswith("eval at step 2: frozenlake success") for m in logs), logs
        metrics = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key={"any_": ["flowtest-metrics"]})
        )
        assert len(metrics) == 2 and {r.flow_run_id for r in metrics} == {r.id for r in iteration_runs}
        assert {row["metric"] for row in json.loads(metrics[0].data)} >= {"loss", "reward_mean", "step_s"}
        (progress,) = await client.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(key={"any_": ["flowtest-progress"]})
        )
        assert progress.data == 100.0
        (report,) = await client.read_artifacts(
            artifact_filter=ArtifactFilter(key={"any_": ["flowtest-summary"]})
        )
        assert "| frozenlake |" in report.data and str(tmp_path / "runs" / "flowtest") in report.data
    assert calls["n"] == 4  # 3 attempts for step 1 + 1 for step 2

    run_dir = tmp_path / "runs" / "flowtest"
    store = MetadataStore(f"sqlite:///{run_dir}/metadata.db")
    ck = store.latest_checkpoint("flowtest")
    assert ck["step"] == 2 and ck["uri"] == "s3://ckpt/flowtest/step-00000002"
    assert S3Dirs(s3_endpoint).complete(ck["uri"])

    # `rollart eval`: an earlier checkpoint, loaded (hash-checked) and served, scored on the held-out maps
    from flows.evaluate import evaluate_run

    path = tmp_path / "flowtest.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, s3_endpoint, steps=2)))
    out = await evaluate_run(str(path), checkpoint=1)
    scored = out["eval"]["frozenlake"]
    assert out["checkpoint_step"] == 1
    assert (scored["version"], scored["n_eval"], scored["overlap"]) == (1, 3, 0)
    assert scored["baseline"] == 0.0 and (run_dir / "eval-step1.json").exists()
    with pytest.raises(FileNotFoundError, match="no checkpoint at step 7"):
        await evaluate_run(str(path), checkpoint=7)

    # resume: the same experiment continues at step 3 from the S3 checkpoint, weights identical at load
    summary = await train(config(tmp_path, s3_endpoint, steps=3), resume=True)
    assert summary["steps_this_run"] == 1
    assert summary["eval"]["frozenlake"]["version"] == 3  # the resumed run's last weights
    assert summary["eval"]["frozenlake"]["before"] == lake["before"]  # the base model, from the first part
    steps = store.steps("flowtest")
    assert [s["step"] for s in steps] == [1, 2, 3]  # nothing repeated or skipped
    assert store.latest_checkpoint("flowtest")["step"] == 3
    with pytest.raises(RunExists, match="already holds 3 trained steps"):  # never overwritten by a fresh run
        await train(config(tmp_path, s3_endpoint, steps=3))
    # two runs completed; a refused run is not a failed experiment: nothing recorded, nothing to resume
    assert [e["kind"] for e in store.events("flowtest")] == ["completed", "completed"]


async def test_a_scheduled_deployment_creates_scheduled_runs_that_resume(prefect_home, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ParameterTypeError

    from flows.deploy import deployment
    from flows.train import train

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, "http://127.0.0.1:1", steps=2)))
    dep = deployment(str(path), ["train.lr=0.002"], cron="0 3 * * *")
    dep_id = await dep.apply()
    async with get_client() as client:
        d = await client.read_deployment(dep_id)
        assert d.name == "flowtest" and d.parameters["resume"] is True and d.parameters["more_steps"] == 2
        assert d.parameters["config"]["train"]["lr"] == 0.002  # the resolved config, overrides applied
        assert d.parameter_openapi_schema["properties"]["config"]["$ref"].endswith("ExperimentConfig")
        assert [s.schedule.cron for s in d.schedules] == ["0 3 * * *"]
        # The temporary server runs no scheduler service; create the run as the scheduler (or the UI) would.
        await client.create_flow_run_from_deployment(dep_id)
        scheduled = [r for r in await client.read_flow_runs() if r.deployment_id == dep_id]
        assert len(scheduled) == 1 and scheduled[0].state.is_scheduled()
        assert scheduled[0].parameters["resume"] is True
        # a run asked for from the UI or the API with a bad field is refused, naming the field
        bad = json.loads(json.dumps(d.parameters["config"]))
        bad["train"]["lr"] = "fast"
        with pytest.raises(Exception, match=r"train.*lr|lr.*train") as refused:
            await client.create_flow_run_from_deployment(dep_id, parameters={"config": bad})
        assert "fast" in str(refused.value)
    with pytest.raises(ParameterTypeError, match=r"train\.lr") as refused:
        await train(bad)  # called as a function (the CLI, a notebook): Prefect validates the same way
