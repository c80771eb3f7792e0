"""Runs `hetbench` in this process once per case, on every rank of one launch, and prints on rank 0 one JSON list:
per case, every rank's exit code, stdout, stderr and the peak of memory traced while it ran (tracemalloc, which
NumPy's arrays report to), for tests/mpi/test_train_checkpoint.py.

    mpiexec -n N python -m mpi4py tests/mpi_resume_cases.py CASES.json   (mpi4py aborts every rank when one raises)

CASES.json: a list of {"name": ..., "args": [...]} (hetbench's arguments), and "trace": false for a case whose
peak nobody reads (tracemalloc makes importing torch, say, many times slower). A case may first make its own
checkpoint from one an earlier case saved, "doctor": {"from": FOLDER, "to": FOLDER, "manifest": RELATIVE PATH,
"path": [keys and indices], "value": VALUE}: FROM copied to TO, and in TO's manifest the field at PATH set to VALUE
(by rank 0, before any rank runs the case). Every case must end alike on every rank
(bad input: exit 2 after the ranks agreed), or the ranks fall out of step; one that fails while running aborts the
whole launch, as the command does.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tracemalloc


def run_case(args: list[str], trace: bool = True) -> dict:
    from hetbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    if trace:
        tracemalloc.start()
        tracemalloc.reset_peak()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(args)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        _, peak = tracemalloc.get_traced_memory() if trace else (0, 0)
        tracemalloc.stop()
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "peak_bytes": peak}


def doctor(spec: dict) -> None:
    import shutil
    from pathlib import Path

    shutil.copytree(spec["from"], spec["to"])
    manifest_path = Path(spec["to"]) / spec["manifest"]
    manifest = json.loads(manifest_path.read_text())
    holder = manifest
    for key in spec["path"][:-1]:
        holder = holder[key]
    holder[spec["path"][-1]] = spec["value"]
    manifest_path.write_text(json.dumps(manifest))


def main_cases(path: str) -> None:
    from hetbench.comm.world import world_rank
    from hetbench.comm.world import World
    from hetbench.signals import launched_size

    cases = json.loads(open(path, encoding="utf-8").read())
    results = []
    for case in cases:
        if "doctor" in case:
            if world_rank() == 0:
                doctor(case["doctor"])
            if launched_size() > 1:
                from mpi4py import MPI

                MPI.COMM_WORLD.Barrier()
        results.append({"name": case["name"], "rank": run_case(case["args"], case.get("trace", True))})
    world = World()
    every = world.gather([r["rank"] for r in results])
    if world.rank == 0:
        print(json.dumps([{"name": r["name"], "ranks": [ranks[i] for ranks in every]}
                          for i, r in enumerate(results)]))


if __name__ == "__main__":
    main_cases(sys.argv[1])
