"""What every config section shares: strict models, one-line-per-problem errors, `--set` overrides."""

from __future__ import annotations

import copy
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ConfigError(ValueError):
    """A config that cannot be used. `problems` holds one `path: message` line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Probability = Annotated[float, Field(ge=0.0, le=1.0)]


def repeated(names: list[str]) -> list[str]:
    """The names that occur more than once, sorted."""
    return sorted({n for n in names if names.count(n) > 1})


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def format_errors(err: ValidationError) -> list[str]:
    """One `field.path: message` line per problem (model-level problems carry their own path)."""
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{_path(e['loc'])}: {msg}" if e["loc"] else msg)
    return lines


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=c` / `tasks.0.weight=2` overrides; values are parsed as YAML scalars or lists."""
    data = copy.deepcopy(data)
    problems = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            problems.append(f"--set {item}: expected KEY=VALUE, e.g. train.lr=1e-4")
            continue
        node: Any = data
        parts = key.split(".")
        try:
            for part in parts[:-1]:
                node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
            last = parts[-1]
            value = yaml.safe_load(raw) if raw else ""
            if isinstance(node, list):
                node[int(last)] = value
            elif isinstance(node, dict):
                node[last] = value
            else:
                raise TypeError
        except (ValueError, IndexError, TypeError, KeyError, yaml.YAMLError):
            problems.append(f"{key}: cannot set this path (no such list item or not a mapping)")
    if problems:
        raise ConfigError(problems)
    return data
