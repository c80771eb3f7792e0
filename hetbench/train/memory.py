"""The host memory a training run takes on a rank, estimated before anything is made (as matmul, collectives, split
and calibrate check theirs), so that a --batch, --hidden or --layers too large for the host is refused in one line
(exit 2) instead of ending in MemoryError after allocating.

An upper bound, in float32 elements (4 bytes each) and counted on the host whatever the rank's device (the batch is
made on the host, and a rank's copies pass through it):
- the model's state: parameters, their gradients and AdamW's two moments, 4 P (sgd: 2 P; a rank holding a shard
  holds less, counted whole here: fsdp gathers whole layers, and the bound stays simple);
- the activations the backward keeps: for the MLP, ACTIVATIONS_PER_LAYER arrays of (batch, hidden) per layer and the
  teacher's; for the GPT, per layer the attention's (batch, heads, T, T) scores twice and GPT_ARRAYS_PER_LAYER
  arrays of (batch, T, hidden), and the logits (batch, T, vocab) twice;
- at rank 0, which checks the run against the same training in one process, the whole of that again.
"""

from __future__ import annotations

from typing import Any

BYTES = 4
ACTIVATIONS_PER_LAYER = 4  # the layer's input, pre-activation, ReLU mask and output, kept for the backward
GPT_ARRAYS_PER_LAYER = 16  # q, k, v, attention output, MLP hidden (4 x wide) and their gradients, rounded up
STATE_COPIES = {"adamw": 4, "sgd": 2}
VOCAB_BOUND = 256  # the GPT's character vocabulary is at most a byte's values


def params(cfg: Any) -> int:
    h, layers = cfg.hidden, cfg.layers
    if getattr(cfg, "model", "mlp") == "gpt":
        return layers * (12 * h * h + 13 * h) + (VOCAB_BOUND + cfg.seq_len) * h + VOCAB_BOUND * h
    return layers * (h * h + h)


def activations(cfg: Any) -> int:
    h, layers, batch = cfg.hidden, cfg.layers, cfg.batch
    if getattr(cfg, "model", "mlp") == "gpt":
        t = cfg.seq_len
        per_layer = 2 * batch * cfg.heads * t * t + GPT_ARRAYS_PER_LAYER * batch * t * h
        return layers * per_layer + 2 * batch * t * VOCAB_BOUND
    return (layers + 2) * ACTIVATIONS_PER_LAYER * batch * h  # the teacher's layers and the loss's arrays beside


def rank_bytes(cfg: Any, rank: int) -> int:
    """The bound on rank `rank`'s host memory for the run `cfg` (a TrainConfig)."""
    one = STATE_COPIES.get(cfg.optimizer, 4) * params(cfg) + activations(cfg)
    return BYTES * one * (2 if rank == 0 else 1)


def memory_errors(cfg: Any, rank: int, share_bytes: int | None) -> list[str]:
    """The refusal where the bound exceeds this rank's share of the host (None: nothing known, nothing refused)."""
    need = rank_bytes(cfg, rank)
    if share_bytes is None or need <= share_bytes:
        return []
    at_root = " and, at rank 0, the one-process run it is checked against" if rank == 0 else ""
    return [f"train --layers {cfg.layers} --hidden {cfg.hidden} --batch {cfg.batch} needs up to {need} bytes of host "
            f"memory on rank {rank} (the model's {params(cfg)} parameters with their gradients and optimizer state, "
            f"the batch's activations{at_root}), more than this rank's share of the host, {share_bytes} bytes; "
            "lower --batch, --hidden or --layers"]
