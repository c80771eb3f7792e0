"""Under mpiexec -n 2 and -n 3 (tests/mpi/test_torch_p2p.py): the "hetbench" backend's point-to-point operations,
which do not block. Two ranks sending each other a message beyond MPI's eager limit at once (what a blocking send
turned into a deadlock), a ring through dist.batch_isend_irecv and through torch's coalescing manager, messages of
one tag arriving in order, sends to the rank itself in either order, a bad peer refused on its rank, and
torch.distributed.pipelining's GPipe and 1F1B schedules against the same model in one process.

Each case named on the command line runs in turn on every rank (tests/mpi_fail_fast.py: rank 0 prints `ok CASE` or
`FAILED CASE: rank R: ...`, and a rank left waiting on a peer that raised ends the job within seconds). The watchdog
is armed, so a rank stuck in MPI (a deadlock) ends the job with a line naming the operation it waits in.
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import hetbench.pytorch  # registers the backend "hetbench"
import hetbench.pytorch.backend
from hetbench.comm import watchdog
from hetbench.pytorch import BackendError

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_fail_fast import run_checks  # noqa: E402 - tests/ on the path first

warnings.filterwarnings("ignore")

WORLD = MPI.COMM_WORLD
ME, N = WORLD.Get_rank(), WORLD.Get_size()
MIB = 1 << 20
# a rank waiting this long in one MPI operation ends the job with a line saying which (a deadlock, not a slow case)
WATCHDOG_SECONDS = 30


def data(rank: int, nbytes: int, salt: int = 0) -> torch.Tensor:
    """What rank `rank` sends: float32 arange * (rank + 1) (+ salt), every value exact in float32."""
    return (torch.arange(nbytes // 4, dtype=torch.float32) % 4096 + salt) * (rank + 1)


def same(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if not torch.equal(got, expected):
        bad = int((got != expected).nonzero()[0, 0]) if got.shape == expected.shape else -1
        raise AssertionError(f"{what}: element {bad} is {got.reshape(-1)[bad].item() if bad >= 0 else got.shape}, "
                             f"expected {expected.reshape(-1)[bad].item() if bad >= 0 else expected.shape}")


def pg() -> Any:
    return dist.distributed_c10d._get_default_group()


def exchange() -> None:
    """Both ranks of a pair isend 8 MiB to each other, then irecv, then wait both: blocking sends of a rendezvous
    message would both wait for a receive never posted."""
    peer = ME ^ 1
    if peer >= N:
        return
    before = pg().metrics.totals().get("send", {}).get("bytes", 0)
    mine, got = data(ME, 8 * MIB), torch.zeros(8 * MIB // 4)
    sent = dist.isend(mine, dst=peer)
    received = dist.irecv(got, src=peer)
    received.wait()
    sent.wait()
    same(got, data(peer, 8 * MIB), f"the 8 MiB from rank {peer}")
    if not (sent.is_completed() and received.is_completed() and received.get_future().value()[0] is got):
        raise AssertionError("a waited Work is not complete, or its future does not hold the received tensor")
    counted = pg().metrics.totals()["send"]["bytes"] - before
    if counted != 8 * MIB:
        raise AssertionError(f"the send's metrics counted {counted} bytes, not {8 * MIB}")


def exchange_device_paths() -> None:
    """The exchange on groups whose CPU tensors stand for GPU tensors (the test hook): the device path, which hands
    MPI the tensors' memory, and the staged host path, whose receive is copied back in wait()."""
    os.environ[hetbench.pytorch.backend.FAKE_DEVICE_ENV] = "1"
    try:
        groups = []
        for path in ("device", "host"):
            hetbench.pytorch.set_path(path)
            groups.append(dist.new_group(list(range(N))))
    finally:
        del os.environ[hetbench.pytorch.backend.FAKE_DEVICE_ENV]
        hetbench.pytorch.set_path("host")
    peer = ME ^ 1
    for group in groups:
        if peer >= N:
            continue
        got = torch.zeros(2 * MIB // 4, dtype=torch.bfloat16)
        sent = dist.isend(data(ME, 2 * MIB).to(torch.bfloat16), dst=peer, group=group)
        received = dist.irecv(got, src=peer, group=group)
        sent.wait()
        received.wait()
        same(got, data(peer, 2 * MIB).to(torch.bfloat16), f"{group.path} path: the message from rank {peer}")
    for group in groups:
        dist.destroy_process_group(group)


def ring_batch() -> None:
    """dist.batch_isend_irecv around the ring, 4 MiB a message: send to the next rank, receive from the previous."""
    right, left = (ME + 1) % N, (ME - 1) % N
    got = torch.zeros(4 * MIB // 4)
    ops = [dist.P2POp(dist.isend, data(ME, 4 * MIB), right), dist.P2POp(dist.irecv, got, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    same(got, data(left, 4 * MIB), f"the ring's message from rank {left}")


def ring_coalesced() -> None:
    """torch's coalescing manager (what calls the group's _start_coalescing / _end_coalescing, with the device):
    the block's Work completes the ring's messages, and each op's own Work still works."""
    right, left = (ME + 1) % N, (ME - 1) % N
    got = torch.zeros(4 * MIB // 4)
    with dist.distributed_c10d._coalescing_manager(pg(), torch.device("cpu"), async_ops=True) as cm:
        sent = dist.isend(data(ME, 4 * MIB, salt=1), dst=right)
        received = dist.irecv(got, src=left)
    cm.wait()
    if not (received.is_completed() and sent.is_completed()):
        raise AssertionError("the coalesced block's Work completed, its ops' Works say they are not")
    received.wait()
    same(got, data(left, 4 * MIB, salt=1), f"the coalesced ring's message from rank {left}")
    # the hooks directly: the block's future holds every op's tensor
    pg()._start_coalescing(torch.device("cpu"))
    got2 = torch.zeros(16)
    ops = [pg().send([data(ME, 64)], right, 3), pg().recv([got2], left, 3)]
    block = pg()._end_coalescing(torch.device("cpu"))
    block.wait()
    value = block.get_future().value()
    if len(value) != 2 or value[1] is not got2 or not all(w.is_completed() for w in ops):
        raise AssertionError(f"the block's future holds {len(value)} tensors, its ops complete: "
                             f"{[w.is_completed() for w in ops]}")
    same(got2, data(left, 64), "the hooks' message")


def in_order() -> None:
    """Six messages of one tag from rank 0 to rank 1, large and small mixed (an eager one after a rendezvous one
    must not overtake it), arrive in the order they were sent."""
    sizes = [4 * MIB, 64, 2 * MIB, 8, 256 * 1024, 4]
    if ME == 0:
        works = [dist.isend(data(0, n, salt=i), dst=1, tag=7) for i, n in enumerate(sizes)]
    elif ME == 1:
        got = [torch.zeros(n // 4) for n in sizes]
        works = [dist.irecv(t, src=0, tag=7) for t in got]
    else:
        return
    for w in reversed(works):  # waited in any order: the order of the calls decides the matching
        w.wait()
    if ME == 1:
        for i, (t, n) in enumerate(zip(got, sizes)):
            same(t, data(0, n, salt=i), f"message {i} ({n} bytes)")


def to_itself() -> None:
    """Sends to this rank itself, in either order with their receive, small and 8 MiB."""
    for nbytes in (8, 8 * MIB):
        got = torch.zeros(nbytes // 4)
        sent = dist.isend(data(ME, nbytes), dst=ME, tag=1)  # send first, then receive
        dist.recv(got, src=ME, tag=1)
        sent.wait()
        same(got, data(ME, nbytes), f"{nbytes} bytes sent to itself, then received")
        got = torch.zeros(nbytes // 4)
        received = dist.irecv(got, src=ME, tag=2)  # receive posted first
        if received.is_completed():
            raise AssertionError("a receive from itself completed before its send")
        sent = dist.isend(data(ME, nbytes, salt=3), dst=ME, tag=2)
        received.wait()
        sent.wait()
        same(got, data(ME, nbytes, salt=3), f"{nbytes} bytes received from itself, the receive posted first")
        dist.isend(data(ME, nbytes, salt=5), dst=ME, tag=4).wait()  # the send waited for before the receive
        got = torch.zeros(nbytes // 4)
        dist.recv(got, src=ME, tag=4)
        same(got, data(ME, nbytes, salt=5), f"{nbytes} bytes sent to itself and waited for, then received")
    try:  # nothing sent: the wait says so rather than wait for ever
        dist.recv(torch.zeros(2), src=ME, tag=9)
    except BackendError as e:
        if "the receive would never end" not in str(e) or "\n" in str(e):
            raise AssertionError(f"a receive from itself with nothing sent raised {e!r}") from None
    else:
        raise AssertionError("a receive from itself with nothing sent did not raise")


def bad_peer() -> None:
    """A peer outside the group, or a dtype the backend does not move, raises one BackendError line at the call, on
    the rank that makes it; the group still works after it."""
    group = f"this group of {N} (0-{N - 1})"
    expected = [
        (lambda: dist.isend(torch.ones(2), dst=N), f"hetbench backend: send: destination rank {N} is not a rank of "
                                                   f"{group}"),
        (lambda: dist.irecv(torch.ones(2), src=N + 2), f"hetbench backend: recv: source rank {N + 2} is not a rank "
                                                       f"of {group}"),
        (lambda: dist.isend(torch.ones(2, dtype=torch.uint32), dst=(ME + 1) % N),
         "hetbench backend: send of uint32 tensors is not supported; dtypes accepted: "),
    ]
    if ME == N - 1:
        for call, message in expected:
            try:
                call()
            except BackendError as e:
                if not str(e).startswith(message) or "\n" in str(e):
                    raise AssertionError(f"raised {e!r}, expected one line starting {message!r}") from None
            else:
                raise AssertionError(f"did not raise {message!r}")
    t = torch.ones(3)
    dist.all_reduce(t)
    same(t, torch.full((3,), float(N)), "an all_reduce after the refusals")


def pipeline_case(schedule_name: str, hidden: int, batch: int) -> None:
    """A 4-layer model (Linear + ReLU each) cut in two stages, one step of `schedule_name` with 4 microbatches and a
    summed MSE loss, its gradients gathered at rank 0 and compared with the same step in one process."""
    if N != 2:
        raise AssertionError(f"the pipeline case runs on 2 ranks, not {N}")
    torch.manual_seed(11)
    layers = [m for _ in range(4) for m in (nn.Linear(hidden, hidden), nn.ReLU())]
    whole = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(5)
    # inputs and targets small enough that the gradients (sums over the batch) keep float32's summation-order
    # differences between 4 microbatches and one batch well inside the tolerance (about a tenth of it)
    x, y = torch.randn(batch, hidden, generator=gen) / 2, torch.randn(batch, hidden, generator=gen) / 20

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out, target, reduction="sum")

    part = copy.deepcopy(nn.Sequential(*layers[4 * ME:4 * ME + 4]))
    stage = PipelineStage(part, ME, 2, torch.device("cpu"))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    schedule = kind(stage, n_microbatches=4, loss_fn=loss_fn, scale_grads=False)
    losses: list[torch.Tensor] = []
    if ME == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=losses)
    grads = [p.grad.clone() for p in part.parameters()]
    gathered = [None] * N if ME == 0 else None
    dist.gather_object((grads, [float(v) for v in losses]), gathered, dst=0)
    if ME != 0:
        return
    reference = loss_fn(whole(x), y)
    reference.backward()
    expected = [p.grad for p in whole.parameters()]
    got = [g for stage_grads, _ in gathered for g in stage_grads]
    for i, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6, msg=lambda m: f"gradient {i}: {' '.join(m.split())}")
    torch.testing.assert_close(sum(gathered[1][1]), float(reference), rtol=1e-5, atol=1e-6,
                               msg=lambda m: f"the microbatches' losses: {' '.join(m.split())}")


def pipeline_gpipe_small() -> None:
    pipeline_case("gpipe", 64, 16)


def pipeline_1f1b_small() -> None:
    pipeline_case("1f1b", 64, 16)


def pipeline_gpipe() -> None:
    pipeline_case("gpipe", 1024, 256)  # 64 rows x 1024 float32 a microbatch: 256 KiB, beyond the eager limit


def pipeline_1f1b() -> None:
    pipeline_case("1f1b", 1024, 256)  # its steady state: both stages send 256 KiB to each other at once


def peer_fails() -> None:
    """On purpose (named on the command line only): the last rank raises instead of sending, while the others
    wait for its message in a Work's wait(); the job must end within seconds with that rank's line."""
    if ME == N - 1:
        raise RuntimeError(f"broken on purpose on rank {ME}")
    dist.irecv(torch.zeros(4 * MIB // 4), src=N - 1).wait()


CASES = [exchange, exchange_device_paths, ring_batch, ring_coalesced, in_order, to_itself, bad_peer,
         pipeline_gpipe_small, pipeline_1f1b_small, pipeline_gpipe, pipeline_1f1b]


def main() -> int:
    watchdog.arm(WATCHDOG_SECONDS)
    dist.init_process_group("hetbench")
    named = {fn.__name__: fn for fn in [*CASES, peer_fails]}
    chosen = sys.argv[1:] or [fn.__name__ for fn in CASES]
    passed = run_checks(WORLD, chosen, lambda name: named[name]())
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
