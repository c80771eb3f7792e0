"""Your own model pipelined across unequal ranks with hb.pipeline, checked against the same steps in one process.

    mpiexec -n 2 python examples/pipeline_own_model.py --weights 3,1   # 4 layers cut [3, 1]
    mpiexec -n 3 python examples/pipeline_own_model.py                 # --weights auto: each rank's measured time
    mpiexec -n 4 python examples/pipeline_own_model.py --pp 2          # 2 stages x 2 data-parallel replicas

The model is a small decoder written the way a transformers model is (a config dataclass, token embedding,
pre-norm decoder layers of causal attention and an MLP, a final norm and an lm head), in plain torch: nothing is
downloaded. Its layers are the pipeline's blocks, the embedding runs before them on the first stage, the norm and
head after them on the last. The loss of a micro-batch is its rows' cross-entropy summed over the GLOBAL batch
size, so the micro-batches' gradients add up to the whole batch's. At the end rank 0 trains the same steps in one
process and compares: every step's loss within a relative 1e-4, and the final parameters as one vector,
||p - p_ref|| / ||p_ref||, within 1e-5. It prints "matches one process" and exits 0, or says what differs and
exits 1.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

LOSS_RTOL = 1e-4
PARAM_RTOL = 1e-5


@dataclass
class DecoderConfig:
    vocab_size: int = 96
    hidden_size: int = 64
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 32


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.heads = cfg.num_attention_heads
        # no bias: a key bias does not change softmax, so its gradient is rounding noise that AdamW would amplify
        self.qkv_proj = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.o_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        rows, seq, width = h.shape
        q, k, v = self.qkv_proj(h).view(rows, seq, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(rows, seq, width))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, cfg.intermediate_size), nn.GELU(),
                                 nn.Linear(cfg.intermediate_size, cfg.hidden_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h))
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_positions = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.LayerNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = Embed(self)(tokens)
        for layer in self.layers:
            h = layer(h)
        return Head(self)(h)


class Embed(nn.Module):
    """What runs before the blocks (the first stage): the model's own embeddings, not copies."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.embed_tokens, self.embed_positions = model.embed_tokens, model.embed_positions

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.embed_tokens(tokens) + self.embed_positions(positions)


class Head(nn.Module):
    """What runs after the blocks (the last stage): the final norm and the lm head, the model's own."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.norm, self.lm_head = model.norm, model.lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))


def batch_of(step: int, batch: int, seq: int, cfg: DecoderConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step, the same on every rank: random tokens, each row's next token the target."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def part_of_loss(global_batch: int):
    """loss_fn(logits, targets): the rows' mean cross-entropy per token, summed, over the global batch size."""

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        return per_token.view(targets.shape).mean(dim=1).sum() / global_batch

    return loss_fn


def one_process(model: Decoder, steps: int, batch: int, seq: int, cfg: DecoderConfig, seed: int,
                lr: float) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same steps on the whole batch in this process: the losses and the final parameters."""
    loss_fn = part_of_loss(batch)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = batch_of(step, batch, seq, cfg, seed)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach() for k, v in model.named_parameters()}


def differences(losses: list[float], ref_losses: list[float], state: dict[str, torch.Tensor],
                ref_state: dict[str, torch.Tensor]) -> tuple[float, float]:
    """The largest relative difference of a step's loss, and ||p - p_ref|| / ||p_ref|| of the parameters as one
    vector (over the names both hold)."""
    loss = max((abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)), default=0.0)
    names = set(state) & set(ref_state)
    diff = math.sqrt(sum(float((state[k].float() - ref_state[k].float()).square().sum()) for k in names))
    norm = math.sqrt(sum(float(ref_state[k].float().square().sum()) for k in names))
    return loss, diff / norm if norm else diff


def compare(losses: list[float], ref_losses: list[float], state: dict[str, torch.Tensor],
            ref_state: dict[str, torch.Tensor]) -> list[str]:
    """What differs between the run and one process (nothing: an empty list): a step's loss past LOSS_RTOL
    (relative), parameters missing or extra, the parameters as one vector past PARAM_RTOL of its norm."""
    problems = []
    if len(losses) != len(ref_losses):
        problems.append(f"{len(losses)} losses against one process's {len(ref_losses)}")
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        if not math.isclose(a, b, rel_tol=LOSS_RTOL):
            problems.append(f"step {step}: loss {a:.8g}, one process {b:.8g} (rtol {LOSS_RTOL})")
    if set(state) != set(ref_state):
        problems.append(f"parameters differ in name: only in the run {sorted(set(state) - set(ref_state))}, "
                        f"only in one process {sorted(set(ref_state) - set(state))}")
    _, param = differences(losses, ref_losses, state, ref_state)
    if not param <= PARAM_RTOL:
        problems.append(f"final parameters: ||p - p_ref|| / ||p_ref|| = {param:.3g} (tolerance {PARAM_RTOL})")
    return problems


def parse_weights(text: str) -> str | list[float]:
    return text if text in ("even", "auto") else [float(w) for w in text.split(",")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", default="auto", help="even, auto (each rank's measured time per layer) or w0,w1,...")
    p.add_argument("--pp", type=int, default=None, help="pipeline stages (default: every rank a stage); the rest "
                                                         "of the ranks are data-parallel replicas")
    p.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="global batch, rows")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default=None, help="k0,k1,...: each rank's device kind for its groups' backends "
                                                  "(default: its vendor); e.g. cpu,amd on one host shows which "
                                                  "groups a two-vendor job puts on hetbench's backend")
    args = p.parse_args()

    import torch.distributed as dist

    import hetbench.pytorch as hb

    hb.init()  # the hetbench backend: rank and world size from MPI
    rank, world = dist.get_rank(), dist.get_world_size()
    device = hb.rank_device()  # this rank's GPU (CUDA or ROCm build) or the CPU, and its vendor
    kind = args.kinds.split(",")[rank] if args.kinds else device.vendor
    cfg = DecoderConfig(num_hidden_layers=args.layers, max_position_embeddings=args.seq_len)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = Decoder(cfg)
    reference = copy.deepcopy(model) if rank == 0 else None  # one process's copy, on the CPU, before training
    model.to(device.device)

    replicas = world // (args.pp or world)
    x0, _ = batch_of(0, args.batch, args.seq_len, cfg, args.seed)
    example = x0[:args.batch // (args.micro_batches * replicas)]  # one micro-batch: what --weights auto times
    pipe = hb.pipeline(model, model.layers, part_of_loss(args.batch), example, pre=Embed(model), post=Head(model),
                       weights=parse_weights(args.weights), pp=args.pp, schedule=args.schedule,
                       microbatches=args.micro_batches, batch=args.batch, device=device.device, kind=kind)
    opt = torch.optim.AdamW(pipe.parameters(), lr=args.lr)
    start, stop = pipe.rows()  # this rank's pipeline's rows of every global batch
    losses = []
    for step in range(args.steps):
        x, y = batch_of(step, args.batch, args.seq_len, cfg, args.seed)
        loss = pipe.step(x[start:stop].to(device.device), y[start:stop].to(device.device))
        opt.step()
        opt.zero_grad()
        loss = loss.detach().cpu()  # a last stage's part of the loss, 0 elsewhere
        dist.all_reduce(loss)  # the parts of every pipeline's last stage: the global batch's loss
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step}  loss {losses[-1]:.6f}")
    summary = pipe.summary()
    state = pipe.full_state_dict()  # collective: every stage's parameters at rank 0, under the model's names
    status = 0
    if rank == 0:
        print(f"cut: {summary['blocks_per_stage']} layers per stage (bounds {summary['bounds']}), rows per "
              f"pipeline {summary['replica_rows']}")
        for g in summary["groups"]:
            print(f"group {g['name']}: ranks {g['ranks']} on {g['backend']}")
        ref_losses, ref_state = one_process(reference, args.steps, args.batch, args.seq_len, cfg, args.seed, args.lr)
        problems = compare(losses, ref_losses, state, ref_state)
        if problems:
            print("differs from one process: " + "; ".join(problems))
            status = 1
        else:
            loss, param = differences(losses, ref_losses, state, ref_state)
            print(f"matches one process: losses within {loss:.2g} (rtol {LOSS_RTOL}), parameters within "
                  f"{param:.2g} of their norm (tolerance {PARAM_RTOL})")
    flag = torch.tensor([status])
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    return int(flag.item())


if __name__ == "__main__":
    sys.exit(main())
