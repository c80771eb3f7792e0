"""A user's script misusing hetbench's torch library (issue 33), one case a run: the battery
(tests/hostile/battery.py, cases_round3.py) runs `mpiexec -n 2|3 python tests/hostile/lib_cases.py CASE`.

A "raises" case misuses one call, on one rank or on all of them (a collective whose output has the wrong size on
one rank, dtypes that differ between ranks, a point-to-point rank out of range, shard_module over models that
differ between ranks, ...). Every rank catches what the call raises and prints ONE line:

    rank R raised TYPE: MESSAGE

or, where the call went on as if nothing were wrong, `rank R did not raise`. Then the group must still work (an
all_reduce every rank joins gives the world size), and the script ends with 0. What the battery asks of it: every
rank's line within the case's time (no hang: a rank left waiting in MPI for a peer that raised), each message one
line without MPI's "error stack" (no crash dump, no abort), exit 0.

An "ok" case is a good use, or a check of a state that must stay right: it exits 0 when it is right, and 4 with a
`WRONG: ...` line where it is not (shard_module updating parameters whose requires_grad is False).

Usage: python tests/hostile/lib_cases.py CASE      (python tests/hostile/lib_cases.py --list: the cases)
       python tests/hostile/lib_cases.py --batch CASE...   (one job, each line "CASE: ..."; the battery's way)
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from typing import Callable

warnings.filterwarnings("ignore")

RAISES: dict[str, Callable[[int, int], None]] = {}
OK: dict[str, Callable[[int, int], None]] = {}


def raises(fn: Callable[[int, int], None]) -> Callable[[int, int], None]:
    RAISES[fn.__name__.replace("_", "-")] = fn
    return fn


def ok(fn: Callable[[int, int], None]) -> Callable[[int, int], None]:
    OK[fn.__name__.replace("_", "-")] = fn
    return fn


def _t(n: int, dtype=None, value: float = 1.0):
    import torch

    return torch.full((n,), value, dtype=dtype or torch.float32)


# --- collectives: one rank (or every rank) with a wrong size, dtype or rank --------------------------------------

@raises
def agit_out_short_last(rank: int, n: int) -> None:
    """all_gather_into_tensor: the last rank's output one element short."""
    import torch.distributed as dist

    dist.all_gather_into_tensor(_t(4 * n - (rank == n - 1)), _t(4))


@raises
def agit_out_long_first(rank: int, n: int) -> None:
    import torch.distributed as dist

    dist.all_gather_into_tensor(_t(4 * n + (rank == 0) * 3), _t(4))


@raises
def agit_in_differs_last(rank: int, n: int) -> None:
    """all_gather_into_tensor: the last rank's input longer, its output sized for it (consistent on that rank)."""
    import torch.distributed as dist

    k = 5 if rank == n - 1 else 4
    dist.all_gather_into_tensor(_t(k * n), _t(k))


@raises
def agit_dtype_last(rank: int, n: int) -> None:
    import torch
    import torch.distributed as dist

    dtype = torch.float64 if rank == n - 1 else torch.float32
    dist.all_gather_into_tensor(_t(4 * n, dtype), _t(4, dtype))


@raises
def rst_in_short_last(rank: int, n: int) -> None:
    """reduce_scatter_tensor: the last rank's input one element short."""
    import torch.distributed as dist

    dist.reduce_scatter_tensor(_t(4), _t(4 * n - (rank == n - 1)))


@raises
def rst_dtype_first(rank: int, n: int) -> None:
    import torch
    import torch.distributed as dist

    dtype = torch.float16 if rank == 0 else torch.float32
    dist.reduce_scatter_tensor(_t(4, dtype), _t(4 * n, dtype))


@raises
def allreduce_size_last(rank: int, n: int) -> None:
    import torch.distributed as dist

    dist.all_reduce(_t(5 if rank == n - 1 else 4))


@raises
def allreduce_size_first_big(rank: int, n: int) -> None:
    """all_reduce: rank 0's tensor far longer than the others' (MPI: message truncated)."""
    import torch.distributed as dist

    dist.all_reduce(_t(100000 if rank == 0 else 4))


@raises
def allreduce_dtype_last(rank: int, n: int) -> None:
    import torch
    import torch.distributed as dist

    dist.all_reduce(_t(4, torch.float64 if rank == n - 1 else torch.float32))


@raises
def allreduce_int_float_first(rank: int, n: int) -> None:
    import torch
    import torch.distributed as dist

    dist.all_reduce(_t(4, torch.int32 if rank == 0 else torch.float32))


@raises
def allreduce_band_float(rank: int, n: int) -> None:
    """all_reduce with BAND of floats on every rank: refused before any MPI call (a control)."""
    import torch.distributed as dist

    dist.all_reduce(_t(4), op=dist.ReduceOp.BAND)


@raises
def broadcast_size_last(rank: int, n: int) -> None:
    import torch.distributed as dist

    dist.broadcast(_t(5 if rank == n - 1 else 4), src=0)


@raises
def broadcast_size_root(rank: int, n: int) -> None:
    import torch.distributed as dist

    dist.broadcast(_t(7 if rank == 0 else 4), src=0)


@raises
def broadcast_dtype_root(rank: int, n: int) -> None:
    import torch
    import torch.distributed as dist

    dist.broadcast(_t(4, torch.float64 if rank == 0 else torch.float32), src=0)


@raises
def broadcast_src_beyond(rank: int, n: int) -> None:
    import torch.distributed as dist

    dist.broadcast(_t(4), src=n)


@raises
def broadcast_src_differs(rank: int, n: int) -> None:
    """broadcast: rank 0 names itself the source, every other rank names rank 1."""
    import torch.distributed as dist

    dist.broadcast(_t(4), src=0 if rank == 0 else 1)


@raises
def a2a_splits_sum_last(rank: int, n: int) -> None:
    """all_to_all_single: the last rank's output splits do not add up to its output."""
    import torch.distributed as dist

    splits = [2] * n
    out_splits = [2] * n if rank != n - 1 else [3] + [2] * (n - 1)
    dist.all_to_all_single(_t(2 * n), _t(2 * n), output_split_sizes=out_splits, input_split_sizes=splits)


@raises
def a2a_splits_count(rank: int, n: int) -> None:
    """all_to_all_single: split lists one longer than the world, on every rank."""
    import torch.distributed as dist

    splits = [1] * (n + 1)
    dist.all_to_all_single(_t(n + 1), _t(n + 1), output_split_sizes=splits, input_split_sizes=splits)


@raises
def a2a_splits_negative_first(rank: int, n: int) -> None:
    import torch.distributed as dist

    splits = [2] * n if rank else [-2, 4 + 2 * (n - 2)] + [0] * (n - 2)
    dist.all_to_all_single(_t(2 * n), _t(2 * n), output_split_sizes=[2] * n, input_split_sizes=splits)


@raises
def a2a_splits_disagree(rank: int, n: int) -> None:
    """all_to_all_single: each rank consistent with itself, but rank 0 sends rank 1 three elements where rank 1
    expects two from it."""
    import torch.distributed as dist

    ins = [2] * n
    if rank == 0:
        ins = [1, 3] + [2] * (n - 2)
    dist.all_to_all_single(_t(2 * n), _t(2 * n), output_split_sizes=[2] * n, input_split_sizes=ins)


@raises
def a2a_not_divisible_last(rank: int, n: int) -> None:
    """all_to_all_single without splits: the last rank's tensors not divisible by the world size."""
    import torch.distributed as dist

    k = 2 * n + (1 if rank == n - 1 else 0)
    dist.all_to_all_single(_t(k), _t(k))


@raises
def allgather_list_len_last(rank: int, n: int) -> None:
    """all_gather: the last rank's output list one tensor short."""
    import torch.distributed as dist

    outs = [_t(4) for _ in range(n - (rank == n - 1))]
    dist.all_gather(outs, _t(4))


@raises
def allgather_list_size_first(rank: int, n: int) -> None:
    """all_gather (uneven sizes allowed): rank 0 sends 5 elements where every rank's list expects 4 from it."""
    import torch.distributed as dist

    dist.all_gather([_t(4) for _ in range(n)], _t(5 if rank == 0 else 4))


@raises
def reduce_dst_beyond(rank: int, n: int) -> None:
    import torch.distributed as dist

    dist.reduce(_t(4), dst=n)


@raises
def gather_list_len_root(rank: int, n: int) -> None:
    """gather: the root's list one tensor short."""
    import torch.distributed as dist

    dist.gather(_t(4), gather_list=[_t(4) for _ in range(n - 1)] if rank == 0 else None, dst=0)


@raises
def scatter_size_root(rank: int, n: int) -> None:
    """scatter: the root's pieces longer than the others' outputs."""
    import torch.distributed as dist

    dist.scatter(_t(4), scatter_list=[_t(6) for _ in range(n)] if rank == 0 else None, src=0)


# --- point to point: a rank out of range or the rank itself, on every rank ---------------------------------------

def _send(dst: Callable[[int, int], int]) -> Callable[[int, int], None]:
    def case(rank: int, n: int) -> None:
        import torch.distributed as dist

        dist.send(_t(4), dst=dst(rank, n))
    return case


def _recv(src: Callable[[int, int], int]) -> Callable[[int, int], None]:
    def case(rank: int, n: int) -> None:
        import torch.distributed as dist

        dist.recv(_t(4), src=src(rank, n))
    return case


RAISES.update({
    "send-dst-neg1": _send(lambda r, n: -1),
    "send-dst-world": _send(lambda r, n: n),
    "send-dst-5": _send(lambda r, n: 5),
    "send-dst-self": _send(lambda r, n: r),
    "recv-src-neg1": _recv(lambda r, n: -1),
    "recv-src-world": _recv(lambda r, n: n),
    "recv-src-self": _recv(lambda r, n: r),
})


@raises
def isend_dst_neg1(rank: int, n: int) -> None:
    import torch.distributed as dist

    dist.isend(_t(4), dst=-1).wait()


@raises
def irecv_src_world(rank: int, n: int) -> None:
    import torch.distributed as dist

    dist.irecv(_t(4), src=n).wait()


# --- the library's own calls --------------------------------------------------------------------------------------

def _mlp(width: int = 8, layers: int = 2, dtype=None, seed: int = 0):
    """A small MLP: `layers` blocks (the units) and a head (the root's)."""
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
            self.head = nn.Linear(width, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = torch.relu(block(x))
            return (self.head if hasattr(self, "head") else self.tail)(x)

    torch.manual_seed(seed)
    model = MLP()
    if dtype is not None:
        model.to(dtype)
    return model


def _shard(model, **kw) -> None:
    import hetbench.pytorch as hb

    hb.shard_module(model, units=list(model.blocks), **kw)


@raises
def shard_width_last(rank: int, n: int) -> None:
    _shard(_mlp(width=9 if rank == n - 1 else 8))


@raises
def shard_layers_last(rank: int, n: int) -> None:
    _shard(_mlp(layers=3 if rank == n - 1 else 2))


@raises
def shard_dtype_last(rank: int, n: int) -> None:
    import torch

    _shard(_mlp(dtype=torch.float64 if rank == n - 1 else None))


@raises
def shard_weights_last(rank: int, n: int) -> None:
    """shard_module: the weights differ on the last rank (each rank would own another slice)."""
    w = ",".join(["1"] * (n - 1) + ["3"]) if rank == n - 1 else ",".join(["3"] + ["1"] * (n - 1))
    _shard(_mlp(), weights=w)


@raises
def shard_weights_count(rank: int, n: int) -> None:
    _shard(_mlp(), weights=",".join(["1"] * (n + 1)))


@raises
def shard_units_differ(rank: int, n: int) -> None:
    """shard_module: rank 0 wraps every block as a unit, the others only the first."""
    import hetbench.pytorch as hb

    model = _mlp()
    hb.shard_module(model, units=list(model.blocks) if rank == 0 else [model.blocks[0]])


@raises
def shard_names_differ(rank: int, n: int) -> None:
    """shard_module: the same shapes under other names on the last rank."""
    import hetbench.pytorch as hb

    model = _mlp()
    if rank == n - 1:
        model.tail = model.head
        del model.head
    hb.shard_module(model, units=list(model.blocks))


@raises
def shard_bias_missing_last(rank: int, n: int) -> None:
    """shard_module: the last rank's first block has no bias."""
    import hetbench.pytorch as hb
    from torch import nn

    model = _mlp()
    if rank == n - 1:
        model.blocks[0] = nn.Linear(8, 8, bias=False)
    hb.shard_module(model, units=list(model.blocks))


@raises
def row_range_short(rank: int, n: int) -> None:
    import hetbench.pytorch as hb

    hb.row_range([5])


@raises
def batch_rows_weights_count(rank: int, n: int) -> None:
    import hetbench.pytorch as hb

    hb.batch_rows(8, ",".join(["1"] * (n + 1)))


@raises
def steplogger_folder(rank: int, n: int) -> None:
    import hetbench.pytorch as hb

    hb.StepLogger(tempfile.gettempdir() if rank == 0 else os.getcwd(), 8)


# --- good uses, and states that must stay right (ok: exit 0, or 4 with a WRONG line) --------------------------------

PREFIX = [""]  # "CASE: " in a batch (--batch): each line says whose it is


def say(line: str) -> None:
    """One line in one write: the ranks' lines reach mpiexec's stdout through pipes and must not interleave."""
    os.write(1, (PREFIX[0] + line + "\n").encode("utf-8", "replace"))


def _wrong(what: str) -> None:
    say(f"WRONG: {what}")
    raise SystemExit(4)


@ok
def agit_good(rank: int, n: int) -> None:
    import torch
    import torch.distributed as dist

    out = _t(4 * n)
    dist.all_gather_into_tensor(out, _t(4, value=float(rank)))
    if not torch.equal(out, torch.arange(n, dtype=torch.float32).repeat_interleave(4)):
        _wrong(f"rank {rank} gathered {out.tolist()}")


@ok
def a2a_uneven_good(rank: int, n: int) -> None:
    """all_to_all_single with uneven splits that agree: rank r sends r+1 elements to every rank."""
    import torch.distributed as dist

    ins = [rank + 1] * n
    outs = [r + 1 for r in range(n)]
    out = _t(sum(outs))
    dist.all_to_all_single(out, _t(sum(ins), value=float(rank)), output_split_sizes=outs, input_split_sizes=ins)
    want = [float(r) for r in range(n) for _ in range(r + 1)]
    if out.tolist() != want:
        _wrong(f"rank {rank} received {out.tolist()}, not {want}")


@ok
def ring_good(rank: int, n: int) -> None:
    """send to the next rank, receive from the previous one (even ranks first)."""
    import torch.distributed as dist

    got = _t(4, value=-1.0)
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    if rank % 2 == 0:
        dist.send(_t(4, value=float(rank)), dst=nxt)
        dist.recv(got, src=prev)
    else:
        dist.recv(got, src=prev)
        dist.send(_t(4, value=float(rank)), dst=nxt)
    if got.tolist() != [float(prev)] * 4:
        _wrong(f"rank {rank} received {got.tolist()} from {prev}")


def _frozen_run(rank: int, n: int, optimizer: str, freeze: Callable) -> None:
    """shard_module over a model some of whose parameters are frozen, trained 2 steps: the frozen ones must come back
    bit-identical (and the others move), in the full state gathered at rank 0."""
    import hetbench.pytorch as hb
    import torch

    model = _mlp(seed=1)
    frozen = freeze(model)
    for p in frozen.values():
        p.requires_grad_(False)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    sharded = hb.shard_module(model, units=list(model.blocks), weights=",".join(str(r + 1) for r in range(n)))
    # as the docs write it: the optimizer over model.parameters() after sharding (this rank's shards)
    opt = (torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=0.5))
    rows = hb.batch_rows(8, sharded.weights)
    start, stop = hb.row_range(rows)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        x = torch.randn(8, 8, generator=g)
        loss = hb.part_of_mean(((model(x[start:stop]) - 1.0) ** 2).sum(1), 8)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    full = sharded.full_state_dict()
    if rank != 0:
        return
    names = set(frozen)
    moved = {k: float((full[k] - before[k]).abs().max()) for k in full
             if k in names and not torch.equal(full[k], before[k])}
    if moved:
        _wrong(f"frozen parameters changed: {moved}")
    if all(torch.equal(full[k], before[k]) for k in full if k not in names):
        _wrong("no trainable parameter moved: the check is vacuous")


@ok
def frozen_first_block_sgd(rank: int, n: int) -> None:
    _frozen_run(rank, n, "sgd", lambda m: {f"blocks.0.{k}": p for k, p in m.blocks[0].named_parameters()})


@ok
def frozen_first_block_adamw(rank: int, n: int) -> None:
    """AdamW's weight decay moves every parameter it is given: a frozen one must not be given."""
    _frozen_run(rank, n, "adamw", lambda m: {f"blocks.0.{k}": p for k, p in m.blocks[0].named_parameters()})


@ok
def frozen_head_bias_adamw(rank: int, n: int) -> None:
    """One frozen tensor in the root (the head's bias) beside trainable ones."""
    _frozen_run(rank, n, "adamw", lambda m: {"head.bias": m.head.bias})


@ok
def frozen_weights_only_sgd(rank: int, n: int) -> None:
    """Every block's weight frozen, the biases trained: frozen and trainable tensors inside one unit."""
    _frozen_run(rank, n, "sgd", lambda m: {f"blocks.{i}.weight": b.weight for i, b in enumerate(m.blocks)})


# --- the run --------------------------------------------------------------------------------------------------

def run_one(name: str, rank: int, n: int) -> int:
    """One case on this rank: 0, or 4 where it found a wrong state (its WRONG line said)."""
    import torch
    import torch.distributed as dist

    if name in OK:
        code = 0
        try:
            OK[name](rank, n)
        except SystemExit as e:  # _wrong: said, the code kept, the other ranks met as ever
            code = int(e.code or 0)
        dist.barrier()
        return code
    try:
        RAISES[name](rank, n)
    except Exception as e:  # noqa: BLE001 - what it raised is what the case shows
        say(f"rank {rank} raised {type(e).__name__}: {e}")
    else:
        say(f"rank {rank} did not raise")
    # the group still works after the error: every rank joins one more collective
    t = torch.ones(1)
    dist.all_reduce(t)
    if t.item() != n:
        say(f"WRONG: rank {rank}: the group is broken after the error (an all_reduce of ones gave {t.item()})")
        return 4
    return 0


def main() -> int:
    names = sys.argv[2:] if sys.argv[1:2] == ["--batch"] else sys.argv[1:]
    if sys.argv[1:] == ["--list"]:
        print("\n".join([*(f"raises {c}" for c in RAISES), *(f"ok {c}" for c in OK)]))
        return 0
    single = names == sys.argv[1:]
    if not names or any(name not in {**RAISES, **OK} for name in names) or (single and len(names) > 1):
        print(f"usage: {sys.argv[0]} CASE | --batch CASE... | --list", file=sys.stderr)
        return 2
    import torch.distributed as dist

    import hetbench.pytorch as hb

    hb.init()
    rank, n = dist.get_rank(), dist.get_world_size()
    code = 0
    # --batch: the cases one after the other in one job (torch's import paid once): each line prefixed with its
    # case; the group must survive every misuse before it
    for name in names:
        PREFIX[0] = f"{name}: " if sys.argv[1] == "--batch" else ""
        code = max(code, run_one(name, rank, n))
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
