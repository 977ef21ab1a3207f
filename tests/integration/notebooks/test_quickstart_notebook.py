"""notebooks/quickstart.ipynb runs as shipped, only its parameter cell set (papermill, as a user would): a
short run, a deployment run that completes on top of it, the plot, and output that reads like a report."""

import json
from pathlib import Path

import nbformat
import papermill

from tests.services import free_port

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
SMALL = [  # a short, cheap run: the HF engine and the Ray object store as weight store
    "model.pretrain_steps=2",
    "backends.generation=hf",
    "backends.weight_store=ray",
    "rollout.concurrency=8",
    "rollout.redundancy=0",
    "train.batch_groups=2",
    "tasks.0.group_size=2",
    "tasks.0.max_turns=3",
    "tasks.0.eval_problems=2",
    "tasks.0.eval_samples=1",
]


def test_the_notebook_runs_as_shipped_with_its_parameters_set(tmp_path, monkeypatch):
    home = tmp_path / "prefect"
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # the notebook starts its own server
    for k, v in {"PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}.items():
        monkeypatch.setenv(k, str(v))
    out = tmp_path / "out.ipynb"
    params = {
        "STEPS": 2,
        "MORE_STEPS": 1,
        "OVERRIDES": SMALL,
        "RUN_ROOT": str(tmp_path / "runs"),
        "PREFECT_PORT": free_port(),
    }
    papermill.execute_notebook(
        NOTEBOOK, out, parameters=params, cwd=str(NOTEBOOK.parent), progress_bar=False, execution_timeout=900
    )
    ran = nbformat.read(out, as_version=4)
    shipped = nbformat.read(NOTEBOOK, as_version=4)
    kept = [c for c in ran.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    assert [c.source for c in kept] == [c.source for c in shipped.cells]  # nothing rewritten

    outputs = [o for c in ran.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "deployment run" in text and ": COMPLETED" in text, text
    assert "Prefect UI: http://127.0.0.1:" in text
    (run_dir,) = (tmp_path / "runs").glob("notebook-*")  # one experiment, named by its start time
    summary = json.loads((run_dir / "summary.json").read_text())  # the deployment run's, resumed at 2
    assert (summary["steps"], summary["steps_this_run"], summary["resumed"]["step"]) == (3, 1, 2)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {}) for o in outputs)
    # a report, not a log: Prefect's per-task lines, Ray's and vLLM's stay out of the notebook
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) <= 40, text
    assert not any(s in text for s in ("Finished in state", "pid=", "Failed to load weights")), text
