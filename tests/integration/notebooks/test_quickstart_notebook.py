"""notebooks/quickstart.ipynb executes headless: a short run, a deployment run triggered, the plot drawn."""

import json
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[3]


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    home = tmp_path / "prefect"
    for k, v in {
        "PREFECT_HOME": home,
        "PREFECT_MEMO_STORE_PATH": home / "memo",
        "PREFECT_LOCAL_STORAGE_PATH": home / "storage",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # a new PREFECT_HOME migrates its database first (~20 s): on a loaded 2-core machine that overran
        # the default start-up timeout once ("Timed out while attempting to connect to ephemeral ... server")
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "ROLLART_ROOT": ROOT,
        "ROLLART_RUN_ROOT": tmp_path / "runs",
        "ROLLART_NOTEBOOK_STEPS": "2",
        "ROLLART_NOTEBOOK_PRETRAIN_STEPS": "2",  # the path, not the 1.5 minutes
    }.items():
        monkeypatch.setenv(k, str(v))
    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    for cell in nb.cells:  # a short, cheap run: HF engine and the Ray object store as weight store
        if cell.cell_type == "code" and 'data["train"]["steps"] = STEPS' in cell.source:
            cell.source += (
                '\ndata["backends"].update(generation="hf", weight_store="ray")'
                '\ndata["rollout"].update(concurrency=8, redundancy=0)'
                '\ndata["train"].update(batch_groups=2)'
                '\nfor t in data["tasks"]:'
                "\n    t.update(group_size=2, max_turns=3, eval_problems=2, eval_samples=1)"
                "\ncfg = load_config(data=data)"
            )
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "triggered" in outputs and "SCHEDULED" in outputs
    (run_dir,) = (tmp_path / "runs").glob("notebook-*")  # one experiment, named by its start time
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and set(summary["eval"]) == {"frozenlake"}
    assert summary["eval"]["frozenlake"]["overlap"] == 0 and summary["eval"]["frozenlake"]["n_eval"] == 2
    assert any(
        o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
