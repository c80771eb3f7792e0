"""transformers' Llama trained across unequal devices with hetbench's uneven FSDP (hb.shard_module), each rank on
its own hetbench device, checked against the same steps in one process.

    mpiexec -n 2 python examples/hf_llama_uneven.py --backends host,opencl --weights 3,1
    mpiexec -n 2 python examples/hf_llama_uneven.py --backends host,sim:mi300x --weights auto --checkpointing
    mpiexec -n 3 python examples/hf_llama_uneven.py --backends host,opencl,host --weights 2,1,0   # rank 2: no rows
    mpiexec -n 2 python examples/hf_llama_uneven.py --steps 3 --save ck                           # then, on 3 ranks:
    mpiexec -n 3 python examples/hf_llama_uneven.py --weights 0.5,0.3,0.2 --steps 6 --resume ck

The model is transformers' own LlamaForCausalLM from a small LlamaConfig (2 decoder layers, hidden 64, 4 query
heads sharing 2 key/value heads, an MLP of 128, a vocabulary of 256, random weights): nothing is downloaded. Rank r
opens the r-th device of --backends with hb.open_device (host, opencl[:INDEX], cupy[:INDEX], sim:MODEL, auto: what
`hetbench --backend` takes for a rank) and dev.offload(model) sends every product of the model's forward and backward
there where torch cannot drive that device (an OpenCL device, a simulated GPU: GEMM and copy time modelled, and said
so), the rest computing in torch on the CPU. hb.shard_module shards the model over the ranks, each decoder layer a
unit, every rank's part of the parameters, gradients and AdamW state in proportion to its weight (--weights auto:
each rank's samples/s through the model on its device, measured before sharding). Every step every rank builds the
same global batch of random tokens (right-padded rows, labels -100 on the padding) and takes its rows by the same
weights with hb.local_batch: a rank with none runs one placeholder row whose loss counts as an exact 0, so its
collectives still meet the others'. Its loss is transformers' own, summed over its tokens and divided by the
global batch's token count (num_items_in_batch): the parts add up to the exact mean over every token of the batch.

--checkpointing turns on transformers' activation checkpointing (each decoder layer recomputed in the backward).
--save DIR writes a sharded checkpoint after the last step (each rank its slices, with AdamW's state; DIR must be
new), and rank 0 reads it back whole with hb.read_checkpoint; --resume DIR goes on from one, on any ranks and
weights, up to --steps.

At the end rank 0 trains the same steps in one process on the CPU (the unsharded model, no offload, no activation
checkpointing, transformers' mean loss over the whole batch) and compares: every step's loss within a relative 1e-4,
and the final parameters as one vector, ||p - p_ref|| / ||p_ref||, within 1e-4. It prints "matches one process"
and exits 0, or says what differs and exits 1. Bad input (a --backends list of the wrong length, a device a rank
cannot open, a checkpoint --resume cannot read or a --save folder that exists) is one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys

import torch

LOSS_RTOL = 1e-4
# looser than examples/tensor_own_model.py's 1e-5: an offloaded rank's GEMMs (PoCL's kernel) sum in another order
# than torch's, and AdamW's division by sqrt(v) turns such rounding differences of small gradients into steps of
# about lr; measured here 1.8e-7 to 8.5e-7 over 6 to 8 steps
PARAM_RTOL = 1e-4
PROBE_ROWS = 4  # the rows --weights auto times each rank's forward and backward on


def llama(args: argparse.Namespace):
    """transformers' LlamaForCausalLM from a small config, its weights from torch's generator (seed them first)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq_len,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    return LlamaForCausalLM(cfg)


def batch_of(step: int, args: argparse.Namespace) -> dict[str, torch.Tensor]:
    """Step `step`'s global batch, the same on every rank: random tokens, each row right-padded to a random length
    of at least half the sequence (attention_mask 0 and labels -100 on the padding)."""
    g = torch.Generator().manual_seed(args.seed * 100_003 + step)
    ids = torch.empty(args.batch, args.seq_len, dtype=torch.long)
    ids[:, 0] = torch.randint(0, args.vocab, (args.batch,), generator=g)
    for i in range(1, args.seq_len):  # a rule to learn: each token follows from the one before
        ids[:, i] = (ids[:, i - 1] * 5 + 3) % args.vocab
    noise = torch.rand(args.batch, args.seq_len, generator=g) < 0.1  # and a tenth of them random
    ids[noise] = torch.randint(0, args.vocab, (int(noise.sum()),), generator=g)
    lengths = torch.randint(args.seq_len // 2, args.seq_len + 1, (args.batch, 1), generator=g)
    mask = (torch.arange(args.seq_len) < lengths).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def tokens_of(batch: dict[str, torch.Tensor]) -> int:
    """The tokens a causal LM's loss counts in the batch: the labels after the first position, padding left out."""
    return int((batch["labels"][:, 1:] != -100).sum())


def to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def enable_checkpointing(model) -> None:
    """transformers' activation checkpointing, non-reentrant (its name since transformers 5; the old one before)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def measured_rate(model, dev, args: argparse.Namespace):
    """--weights auto: this rank's samples/s through the model's forward and backward on its device, the best of 3
    on PROBE_ROWS rows of step 0's batch (on a throwaway copy, offloaded as the model is; on a simulated device its
    modelled GEMM and copy time in place of the host's emulating them)."""

    def rate() -> float:
        probe = copy.deepcopy(model)
        batch = to({k: v[:PROBE_ROWS] for k, v in batch_of(0, args).items()}, dev.device)
        best = math.inf
        for _ in range(3):
            with dev.step() as figures:
                probe(**batch, use_cache=False).loss.backward()
            best = min(best, figures["step_seconds"])
        return PROBE_ROWS / best

    return rate


def one_process(model, args: argparse.Namespace) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same steps on the whole batch in this process: transformers' mean loss over the batch's tokens."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        loss = model(**batch_of(step, args), use_cache=False).loss
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
            ref_state: dict[str, torch.Tensor], first: int = 0) -> list[str]:
    """What differs between the run (its steps from `first` on) and one process (nothing: an empty list): a step's
    loss past LOSS_RTOL, parameters missing, extra or of another shape, the parameters as one vector past
    PARAM_RTOL of its norm."""
    problems = []
    ref_losses = ref_losses[first:]
    if len(losses) != len(ref_losses):
        problems.append(f"{len(losses)} losses against one process's {len(ref_losses)}")
    for step, (a, b) in enumerate(zip(losses, ref_losses), first):
        if not math.isclose(a, b, rel_tol=LOSS_RTOL):
            problems.append(f"step {step}: loss {a:.8g}, one process {b:.8g} (rtol {LOSS_RTOL})")
    if set(state) != set(ref_state):
        problems.append(f"parameters differ in name: only in the run {sorted(set(state) - set(ref_state))}, "
                        f"only in one process {sorted(set(ref_state) - set(state))}")
    shapes = sorted(k for k in set(state) & set(ref_state) if state[k].shape != ref_state[k].shape)
    if shapes:
        problems.append(f"parameters differ in shape: {shapes}")
        return problems
    _, param = differences(losses, ref_losses, state, ref_state)
    if not param <= PARAM_RTOL:
        problems.append(f"final parameters: ||p - p_ref|| / ||p_ref|| = {param:.3g} (tolerance {PARAM_RTOL})")
    return problems


def device_line(rank: int, spec: str, f: dict) -> str:
    """One offloaded rank's figures for a step (dev.step()'s)."""
    return (f"  rank {rank} {spec}: {f['device_gemms']} GEMMs {f['device_gemm_seconds'] * 1e3:.3f} ms "
            f"({f['device_timing']}), copies {f['device_copy_seconds'] * 1e3:.3f} ms, step {f['step_seconds'] * 1e3:.1f} "
            "ms")


def refuse(rank: int, line: str) -> int:
    """Bad input that every rank met alike: rank 0 says it in one line on stderr, every rank leaves with 2."""
    import torch.distributed as dist

    if rank == 0:
        print(line, file=sys.stderr)
    dist.destroy_process_group()
    return 2


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="host",
                   help="s0,s1,...: each rank's device (host, opencl[:INDEX], cupy[:INDEX], sim:MODEL, auto), or one "
                        "for every rank")
    p.add_argument("--weights", default="even", help="even, auto (each rank's measured samples/s) or w0,w1,...")
    p.add_argument("--checkpointing", action="store_true", help="transformers' activation checkpointing")
    p.add_argument("--save", metavar="DIR", help="a sharded checkpoint after the last step (a new folder)")
    p.add_argument("--resume", metavar="DIR", help="go on from a sharded checkpoint (any ranks and weights)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4, help="query heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (grouped-query attention)")
    p.add_argument("--intermediate", type=int, default=128, help="the MLP's hidden width")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=16, help="global batch, rows")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import torch.distributed as dist

    import hetbench.pytorch as hb
    from hetbench.backends.base import BackendUnavailable

    hb.init()  # the hetbench backend: rank and world size from MPI
    rank, world = dist.get_rank(), dist.get_world_size()
    specs = args.backends.split(",")
    if len(specs) == 1:
        specs *= world
    if len(specs) != world:  # every rank reads the same argument: each refuses alike
        return refuse(rank, f"--backends names {len(specs)} devices for {world} ranks: one each, or one for all")
    try:  # collective: a rank that cannot open its device makes every rank raise the same line
        dev = hb.open_device(specs[rank])
    except (ValueError, BackendUnavailable) as e:  # a spec --backend refuses, a device this rank cannot open
        return refuse(rank, f"--backends: {e}")

    sizes = ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "batch", "seq_len", "steps")
    small = next((name for name in sizes if getattr(args, name) < 1), None)
    if small is not None:  # every rank reads the same arguments: each refuses alike
        return refuse(rank, f"--{small.replace('_', '-')} {getattr(args, small)}: a whole number of 1 or more")

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = llama(args)
    reference = copy.deepcopy(model) if rank == 0 else None  # one process's copy, on the CPU, before anything
    model.to(dev.device)
    dev.offload(model)  # every product of its forward and backward on the device (nothing where torch drives it)
    weights = args.weights  # even, auto or w0,w1,...: shard_module reads it as --weights is read
    try:  # collective: weights it refuses raise the same line on every rank, before any shard is made
        sharded = hb.shard_module(model, units=list(model.model.layers), weights=weights,
                                  rate=measured_rate(model, dev, args) if weights == "auto" else None)
    except ValueError as e:
        return refuse(rank, str(e))  # its line names --weights
    if args.checkpointing:
        enable_checkpointing(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)  # this rank's flat shards
    first = 0
    if args.resume:  # collective: re-sharded onto these ranks and weights, AdamW's state with it
        try:
            first = sharded.load_checkpoint(args.resume, opt)["steps"]
        except hb.ShardedCheckpointError as e:  # the same line on every rank, the model left as it was
            return refuse(rank, f"--resume: {e}")
    rows = hb.batch_rows(args.batch, sharded.weights)  # the batch split by the same weights
    if rank == 0:
        print(f"weights {[round(w, 3) for w in sharded.weights]}"
              + (" (auto: each rank's samples/s through the model)" if weights == "auto" else "")
              + f", rows {rows} of {args.batch}"
              + (f", resumed from {args.resume} after {first} steps" if args.resume else ""))

    losses = []
    for step in range(first, args.steps):
        batch = batch_of(step, args)
        tokens = tokens_of(batch)  # the global batch's tokens: the loss's denominator on every rank
        mine = hb.local_batch(batch, rows)  # this rank's rows, or one placeholder row
        with dev.step() as figures:
            out = model(**to(mine.data, dev.device), num_items_in_batch=tokens, use_cache=False)
            loss = mine.counted(out.loss)  # this rank's part of the global mean; an exact 0 on a placeholder
            loss.backward()  # every unit's gradient reduce-scattered, summed, to its owners
            opt.step()
            opt.zero_grad(set_to_none=False)
        total = loss.detach().double().cpu().reshape(1)
        dist.all_reduce(total)
        losses.append(float(total))
        every = hb.all_ranks(figures)
        if rank == 0:
            print(f"step {step}  loss {losses[-1]:.6f}  tokens {tokens}")
            for r, f in enumerate(every):
                if "device_gemms" in f:
                    print(device_line(r, specs[r], f))

    held = hb.all_ranks((sharded.elements, sharded.state_bytes(opt), repr(dev)))
    total_params = sharded.num_parameters()
    state = sharded.full_state_dict()  # collective: every parameter whole at rank 0, by name
    saved = None
    if args.save:
        try:
            sharded.save_checkpoint(args.save, opt, extra={"steps": args.steps})  # collective
        except hb.ShardedCheckpointError as e:  # the same line on every rank, nothing left in DIR's place
            return refuse(rank, f"--save: {e}")
        if rank == 0:
            saved = hb.read_checkpoint(args.save)["model"]  # one process, no ranks: the unsharded state dict
    status = 0
    if rank == 0:
        for r, (elements, b, device) in enumerate(held):
            print(f"rank {r}: {elements} of {total_params} parameters ({100 * elements / total_params:.1f} %), "
                  f"{b['param_bytes']} + {b['grad_bytes']} + {b['optimizer_bytes']} bytes of parameters, gradients "
                  f"and optimizer state; {device}")
        problems = []
        if saved is not None:
            same = set(saved) == {k for k, _ in reference.state_dict().items()} and all(
                torch.equal(saved[k], v) for k, v in state.items())
            print(f"saved {args.save}: read_checkpoint gives {len(saved)} tensors, "
                  + ("the trained parameters" if same else "NOT the trained parameters"))
            if not same:
                problems.append(f"{args.save} read back differs from the trained parameters")
        ref_losses, ref_state = one_process(reference, args)
        problems += compare(losses, ref_losses, state, ref_state, first)
        if problems:
            print("differs from one process: " + "; ".join(problems))
            status = 1
        else:
            loss, param = differences(losses, ref_losses[first:], state, ref_state)
            print(f"matches one process: losses within {loss:.2g} (rtol {LOSS_RTOL}), parameters within "
                  f"{param:.2g} of their norm (tolerance {PARAM_RTOL})")
    flag = torch.tensor([status])
    dist.broadcast(flag, 0)
    dev.close()
    dist.destroy_process_group()
    return int(flag.item())


if __name__ == "__main__":
    sys.exit(main())
