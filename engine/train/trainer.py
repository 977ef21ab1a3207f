"""The torch training backend: GRPO steps on a Hugging Face causal LM in one process (small models, CPU).

One `train_step` is one optimiser step: the batch is cut into micro-batches whose losses are weighted so
the accumulated gradient equals that of the whole batch, then the gradient norm is clipped and AdamW
steps. `version` counts optimiser steps, which is what generation workers tag their tokens with.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, PreTrainedModel

from engine.precision import Precision, resolve_dtype
from engine.train.batch import TrainBatch, token_logprobs
from engine.train.grpo import LossAgg, policy_loss
from engine.train.packed import decode

if TYPE_CHECKING:
    from transformers import GenerationMixin

    class CausalLM(PreTrainedModel, GenerationMixin):
        """The trainer's model, statically: an HF causal LM, or a module with its edges (MegatronLM)."""


ClipTo = Literal["proximal", "behaviour"]


@dataclass(frozen=True)
class TrainerConfig:
    lr: float = 1e-5
    warmup_steps: int = (
        0  # the lr rises linearly over the first `warmup_steps` steps (from lr / warmup_steps)
    )
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0  # None: report the norm, do not clip
    micro_batch_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.28
    # The clip band's centre (engine.train.grpo.policy_loss): "behaviour", the policy that generated the
    # tokens (plain PPO clipping); or "proximal", the weights this step starts from, with the behaviour
    # policy corrected by importance weights truncated at `is_cap` (inert in one update per batch: the
    # step's own weights are the centre, so nothing clips).
    clip_to: ClipTo = "behaviour"
    is_cap: float = 2.0
    agg: LossAgg = "token-mean"
    kl_beta: float = 0.0
    seed: int = 0
    # The sampling temperature of the rollout: engines report log_softmax(logits / T) of the sampled token,
    # so the trainer scores tokens the same way or the importance ratio is off by the temperature.
    temperature: float = 1.0
    # Forward passes under bfloat16 autocast or in float32 (engine/precision.py; auto: by the device).
    # Weights, gradients and optimiser state stay float32; log-probs and the loss are float32 either way.
    dtype: Precision = "auto"

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not all(0.0 <= b < 1.0 for b in self.betas) or len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 (greedy rollouts have no behaviour distribution)")
        resolve_dtype(self.dtype, "cpu")  # refuses an unknown name
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.clip_to not in ("proximal", "behaviour"):
            raise ValueError(f"clip_to must be 'proximal' or 'behaviour', got {self.clip_to!r}")
        if self.is_cap < 1:
            raise ValueError(f"is_cap must be >= 1, got {self.is_cap}")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimiser step `step` (0-based): linear warm-up, then constant."""
        return self.lr * min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else self.lr


# An HF causal LM, a local HF model directory, or a module with the same edges (engine.train.megatron)
ModelSource = PreTrainedModel | torch.nn.Module | str | Path


class TorchTrainer:
    """GRPO trainer over an HF `AutoModelForCausalLM` (a local directory, or a model object).

    The model stays in eval mode: dropout off, so that on-policy importance ratios are exactly 1 and the
    trainer scores tokens the way the generation engine did. `ref_model` (for the KL term) is required
    exactly when `config.kl_beta > 0`; pass the same one again when resuming from a checkpoint.
    """

    def __init__(
        self,
        model: ModelSource,
        config: TrainerConfig | None = None,
        ref_model: ModelSource | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config = config or TrainerConfig()
        if self.config.kl_beta > 0 and ref_model is None:
            raise ValueError("ref_model is required when kl_beta > 0")
        if self.config.kl_beta == 0 and ref_model is not None:
            raise ValueError("ref_model is only used when kl_beta > 0; drop it or set kl_beta")
        random.seed(self.config.seed)
        torch.manual_seed(self.config.seed)
        self.device = torch.device(device)
        self.dtype = resolve_dtype(self.config.dtype, self.device.type)
        self.model = _load(model, self.device)
        self.ref_model = _load(ref_model, self.device) if ref_model is not None else None
        staged = [hasattr(m, "run_micro_batches") for m in (self.model, self.ref_model) if m is not None]
        if staged == [True, False]:
            raise ValueError(
                "ref_model: a policy that runs its own micro-batches (MegatronLM) needs one that does"
            )
        if staged == [False, True]:  # the trainer scores an HF policy's reference itself, as an HF model
            raise ValueError(
                "ref_model: a reference that runs its own micro-batches (MegatronLM) needs a policy that does"
            )
        if self.ref_model is not None:
            self.ref_model.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=self.config.lr,
            betas=self.config.betas,
            weight_decay=self.config.weight_decay,
        )
        self.version = 0

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimiser step on `batch`; returns loss and statistics of the whole batch."""
        start = time.perf_counter()
        cfg = self.config
        action_tokens = float(batch.loss_mask.sum())
        valid_seqs = float((batch.loss_mask.sum(dim=1) > 0).sum())
        if action_tokens == 0:
            raise ValueError("batch has no action tokens (loss_mask is all zero): nothing to train on")
        self.optimizer.zero_grad(set_to_none=True)
        averaged = ("clip_frac", "ratio_mean", "kl") + (
            ("is_weight_mean", "is_truncated_frac") if cfg.clip_to == "proximal" else ()
        )
        totals = dict.fromkeys(("loss", "entropy", *averaged), 0.0)
        micros = []
        for lo in range(0, len(batch), cfg.micro_batch_size):
            micro = batch.rows(lo, lo + cfg.micro_batch_size)
            micro_tokens = float(micro.loss_mask.sum())
            if micro_tokens == 0:
                continue
            # Weight so that the sum over micro-batches equals the full-batch aggregate.
            if cfg.agg == "token-mean":
                weight = micro_tokens / action_tokens
            else:
                weight = float((micro.loss_mask.sum(dim=1) > 0).sum()) / valid_seqs
            micros.append((micro, weight))
        for (micro, weight), (loss, stats, entropy_sum) in zip(micros, self._backward(micros), strict=True):
            micro_tokens = float(micro.loss_mask.sum())
            totals["loss"] += loss * weight
            for key in averaged:
                totals[key] += stats[key] * micro_tokens / action_tokens
            totals["entropy"] += entropy_sum / action_tokens
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
        own_clip = getattr(
            self.model, "clip_grad_norm_", None
        )  # a model split over ranks clips by the whole norm
        grad_norm = (
            own_clip(max_norm)
            if own_clip
            else torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        )
        lr = cfg.lr_at(self.version)  # from the step count alone, so a resumed run continues the schedule
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        self.optimizer.step()
        self.version += 1
        step_s = time.perf_counter() - start
        tokens = float(batch.attention_mask.sum())
        return {
            **totals,
            "grad_norm": float(grad_norm),
            "lr": lr,
            "tokens": tokens,
            "action_tokens": action_tokens,
            "tokens_per_s": tokens / step_s,
            "compute_s": step_s,  # the optimiser step alone; the metrics' step_s is the whole iteration
            "version": float(self.version),
        }

    def _backward(
        self, micros: list[tuple[TrainBatch, float]]
    ) -> list[tuple[float, dict[str, float], float]]:
        """Each micro-batch's loss, statistics and entropy sum, `loss * weight` backpropagated. A model that
        runs its micro-batches itself (`run_micro_batches`: engine.train.megatron, whose pipeline stages
        need them all) takes them in one call, `_staged`; the loss is the same."""
        run = getattr(self.model, "run_micro_batches", None)
        if run is not None:  # (a reference then has one too: __init__)
            return self._staged(micros, run, getattr(self.ref_model, "run_micro_batches", None))
        out = []
        for micro, weight in micros:
            ids, attn, mask = self._inputs(micro)
            with self._autocast():
                logprobs, entropy = self._scored(self.model, ids, attn, mask)
                ref_logprobs = None
                if self.ref_model is not None:
                    with torch.no_grad():
                        ref_logprobs, _ = self._scored(self.ref_model, ids, attn, mask)
            loss, stats = self._loss(micro, logprobs, mask, ref_logprobs)
            (loss * weight).backward()
            out.append((loss.item(), stats, float((entropy * mask).sum())))
        return out

    def _staged(
        self,
        micros: list[tuple[TrainBatch, float]],
        run: Callable[..., list[Any]],
        ref_run: Callable[..., list[Any]] | None,
    ) -> list[tuple[float, dict[str, float], float]]:
        """`_backward` through the model's `run_micro_batches` (`run`): the loss is computed from each
        micro-batch's logits where they are (the last pipeline stage), and its results reach every rank.
        The KL reference's log-probs come first, from its own forward-only pass (`ref_run`)."""
        inputs = [self._inputs(micro) for micro, _ in micros]
        ids = [i for i, _, _ in inputs]
        refs: list[Tensor | None] = [None] * len(micros)
        if ref_run is not None:
            with torch.no_grad():
                refs = ref_run(
                    ids,
                    lambda k, logits: (None, self._logprobs(logits, ids[k])[0].cpu()),
                    context=self._autocast,
                )

        def loss_of(k: int, logits: Tensor) -> tuple[Tensor, tuple[float, dict[str, float], float]]:
            (micro, weight), (_, _, mask), ref = micros[k], inputs[k], refs[k]
            logprobs, entropy = self._logprobs(logits, ids[k])
            loss, stats = self._loss(micro, logprobs, mask, ref.to(self.device) if ref is not None else None)
            return loss * weight, (loss.item(), stats, float((entropy * mask).sum()))

        return run(ids, loss_of, backward=True, context=self._autocast)

    def _inputs(self, micro: TrainBatch) -> tuple[Tensor, Tensor, Tensor]:
        """Input ids, attention and loss masks of `micro` on the device, without the columns that are
        padding in every row."""
        width = int(micro.attention_mask.sum(dim=1).max())
        ids, attn, mask = (
            t[:, :width].to(self.device) for t in (micro.input_ids, micro.attention_mask, micro.loss_mask)
        )
        return ids, attn, mask

    def _loss(
        self, micro: TrainBatch, logprobs: Tensor, mask: Tensor, ref_logprobs: Tensor | None
    ) -> tuple[Tensor, dict[str, float]]:
        """The GRPO loss of `micro` (engine.train.grpo.policy_loss) from the policy's log-probs."""
        width = logprobs.shape[1]
        return policy_loss(
            logprobs,
            micro.behavior_logprobs[:, :width].to(self.device),
            micro.advantages.to(self.device),
            mask,
            clip_low=self.config.clip_low,
            clip_high=self.config.clip_high,
            agg=self.config.agg,
            ref_logprobs=ref_logprobs,
            kl_beta=self.config.kl_beta,
            # one optimiser step per batch: every micro-batch is scored by the weights the step started
            # from, so these log-probs (without their gradient) are exactly the proximal policy's
            proximal_logprobs=logprobs.detach() if self.config.clip_to == "proximal" else None,
            is_cap=self.config.is_cap,
        )

    def _logprobs(self, logits: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Per-token log-probs and entropies `(B, T)` of `ids` from full logits, at the temperature."""
        return token_logprobs(logits / self.config.temperature, ids)

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.dtype == "bfloat16")

    def _scored(
        self, model: PreTrainedModel, ids: Tensor, attn: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Per-token log-probs and entropies `(B, T)` at the temperature, computed where `mask` is set.

        The LM head and its log-softmax over the vocabulary run on the action tokens only: with a real
        vocabulary (49k for SmolLM2) the `(B, T, V)` logits of every prompt token are most of a step's
        memory traffic and carry no loss. Models whose head is more than a linear map (logit scaling or
        soft-capping) take the plain path over all positions.
        """
        head, decoder = model.get_output_embeddings(), model.get_decoder()
        plain = any(getattr(model.config, k, None) for k in ("final_logit_softcapping", "logit_scale"))
        if plain or head is None or decoder is None or decoder is model:
            return self._logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
        hidden = decode(decoder, ids, attn, mask)
        sel = mask[:, 1:] > 0  # token t is read from the logits at position t - 1
        logp = torch.log_softmax(head(hidden[:, :-1][sel]).float() / self.config.temperature, dim=-1)
        picked = logp.gather(-1, ids[:, 1:][sel][:, None]).squeeze(-1)
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1)
        where = torch.nn.functional.pad(sel, (1, 0))
        zeros = picked.new_zeros(ids.shape, dtype=torch.float32)
        return zeros.masked_scatter(where, picked), zeros.detach().masked_scatter(where, entropy)

    def state_dict(self) -> dict[str, Tensor]:
        """A CPU snapshot of the weights, named exactly as the HF model names them (for publishing)."""
        return {name: t.detach().to("cpu", copy=True) for name, t in self.model.state_dict().items()}

    # The edges a checkpoint uses. A model split over model-parallel ranks (engine.train.megatron) gives and
    # takes whole weights and optimiser state there, every rank calling; only its rank 0 writes.
    @property
    def writes(self) -> bool:
        """Whether this process writes what the trainer saves (False on model-parallel ranks but 0)."""
        return int(getattr(self.model, "rank", 0)) == 0

    def hf_model(self) -> PreTrainedModel:
        """An HF model holding the weights (the model itself, or a whole copy of a split one)."""
        to_hf = getattr(self.model, "to_hf_model", None)
        return to_hf() if to_hf else self.model

    def optimizer_state(self) -> dict:
        own = getattr(self.model, "optimizer_state", None)
        return own(self.optimizer) if own else self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict) -> None:
        own = getattr(self.model, "load_optimizer_state", None)
        if own:
            own(self.optimizer, state)
        else:
            self.optimizer.load_state_dict(state)

    @torch.no_grad()
    def greedy_generate(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        """Greedy continuation of `prompt_ids` (new tokens only), via plain HF `generate`; for checks."""
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        # transformers types generate's self as a Protocol (GenerativePreTrainedModel) its models do not match
        out = self.model.generate(  # type: ignore[misc]
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
        )
        return out[0, len(prompt_ids) :].tolist()


def _load(source: ModelSource, device: torch.device) -> CausalLM:
    """The model of `source` on `device`, in eval mode. A module that is no HF causal LM (MegatronLM)
    stands in for one: it has the same edges (ModelSource)."""
    model: torch.nn.Module
    if isinstance(source, str | Path):
        if not Path(source).is_dir():
            raise ValueError(f"model directory {source} does not exist (the trainer loads local models only)")
        model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True)
    else:
        model = source
    return cast("CausalLM", model.to(device).eval())
