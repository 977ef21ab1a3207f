"""The modelled engine's records (`engine.backends.modelled`): a request's state in it, its counters, and the
segment of work it is in."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from engine.types import GenOutput, GenRequest


@dataclass(eq=False)
class ModelledSeq:
    """One request's state inside the engine."""

    request: GenRequest
    future: asyncio.Future[GenOutput]
    target: int  # output tokens it will generate
    submitted: float  # wall clock
    admitted: float = 0.0  # wall clock, when it joined the decode batch
    version: int = -1
    prefilled: bool = False  # prompt KV already computed elsewhere (PD)
    reserved: bool = False  # holds KV memory on its engine: from admission until it leaves the batch
    prefill_tokens: int = 0  # prompt tokens computed, i.e. not found in the prefix cache
    cached_tokens: int = 0
    start_step: int = 0  # engine decode step that produces its first token
    started_s: float = 0.0  # engine busy clock (modelled s) at admission
    generated: int = 0
    modelled_s: float = 0.0  # modelled seconds from admission to leaving the batch
    finish_reason: str = ""


@dataclass
class Counters:
    requests: int = 0
    finished: int = 0
    aborted: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0  # running contexts re-prefilled after new weights
    generated_tokens: int = 0


@dataclass
class Segment:
    """The engine's work from one event to the next (`engine.backends.modelled`): a prefill pass, then
    `steps` decode steps of a fixed batch, from the state it starts in."""

    start: float  # loop time it starts: the last segment's planned end
    prefill_s: float  # modelled
    steps: int
    step: int  # decode steps run before it
    context: int  # KV tokens its first step reads
    batch: int  # running sequences
    busy_s: float  # modelled busy seconds before it


def need(seq: ModelledSeq) -> int:
    """KV tokens `seq` holds once admitted: its prompt and every output token it will generate."""
    return len(seq.request.prompt_ids) + seq.target
