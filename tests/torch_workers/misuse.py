"""Under mpiexec -n 2 and -n 3 (tests/mpi/test_torch_misuse.py): the torch library misused from a user's script, one
rank or every rank, each case in turn in one launch. Every case asserts, on EVERY rank, the exception's type and its
whole message (the same line everywhere, naming the rank and the values), and that the group still works after it
(an all_reduce every rank joins). A rank left waiting in MPI for a peer that raised ends the job within seconds
(tests/mpi_fail_fast.py), so a hang fails the test with the case's name, not a timeout. Rank 0 prints `ok CASE` or
`FAILED CASE: rank R: ...` per case; the exit code is 0 only when every case passed on every rank.

The last case trains a model with frozen parameters under shard_module: they stay bit-identical, the others move
and match the same training in one process."""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch import nn

import hetbench.pytorch as hb
from hetbench.harness.split_plan import WeightsError
from hetbench.pytorch import BackendError, WrapError

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_fail_fast import run_checks  # noqa: E402 - tests/ on the path first

warnings.filterwarnings("ignore")

WORLD = MPI.COMM_WORLD
ME, N = WORLD.Get_rank(), WORLD.Get_size()
LAST = N - 1
OTHERS = "rank 0" if N == 2 else f"ranks {','.join(map(str, range(N - 1)))}"


def ones(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.ones(n, dtype=dtype)


def refused(call: Callable[[], Any], kind: type, message: str) -> None:
    """`call` raises `kind` with exactly `message` on this rank, one line; the group still works afterwards."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - what it raised is what is checked
        if type(e) is not kind or str(e) != message:
            raise AssertionError(f"raised {type(e).__name__}: {e!s} -- expected {kind.__name__}: {message}") from None
    else:
        raise AssertionError(f"did not raise (expected {kind.__name__}: {message})")
    still_works()


def still_works() -> None:
    t = ones(3)
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((3,), float(N))):
        raise AssertionError(f"the group no longer works: all_reduce gave {t.tolist()}")


def gather_into_short() -> None:
    out = ones(4 * N - (ME == LAST))
    refused(lambda: dist.all_gather_into_tensor(out, ones(4)), BackendError,
            f"hetbench backend: all_gather_into_tensor: rank {LAST}: output holds {4 * N - 1} elements, not {N} x the "
            "input's 4")


def allreduce_sizes() -> None:
    refused(lambda: dist.all_reduce(ones(4 + (ME == LAST))), BackendError,
            f"hetbench backend: allreduce: the ranks pass different tensors ({OTHERS}: 4 elements of float32; rank "
            f"{LAST}: 5 elements of float32): every rank must pass the same")


def allreduce_dtypes() -> None:
    refused(lambda: dist.all_reduce(ones(4, torch.float64 if ME == LAST else torch.float32)), BackendError,
            f"hetbench backend: allreduce: the ranks pass different tensors ({OTHERS}: 4 elements of float32; rank "
            f"{LAST}: 4 elements of float64): every rank must pass the same")


def allreduce_ops() -> None:
    op = dist.ReduceOp.MAX if ME == LAST else dist.ReduceOp.SUM
    refused(lambda: dist.all_reduce(ones(4), op=op), BackendError,
            f"hetbench backend: allreduce: the ranks pass different op ({OTHERS}: SUM; rank {LAST}: MAX): every rank "
            "must pass the same")


def broadcast_root_out_of_range() -> None:
    refused(lambda: dist.broadcast(ones(2), src=N), BackendError,
            f"hetbench backend: broadcast: root {N} is not a rank of this group of {N} (0-{LAST})")


def gather_list_short() -> None:
    parts = [ones(2) for _ in range(N - 1)] if ME == 0 else None
    refused(lambda: dist.gather(ones(2), parts, dst=0), BackendError,
            f"hetbench backend: gather: rank 0: the gather list holds {N - 1} tensors for a group of {N} ranks")


def all_to_all_splits_differ() -> None:
    send = [1, 3] + [2] * (N - 2) if ME == 0 else [2] * N
    refused(lambda: dist.all_to_all_single(ones(2 * N), ones(2 * N), [2] * N, send), BackendError,
            "hetbench backend: all_to_all_single: rank 0 sends 1 elements to rank 0, which expects 2 from it: every "
            "rank's input split sizes must match its peers' output split sizes")


def all_to_all_split_count() -> None:
    sizes = [1] * (N + 1)
    refused(lambda: dist.all_to_all_single(ones(N + 1), ones(N + 1), sizes, sizes), BackendError,
            f"hetbench backend: all_to_all_single: the input split sizes {sizes} give {N + 1} sizes for a group of "
            f"{N} ranks")


def p2p_ranks() -> None:
    """Each point-to-point call names its bad peer on the rank that makes it (its peer is not in the call)."""
    group = f"this group of {N} (0-{LAST})"
    if ME == 0:
        refused(lambda: dist.send(ones(2), dst=-1), BackendError,
                f"hetbench backend: send: destination rank -1 is not a rank of {group}")
        refused(lambda: dist.isend(ones(2), dst=N).wait(), BackendError,
                f"hetbench backend: send: destination rank {N} is not a rank of {group}")
        refused(lambda: dist.recv(ones(2), src=N + 4), BackendError,
                f"hetbench backend: recv: source rank {N + 4} is not a rank of {group}")
        refused(lambda: dist.irecv(ones(2), src=-1).wait(), BackendError,
                f"hetbench backend: recv: source rank -1 is not a rank of {group}")
    else:
        for _ in range(4):
            still_works()
    # a receive from the rank itself with nothing sent, on every rank
    refused(lambda: dist.recv(ones(2), src=ME), BackendError,
            f"hetbench backend: recv: source rank {ME} is this rank itself, and no message of tag 0 from it is waiting "
            "(sends complete before they return): the receive would never end")
    # one sent to itself first (isend allows it) is received
    got = torch.zeros(2)
    dist.isend(ones(2) * 3, dst=ME).wait()
    dist.recv(got, src=ME)
    if not torch.equal(got, torch.full((2,), 3.0)):
        raise AssertionError(f"a message to this rank itself came as {got.tolist()}")


def mpi_error_one_line() -> None:
    """An error MPI reports itself (a receive buffer too small for the message) comes out as one line."""
    if ME == 0:
        dist.send(ones(8), dst=1)
    elif ME == 1:
        try:
            dist.recv(ones(4), src=0)
        except BackendError as e:
            text = str(e)
            if "\n" in text or not text.startswith("hetbench backend: recv: MPI error: ") or "truncat" not in text:
                raise AssertionError(f"not one line naming the truncation: {text!r}") from None
        else:
            raise AssertionError("a receive into 4 elements of a message of 8 did not raise")
    still_works()


def row_range_short() -> None:
    refused(lambda: hb.row_range([5]), ValueError,
            f"row_range: 1 row counts given for a world of {N} ranks: give one per rank (batch_rows makes them)")


def step_logger_folder() -> None:
    folder = tempfile.gettempdir()
    refused(lambda: hb.StepLogger(folder, 8), ValueError,
            f"StepLogger: cannot write the log {folder!r}: Is a directory")


def mlp(hidden: int = 8) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def shard_width_last() -> None:
    model = mlp(9 if ME == LAST else 8)
    refused(lambda: hb.shard_module(model, units=[model[0], model[2]]), WrapError,
            f"shard_module: the ranks' models differ: rank 0 has parameter 0.weight (unit 0) float32[8, 6] where rank "
            f"{LAST} has parameter 0.weight (unit 0) float32[9, 6]; every rank must shard the same model (names, "
            "shapes, dtypes and requires_grad alike)")


def shard_frozen_last() -> None:
    model = mlp()
    if ME == LAST:
        model[2].bias.requires_grad_(False)
    refused(lambda: hb.shard_module(model, units=[model[0], model[2]]), WrapError,
            f"shard_module: the ranks' models differ: rank 0 has parameter 2.bias (unit 2) float32[8] where rank "
            f"{LAST} has parameter 2.bias (unit 2) float32[8] frozen; every rank must shard the same model (names, "
            "shapes, dtypes and requires_grad alike)")


def shard_weights_last() -> None:
    model = mlp()
    weights = ",".join(["1"] * N) if ME == LAST else ",".join(["3"] + ["1"] * (N - 1))
    mine = [",".join(["3"] + ["1"] * (N - 1))] * (N - 1) + [",".join(["1"] * N)]
    said = f"{OTHERS}: {mine[0]!r}; rank {LAST}: {mine[-1]!r}"
    refused(lambda: hb.shard_module(model, units=[model[0]], weights=weights), WeightsError,
            f"shard_module: the ranks pass different weights ({said}): every rank must pass the same")


def shard_unit_refused_on_one_rank() -> None:
    model = mlp()
    units = [model] if ME == LAST else [model[0]]
    refused(lambda: hb.shard_module(model, units=units), WrapError,
            f"shard_module refused on every rank: rank {LAST}: unit 0 (Sequential) is the model itself, which is the "
            "root unit already; list only its submodules")


STEPS, BATCH = 4, 12


def frozen_train(model: nn.Sequential, rows: tuple[int, int]) -> list[float]:
    """AdamW (weight decay on: it would move a frozen parameter that reached the optimizer) on the rows given."""
    opt = torch.optim.AdamW([p for p in model.parameters()], lr=0.05, weight_decay=0.1)
    gen = torch.Generator().manual_seed(7)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, 6, generator=gen), torch.randn(BATCH, 2, generator=gen)
        lo, hi = rows
        loss = hb.part_of_mean(((model(x[lo:hi]) - y[lo:hi]) ** 2).sum(1), BATCH)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses


def frozen(model: nn.Sequential) -> nn.Sequential:
    model[0].weight.requires_grad_(False)
    model[2].requires_grad_(False)
    return model


def shard_frozen_stays_frozen() -> None:
    start = {k: v.detach().clone() for k, v in frozen(mlp()).state_dict().items()}
    want = frozen(mlp())
    frozen_train(want, (0, BATCH))
    model = frozen(mlp())
    weights = ",".join(["3"] + ["1"] * (N - 1))
    sharded = hb.shard_module(model, units=[model[0], model[2]], weights=weights)
    frozen_train(model, hb.row_range(hb.batch_rows(BATCH, weights)))
    full = sharded.full_state_dict()
    if ME == 0:
        for name in ("0.weight", "2.weight", "2.bias"):
            if not torch.equal(full[name], start[name]):
                raise AssertionError(f"frozen {name} moved by {float((full[name] - start[name]).abs().max()):.3g}")
        for name in ("0.bias", "4.weight", "4.bias"):
            if torch.equal(full[name], start[name]):
                raise AssertionError(f"trainable {name} did not move")
            reference = want.state_dict()[name]
            if not torch.allclose(full[name], reference, rtol=1e-4, atol=1e-5):
                raise AssertionError(f"{name} differs from one process by "
                                     f"{float((full[name] - reference).abs().max()):.3g}")
    summary = sharded.summary()
    if (summary["frozen_parameters"], summary["frozen"]) != (3, ["0.weight", "2.weight", "2.bias"]):
        raise AssertionError(f"summary: {summary}")
    if "6 parameters (3 frozen)" not in repr(sharded):
        raise AssertionError(repr(sharded))
    sharded.close()


CASES = [gather_into_short, allreduce_sizes, allreduce_dtypes, allreduce_ops, broadcast_root_out_of_range,
         gather_list_short, all_to_all_splits_differ, all_to_all_split_count, p2p_ranks, mpi_error_one_line,
         row_range_short, step_logger_folder, shard_width_last, shard_frozen_last, shard_weights_last,
         shard_unit_refused_on_one_rank, shard_frozen_stays_frozen]


def main() -> int:
    hb.init()
    named = {fn.__name__: fn for fn in CASES}
    chosen = sys.argv[1:] or list(named)  # cases named on the command line, else all
    passed = run_checks(WORLD, chosen, lambda name: named[name]())
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
