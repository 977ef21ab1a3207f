"""One idea per file, whole ideas on one screen: no source file over 400 lines, no function over 60."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["flows", "tasks", "engine", "infra", "bench"]
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _long_functions(path: Path) -> list[str]:
    """'path:line name (n lines)' for each function or method longer than MAX_FUNCTION_LINES, decorators
    excluded, docstring included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{path.name}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_the_packages_are_found():
    assert len(_sources()) > 100


def test_no_source_file_is_over_400_lines():
    sizes = {p.relative_to(ROOT): len(p.read_text().splitlines()) for p in _sources()}
    assert {p: n for p, n in sizes.items() if n > MAX_FILE_LINES} == {}


def test_no_function_is_over_60_lines():
    assert [f for p in _sources() for f in _long_functions(p)] == []


def test_the_check_sees_a_long_function(tmp_path):
    module = tmp_path / "m.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    module.write_text(f"def short():\n    pass\n\n\nasync def long():\n{body}")
    assert _long_functions(module) == [f"m.py:5 long ({MAX_FUNCTION_LINES + 1} lines)"]
