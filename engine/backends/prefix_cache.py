"""The modelled engine's prefix cache: per trajectory, the token ids whose KV its previous turn left."""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    """LRU of the token ids whose KV each trajectory left in the cache, bounded in tokens by the caller."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, list[int]] = OrderedDict()
        self._tokens = 0

    def take(self, trajectory_id: str, prompt: list[int]) -> int:
        """Prompt tokens already cached: the common prefix with the trajectory's entry, which leaves the
        cache (its KV is now the running sequence's, stored again when that one leaves)."""
        cached = self._entries.pop(trajectory_id, None) if trajectory_id else None
        if cached is None:
            return 0
        self._tokens -= len(cached)
        n = min(len(cached), len(prompt))
        # The entry is the cache's own and leaves it: cut or extend it to the prompt's length and compare the
        # two whole, one pass over the context (a slice of the prompt would copy all of it first).
        del cached[n:]
        cached += prompt[n:]
        if cached == prompt:  # the usual case, a grown context
            return n
        return next(i for i, (a, b) in enumerate(zip(cached, prompt, strict=True)) if a != b)

    def store(self, trajectory_id: str, ids: list[int], limit: int) -> None:
        """Keep `ids` as the trajectory's entry, evicting the least recently used to stay within `limit`; the
        cache owns `ids` from now on (`take` reshapes it)."""
        if not trajectory_id:
            return
        old = self._entries.pop(trajectory_id, None)
        self._tokens -= len(old) if old is not None else 0
        if len(ids) > limit:
            return
        self._entries[trajectory_id] = ids
        self._tokens += len(ids)
        self.fit(limit)

    def fit(self, limit: int) -> None:
        """Evict the least recently used entries until at most `limit` tokens stay."""
        while self._entries and self._tokens > limit:
            self._tokens -= len(self._entries.popitem(last=False)[1])

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
