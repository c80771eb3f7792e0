"""The tasks of `hetbench train --frontend torch`, as plain torch modules: deterministic from the config, so a run
across several ranks (each taking some rows of every step's global batch) can be checked against the same run in
one process. No MPI and no torch.distributed here: the training command wraps these modules (DDP, or FSDP2 over
`units(model)` then the root) and splits each step's rows.

The contract every task keeps:
- build_model(cfg): float32 on the CPU, its initial parameters a function of the config alone (the global torch
  RNG is neither read nor advanced).
- make_batch(cfg, step, start, stop): rows [start, stop) of step `step`'s global batch, exactly the slice of the
  whole batch (0 rows allowed), whatever range a rank asks for.
- row_losses(model, x, y): one loss per row. The global loss is row_losses(...).sum() / cfg.batch over the whole
  batch, so a rank's part is its rows' sum over the GLOBAL batch and the ranks' summed gradients are the whole
  batch's (hetbench.pytorch.uneven). row_losses calls model(x), so a DDP or FSDP2 wrapper's forward runs.

Task "mlp": exactly hetbench.train's NumPy task (hetbench/train/model.py): h_{l+1} = h_l + relu(h_l @ W_l + b_l),
its initial W, b from hetbench.train.model.init_params (an nn.Linear's weight is W.T), its batch from
hetbench.train.model.make_batch, row loss 0.5 * ||h_L - y||^2.

Task "gpt": a small decoder-only transformer language model, character-level, over the text shipped in
data/text.txt (Shakespeare's Sonnets I-LXVI; data/README.md): token embedding + learned position embedding,
`layers` pre-LayerNorm blocks (causal multi-head self-attention written as explicit matmuls q @ k^T, mask,
softmax, @ v, not F.scaled_dot_product_attention; an MLP of 4 x hidden with GELU), a final
LayerNorm and a linear head (no weight tying). The vocabulary is the sorted set of the text's characters. A batch
row is seq_len + 1 characters from a position drawn, for the whole global batch at once, by
numpy.random.default_rng([seed, 2, step]); x the first seq_len of them, y the next characters. Row loss: the mean
cross-entropy of the row's seq_len next-character predictions. Init: GPT-2's (normal std 0.02, the residual
projections 0.02 / sqrt(2 * layers), biases 0, LayerNorms 1 and 0) from a torch.Generator seeded with cfg.seed.

GPT_DEFAULTS are the settings whose loss falls furthest in 300 CPU steps (docs/pytorch.md has the runs).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any
from importlib import resources

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetbench.train import model as np_model

TASKS = ("mlp", "gpt")

# recommended gpt settings: 300 AdamW steps (lr 3e-3) in 8-13 s on 2 idle CPU cores (module docstring)
GPT_DEFAULTS = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "batch": 32}
GPT_LR = 3e-3  # the AdamW learning rate the figures above were measured with

TEXT_NAME = "text.txt"
TEXT_SOURCE = ("William Shakespeare, The Sonnets (1609), sonnets I-LXVI, modern spelling; public domain "
               "(hetbench/train/torch_frontend/data/README.md)")

_DATA_STREAM = 2  # numpy.random.default_rng([seed, 2, step]) draws gpt's sequence positions
INIT_STD = 0.02  # gpt: GPT-2's init


@dataclass(frozen=True)
class TaskConfig:
    task: str = "mlp"
    layers: int = 4
    hidden: int = 32
    batch: int = 64  # global batch (rows = sequences for gpt)
    seed: int = 0
    seq_len: int = 64  # gpt only: tokens per sequence (context)
    heads: int = 4  # gpt only; hidden % heads == 0 is required

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, not {self.task!r}")
        for name in ("layers", "hidden", "batch", "seq_len", "heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"seed must be a whole number >= 0, not {self.seed!r}")
        if self.task == "gpt":
            if self.hidden % self.heads:
                raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}) for the gpt task")
            if self.seq_len + 1 > len(_text_ids()):
                raise ValueError(f"seq_len {self.seq_len} is longer than the text ({len(_text_ids())} characters) "
                                 "allows")

    def numpy_config(self) -> np_model.ModelConfig:
        """The mlp task's hetbench.train ModelConfig."""
        return np_model.ModelConfig(self.layers, self.hidden, self.batch, self.seed)


# ---- the shipped text -------------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def text() -> str:
    """The gpt task's text (hetbench/train/torch_frontend/data/text.txt), read with importlib.resources."""
    return resources.files(__package__).joinpath("data", TEXT_NAME).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def vocab() -> str:
    """The vocabulary: the sorted set of the text's characters (token i is vocab()[i])."""
    return "".join(sorted(set(text())))


@lru_cache(maxsize=1)
def _text_ids() -> np.ndarray:
    index = {ch: i for i, ch in enumerate(vocab())}
    return np.fromiter((index[ch] for ch in text()), dtype=np.int64, count=len(text()))


def text_sha256() -> str:
    return hashlib.sha256(text().encode("utf-8")).hexdigest()


def encode(s: str) -> torch.Tensor:
    index = {ch: i for i, ch in enumerate(vocab())}
    return torch.tensor([index[ch] for ch in s], dtype=torch.long)


def decode(ids: torch.Tensor | np.ndarray | list[int]) -> str:
    chars = vocab()
    return "".join(chars[int(i)] for i in np.asarray(ids).ravel())


# ---- mlp --------------------------------------------------------------------------------------------------------

class ResidualReLU(nn.Module):
    """h + relu(h @ W + b), with W = linear.weight.T."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.relu(self.linear(h))


class ResidualMLP(nn.Module):
    def __init__(self, layers: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ResidualReLU(hidden) for _ in range(layers))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h)
        return h


def _build_mlp(cfg: TaskConfig) -> ResidualMLP:
    with torch.random.fork_rng(devices=[]):  # nn.Linear's own init draws from the global RNG: leave it as it was
        model = ResidualMLP(cfg.layers, cfg.hidden)
    with torch.no_grad():
        for layer, (W, b) in zip(model.layers, np_model.init_params(cfg.numpy_config())):
            layer.linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(W.T)))
            layer.linear.bias.copy_(torch.from_numpy(b))
    return model


# ---- gpt --------------------------------------------------------------------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        # attention's two products; hetbench.pytorch.offload puts them on a hetbench device
        self.matmul = torch.matmul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        H = self.heads  # under tensor parallelism, this rank's heads (hetbench/pytorch/tensor.py)
        q, k, v = self.qkv(x).chunk(3, dim=2)
        D = self.head_dim
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, D).transpose(1, 2)
        v = v.view(B, T, H, D).transpose(1, 2)
        att = self.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = self.matmul(att, v)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, H * D)
        return self.proj(y)


class FeedForward(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """x + attn(ln1(x)), then + mlp(ln2(.)): a pre-LayerNorm transformer block."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = FeedForward(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    """Token ids (rows, T <= seq_len) -> next-character logits (rows, T, vocab)."""

    def __init__(self, vocab_size: int, seq_len: int, layers: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.tok = nn.Embedding(vocab_size, hidden)
        self.pos = nn.Embedding(seq_len, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.seq_len:
            raise ValueError(f"a sequence of {T} tokens is longer than the context of {self.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        # an nn.Linear on (rows, T, hidden) returns a view of its 2-D result, and FSDP2 warns about a root module
        # returning a view (an in-place op on it would skip its backward hook): hand back a tensor of its own
        return self.head(self.ln_f(x)).clone()


def _build_gpt(cfg: TaskConfig) -> CharGPT:
    with torch.random.fork_rng(devices=[]):
        model = CharGPT(len(vocab()), cfg.seq_len, cfg.layers, cfg.hidden, cfg.heads)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    residual_std = INIT_STD / math.sqrt(2 * cfg.layers)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a fixed order: the module's definition
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0)
            elif name.endswith(("attn.proj.weight", "mlp.proj.weight")):
                p.normal_(0.0, residual_std, generator=gen)
            else:
                p.normal_(0.0, INIT_STD, generator=gen)
    return model


def gpt_param_count(cfg: TaskConfig) -> int:
    h, v = cfg.hidden, len(vocab())
    block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h)
    return v * h + cfg.seq_len * h + cfg.layers * block + 2 * h + h * v + v


# ---- the interface ----------------------------------------------------------------------------------------------

def build_model(cfg: TaskConfig) -> nn.Module:
    """The task's model, float32 on the CPU, initialised from cfg.seed alone."""
    if cfg.task == "mlp":
        return _build_mlp(cfg)
    return _build_gpt(cfg)


def units(model: nn.Module) -> list[nn.Module]:
    """The modules to wrap one by one with FSDP2, in forward order: the mlp's residual layers, the gpt's
    transformer blocks."""
    if isinstance(model, ResidualMLP):
        return list(model.layers)
    if isinstance(model, CharGPT):
        return list(model.blocks)
    if hasattr(model, "block_indices"):  # a pipeline's stage (hetbench.pytorch.pipeline.StageModule): its blocks
        return list(model.blocks)
    raise TypeError(f"{type(model).__name__} is not a model of hetbench.train.torch_frontend.models")


def tensor_plan(model: nn.Module) -> dict[str, Any]:
    """The task's tensor-parallel plan (hetbench.pytorch.tensor): the mlp's residual layers each a column-parallel
    Linear gathered whole (the residual needs every column); the gpt's attention by whole heads (its fused
    q/k/v, the head count it reads) and its MLP's fc/proj a column/row pair. The gpt's embeddings, LayerNorms and
    head stay whole on every rank."""
    # torch.distributed only where a plan is asked for: the tasks themselves stay free of it (module docstring)
    from hetbench.pytorch.tensor import Gathered, heads, pair

    if isinstance(model, ResidualMLP):
        return {"layers.*.linear": Gathered()}
    blocks = list(model.blocks) if isinstance(model, CharGPT) or hasattr(model, "block_indices") else None
    if blocks and isinstance(blocks[0], ResidualReLU):  # a pipeline stage of the mlp (pipeline.StageModule)
        return {"blocks.*.linear": Gathered()}
    if blocks is not None:  # the gpt, or a stage of it: its blocks (a stage's embedding and head stay whole)
        h = blocks[0].attn.heads if blocks else 1
        return {"blocks.*.attn": heads("qkv", "proj", heads=h, attributes={"heads": 1}),
                "blocks.*.mlp": pair("fc", "proj")}
    raise TypeError(f"{type(model).__name__} is not a model of hetbench.train.torch_frontend.models")


class Embedding(nn.Module):
    """The gpt's token + position embedding, the part before its blocks (a pipeline's first stage holds it)."""

    def __init__(self, model: CharGPT) -> None:
        super().__init__()
        self.tok, self.pos = model.tok, model.pos

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    """The gpt's final LayerNorm and head, the part after its blocks."""

    def __init__(self, model: CharGPT) -> None:
        super().__init__()
        self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))


def pipeline_parts(model: nn.Module) -> tuple[list[nn.Module], nn.Module | None, nn.Module | None]:
    """(blocks, what runs before them, what runs after) of a task's model: the mlp is its residual layers alone;
    the gpt its blocks between the embedding and the final LayerNorm + head. Running them in order is the model's
    forward."""
    if isinstance(model, CharGPT):
        return list(model.blocks), Embedding(model), Head(model)
    return units(model), None, None


def _check_rows(cfg: TaskConfig, start: int, stop: int) -> None:
    if not (0 <= start <= stop <= cfg.batch):
        raise ValueError(f"rows [{start}, {stop}) are outside the batch of {cfg.batch}")


def make_batch(cfg: TaskConfig, step: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [start, stop) of step `step`'s global batch, (x, y): identical to slicing the whole batch.
    mlp: float32 (rows, hidden) both. gpt: int64 token ids (rows, seq_len) both, y the characters after x's."""
    _check_rows(cfg, start, stop)
    if cfg.task == "mlp":
        x, y = np_model.make_batch(cfg.numpy_config(), step, start, stop - start)
        return torch.from_numpy(x), torch.from_numpy(y)
    ids = _text_ids()
    rng = np.random.default_rng([int(cfg.seed), _DATA_STREAM, int(step)])
    starts = rng.integers(0, len(ids) - cfg.seq_len, size=cfg.batch)[start:stop]  # whole batch drawn, then sliced
    chunks = ids[starts[:, None] + np.arange(cfg.seq_len + 1)]  # (rows, seq_len + 1)
    chunks = torch.from_numpy(np.ascontiguousarray(chunks))
    return chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous()


def row_losses(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One loss per row, shape (rows,), through model(x) (so a DDP / FSDP2 wrapper's forward runs). A float y is
    the mlp's target (0.5 * ||h_L - y||^2), an integer y the gpt's next characters (mean cross-entropy over the
    row's positions)."""
    return output_row_losses(model(x), y)


def output_row_losses(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """row_losses from the model's output (a pipeline's last stage has the output, not the model)."""
    if y.dtype.is_floating_point:
        return 0.5 * (out - y).square().sum(dim=-1)
    rows, T = y.shape
    losses = F.cross_entropy(out.reshape(rows * T, out.shape[-1]), y.reshape(rows * T), reduction="none")
    return losses.view(rows, T).mean(dim=1)


def describe(cfg: TaskConfig) -> dict:
    """The facts to record in a results file."""
    out: dict = {"task": cfg.task, "layers": cfg.layers, "hidden": cfg.hidden, "batch": cfg.batch, "seed": cfg.seed}
    if cfg.task == "mlp":
        out["parameters"] = cfg.numpy_config().param_count
        out["teacher_layers"] = np_model.TEACHER_LAYERS
        out["loss"] = "sum over rows of 0.5*||h_L - y||^2 / batch"
    else:
        out.update({
            "seq_len": cfg.seq_len,
            "heads": cfg.heads,
            "parameters": gpt_param_count(cfg),
            "vocab": len(vocab()),
            "text": TEXT_NAME,
            "text_sha256": text_sha256(),
            "text_chars": len(text()),
            "text_source": TEXT_SOURCE,
            "loss": "mean over rows of the mean next-character cross-entropy (nats)",
        })
    return out


def train_curve(cfg: TaskConfig, steps: int, lr: float = GPT_LR) -> list[float]:
    """The global loss before each of `steps` AdamW steps (lr `lr`) in one process: the check's reference and the
    figures in the module docstring."""
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = make_batch(cfg, step, 0, cfg.batch)
        loss = row_losses(model, x, y).sum() / cfg.batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _main() -> None:
    import argparse
    import time

    parser = argparse.ArgumentParser(description="the gpt task's loss curve in one process on this machine")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=GPT_LR)
    for name, value in GPT_DEFAULTS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = TaskConfig("gpt", seed=args.seed, **{name: getattr(args, name) for name in GPT_DEFAULTS})
    t0, c0 = time.perf_counter(), time.process_time()
    losses = train_curve(cfg, args.steps, args.lr)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(asdict(cfg), f"lr {args.lr}, torch threads {torch.get_num_threads()}")
    print(f"{args.steps} steps in {seconds:.1f} s ({cpu:.1f} s of CPU time); "
          f"ln(vocab {len(vocab())}) = {math.log(len(vocab())):.3f}")
    for step in sorted({0, *range(0, args.steps, max(1, args.steps // 6)), args.steps - 1}):
        print(f"step {step:5d}  loss {losses[step]:.4f}")


if __name__ == "__main__":
    _main()
