"""The host path's staging holds a few chunks, never a whole buffer (issue 20): a 64 MiB allreduce of OpenCL buffers
on 2 ranks (PoCL: the device's buffers are host memory, so the process's peak RSS shows everything) staged in 1 MiB
chunks by the copy ring. Its peak is what the pre-check planned (point_host_bytes), and below 5 buffers: the send and
receive buffers and the device's two copies (4 at the start), the ring's 3 x 2 chunks and MPI's temporaries of a
chunk while it runs; the whole-buffer staging it replaces held 6 (a staged copy and a second upload)."""

from __future__ import annotations

import json

from helpers import needs_mpi, needs_opencl, run_cli

from hetbench.backends.host import RUNTIME_SCRATCH_BYTES

MIB = 1024**2


@needs_mpi
@needs_opencl
def test_a_staged_64_mib_allreduce_holds_chunks_not_a_staged_copy(tmp_path):
    size = 64 * MIB
    run = run_cli(["collectives", "--op", "allreduce", "--min-bytes", "64M", "--max-bytes", "64M", "--backend",
                   "opencl", "--stage-method", "copy", "--stage-chunk-bytes", "1M", "--iters", "2", "--warmup", "1",
                   "--out", "r.json"], nprocs=2, cwd=tmp_path, timeout=180)
    assert run.returncode == 0, run.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    row = doc["rows"][0]
    assert row["wrong"] == 0 and row["stage_chunks"] == 64 and row["stage_chunk_bytes"] == MIB
    assert row["stage_chosen_by"] == "given" and row["staging"]["rank_method"] == ["copy", "copy"]
    for rank in doc["metadata"]["ranks"]:
        memory = rank["memory"]
        above = memory["peak_rss_bytes"] - memory["rss_at_start_bytes"]
        planned = memory["host_memory_planned_bytes"]
        # the plan: 4 buffers at the start (send and receive, and the device's copies in host memory); while it
        # runs the receive buffer, the device's two, the ring (3 slots x 2 sides x 1 MiB) and MPI's 1 MiB; the
        # check 3 + 1 MiB
        assert planned == RUNTIME_SCRATCH_BYTES + 4 * size, planned / MIB
        assert above <= 1.1 * planned, (above / MIB, planned / MIB)
        assert 4 * size <= above < 5 * size, above / size
