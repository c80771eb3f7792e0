"""A transformers Llama decoder tensor parallel across unequal ranks with hb.tensor_parallel, checked against the
same steps in one process.

    mpiexec -n 2 python examples/tensor_own_model.py --weights 3,1                          # 2 kv heads: [2, 0]
    mpiexec -n 2 python examples/tensor_own_model.py --weights 3,1 --heads 8 --kv-heads 4   # [3, 1]
    mpiexec -n 3 python examples/tensor_own_model.py --weights 0.5,0.3,0.2 --heads 8 --kv-heads 4 --cut-head

The model is transformers' own LlamaForCausalLM, built from a small LlamaConfig (hidden 64, 4 query heads sharing
2 key/value heads (grouped-query attention), 2 layers, an MLP of 128, a vocabulary of 96): nothing is downloaded.
Its attention runs transformers' "eager" implementation (--attn sdpa for torch's fused one). The plan cuts each
layer's attention by whole key/value heads, each with its group of query heads (q_proj, k_proj, v_proj column
parallel, o_proj row parallel), and its MLP by columns (gate_proj, up_proj column parallel, down_proj row parallel),
each rank's share in proportion to its weight; the embedding and the RMSNorms stay whole on every rank, and so
does the lm head unless --cut-head cuts its vocabulary columns (hb.Gathered: the logits gathered whole). A rank
whose weight rounds to no key/value head holds none of that attention (its projections 0 wide) and still takes
part in its collectives. Every rank gives the model the same batch, and the loss (transformers' own,
from labels) is the same on every rank. A plan the model cannot take (fewer key/value heads than ranks: 2 of them
on 3 ranks) is refused on every rank before anything is cut: one line, exit 2.

At the end rank 0 trains the same steps in one process and compares: every step's loss within a relative 1e-4,
and the final parameters (gathered whole by tp.full_state_dict()) as one vector, ||p - p_ref|| / ||p_ref||, within
1e-5. It prints "matches one process" and exits 0, or says what differs and exits 1.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time

import torch

LOSS_RTOL = 1e-4
PARAM_RTOL = 1e-5


def llama(args: argparse.Namespace):
    """transformers' LlamaForCausalLM from a small config, its weights from torch's generator (seed them first)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq_len,
                      attention_bias=args.bias, mlp_bias=args.bias, tie_word_embeddings=False)
    cfg._attn_implementation = args.attn
    return LlamaForCausalLM(cfg)


def plan_for(kv_heads: int, head: bool = False) -> dict:
    """The tensor-parallel plan of a Llama: attention by key/value heads with their queries, the MLP by columns
    (and with `head`, the lm head's vocabulary columns, its logits gathered whole). LlamaAttention views its
    projections with -1 heads and keeps its query-per-key/value group count, so no attribute of the module needs
    setting (attributes={})."""
    import hetbench.pytorch as hb

    plan = {"model.layers.*.self_attn": hb.heads(("q_proj", "k_proj", "v_proj"), "o_proj", kv_heads=kv_heads),
            "model.layers.*.mlp": hb.pair(("gate_proj", "up_proj"), "down_proj")}
    if head:
        plan["lm_head"] = hb.Gathered()
    return plan


def batch_of(args: argparse.Namespace) -> torch.Tensor:
    """The batch every step trains on, the same on every rank: random tokens from the seed."""
    g = torch.Generator().manual_seed(args.seed * 100_003 + 1)
    return torch.randint(0, args.vocab, (args.batch, args.seq_len), generator=g)


def train(model, tokens: torch.Tensor, steps: int, lr: float, on_step=None) -> list[float]:
    """`steps` AdamW steps on the batch (transformers' causal-LM loss from labels = the tokens); the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        loss = model(input_ids=tokens, labels=tokens, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
    return losses


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
    """What differs between the run and one process (nothing: an empty list): a step's loss past LOSS_RTOL,
    parameters missing, extra or of another shape, the parameters as one vector past PARAM_RTOL of its norm."""
    problems = []
    if len(losses) != len(ref_losses):
        problems.append(f"{len(losses)} losses against one process's {len(ref_losses)}")
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        if not math.isclose(a, b, rel_tol=LOSS_RTOL):
            problems.append(f"step {step}: loss {a:.8g}, one process {b:.8g} (rtol {LOSS_RTOL})")
    if set(state) != set(ref_state):
        problems.append(f"parameters differ in name: only in the run {sorted(set(state) - set(ref_state))}, "
                        f"only in one process {sorted(set(ref_state) - set(state))}")
    shapes = [k for k in set(state) & set(ref_state) if state[k].shape != ref_state[k].shape]
    if shapes:
        problems.append(f"parameters differ in shape: {sorted(shapes)}")
        return problems
    _, param = differences(losses, ref_losses, state, ref_state)
    if not param <= PARAM_RTOL:
        problems.append(f"final parameters: ||p - p_ref|| / ||p_ref|| = {param:.3g} (tolerance {PARAM_RTOL})")
    return problems


def parse_weights(text: str) -> str | list[float]:
    return text if text == "even" else [float(w) for w in text.split(",")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights", default="even", help="even or w0,w1,...: each rank's relative speed")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4, help="query heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (grouped-query attention)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=128, help="the MLP's hidden width")
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--bias", action="store_true", help="biases on the attention's and the MLP's Linears")
    p.add_argument("--cut-head", action="store_true", help="the lm head's columns cut too (hb.Gathered)")
    p.add_argument("--attn", default="eager", choices=["eager", "sdpa"], help="transformers' attention function")
    p.add_argument("--batch", type=int, default=4, help="rows")
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import torch.distributed as dist

    import hetbench.pytorch as hb

    hb.init()  # the hetbench backend: rank and world size from MPI
    rank = dist.get_rank()
    device = hb.rank_device()  # this rank's GPU (CUDA or ROCm build) or the CPU
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = llama(args)
    reference = copy.deepcopy(model) if rank == 0 else None  # one process's copy, on the CPU, before the cut
    whole_elements = sum(p.numel() for p in model.parameters())
    model.to(device.device)

    try:  # collective; the same plan, weights and model on every rank: each refuses alike, before any collective
        tp = hb.tensor_parallel(model, plan_for(args.kv_heads, args.cut_head), weights=parse_weights(args.weights))
    except hb.TensorParallelError as e:
        if rank == 0:
            print(f"cannot cut the model: {e}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    held = hb.all_ranks(sum(p.numel() for p in model.parameters()))
    tokens = batch_of(args)

    def show(step: int, loss: float) -> None:
        if rank == 0:
            print(f"step {step}  loss {loss:.6f}")

    tp.take_figures()  # from here: the training steps' collectives
    start = time.perf_counter()
    losses = train(model, tokens.to(device.device), args.steps, args.lr, show)
    figures = hb.all_ranks((tp.take_figures(), time.perf_counter() - start))
    summary = tp.summary()
    state = tp.full_state_dict()  # collective: every parameter whole, under the model's names, on every rank
    status = 0
    if rank == 0:
        for part, suffix in (("attention", ".self_attn"), ("mlp", ".mlp"), ("lm head", "lm_head")):
            cut = [x for x in summary["layers"] if x["name"].endswith(suffix)]
            if cut:
                alike = all(x["counts"] == cut[0]["counts"] for x in cut)
                print(f"cut {part}: {cut[0]['units']} {cut[0]['what']}, {cut[0]['counts']} per rank"
                      + (f" (each of the {len(cut)} layers)" if alike and len(cut) > 1 else
                         "" if alike else f" ({cut[0]['name']}; the others differ)"))
        print("parameters held: " + ", ".join(f"rank {r} {n} ({n / whole_elements:.0%})" for r, n in enumerate(held))
              + f" of {whole_elements}")
        print(f"tp collectives in the {args.steps} steps: " + ", ".join(
            f"rank {r} {f.calls} calls, {f.bytes / 1024:.0f} KiB, {f.seconds * 1e3:.0f} ms of {s * 1e3:.0f} ms "
            f"({f.seconds / s:.0%})" for r, (f, s) in enumerate(figures)))
        empty = [(r, names) for r, names in enumerate(summary["empty_layers_per_rank"]) if names]
        for r, names in empty:
            print(f"rank {r} holds none of: {', '.join(names)}")
        ref_losses = train(reference, tokens, args.steps, args.lr)
        ref_state = {k: v.detach() for k, v in reference.named_parameters()}
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
