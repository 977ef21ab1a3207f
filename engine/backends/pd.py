"""PD disaggregation on modelled devices: prompts are prefilled on one pool, decoded on another (paper §5).

A `PrefillStage` is the prefill side: `tp` devices acting as one prefill engine, shared by every decode
engine it feeds — `xPyD` is one stage of x devices and y `PDBackend` decode engines. Each round it takes
every request queued at that moment as one batch, charges its prefill on the stage's devices
(`prefill_only_s`, the same forward pass a colocated engine runs: weight GEMMs, at least one read of the
weights the batch touches, plus attention over each prompt's cached prefix) and then ships the KV of the
prefilled tokens to the decode side (`kv_transfer_s` over `link_bytes_per_s`, one after the other: no
overlap of compute and transfer), and hands each request to its decode engine, which only decodes (and
admits it when its KV memory has room: `engine.backends.modelled`). The default link is one 400 Gb/s RDMA
NIC on the prefill side (an assumption: prefill and decode pools are different machines, so NVLink does
not apply).

The prefix cache stays per trajectory on the decode engine (it keeps the KV of earlier turns), so only the
uncached tokens are prefilled and shipped. Their attention needs the cached prefix's KV, which the stage
reads for free, as if it kept a copy (a Mooncake-style KV pool with free reads): optimistic for PD, since
fetching it over the NIC would cost ~46 ms for a 40k-token Qwen2.5-7B context. The stage's own KV memory
is not bounded. KV recomputed after new weights is prefilled and shipped the same way and stalls that
decode engine's batch meanwhile.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from engine.backends.modelled import ModelledBackend
from engine.backends.modelled_state import ModelledSeq
from engine.backends.pacing import Pacer, clock
from engine.devices import DeviceProfile, ModelProfile, attention_pairs, kv_transfer_s, prefill_only_s

NIC_BYTES_PER_S = 400e9 / 8  # one 400 Gb/s RDMA NIC


class PrefillStage:
    """Prefill devices shared by PD decode engines (module doc)."""

    def __init__(
        self,
        model: ModelProfile,
        device: DeviceProfile,
        tp: int = 1,
        *,
        link_bytes_per_s: float = NIC_BYTES_PER_S,
        time_scale: float = 1e-3,
        mfu: float = 1.0,
        mbu: float = 1.0,
    ) -> None:
        if tp < 1 or link_bytes_per_s <= 0 or time_scale <= 0:
            raise ValueError(
                f"need tp >= 1, link_bytes_per_s > 0 and time_scale > 0, got {tp}, {link_bytes_per_s}, "
                f"{time_scale}"
            )
        self.model, self.device, self.tp = model, device, tp
        self.link_bytes_per_s, self.time_scale, self.mfu, self.mbu = link_bytes_per_s, time_scale, mfu, mbu
        self.busy_s = 0.0  # modelled seconds the prefill devices computed
        self.transfer_s = 0.0  # modelled seconds of KV shipping
        self.batches = 0
        self._queue: deque[tuple[ModelledSeq, PDBackend]] = deque()
        self._pacer = Pacer(time_scale)
        self._task: asyncio.Task[None] | None = None
        self._created = clock()

    def cost(self, tokens: int, pairs: int, longest: int) -> float:
        """Modelled seconds to prefill `tokens` tokens here, whose attention spans `pairs` (query, key)
        pairs (`longest` of them one request's), and ship their KV; counted as work done."""
        if tokens <= 0:
            return 0.0
        compute = prefill_only_s(
            self.model, self.device, tokens, self.tp, pairs=pairs, longest=longest, mfu=self.mfu, mbu=self.mbu
        )
        transfer = kv_transfer_s(self.model, tokens, self.link_bytes_per_s)
        self.busy_s += compute
        self.transfer_s += transfer
        return compute + transfer

    def stats(self) -> dict[str, float]:
        elapsed = (clock() - self._created) / self.time_scale
        return {
            "prefill_busy_s": self.busy_s,
            "prefill_utilisation": min(1.0, self.busy_s / elapsed),
            "kv_transfer_s": self.transfer_s,
            "prefill_batches": self.batches,
        }

    def submit(self, seq: ModelledSeq, engine: PDBackend) -> None:
        self._queue.append((seq, engine))
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        try:
            while self._queue:
                batch = [(s, e) for s, e in self._queue if not s.finish_reason]
                self._queue.clear()
                self.batches += bool(batch)
                tokens = sum(s.prefill_tokens for s, _ in batch)  # its decode engine looked up its cache
                each = [attention_pairs(s.prefill_tokens, s.cached_tokens) for s, _ in batch]
                self._pacer.owe(self.cost(tokens, sum(each), max(each, default=0)))
                await self._pacer.pay()
                for seq, engine in batch:
                    if not seq.finish_reason:  # else aborted while being prefilled
                        engine._receive(seq)
        finally:
            self._task = None
            self._pacer.reset()


class PDBackend(ModelledBackend):
    """A decode engine on `decode_device` (x `decode_tp`) whose prompts are prefilled by `stage`."""

    def __init__(
        self,
        model: ModelProfile,
        stage: PrefillStage,
        decode_device: DeviceProfile,
        decode_tp: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, decode_device, decode_tp, **kwargs)
        if stage.model != model or stage.time_scale != self.time_scale:
            raise ValueError(
                f"the prefill stage serves {stage.model.name} at time_scale {stage.time_scale}; this decode "
                f"engine {model.name} at {self.time_scale}: they must match"
            )
        self.stage = stage

    def stats(self) -> dict[str, float]:
        """The decode engine's stats plus its prefill stage's (shared with the stage's other engines)."""
        out = super().stats()
        out.update(self.stage.stats())
        return out

    async def close(self) -> None:
        await super().close()
        await self.stage.close()

    def _start(self, seq: ModelledSeq) -> None:
        """Admitted here (KV memory reserved, as an SGLang decode server preallocates before the transfer):
        the stage prefills it."""
        self.stage.submit(seq, self)

    def _receive(self, seq: ModelledSeq) -> None:
        """The stage prefilled `seq` and shipped its KV: it joins this engine's decode batch."""
        seq.prefilled = True
        self._ready.append(seq)
        self._ensure_loop()

    def _prefill_cost(self, tokens: int, pairs: int, longest: int) -> float:
        return self.stage.cost(tokens, pairs, longest)
