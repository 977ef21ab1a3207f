"""Client for serverless function endpoints (Ray Serve locally, AWS Lambda URLs at scale).

A call is an HTTP POST of `{"args": [...], "kwargs": {...}}` answered by `{"result": ...}`.
Transient failures (connection errors, 5xx, timeouts) are retried with exponential backoff;
a 4xx is the caller's mistake and is raised at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx


class ServerlessError(RuntimeError):
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

    def _parse(self, resp: httpx.Response) -> Any:
        if 400 <= resp.status_code < 500:
            raise ServerlessError(f"{self.url}: HTTP {resp.status_code}: {resp.text[:300]}")
        resp.raise_for_status()
        body = resp.json()
        if not isinstance(body, dict) or "result" not in body:
            raise ServerlessError(f"{self.url}: answer has no 'result' field: {str(body)[:300]}")
        return body["result"]

    def _payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"args": list(args), "kwargs": kwargs}

    def call(self, *args: Any, **kwargs: Any) -> Any:
        for attempt in range(self.retries + 1):
            self.attempts += 1
            try:
                resp = httpx.post(
                    self.url, json=self._payload(args, kwargs), headers=self.headers, timeout=self.timeout_s
                )
                return self._parse(resp)
            except (httpx.TransportError, httpx.HTTPStatusError) as e:
                if attempt == self.retries:
                    raise ServerlessError(f"{self.url}: failed after {attempt + 1} attempts: {e}") from e
                time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            for attempt in range(self.retries + 1):
                self.attempts += 1
                try:
                    resp = await client.post(self.url, json=self._payload(args, kwargs), headers=self.headers)
                    return self._parse(resp)
                except (httpx.TransportError, httpx.HTTPStatusError) as e:
                    if attempt == self.retries:
                        raise ServerlessError(f"{self.url}: failed after {attempt + 1} attempts: {e}") from e
                    await asyncio.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")
