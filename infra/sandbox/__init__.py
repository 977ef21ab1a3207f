"""Where untrusted (model-written) Python runs: `backends.sandbox` picks the backend.

- `bwrap` (default, `bwrap.py`): bubblewrap on this host; `run_python` below is that backend's.
- `kubernetes` (`kubernetes.py`): a short-lived pod per run, through the official client, imported only
  when chosen (the driver's imports stay light).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from infra.sandbox.base import Sandbox, SandboxResult, SandboxUnavailable
from infra.sandbox.bwrap import bwrap_available, run_python

__all__ = [
    "SANDBOXES",
    "Sandbox",
    "SandboxResult",
    "SandboxUnavailable",
    "bwrap_available",
    "make_sandbox",
    "run_python",
]

_BACKENDS = {
    "bwrap": ("infra.sandbox.bwrap", "Bwrap"),
    "kubernetes": ("infra.sandbox.kubernetes", "KubernetesSandbox"),
}
SANDBOXES: tuple[str, ...] = tuple(_BACKENDS)


@functools.cache
def make_sandbox(backend: str = "bwrap", **settings: Any) -> Sandbox:
    """The sandbox `backend` with `settings` (its constructor's arguments), one per process for each: the
    code envs of a run share it, and with it a Kubernetes client's connections and its policy check."""
    if backend not in _BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; known: {', '.join(SANDBOXES)}")
    module, name = _BACKENDS[backend]
    sandbox: Sandbox = getattr(importlib.import_module(module), name)(**settings)
    return sandbox
