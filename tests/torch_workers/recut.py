"""`hetbench train --frontend torch --pp 2 --weights auto` with the probe made wrong on purpose: rank 1's measured
seconds per part multiplied by RECUT_SLOWDOWN, so the probe's cut gives it too few blocks. The run's measured stage
times must then re-cut the blocks towards even (tests/mpi/test_torch_pipeline.py reads the document).

    mpiexec -n 2 python tests/torch_workers/recut.py OUT.json
"""

from __future__ import annotations

import sys

import hetbench.train.torch_frontend.pipeline as piped

RECUT_SLOWDOWN = 16.0
_measure = piped._measure


def _wrong(cfg, state, rows):  # type: ignore[no-untyped-def]
    seconds, sizes, acts = _measure(cfg, state, rows)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 1:
        seconds = [s * RECUT_SLOWDOWN for s in seconds]
    return seconds, sizes, acts


piped._measure = _wrong
sys.argv = ["hetbench", "train", "--frontend", "torch", "--pp", "2", "--weights", "auto", "--model", "mlp",
            "--layers", "8", "--hidden", "512", "--batch", "512", "--steps", "6", "--out", sys.argv[1]]
from hetbench.__main__ import run  # noqa: E402

run()
