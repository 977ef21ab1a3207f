"""The docs name real code: every backticked repository path in docs/*.md exists, and a name written right
after a `.py` path (`path/file.py` `Name` or `Name.method`, or a list of them joined by commas, "and" or
"or") is defined in that file. Names are read with `ast` (classes, functions, methods, class attributes
and module-level assignments); no module is imported.

Every capitalised `Class.member` in the docs, with or without a path, must be defined in some module of
engine/, flows/, tasks/, infra/ or bench/.

A "line" is a rendered line: the soft-wrapped lines of a paragraph or list item are joined, table rows stay
apart, and fenced code blocks are skipped.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
TOP_DIRS = ("bench", "configs", "engine", "flows", "infra", "notebooks", "scripts", "tasks", "tests")

SPAN = re.compile(r"`([^`\n]+)`")
PY_PATH = re.compile(r"[\w./-]+\.py")
DIR_PATH = re.compile(rf"(?:{'|'.join(TOP_DIRS)})(?:/[\w.-]+)*/")
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?(?:\(\))?")
SEPARATOR = re.compile(r"\s*(?:,|and|or)?\s*")
CLASS_MEMBER = re.compile(r"([A-Z]\w*\.\w+)(?:\(.*\))?")


def logical_lines(text: str) -> list[str]:
    """Paragraphs and list items joined into one line each; table rows, headings and code skipped."""
    out: list[str] = []
    current: list[str] = []
    fenced = False

    def flush() -> None:
        if current:
            out.append(" ".join(current))
            current.clear()

    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line or line.startswith(("#", "|")):
            flush()
            if line.startswith("|"):
                out.append(line)
            continue
        if re.match(r"([-*]|\d+\.)\s", line):
            flush()
        current.append(line)
    flush()
    return out


@cache
def defined_names(path: Path) -> frozenset[str]:
    """Top-level classes, functions and assigned names, plus `Class.member` for a class's methods and
    class-level attributes."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()

    def targets(node: ast.stmt) -> list[str]:
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(f"{node.name}.{member.name}")
                names.update(f"{node.name}.{t}" for t in targets(member))
        else:
            names.update(targets(node))
    return frozenset(names)


def references(doc: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(paths, [(py path, name)]) referenced in `doc`, in order."""
    paths: list[str] = []
    pairs: list[tuple[str, str]] = []
    for line in logical_lines(doc.read_text()):
        spans = list(SPAN.finditer(line))
        owner = None  # the .py path the spans after it belong to, while only separators come between
        for prev, span in zip([None, *spans], spans, strict=False):
            text = span.group(1)
            gap = line[prev.end() : span.start()] if prev else ""
            if owner and not SEPARATOR.fullmatch(gap):
                owner = None
            if PY_PATH.fullmatch(text) or DIR_PATH.fullmatch(text):
                paths.append(text)
                owner = text if text.endswith(".py") else None
            elif owner and NAME.fullmatch(text):
                pairs.append((owner, text.removesuffix("()")))
            else:
                owner = None
    return paths, pairs


def test_docs_reference_real_paths_and_names() -> None:
    assert DOCS, "no docs/*.md found"
    missing, undefined, checked = [], [], 0
    for doc in DOCS:
        paths, pairs = references(doc)
        for p in paths:
            checked += 1
            if not (ROOT / p).exists():
                missing.append(f"{doc.name}: {p}")
        for p, name in pairs:
            checked += 1
            if (ROOT / p).is_file() and name not in defined_names(ROOT / p):
                undefined.append(f"{doc.name}: {p} has no {name}")
    assert missing == [], "paths that do not exist"
    assert undefined == [], "names not defined where the docs say"
    assert checked >= 20, f"only {checked} references checked: is the parser still finding them?"


def test_every_class_member_named_in_the_docs_exists() -> None:
    """A `Class.member` written without its path (a hop of the walk-through) is still defined somewhere in
    the packages. Only capitalised class names are checked: `train.alpha` is a config key."""
    known: set[str] = set()
    for package in ("engine", "flows", "tasks", "infra", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            known |= defined_names(path)
    named, unknown = 0, []
    for doc in DOCS:
        for line in logical_lines(doc.read_text()):
            for span in SPAN.finditer(line):
                m = CLASS_MEMBER.fullmatch(span.group(1))
                if m:
                    named += 1
                    if m.group(1) not in known:
                        unknown.append(f"{doc.name}: {span.group(1)}")
    assert unknown == []
    assert named >= 20


def test_the_parser_finds_paths_names_and_lists(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(
        "Run `engine/protocol.py` `IterationProtocol.step`, `Phase` and\n"
        "`Collaborators` (not `acall`: prose ends the list) from `engine/` with `x.py`.\n"
        "\n"
        "```\n`engine/nowhere.py` `Nothing`\n```\n"
        "| `engine/types.py` | `Group` |\n"
    )
    paths, pairs = references(doc)
    assert paths == ["engine/protocol.py", "engine/", "x.py", "engine/types.py"]
    assert pairs == [
        ("engine/protocol.py", "IterationProtocol.step"),
        ("engine/protocol.py", "Phase"),
        ("engine/protocol.py", "Collaborators"),
    ]
    names = defined_names(ROOT / "engine/protocol.py")
    assert {"IterationProtocol", "IterationProtocol.step", "Phase", "Collaborators.rollout"} <= names
    assert "IterationProtocol.nope" not in names
