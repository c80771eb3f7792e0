"""The training run's host memory bound (hetbench/train/memory.py), recomputed by hand: 4 bytes per float32 element,
the model's state (parameters, gradients, AdamW's two moments: 4 copies; sgd 2), the activations the backward keeps,
twice at rank 0 (its one-process check)."""

from __future__ import annotations

from types import SimpleNamespace

from hetbench.train import memory


def _mlp(**kw):
    return SimpleNamespace(**{"model": "mlp", "layers": 4, "hidden": 32, "batch": 64, "optimizer": "adamw", **kw})


def test_mlp_bound_by_hand():
    p = 4 * (32 * 32 + 32)  # 4224 parameters
    acts = (4 + 2) * 4 * 64 * 32  # (layers + 2) x 4 arrays of (batch, hidden)
    assert memory.params(_mlp()) == p
    assert memory.rank_bytes(_mlp(), 1) == 4 * (4 * p + acts)
    assert memory.rank_bytes(_mlp(), 0) == 2 * 4 * (4 * p + acts)
    assert memory.rank_bytes(_mlp(optimizer="sgd"), 1) == 4 * (2 * p + acts)


def test_gpt_bound_by_hand():
    cfg = SimpleNamespace(model="gpt", layers=2, hidden=64, heads=4, seq_len=64, batch=32, optimizer="adamw")
    p = 2 * (12 * 64 * 64 + 13 * 64) + (256 + 64) * 64 + 256 * 64
    acts = 2 * (2 * 32 * 4 * 64 * 64 + 16 * 32 * 64 * 64) + 2 * 32 * 64 * 256
    assert memory.params(cfg) == p and memory.activations(cfg) == acts
    assert memory.rank_bytes(cfg, 3) == 4 * (4 * p + acts)


def test_refused_only_above_the_share():
    need = memory.rank_bytes(_mlp(), 0)
    assert memory.memory_errors(_mlp(), 0, need) == []
    assert memory.memory_errors(_mlp(), 0, None) == []
    (line,) = memory.memory_errors(_mlp(), 0, need - 1)
    assert f"needs up to {need} bytes" in line and f"share of the host, {need - 1} bytes" in line
    assert "rank 0" in line and "one-process run" in line
    (line,) = memory.memory_errors(_mlp(), 1, 10)
    assert "one-process run" not in line
