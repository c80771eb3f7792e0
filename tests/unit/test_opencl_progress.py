"""The OpenCL GEMM's search on first use (HETBENCH_OPENCL_GEMM=tuned, no cached winner) says how far it has got: a
note line at most every PROGRESS_EVERY_SECONDS and at the last candidate (lines, not a redrawn bar: a rank under
mpiexec writes through a pipe)."""

from __future__ import annotations

import logging

import pytest

from hetbench.backends import opencl


def test_progress_lines_at_most_every_period_and_at_the_end(caplog):
    now = [100.0]
    on_step = opencl.progress_lines("tuning fp32 large", every=5.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="hetbench.opencl"):
        for done, t in [(1, 101.0), (2, 104.9), (3, 105.0), (4, 106.0), (5, 112.5), (6, 113.0), (7, 113.2)]:
            now[0] = t
            on_step(done, 7, "tune fp32 large")
    assert [r.getMessage() for r in caplog.records] == [
        "Note: tuning fp32 large: 3/7 candidates, 5 s",  # 5.0 s after the start: the first line
        "Note: tuning fp32 large: 5/7 candidates, 12 s",  # 7.5 s after the last line (106.0 was only 1 s after)
        "Note: tuning fp32 large: 7/7 candidates, 13 s",  # the last step, whatever the time
    ]


def test_the_search_on_first_use_reports_its_progress(monkeypatch, caplog):
    """gemm_path, in tuned mode without a cached winner, runs tune_gemm with a progress callback that writes lines."""
    if opencl.cl is None or not opencl._all_devices():
        pytest.skip("no OpenCL platform or device on this machine")
    from hetbench.backends.base import BackendSpec
    from hetbench.backends import opencl_tune
    from hetbench.dtypes import DTYPES

    monkeypatch.setenv(opencl_tune.CACHE_ENV, "/nonexistent-cache-dir-for-this-test")
    monkeypatch.setenv(opencl.GEMM_ENV, "tuned")
    backend = opencl.open_device(BackendSpec("opencl", 0), 0, 1)
    seen = []

    def fake_tune(dtype, cls, on_step=None, **kwargs):
        seen.append(cls)
        on_step(3, 3, "tune")  # the last step: always a line
        params = opencl_tune.default_params(backend._facts, dtype.name)
        return {"params": params.as_dict(), "tuned_gflops": 1.0, "clblast_gflops": None}

    monkeypatch.setattr(backend, "tune_gemm", fake_tune)
    with caplog.at_level(logging.WARNING, logger="hetbench.opencl"):
        path, _ = backend.gemm_path(DTYPES["fp32"], 64, 64, 64)
    backend.close()
    assert path == "tuned" and seen == ["small"]
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Note: tuning the OpenCL GEMM for fp32 small products") for m in messages), messages
    assert messages[-1].startswith("Note: tuning fp32 small: 3/3 candidates, "), messages
