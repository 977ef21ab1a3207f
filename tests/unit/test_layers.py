"""The packages import one way: flows → tasks → engine → infra (a layer may use any layer below it)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["flows", "tasks", "engine", "infra"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_package_imports_a_layer_above_it():
    upward = []
    for rank, layer in enumerate(LAYERS):
        above = set(LAYERS[:rank])
        for path in sorted((ROOT / layer).rglob("*.py")):
            upward += [f"{path.relative_to(ROOT)} imports {name}" for name in sorted(_imports(path) & above)]
    assert upward == []


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom flows.train import train\nif True:\n    import tasks.phase\n")
    assert _imports(module) == {"os", "flows", "tasks"}
