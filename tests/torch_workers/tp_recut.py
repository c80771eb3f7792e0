"""`hetbench train --frontend torch --tp 2 --weights auto` with the probe made wrong on purpose: rank 1's measured
samples/s divided by RECUT_SLOWDOWN, so the first cut gives it too few columns. The ranks' measured compute in the
first steps must then cut the layers again towards even (tests/mpi/test_torch_tensor.py reads the document).

    mpiexec -n 2 python tests/torch_workers/tp_recut.py OUT.json
"""

from __future__ import annotations

import sys

import hetbench.train.torch_frontend.run as torch_run

RECUT_SLOWDOWN = 8.0
_probe = torch_run.probe_samples_per_second


def _wrong(cfg, state, repeats=2):  # type: ignore[no-untyped-def]
    rate = _probe(cfg, state, repeats)
    from mpi4py import MPI

    return rate / RECUT_SLOWDOWN if MPI.COMM_WORLD.Get_rank() == 1 else rate


torch_run.probe_samples_per_second = _wrong
sys.argv = ["hetbench", "train", "--frontend", "torch", "--tp", "2", "--weights", "auto", "--model", "mlp",
            "--layers", "4", "--hidden", "512", "--batch", "256", "--steps", "6", "--out", sys.argv[1]]
from hetbench.__main__ import run  # noqa: E402

run()
