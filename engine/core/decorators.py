"""Method decorators that declare how a Cluster dispatches a Worker method (paper §5).

- `register`: call the method on every worker of the cluster and gather the results (in rank order).
- `hw_mapping(tag_name)`: route the call to one worker whose hardware matches the call's tag (a pool
  kind, or a workload profile mapped to one): its `tag_name` keyword, or else that attribute of its first
  argument (a request object); fall back to a compatible worker when every matching worker is busy.
- `register_serverless(endpoint)`: the cluster method becomes an HTTP call to a serverless URL; the
  decorated body is what that endpoint runs (so a serverless deployment can host the same code).

The decorators only attach a `DispatchSpec`; the function itself is unchanged and still callable on
the worker (e.g. inside the actor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

F = TypeVar("F", bound=Callable[..., object])
SPEC_ATTR = "__rollart_dispatch__"


@dataclass(frozen=True)
class DispatchSpec:
    kind: Literal["all", "hw", "serverless"]
    tag_name: str = ""
    endpoint: str = ""

    def tag(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The hardware tag of an `hw_mapping` call (see the module docstring)."""
        if self.tag_name in kwargs:
            return str(kwargs[self.tag_name])
        if args and hasattr(args[0], self.tag_name):
            return str(getattr(args[0], self.tag_name))
        raise TypeError(f"hw_mapping call needs the keyword argument or request field '{self.tag_name}'")


def _attach(spec: DispatchSpec) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        setattr(fn, SPEC_ATTR, spec)
        return fn

    return deco


def register(fn: F) -> F:
    return _attach(DispatchSpec("all"))(fn)


def hw_mapping(tag_name: str = "tag") -> Callable[[F], F]:
    return _attach(DispatchSpec("hw", tag_name=tag_name))


def register_serverless(endpoint: str) -> Callable[[F], F]:
    return _attach(DispatchSpec("serverless", endpoint=endpoint))


def dispatch_spec(fn: object) -> DispatchSpec | None:
    return getattr(fn, SPEC_ATTR, None)
