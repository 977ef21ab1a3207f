"""Generation with a Hugging Face causal LM and continuous batching, for CPUs and small models.

One asyncio task drives the engine: each *step* gives every active sequence one new token. Sequences that
were decoding run as one batched forward over a shared, left-padded KV cache; requests that arrived since
the last step are prefilled together (right-padded, so no query row is fully masked) and merged into the
batch; finished and aborted sequences leave the batch after the step. Forwards run in a one-thread executor
so the event loop keeps accepting requests while the model computes.

Log-prob convention (shared with the vLLM backend, which reports vLLM's "processed_logprobs"): each output
log-prob is the log-probability with which the sampler drew that token, i.e. `log_softmax(logits / T)`
after top-p masking (renormalised over the kept tokens). With `top_p == 1` this is exactly the policy's
temperature-scaled log-prob `log_softmax(logits / T)[token]` that the GRPO importance ratio needs. Greedy
requests (`T == 0`) report the unscaled `log_softmax(logits)[token]`.

`load_weights` copies tensors in place between steps (it waits for a running step to finish). Sequences in
flight then re-prefill their whole context with the new weights, so every later token is the new version's.
An output's `version` is the version that produced its first token. Timings: `queue_s` runs from
submission to the start of the step that produced the first token, `gen_s` from there to the end.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Container, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from engine.backends.base import GenerationBackend
from engine.precision import Precision, resolve_dtype
from engine.types import GenOutput, GenRequest


@dataclass(eq=False)
class _Seq:
    """One request's state inside the engine."""

    request: GenRequest
    future: asyncio.Future[GenOutput]
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    submitted: float
    admitted: float = 0.0
    version: int = -1
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    aborted: bool = False
    finish_reason: str = ""

    @property
    def context(self) -> list[int]:
        return self.request.prompt_ids + self.tokens


class HFBackend(GenerationBackend):
    """Continuous-batching generation on a `transformers` causal LM (see the module docstring)."""

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        device: str = "cpu",
        max_batch: int = 32,
        dtype: Precision = "auto",
        eos_token_ids: Iterable[int] | None = None,
    ) -> None:
        """`dtype`: the weights' precision (engine/precision.py; auto: bfloat16 on a GPU, float32 on a CPU);
        published weights are cast to it as they load."""
        torch_dtype = getattr(torch, resolve_dtype(dtype, str(device)))
        if not isinstance(model, PreTrainedModel):
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch_dtype)
        # in place; transformers types `PreTrainedModel.to` as a functools.wraps object, whose self is unbound
        model.to(device=device, dtype=torch_dtype)  # type: ignore[call-arg]
        self.model = model.eval()
        self.device = torch.device(device)
        self.max_batch = max_batch
        self.max_context = int(self.model.config.max_position_embeddings)
        if eos_token_ids is None:
            eos = self.model.generation_config.eos_token_id
            eos_token_ids = [] if eos is None else [eos] if isinstance(eos, int) else eos
        self.eos_token_ids = frozenset(eos_token_ids)
        self.version = 0
        self._params = dict(self.model.named_parameters(remove_duplicate=False))
        self._lock = threading.Lock()  # held by a step's forward and by load_weights
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-backend")
        self._rng = torch.Generator(device=self.device)
        self._rng.seed()  # unseeded requests draw from here, nondeterministically
        self._waiting: deque[_Seq] = deque()
        self._inflight: dict[str, _Seq] = {}
        self._loop_task: asyncio.Task[None] | None = None
        # Batch state, touched only between or inside steps (never concurrently).
        self._running: list[_Seq] = []
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self._stale = False  # set by load_weights: the KV cache predates the weights

    # ---- public API -------------------------------------------------------------------------------

    async def generate(self, request: GenRequest) -> GenOutput:
        validate_request(request, self.max_context, self._inflight)
        sampling = request.sampling
        generator = None
        if sampling.seed is not None and sampling.temperature > 0:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        seq = _Seq(
            request=request,
            future=asyncio.get_running_loop().create_future(),
            stop_ids=self.eos_token_ids | frozenset(sampling.stop_token_ids),
            generator=generator,
            submitted=time.perf_counter(),
        )
        self._inflight[request.request_id] = seq
        self._waiting.append(seq)
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run())
        try:
            return await seq.future
        except asyncio.CancelledError:
            seq.aborted = True  # the caller gave up: free the batch slot at the next step
            raise

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy `named_tensors` (HF parameter names) into the model; later tokens carry `version`.

        Every name and shape is checked before anything is copied, so a bad update changes nothing.
        """
        updates = list(named_tensors)
        for name, tensor in updates:
            param = self._params.get(name)
            if param is None:
                raise KeyError(f"load_weights: model has no parameter {name!r}")
            if param.shape != tensor.shape:
                raise ValueError(
                    f"load_weights: {name} has shape {tuple(param.shape)}, got {tuple(tensor.shape)}"
                )
        with self._lock, torch.no_grad():
            for name, tensor in updates:
                self._params[name].copy_(tensor)
            self.version = version
            self._stale = True

    async def abort(self, request_id: str) -> None:
        seq = self._inflight.get(request_id)
        if seq is None:
            return
        seq.aborted = True
        if seq in self._waiting:
            self._waiting.remove(seq)
            seq.finish_reason = "abort"
            self._resolve(seq)

    async def close(self) -> None:
        for request_id in list(self._inflight):
            await self.abort(request_id)
        if self._loop_task is not None:
            await self._loop_task
        self._executor.shutdown(wait=True)

    # ---- engine loop (event-loop thread) ----------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting or self._running:
            admitted: list[_Seq] = []
            while self._waiting and len(self._running) + len(admitted) < self.max_batch:
                admitted.append(self._waiting.popleft())
            try:
                finished = await loop.run_in_executor(self._executor, self._step, admitted)
            except Exception as exc:  # a failed step fails the requests it held, not the engine
                for seq in [s for s in self._inflight.values() if s not in self._waiting]:
                    if not seq.future.done():
                        seq.future.set_exception(exc)
                    del self._inflight[seq.request.request_id]
                self._reset()
                continue
            for seq in finished:
                self._resolve(seq)
        self._loop_task = None

    def _resolve(self, seq: _Seq) -> None:
        self._inflight.pop(seq.request.request_id, None)
        if seq.future.done():  # the caller was cancelled
            return
        now = time.perf_counter()
        admitted = seq.admitted or now
        seq.future.set_result(
            GenOutput(
                request_id=seq.request.request_id,
                token_ids=seq.tokens,
                logprobs=seq.logprobs,
                version=seq.version if seq.version >= 0 else self.version,
                finish_reason=seq.finish_reason,
                timings={"queue_s": admitted - seq.submitted, "gen_s": now - admitted},
            )
        )

    # ---- one engine step (executor thread) --------------------------------------------------------

    @torch.inference_mode()
    def _step(self, admitted: list[_Seq]) -> list[_Seq]:
        """Advance every running sequence and every admitted one by one token; return finished ones."""
        now = time.perf_counter()
        for seq in admitted:
            seq.admitted = now
        finished = [s for s in [*self._running, *admitted] if s.aborted]
        for seq in finished:
            seq.finish_reason = "abort"
        self._keep([s for s in self._running if not s.aborted])
        admitted = [s for s in admitted if not s.aborted]
        with self._lock:
            if self._stale:  # new weights: recompute every running sequence's KV cache
                admitted = [*self._running, *admitted]
                self._keep([])
                self._stale = False
            decoding = list(self._running)
            if decoding:
                self._sample(decoding, self._decode())
            if admitted:
                self._sample(admitted, self._prefill(admitted))
        done = [s for s in self._running if self._check_finished(s)]
        self._keep([s for s in self._running if not s.finish_reason])
        return finished + done

    def _decode(self) -> torch.Tensor:
        """Feed each running sequence its last sampled token; return next-token logits [B, V]."""
        last = torch.tensor([[s.tokens[-1]] for s in self._running], device=self.device)
        positions = self._mask.sum(dim=1, keepdim=True)
        self._mask = torch.cat([self._mask, torch.ones_like(positions)], dim=1)
        out = self.model(
            input_ids=last,
            attention_mask=self._mask,
            position_ids=positions,
            past_key_values=self._cache,
            use_cache=True,
        )
        return out.logits[:, -1, :]

    def _prefill(self, seqs: list[_Seq]) -> torch.Tensor:
        """Run the contexts of `seqs` right-padded, merge their KV into the batch; return logits [N, V]."""
        contexts = [s.context for s in seqs]
        lengths = torch.tensor([len(c) for c in contexts], device=self.device)
        width = int(lengths.max())
        ids = torch.zeros(len(seqs), width, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for row, ctx in enumerate(contexts):
            ids[row, : len(ctx)] = torch.tensor(ctx, device=self.device)
            mask[row, : len(ctx)] = 1
        cache = DynamicCache(config=self.model.config)
        positions = torch.arange(width, device=self.device).expand(len(seqs), width)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
        self._merge(seqs, cache, lengths)
        return out.logits[torch.arange(len(seqs)), lengths - 1, :]

    def _merge(self, seqs: list[_Seq], cache: DynamicCache, lengths: torch.Tensor) -> None:
        """Append right-padded prefill KV rows to the left-padded batch cache (real tokens end-aligned)."""
        old = len(self._running)
        old_len = self._mask.shape[1]
        total = max(old_len, int(lengths.max()))
        mask = torch.zeros(old + len(seqs), total, dtype=torch.long, device=self.device)
        mask[:old, total - old_len :] = self._mask
        for row, n in enumerate(lengths.tolist()):
            mask[old + row, total - n :] = 1
        if self._cache is None:
            self._cache = DynamicCache(config=self.model.config)
        for layer, new in zip(_kv_layers(self._cache), _kv_layers(cache), strict=True):
            for attr in ("keys", "values"):
                src = getattr(new, attr)
                merged = src.new_zeros(old + len(seqs), src.shape[1], total, src.shape[3])
                if old:
                    merged[:old, :, total - old_len :] = getattr(layer, attr)
                for row, n in enumerate(lengths.tolist()):
                    merged[old + row, :, total - n :] = src[row, :, :n]
                setattr(layer, attr, merged)
            layer.is_initialized, layer.dtype, layer.device = True, new.dtype, new.device
        self._mask = mask
        self._running = [*self._running, *seqs]

    def _keep(self, seqs: list[_Seq]) -> None:
        """Shrink the batch to `seqs` (a subsequence of the running ones) and drop all-padding columns."""
        if len(seqs) == len(self._running):
            return
        if not seqs:
            self._reset()
            return
        index = {id(s): i for i, s in enumerate(self._running)}
        rows = torch.tensor([index[id(s)] for s in seqs], device=self.device)
        mask = self._mask[rows]
        start = int(mask.any(dim=0).long().argmax())
        self._mask = mask[:, start:]
        assert self._cache is not None
        for layer in self._cache.layers:
            for attr in ("keys", "values"):
                setattr(layer, attr, getattr(layer, attr)[rows, :, start:])
        self._running = seqs

    def _reset(self) -> None:
        """Empty the batch: no running sequences, no KV cache."""
        self._running, self._cache, self._stale = [], None, False
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)

    def _sample(self, seqs: list[_Seq], logits: torch.Tensor) -> None:
        """Pick one token per sequence from `logits` [N, V]; record it and its log-prob (see module doc)."""
        logits = logits.float()
        temps = torch.tensor([s.request.sampling.temperature for s in seqs], device=logits.device)
        scaled = logits / torch.where(temps > 0, temps, 1.0).unsqueeze(1)
        top_p = torch.tensor(
            [s.request.sampling.top_p if s.request.sampling.temperature > 0 else 1.0 for s in seqs],
            device=logits.device,
        )
        if bool((top_p < 1).any()):
            scaled = top_p_filter(scaled, top_p)
        logprobs = torch.log_softmax(scaled, dim=-1)
        probs = logprobs.exp()
        for row, seq in enumerate(seqs):
            if seq.request.sampling.temperature == 0:
                token = int(logits[row].argmax())
            else:
                token = int(torch.multinomial(probs[row], 1, generator=seq.generator or self._rng))
            if seq.version < 0:
                seq.version = self.version
            seq.tokens.append(token)
            seq.logprobs.append(float(logprobs[row, token]))

    def _check_finished(self, seq: _Seq) -> bool:
        if seq.tokens[-1] in seq.stop_ids:
            seq.finish_reason = "stop"
        elif len(seq.tokens) >= seq.request.sampling.max_tokens or len(seq.context) >= self.max_context:
            seq.finish_reason = "length"
        return bool(seq.finish_reason)


def _kv_layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers, each holding keys and values (a DynamicLayer), which the batch merges and cuts;
    TypeError for a model with other layers (the recurrent state of linear attention)."""
    layers = []
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer):
            raise TypeError(f"HFBackend batches key/value caches only, not a {type(layer).__name__} layer")
        layers.append(layer)
    return layers


def validate_request(request: GenRequest, max_context: int, inflight: Container[str]) -> None:
    """Reject, with the reason, a request no backend can serve (shared by the HF and vLLM backends)."""
    rid = request.request_id
    if rid in inflight:
        raise ValueError(f"request id {rid!r} is already in flight")
    if not request.prompt_ids:
        raise ValueError(f"request {rid!r}: empty prompt")
    if len(request.prompt_ids) >= max_context:
        raise ValueError(
            f"request {rid!r}: prompt of {len(request.prompt_ids)} tokens does not fit the model's "
            f"context of {max_context}"
        )
    if request.sampling.max_tokens < 1:
        raise ValueError(f"request {rid!r}: max_tokens must be >= 1")
    if request.sampling.temperature < 0 or not 0 < request.sampling.top_p <= 1:
        raise ValueError(f"request {rid!r}: need temperature >= 0 and 0 < top_p <= 1")


def top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every token outside the nucleus of each row (vLLM's rule, so both backends agree).

    Tokens are dropped, smallest first, while the probability mass of the dropped ones stays <= 1 - p; the
    most likely token is always kept.
    """
    sorted_logits, order = logits.sort(dim=-1)
    dropped = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p).unsqueeze(1)
    dropped[:, -1] = False
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(dropped, float("-inf")))
