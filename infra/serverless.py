"""Client for serverless function endpoints (Ray Serve locally, AWS Lambda URLs at scale).

A call is an HTTP POST of `{"args": [...], "kwargs": {...}}` answered by `{"result": ...}`.
Transient failures (connection errors, 5xx, timeouts) are retried with exponential backoff;
a 4xx is the caller's mistake and is raised at once. Connections are kept alive between calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx


class ServerlessError(RuntimeError):
    pass


class _Transient(Exception):
    pass


class ServerlessClient:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.2,
    ):
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.attempts = 0  # total HTTP attempts, for metrics
        self._sync: httpx.Client | None = None
        self._async: httpx.AsyncClient | None = None
        self._async_loop: asyncio.AbstractEventLoop | None = None

    def __getstate__(self) -> dict[str, Any]:  # picklable for Ray: connections are per process
        return {**self.__dict__, "_sync": None, "_async": None, "_async_loop": None}

    def _payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"args": list(args), "kwargs": kwargs}

    def _parse(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 500:
            raise _Transient(f"HTTP {resp.status_code}: {resp.text[:300]}")
        if resp.status_code >= 400:
            raise ServerlessError(f"{self.url}: HTTP {resp.status_code}: {resp.text[:300]}")
        body = resp.json()
        if not isinstance(body, dict) or "result" not in body:
            raise ServerlessError(f"{self.url}: answer has no 'result' field: {str(body)[:300]}")
        return body["result"]

    def _attempts(self) -> Iterator[float]:
        """Yields the backoff before each attempt (0 first); the caller stops at success."""
        for attempt in range(self.retries + 1):
            self.attempts += 1
            yield 0.0 if attempt == 0 else self.backoff_s * 2 ** (attempt - 1)

    def _give_up(self, last: Exception) -> ServerlessError:
        return ServerlessError(f"{self.url}: failed after {self.retries + 1} attempts: {last}")

    def call(self, *args: Any, **kwargs: Any) -> Any:
        self._sync = self._sync or httpx.Client(timeout=self.timeout_s, headers=self.headers)
        last: Exception | None = None
        for delay in self._attempts():
            time.sleep(delay)
            try:
                return self._parse(self._sync.post(self.url, json=self._payload(args, kwargs)))
            except (httpx.TransportError, _Transient) as e:
                last = e
        raise self._give_up(last or RuntimeError("no attempt"))

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        if self._async is None or self._async_loop is not loop:  # an AsyncClient belongs to one loop
            self._async, self._async_loop = (
                httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers),
                loop,
            )
        last: Exception | None = None
        for delay in self._attempts():
            await asyncio.sleep(delay)
            try:
                return self._parse(await self._async.post(self.url, json=self._payload(args, kwargs)))
            except (httpx.TransportError, _Transient) as e:
                last = e
        raise self._give_up(last or RuntimeError("no attempt"))
