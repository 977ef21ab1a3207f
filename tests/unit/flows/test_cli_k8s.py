"""`rollart k8s render` on the command line."""

from pathlib import Path

from flows.cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_the_command_writes_one_file_per_manifest_and_refuses_a_bad_config(tmp_path, capsys):
    out = tmp_path / "k8s"
    assert (
        main(["k8s", "render", str(ROOT / "configs/quickstart.yaml"), "--out", str(out), "--image", "i"]) == 0
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "configmap-rollart-quickstart-config.yaml",
        "networkpolicy-rollart-quickstart-net.yaml",
        "raycluster-rollart-quickstart.yaml",
        "secret-rollart-quickstart-tokens.yaml",
    ]
    assert "validated offline against Kubernetes 1.37" in capsys.readouterr().out
    bad = ["k8s", "render", str(ROOT / "configs/quickstart.yaml"), "--out", str(out), "--image", "i"]
    assert main([*bad, "--set", "train.lr=-1"]) == 2
    assert "config error: train.lr" in capsys.readouterr().err
