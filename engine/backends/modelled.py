"""Modelled generation: a continuous-batching engine whose compute is a roofline of a device.

The control plane (proxy, env loops, buffer, weight sync) is real; only the GPU is replaced. Requests
queue; each engine *iteration* admits waiting requests while the batch has room, prefills their prompt
tokens that are not in the prefix cache in one forward pass (`prefill_only_s` of `engine.devices`: the
weight GEMMs, at least one weight read, plus attention over each prompt's cached prefix), then runs decode
steps that give every running sequence one token each (`decode_step_s`, KV of every running context
included). The prefill pass stalls the decode batch, as SGLang schedules by default (prefill batches run
apart from decode batches); vLLM V1's mixed batches, where a small prefill rides on a decode step's weight
read, are not modelled. A request leaves the batch after its number of output tokens; it gets fixed token
ids (`token_id`), log-probs of `LOGPROB` each and the version at admission. Time is real but scaled: the
engine waits `time_scale` wall seconds per modelled second, so the callers feel the queueing and batching.

Cheap to simulate, and exact at the step: each iteration is a *segment*, from one event to the next: the
admitted requests' prefill pass and then the decode steps up to the next finish; between
events the batch is fixed and a step's KV grows linearly, so its time is one closed form
(`decode_steps_s`) and it is taken as one sleep — O(events), not O(steps x batch). An event that comes
in during a segment (an arrival, an abort, new weights) cuts it at the decode step boundary at or after
its time, where the engine takes it in, as a continuous-batching engine does between two steps; the
requests that finished are returned at the end of their step. Each segment starts where the last was
planned to end, so oversleeping (a loaded event loop) is credited and throughput keeps to modelled x
time_scale. Idle, no task runs: the next request starts the engine. Waits and timestamps go by the
event loop's clock (`clock`), so under a loop with a simulated clock (`bench.clock`) the same engine runs
in simulated time.

KV memory (`kv_tokens`, default: what fits in device memory next to the weights) holds the running batch
and the prefix cache. A request is admitted only if its prompt and all its output tokens fit next to the
running ones' (a reservation, as SGLang's scheduler reserves output room; it knows the output length, so
no request is ever preempted and recomputed), or if the batch is empty (a request bigger than memory runs
alone, where a real engine would reject it); otherwise it waits, first come first served. Prefix cache:
per trajectory, the token ids whose KV the previous turn left behind (prompt + output), an LRU in the
memory the running batch leaves free. A turn prefills only the tokens after the longest common prefix
with its trajectory's entry, and that entry becomes the running sequence's KV until it leaves. New
weights (`load_weights`) empty the cache and re-prefill the running sequences' contexts at the next
iteration, as a real engine recomputes KV after an update.

`engine.backends.pd` adds PD disaggregation on top of this engine.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

from engine.backends.base import GenerationBackend
from engine.backends.modelled_state import Counters, ModelledSeq, Segment, need
from engine.backends.pacing import Alarm, clock
from engine.backends.prefix_cache import PrefixCache
from engine.devices import (
    DecodeCost,
    DeviceProfile,
    ModelProfile,
    attention_pairs,
    kv_capacity_tokens,
    prefill_only_s,
)
from engine.types import GenOutput, GenRequest

LOGPROB = -1.0  # behaviour log-prob reported for every fake token
OutputTokens = int | Callable[[GenRequest, random.Random], int] | None


class ModelledBackend(GenerationBackend):
    """Continuous batching on a modelled `device` running `model` over `tp` devices (module doc).

    `output_tokens`: how many tokens a request generates, capped by its `sampling.max_tokens` (None: always
    `max_tokens`; an int; or `f(request, rng)` with an rng seeded by `seed` and the request id, so a
    request's length does not depend on arrival order). Hitting the cap reports "length", else "stop".
    """

    def __init__(
        self,
        model: ModelProfile,
        device: DeviceProfile,
        tp: int = 1,
        time_scale: float = 1e-3,
        max_batch: int = 256,
        prefix_cache: bool = True,
        output_tokens: OutputTokens = None,
        seed: int = 0,
        *,
        mfu: float = 1.0,
        mbu: float = 1.0,
        kv_tokens: int | None = None,
        token_id: int = 0,
    ) -> None:
        if tp < 1 or max_batch < 1 or time_scale <= 0:
            raise ValueError(f"need tp >= 1, max_batch >= 1, time_scale > 0: {tp}, {max_batch}, {time_scale}")
        if not (0 < mfu <= 1 and 0 < mbu <= 1):
            raise ValueError(f"mfu and mbu are fractions of peak in (0, 1], got {mfu}, {mbu}")
        self.model, self.device, self.tp = model, device, tp
        self.time_scale, self.max_batch = time_scale, max_batch
        self.mfu, self.mbu, self.token_id = mfu, mbu, token_id
        self.version = 0
        self.kv_tokens = kv_capacity_tokens(model, device, tp) if kv_tokens is None else kv_tokens
        self._reserved = 0  # KV tokens the admitted requests hold or will hold: prompts + outputs
        self._holders = 0  # admitted requests, within max_batch
        self._cache = PrefixCache() if prefix_cache else None
        self._output_tokens = output_tokens
        self._seed = seed
        self._alarm = Alarm()  # the end of the segment in flight (module doc)
        self._segment: Segment | None = None
        self._next_start: float | None = None  # loop time the next segment starts: the last one's end
        self._decode_s = DecodeCost(model, device, tp, mfu=mfu, mbu=mbu)
        self._inflight: dict[str, ModelledSeq] = {}
        self._waiting: deque[ModelledSeq] = deque()  # waiting for KV memory
        self._ready: list[ModelledSeq] = []  # admitted, to join the decode batch at the next iteration
        self._running: dict[str, ModelledSeq] = {}
        self._finishing: list[tuple[int, int, ModelledSeq]] = []  # heap of (finish step, tie-break, seq)
        self._order = itertools.count()
        self._step = 0  # decode steps run so far
        self._context = 0  # KV tokens the next decode step reads: the running contexts, summed
        self._stale = False  # new weights: running KV must be recomputed
        self._busy_s = 0.0  # modelled seconds the device worked
        self._created = clock()
        self._counters = Counters()
        self._loop_task: asyncio.Task[None] | None = None

    # ---- public API -------------------------------------------------------------------------------

    async def generate(self, request: GenRequest) -> GenOutput:
        rid = request.request_id
        if rid in self._inflight:
            raise ValueError(f"request id {rid!r} is already in flight")
        if not request.prompt_ids:
            raise ValueError(f"request {rid!r}: empty prompt")
        if request.sampling.max_tokens < 1:
            raise ValueError(f"request {rid!r}: max_tokens must be >= 1")
        future: asyncio.Future[GenOutput] = asyncio.get_running_loop().create_future()
        seq = ModelledSeq(request, future, self._target(request), submitted=clock())
        self._inflight[rid] = seq
        self._counters.requests += 1
        self._submit(seq)
        try:
            return await future
        except asyncio.CancelledError:
            self._drop(seq)  # the caller gave up: free the batch slot now
            raise

    def load_weights(self, named_tensors: Iterable[Any], version: int) -> None:
        """No weights to copy: later admissions carry `version`; running KV is recomputed (module doc)."""
        self.version = version
        self._stale = bool(self._running)
        if self._cache is not None:
            self._cache.clear()
        if self._loop_task is not None:  # recomputed from the next step on (a sync caller may be on a thread)
            self._loop_task.get_loop().call_soon_threadsafe(self._interrupt)

    async def abort(self, request_id: str) -> None:
        seq = self._inflight.get(request_id)
        if seq is not None:
            self._drop(seq)

    async def close(self) -> None:
        for seq in list(self._inflight.values()):
            self._drop(seq)
        if self._loop_task is not None:
            await self._loop_task

    def stats(self) -> dict[str, float]:
        """Counters, modelled busy and elapsed seconds, and utilisation = busy / elapsed."""
        elapsed = (clock() - self._created) / self.time_scale
        return {
            **asdict(self._counters),
            "running": len(self._running),
            "waiting": sum(not s.finish_reason for s in self._waiting),  # aborted ones leave lazily
            "decode_steps": self._step,
            "busy_s": self._busy_s,
            "elapsed_s": elapsed,
            "utilisation": min(1.0, self._busy_s / elapsed),
        }

    # ---- engine -----------------------------------------------------------------------------------

    def _target(self, request: GenRequest) -> int:
        cap = request.sampling.max_tokens
        spec = self._output_tokens
        if spec is None:
            return cap
        rng = random.Random(f"{self._seed}:{request.request_id}")
        n = spec if isinstance(spec, int) else spec(request, rng)
        if n < 1:
            raise ValueError(f"output_tokens gave {n} tokens for request {request.request_id!r}; need >= 1")
        return min(n, cap)

    def _submit(self, seq: ModelledSeq) -> None:
        """Queue for admission: KV memory and a batch slot (module doc)."""
        self._waiting.append(seq)
        self._ensure_loop()

    def _start(self, seq: ModelledSeq) -> None:
        """An admitted `seq` joins the batch at the next iteration, which prefills it (PD: its stage does)."""
        self._ready.append(seq)

    def _has_batch(self) -> bool:
        """Admit waiting requests in order while KV memory and batch slots last (a request bigger than
        memory only when nothing else holds any), then say whether there is a batch to run."""
        while self._waiting:
            seq = self._waiting[0]
            if not seq.finish_reason:  # else aborted while waiting: dropped here
                full = self._reserved and self._reserved + need(seq) > self.kv_tokens
                if full or self._holders >= self.max_batch:
                    break
                self._lookup(seq)  # its cached prefix becomes part of its reservation
                seq.reserved = True
                self._holders += 1
                self._reserved += need(seq)
                if self._cache is not None:  # the cache lives in the memory the admitted ones leave free
                    self._cache.fit(self.kv_tokens - self._reserved)
                self._start(seq)
            self._waiting.popleft()
        return bool(self._running or self._ready)

    def _ensure_loop(self) -> None:
        """Start the engine for new work, or take it in at the next step boundary when it runs."""
        if self._loop_task is None:
            self._next_start = clock()
            self._loop_task = asyncio.create_task(self._run())
        else:
            self._interrupt()

    def _prefill_cost(self, tokens: int, pairs: int, longest: int) -> float:
        """Modelled seconds to (re)compute the KV of `tokens` tokens for the decode batch, whose attention
        spans `pairs` (query, key) pairs, `longest` of them one request's: one prefill forward pass that
        stalls the decode batch."""
        if not tokens:
            return 0.0
        return prefill_only_s(
            self.model, self.device, tokens, self.tp, pairs=pairs, longest=longest, mfu=self.mfu, mbu=self.mbu
        )

    async def _run(self) -> None:
        try:
            while self._has_batch():
                assert self._next_start is not None
                await self._alarm.until(self._plan(self._next_start))
                self._segment = None
                for seq in self._finished():
                    self._resolve(seq)
        except Exception as exc:  # an engine bug must fail its callers, not hang them
            for seq in list(self._inflight.values()):
                if not seq.future.done():
                    seq.future.set_exception(exc)
            raise
        finally:
            self._loop_task = self._segment = self._next_start = None

    def _plan(self, start: float) -> float:
        """Commit the segment starting at loop time `start`: the admitted join the batch (one prefill pass),
        then decode steps to the next finish. Returns the loop time it ends."""
        prefill = self._prefill() if self._stale or self._ready else 0.0
        finishing = self._finishing
        while finishing and finishing[0][2].finish_reason:  # aborted while running
            heapq.heappop(finishing)
        batch = len(self._running)
        steps = finishing[0][0] - self._step if batch else 0
        segment = Segment(start, prefill, steps, self._step, self._context, batch, self._busy_s)
        self._segment = segment
        return self._commit(segment, steps)

    def _commit(self, segment: Segment, steps: int) -> float:
        """The engine's state at the end of `segment`'s first `steps` decode steps; the loop time they end."""
        cost = segment.prefill_s + (self._decode_s(segment.context, steps, segment.batch) if steps else 0.0)
        segment.steps = steps
        self._step = segment.step + steps
        self._context = segment.context + segment.batch * steps
        self._busy_s = segment.busy_s + cost
        self._next_start = segment.start + cost * self.time_scale
        return self._next_start

    def _interrupt(self) -> None:
        """An event during the segment in flight: it is cut at the decode step boundary at or after now, where
        the engine takes the event in (module doc)."""
        segment = self._segment
        if segment is None or segment.steps <= 1:
            return
        spent = (clock() - segment.start) / self.time_scale - segment.prefill_s  # decoding, modelled s
        low, high = 1, segment.steps  # the first step that ends at or after now
        while low < high:
            mid = (low + high) // 2
            done = self._decode_s(segment.context, mid, segment.batch) >= spent
            low, high = (low, mid) if done else (mid + 1, high)
        if low < segment.steps:
            self._alarm.move(self._commit(segment, low))

    def _finished(self) -> list[ModelledSeq]:
        """The running requests whose last token the segment just ended made: out of the batch."""
        done = []
        finishing = self._finishing
        while finishing and finishing[0][0] <= self._step:
            seq = heapq.heappop(finishing)[2]
            if not seq.finish_reason:
                self._leave(seq, "length" if seq.target == seq.request.sampling.max_tokens else "stop")
                done.append(seq)
        return done

    def _prefill(self) -> float:
        """The admitted join the batch (after new weights, every running context is computed again): the
        prefill's modelled seconds."""
        each: list[int] = []  # (query, key) pairs of each request prefilled here
        prefill = 0
        if self._stale:  # new weights: every running context is computed again
            contexts = [len(s.request.prompt_ids) + self._step - s.start_step for s in self._running.values()]
            prefill, each = self._context, [attention_pairs(n) for n in contexts]
        self._counters.recomputed_tokens += prefill
        self._stale = False
        now = clock()
        for seq in self._ready:
            if seq.finish_reason:  # aborted since its admission
                continue
            self._join(seq, now)
            if not seq.prefilled:
                prefill += seq.prefill_tokens
                each.append(attention_pairs(seq.prefill_tokens, seq.cached_tokens))
        self._ready.clear()
        return self._prefill_cost(prefill, sum(each), max(each, default=0))

    def _lookup(self, seq: ModelledSeq) -> None:
        """Split the prompt into cached and to-be-prefilled tokens."""
        prompt = seq.request.prompt_ids
        cached = self._cache.take(seq.request.trajectory_id, prompt) if self._cache is not None else 0
        seq.cached_tokens, seq.prefill_tokens = cached, len(prompt) - cached
        self._counters.cached_tokens += cached
        self._counters.prefill_tokens += seq.prefill_tokens

    def _join(self, seq: ModelledSeq, now: float) -> None:
        """Put an admitted `seq` in the decode batch."""
        seq.admitted, seq.version = now, self.version
        seq.start_step, seq.started_s = self._step, self._busy_s
        self._running[seq.request.request_id] = seq
        self._context += len(seq.request.prompt_ids)
        heapq.heappush(self._finishing, (self._step + seq.target, next(self._order), seq))

    def _release(self, seq: ModelledSeq) -> None:
        """`seq` gives back its KV memory and batch slot."""
        seq.reserved = False
        self._holders -= 1
        self._reserved -= need(seq)

    def _leave(self, seq: ModelledSeq, reason: str) -> None:
        """Take a running `seq` out of the batch; its KV (prompt + output) goes to the prefix cache."""
        del self._running[seq.request.request_id]
        seq.generated = self._step - seq.start_step
        seq.modelled_s = self._busy_s - seq.started_s
        seq.finish_reason = reason
        self._context -= len(seq.request.prompt_ids) + seq.generated
        self._release(seq)
        self._counters.generated_tokens += seq.generated
        self._counters.finished += reason != "abort"
        if self._cache is not None:
            ids = seq.request.prompt_ids + [self.token_id] * seq.generated
            self._cache.store(seq.request.trajectory_id, ids, self.kv_tokens - self._reserved)

    def _drop(self, seq: ModelledSeq) -> None:
        """Abort `seq` wherever it is (the segment in flight is cut at the step it is in); a finished one is
        left alone."""
        if seq.finish_reason:
            return
        self._interrupt()
        if seq.request.request_id in self._running:
            self._leave(seq, "abort")
        elif seq.reserved:  # admitted, not yet in the batch (PD: in its prefill stage)
            self._release(seq)
        seq.finish_reason = "abort"  # queued seqs are skipped when their stage reaches them
        self._counters.aborted += 1
        self._resolve(seq)

    def _resolve(self, seq: ModelledSeq) -> None:
        self._inflight.pop(seq.request.request_id, None)
        if seq.future.done():  # the caller was cancelled
            return
        now = clock()
        admitted = seq.admitted or now
        n = seq.generated
        seq.future.set_result(
            GenOutput(
                request_id=seq.request.request_id,
                token_ids=[self.token_id] * n,
                logprobs=[LOGPROB] * n,
                version=seq.version if seq.version >= 0 else self.version,
                finish_reason=seq.finish_reason,
                timings={
                    "queue_s": admitted - seq.submitted,
                    "gen_s": now - admitted,
                    "modelled_s": seq.modelled_s,
                    "prefill_tokens": seq.prefill_tokens,
                    "cached_tokens": seq.cached_tokens,
                },
            )
        )
