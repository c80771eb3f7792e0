"""Every figure of a `hetbench split` results document pinned in one process: the per-iteration phases, rows and
summary of a measured split computed from phases, rates and links given by hand (a fake clock), and a --plan's
figures (its even split's prediction among them) recomputed from the plan's own rates and link. Each expected
number is worked out in the comments; a wrong phase, term, rank, unit or median fails."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from hetbench.harness import split_plan as plan
from hetbench.config import parse_backend_map
from hetbench.dtypes import DTYPES
from hetbench.benchmarks.split import run
from hetbench.benchmarks.split.run import Phases, RankRun, SplitFigures
from hetbench.harness.verify import Verdict

MS = 1e-3
REL = 1e-12  # the same arithmetic in another order: equal but for rounding

# rows strategy, 10 x 1000 x 5000: 1e8 flop in all, 2 * part * 1000 * 5000 = 1e7 * part on a rank
M, N, K = 10, 1000, 5000
TOTAL = 2 * M * N * K


def ph(distribute, h2d, gemm, d2h, collect):
    """One rank's iteration in milliseconds (the order the phases run in)."""
    return Phases(distribute * MS, collect * MS, h2d * MS, gemm * MS, d2h * MS)


# The weighted split [6, 0, 4]: rank 0 the root (host memory, no copies), rank 1 with nothing to do, rank 2 a
# device behind copies. Per iteration (ms):        distribute  h2d  gemm  d2h  collect   device (h2d+gemm+d2h)
WEIGHTED = [[ph(1, 0, 30, 0, 9), ph(1, 0, 32, 0, 8), ph(2, 0, 40, 0, 9)],          # 30, 32, 40
            [ph(.5, 0, 0, 0, .5), ph(.5, 0, 0, 0, .5), ph(.5, 0, 0, 0, .5)],     # 0
            [ph(6, 4, 25, 5, 3), ph(7, 4, 26, 6, 2), ph(6, 5, 20, 4, 3)]]        # 34, 36, 29
# iteration 1: distribute max(1, .5, 6) = 6, device max(30, 0, 34) = 34, collect max(9, .5, 3) = 9: 49 ms end to
#   end (the GEMMs alone, max 30, would give 45; without collect 40); compute phase 30; imbalance of the working
#   ranks' GEMMs 30 / mean(30, 25) - 1 = 1/11 (of the device phases it would be 34/32 - 1; counting rank 1's 0 in
#   the mean 30 / 18.33 - 1)
# iteration 2: 7 + max(32, 36) + 8 = 51; compute 32; imbalance 32 / 29 - 1 = 3/29
# iteration 3: 6 + max(40, 29) + 9 = 55; compute 40; imbalance 40 / 30 - 1 = 1/3
# medians: end to end 51 (the mean would be 51.67), compute 32 (mean 34), distribute 6, device 36, collect 9,
# imbalance 3/29
EVEN = [[ph(1, 0, 20, 0, 10), ph(1, 0, 21, 0, 10), ph(1, 0, 22, 0, 10)],
        [ph(4, 2, 60, 3, 3), ph(4, 2, 62, 3, 3), ph(4, 2, 70, 3, 3)],           # 65, 67, 75
        [ph(5, 3, 30, 3, 2), ph(5, 3, 31, 3, 2), ph(5, 3, 29, 3, 2)]]           # 36, 37, 35
# end to end 5 + 65 + 10 = 80, 82, 90 (median 82); compute 60, 62, 70 (median 62)
# imbalance 60 / mean(20, 60, 30) - 1 = 7/11, 62 / mean(21, 62, 31) - 1 = 12/19, 70 / mean(22, 70, 29) - 1 = 89/121
# (median 7/11)

SOLO = [4e9, 1e9, 2e9]  # each rank alone, flop/s: 7 GFLOP/s summed
SOLO_PARTS = [5, 3, 4]
BESIDE = [3e9, 0.5e9, 1.5e9]  # each rank beside the others: what the cost model predicts with
LINKS = [None, plan.Link(2e9, 5e-6), plan.Link(1.25e9, 12e-6)]  # 2 GB/s, 5 us; 1.25 GB/s, 12 us
FACTS = [{"host": "a", "backend": "host", "vendor": "v", "device": "cpu", "device_timing": "measured"},
         {"host": "a", "backend": "sim:h100", "vendor": "v", "device": "h100", "device_timing": "modelled"},
         {"host": "b", "backend": "opencl", "vendor": "v", "device": "gpu", "device_timing": "measured"}]
CFG = SimpleNamespace(plan=False, dtype=DTYPES["fp32"])


def gathered() -> list[RankRun]:
    chosen = {"mnk": (M, N, K), "caps": [None, None, None], "strategy": "rows", "strategy_given": "rows",
              "weights_kind": "list", "weights": [3.0, 0.0, 2.0],
              "predictions": {"rows": plan.predict("rows", M, N, K, 4, [6, 0, 4], BESIDE, LINKS).to_dict()},
              "links": LINKS, "rates": {"rows": BESIDE}, "solo_rates": {"rows": SOLO}, "refined": []}
    out = []
    for r in range(3):
        splits = [("even", "rows", [4, 3, 3], EVEN[r]), ("weighted", "rows", [6, 0, 4], WEIGHTED[r])]
        out.append(RankRun(LINKS[r], {"rows": (SOLO[r], SOLO_PARTS[r])}, splits, [],
                           chosen if r == 0 else {}, None, Verdict(True, 0.25), FACTS[r]))
    return out


def test_each_iteration_adds_the_slowest_phases_and_weighs_the_working_ranks_gemms():
    its = SplitFigures("weighted", "rows", [6, 0, 4], WEIGHTED).iteration_times()
    assert [t["distribute"] for t in its] == pytest.approx([6 * MS, 7 * MS, 6 * MS], rel=REL)
    assert [t["device"] for t in its] == pytest.approx([34 * MS, 36 * MS, 40 * MS], rel=REL)
    assert [t["compute"] for t in its] == pytest.approx([30 * MS, 32 * MS, 40 * MS], rel=REL)
    assert [t["collect"] for t in its] == pytest.approx([9 * MS, 8 * MS, 9 * MS], rel=REL)
    assert [t["end_to_end"] for t in its] == pytest.approx([49 * MS, 51 * MS, 55 * MS], rel=REL)
    assert [t["imbalance"] for t in its] == pytest.approx([1 / 11, 3 / 29, 1 / 3], rel=REL)
    even = SplitFigures("even", "rows", [4, 3, 3], EVEN).iteration_times()
    assert [t["end_to_end"] for t in even] == pytest.approx([80 * MS, 82 * MS, 90 * MS], rel=REL)
    assert [t["imbalance"] for t in even] == pytest.approx([7 / 11, 12 / 19, 89 / 121], rel=REL)


def test_each_ranks_row_is_its_own_phases_part_rates_and_link():
    rows = run.rows(CFG, gathered())
    assert [(r["split"], r["rank"]) for r in rows] == [(s, r) for s in ("even", "weighted") for r in range(3)]
    by = {(r["split"], r["rank"]): r for r in rows}
    for r in range(3):
        row = by["weighted", r]
        assert row["part"] == [6, 0, 4][r] and row["share_percent"] == pytest.approx([60, 0, 40][r], rel=REL)
        assert row["gemm_flops"] == [6e7, 0, 4e7][r] and by["even", r]["gemm_flops"] == [4e7, 3e7, 3e7][r]
        assert (row["m"], row["n"], row["k"], row["strategy"], row["dtype"]) == (M, N, K, "rows", "fp32")
        assert row["solo_gflops"] == pytest.approx([4, 1, 2][r], rel=REL) and row["solo_part"] == SOLO_PARTS[r]
        assert row["rate_gflops"] == pytest.approx([3, 0.5, 1.5][r], rel=REL)
        assert row["backend"] == FACTS[r]["backend"] and row["device_timing"] == FACTS[r]["device_timing"]
    # the links in GB/s and us, on every split's rows of the rank; none at the root
    for split in ("even", "weighted"):
        assert [by[split, r]["link_gbps"] for r in range(3)] == [None, pytest.approx(2.0), pytest.approx(1.25)]
        assert [by[split, r]["link_latency_us"] for r in range(3)] == [None, pytest.approx(5.0), pytest.approx(12.0)]
    r2 = by["weighted", 2]
    # its GEMMs 25, 26, 20 ms: median 25, min 20, max 26, mean 71/3, cv stdev / mean
    assert r2["compute_seconds_median"] == pytest.approx(25 * MS, rel=REL)
    assert (r2["compute_seconds_min"], r2["compute_seconds_max"]) == pytest.approx((20 * MS, 26 * MS), rel=REL)
    assert r2["compute_seconds_mean"] == pytest.approx(71 / 3 * MS, rel=REL)
    assert r2["compute_seconds_cv"] == pytest.approx(statistics.stdev([25, 26, 20]) / (71 / 3), rel=1e-9)
    assert r2["h2d_seconds_median"] == pytest.approx(4 * MS, rel=REL)  # of 4, 4, 5
    assert r2["d2h_seconds_median"] == pytest.approx(5 * MS, rel=REL)  # of 5, 6, 4
    assert r2["gemm_gflops"] == pytest.approx(4e7 / (25 * MS) / 1e9, rel=REL)  # its flops over its median GEMM
    # communication: distribute + h2d + d2h + collect = 6+4+5+3 = 18, 7+4+6+2 = 19, 6+5+4+3 = 18: median 18
    assert r2["comm_seconds_median"] == pytest.approx(18 * MS, rel=REL)
    assert by["weighted", 0]["comm_seconds_median"] == pytest.approx(10 * MS, rel=REL)  # 1+9, 1+8, 2+9
    # idle: the slowest device phase (34, 36, 40) less its own: rank 0 (30, 32, 40) -> 4, 4, 0: median 4;
    # rank 1 (nothing) -> 34, 36, 40: 36; rank 2 (34, 36, 29) -> 0, 0, 11: 0
    assert [by["weighted", r]["idle_seconds_median"] for r in range(3)] == pytest.approx([4 * MS, 36 * MS, 0],
                                                                                         rel=REL, abs=1e-15)
    # the even split's rows are its own iterations': rank 1's GEMMs 60, 62, 70 ms, its device phases 65, 67, 75
    # the slowest, rank 0 idle 65 - 20, 67 - 21, 75 - 22: median 46
    assert by["even", 1]["compute_seconds_median"] == pytest.approx(62 * MS, rel=REL)
    assert [by["even", r]["idle_seconds_median"] for r in range(3)] == pytest.approx([46 * MS, 0, 30 * MS], rel=REL,
                                                                                     abs=1e-15)
    assert by["weighted", 1]["gemm_gflops"] is None and by["weighted", 0]["gemm_gflops"] == pytest.approx(
        6e7 / (32 * MS) / 1e9, rel=REL)
    assert r2["raw"] == {"compute_seconds": pytest.approx([25 * MS, 26 * MS, 20 * MS], rel=REL),
                         "h2d_seconds": pytest.approx([4 * MS, 4 * MS, 5 * MS], rel=REL),
                         "d2h_seconds": pytest.approx([5 * MS, 6 * MS, 4 * MS], rel=REL),
                         "distribute_seconds": pytest.approx([6 * MS, 7 * MS, 6 * MS], rel=REL),
                         "collect_seconds": pytest.approx([3 * MS, 2 * MS, 3 * MS], rel=REL)}


def test_each_splits_figures_and_the_summary_from_known_phases():
    g = gathered()
    s = run.summarize_job(CFG, run.rows(CFG, g), g)
    weighted, even = s["splits"]["weighted"], s["splits"]["even"]
    assert weighted["parts"] == [6, 0, 4] and even["parts"] == [4, 3, 3]
    assert weighted["end_to_end_seconds_median"] == pytest.approx(51 * MS, rel=REL)
    assert (weighted["end_to_end_seconds_min"], weighted["end_to_end_seconds_max"]) == pytest.approx(
        (49 * MS, 55 * MS), rel=REL)
    assert weighted["raw"]["end_to_end_seconds"] == pytest.approx([49 * MS, 51 * MS, 55 * MS], rel=REL)
    assert weighted["raw"]["compute_seconds"] == pytest.approx([30 * MS, 32 * MS, 40 * MS], rel=REL)
    assert weighted["distribute_seconds_median"] == pytest.approx(6 * MS, rel=REL)
    assert weighted["device_seconds_median"] == pytest.approx(36 * MS, rel=REL)
    assert weighted["compute_seconds_median"] == pytest.approx(32 * MS, rel=REL)
    assert weighted["collect_seconds_median"] == pytest.approx(9 * MS, rel=REL)
    # 1e8 flop in 51 ms end to end: 1.96 GFLOP/s; in the 32 ms compute phase 3.125; of the 7 GFLOP/s the ranks
    # do alone (solo, not beside: 5)
    assert weighted["achieved_gflops"] == pytest.approx(1e8 / (51 * MS) / 1e9, rel=REL)
    assert weighted["compute_phase_gflops"] == pytest.approx(3.125, rel=REL)
    assert weighted["efficiency_end_to_end"] == pytest.approx(1e8 / (51 * MS) / 1e9 / 7, rel=REL)
    assert weighted["efficiency_compute"] == pytest.approx(3.125 / 7, rel=REL)
    assert weighted["imbalance"] == pytest.approx(3 / 29, rel=REL)
    assert weighted["imbalance_per_iteration"] == pytest.approx([1 / 11, 3 / 29, 1 / 3], rel=REL)
    assert even["end_to_end_seconds_median"] == pytest.approx(82 * MS, rel=REL)
    assert even["compute_phase_gflops"] == pytest.approx(1e8 / (62 * MS) / 1e9, rel=REL)
    assert even["imbalance"] == pytest.approx(7 / 11, rel=REL)
    # the measured split's prediction: its own parts, the rates beside the others (rank 0: 6e7 / 3e9 = 20 ms;
    # rank 2: 4e7 / 1.5e9 = 26.67 ms), rank 2's link (rank 1 moves nothing): distribute 12 us + (4 rows of A and
    # B: 4 * 5000 + 5000 * 1000 = 5.02e6 floats) * 4 B / 1.25 GB/s = 16.076 ms; collect 12 us + 4000 * 4 / 1.25e9
    # = 24.8 us
    predicted = weighted["predicted"]
    assert predicted["parts"] == [6, 0, 4]
    assert predicted["compute_seconds"] == pytest.approx([0.02, 0, 4e7 / 1.5e9], rel=REL)
    assert predicted["distribute_seconds"] == pytest.approx(12e-6 + 5.02e6 * 4 / 1.25e9, rel=REL)
    assert predicted["collect_seconds"] == pytest.approx(24.8e-6, rel=REL)
    assert predicted["seconds"] == pytest.approx(12e-6 + 5.02e6 * 4 / 1.25e9 + 4e7 / 1.5e9 + 24.8e-6, rel=REL)
    # the even split's: rank 1 (3 rows) is the slowest beside the others, 3e7 / 0.5e9 = 60 ms
    assert max(even["predicted"]["compute_seconds"]) == pytest.approx(0.06, rel=REL)
    # modelled where a simulated rank computed: rank 1 works in the even split only
    assert (weighted["timing"], even["timing"]) == ("measured", "modelled")
    # the summary: the weighted split's figures at the top, the gain over even, the solo sum, the links' units
    assert s["total_gemm_flops"] == TOTAL == 10**8 and s["ranks"] == 3
    assert s["sum_solo_gflops"] == pytest.approx(7, rel=REL)
    assert s["parts"] == [6, 0, 4] and s["strategy"] == "rows" and s["weights"] == [3.0, 0.0, 2.0]
    for key in ("end_to_end_seconds_median", "achieved_gflops", "efficiency_end_to_end", "efficiency_compute",
                "imbalance", "timing"):
        assert s[key] == weighted[key], key
    assert s["predicted_seconds"] == weighted["predicted"]["seconds"]
    assert s["speedup_over_even"] == pytest.approx(82 / 51, rel=REL)  # the same flops in 51 ms against 82
    assert s["links"] == [None, {"link_gbps": pytest.approx(2.0), "link_latency_us": pytest.approx(5.0)},
                          {"link_gbps": pytest.approx(1.25), "link_latency_us": pytest.approx(12.0)}]
    assert s["model_best"] == plan.best_root_share("rows", M, N, K, 4, BESIDE, LINKS, [None] * 3, 0).to_dict()
    assert s["verified"] is True and s["max_residual_over_tolerance"] == 0.25


def _plan(backend: str, weights: str, strategy: str = "auto", gbit: float = 100.0, latency_us: float = 10.0,
          m: int = 65536, n: int = 65536, k: int = 65536, overlap: bool = True) -> tuple[dict, list[dict]]:
    backends = tuple(parse_backend_map(backend, backend.count("=")))
    cfg = SimpleNamespace(m=m, n=n, k=k, dtype=DTYPES["fp32"], backends=backends, strategy=strategy,
                          weights=plan.parse_weights(weights, len(backends)), link_gbit_per_s=gbit,
                          link_latency_us=latency_us, overlap=overlap, chunks=None)
    state = run.SplitState(None, None, "", None, None, (m, n, k), None)  # type: ignore[arg-type]
    outcome = run.plan_only(cfg, None, state)  # type: ignore[arg-type]
    return outcome.chosen["summary"], outcome.chosen["rows"]


@pytest.mark.parametrize("backend, weights, strategy, shape, chosen", [
    # an H100 and an MI300X over 100 Gb/s at 65536^3: auto weights give [19038, 46498], rows
    ("0=sim:h100,1=sim:mi300x", "auto", "auto", (65536, 65536, 65536), "rows"),
    # three ranks, given weights, a long inner dimension: the k strategy (even: k split 3 ways)
    ("0=sim:h100,1=sim:mi300x,2=sim:a100", "1,3,2", "auto", (4096, 4096, 1 << 20), "k"),
])
@pytest.mark.parametrize("overlap", [True, False])
def test_a_plans_figures_and_its_even_splits_prediction(backend, weights, strategy, shape, chosen, overlap):
    from hetbench.benchmarks.split.stream import auto_chunks

    m, n, k = shape
    s, rows = _plan(backend, weights, strategy, gbit=80.0, latency_us=7.0, m=m, n=n, k=k, overlap=overlap)
    chunks = auto_chunks(n) if overlap else None  # streamed (the default) in auto chunks, or phased
    assert s["overlap"] is overlap and s["chunks"] == chunks
    ranks = len(rows)
    assert s["strategy"] == chosen
    dim = m if chosen == "rows" else k
    rates = [r["solo_gflops"] * 1e9 for r in rows]
    # --link-gbps is gigabits: 80 Gb/s is 10 GB/s; --link-latency-us 7 is 7e-6 s
    link = plan.Link(10e9, 7e-6)
    links = [None] + [link] * (ranks - 1)
    # each simulated device's copies between the host and it at its model's host link (a 16 MiB copy's rate)
    from hetbench.backends import sim
    from hetbench.harness.probe import COPY_PROBE_BYTES

    models = [item.split("=")[1].split(":")[1] for item in backend.split(",")]
    copies = [COPY_PROBE_BYTES / (COPY_PROBE_BYTES / (sim.get_model(x).host_link_gbps * 1e9)
                                  + sim.get_model(x).launch_latency_us * 1e-6) for x in models]
    assert s["copies_gbps"] == pytest.approx([c / 1e9 for c in copies], rel=1e-12)
    assert [r["link_gbps"] for r in rows] == [None] + [pytest.approx(10.0)] * (ranks - 1)
    assert [r["link_latency_us"] for r in rows] == [None] + [pytest.approx(7.0)] * (ranks - 1)
    # the even split: equal parts (largest remainder, ties to the lower rank), predicted with the plan's rates and
    # link for the chosen strategy
    even_parts = [dim // ranks + (1 if r < dim % ranks else 0) for r in range(ranks)]
    assert s["even_parts"] == even_parts
    even = plan.predict(chosen, m, n, k, 4, even_parts, rates, links, chunks=chunks, copies=copies)
    assert s["even_predicted_seconds"] == pytest.approx(even.seconds, rel=1e-9)
    stored = s["even_predictions"][chosen]
    assert stored["parts"] == even_parts and stored["compute_seconds"] == pytest.approx(even.compute_seconds, rel=1e-9)
    assert (stored["distribute_seconds"], stored["collect_seconds"]) == pytest.approx(
        (even.distribute_seconds, even.collect_seconds), rel=1e-9)
    # the weighted split: the weights' parts, predicted likewise
    given = rates if weights == "auto" else [float(w) for w in weights.split(",")]
    parts = plan.shares(given, dim)
    assert s["parts"] == parts != even_parts
    weighted = plan.predict(chosen, m, n, k, 4, parts, rates, links, chunks=chunks, copies=copies)
    assert s["predicted_seconds"] == pytest.approx(weighted.seconds, rel=1e-9)
    assert s["predicted_speedup_over_even"] == pytest.approx(even.seconds / weighted.seconds, rel=1e-9)
    total = 2 * m * n * k
    assert s["total_gemm_flops"] == total
    assert s["sum_solo_gflops"] == pytest.approx(sum(rates) / 1e9, rel=1e-12)
    assert s["predicted_gflops"] == pytest.approx(total / weighted.seconds / 1e9, rel=1e-9)
    assert s["predicted_efficiency_end_to_end"] == pytest.approx(total / weighted.seconds / sum(rates), rel=1e-9)
    assert s["predicted_efficiency_compute"] == pytest.approx(
        total / max(weighted.compute_seconds) / sum(rates), rel=1e-9)
    slowest = max(weighted.compute_seconds)
    for r, row in enumerate(rows):
        flops = 2 * parts[r] * n * k if chosen == "rows" else 2 * m * n * parts[r]
        assert row["part"] == parts[r] and row["gemm_flops"] == flops
        assert row["share_percent"] == pytest.approx(100 * parts[r] / dim, rel=1e-12)
        assert row["compute_seconds_median"] == pytest.approx(flops / rates[r], rel=1e-9)
        assert row["idle_seconds_median"] == pytest.approx(slowest - flops / rates[r], rel=1e-9, abs=1e-12)
    best = s["model_best"]
    # the model's best may use the other strategy: its share is of that strategy's dimension
    best_dim = m if best["strategy"] == "rows" else k
    assert sum(best["parts"]) == best_dim
    assert best["root_share_percent"] == pytest.approx(100 * best["parts"][0] / best_dim, rel=1e-12)


def test_the_denominator_is_each_rank_alone_at_its_final_part_and_above_1_is_a_fault(capsys):
    """With the final parts timed alone (solo_at_parts), the efficiency's denominator is their median rates, a rank
    without a part counting its probe's; the probes' efficiency stays beside it. An efficiency above 1 is listed as a
    measurement fault in the document and marked on the console, never shown as a gain."""
    from hetbench.report.console import split_report

    g = gathered()
    # rank 0 alone at its 6 rows: 6e7 flop in 20 ms = 3 GFLOP/s (its probe: SOLO[0]); rank 2 at 4 rows in 10 ms = 4
    at_parts = [{"part": 6, "gflops_median": 3.0, "gflops_min": 2.9, "gflops_max": 3.1, "seconds": [0.02] * 3},
                None,
                {"part": 4, "gflops_median": 4.0, "gflops_min": 3.8, "gflops_max": 4.2, "seconds": [0.01] * 3}]
    g[0].chosen["solo_at_parts"] = at_parts
    s = run.summarize_job(CFG, run.rows(CFG, g), g)
    denominator = 3.0 + SOLO[1] / 1e9 + 4.0  # rank 1 has no part: its probe's rate
    assert s["sum_solo_gflops"] == pytest.approx(denominator, rel=REL)
    assert s["sum_solo_gflops_probe"] == pytest.approx(sum(SOLO) / 1e9, rel=REL)
    assert s["solo_at_parts"] == at_parts and "final part" in s["efficiency_basis"]
    for name in ("weighted", "even"):
        f = s["splits"][name]
        assert f["efficiency_end_to_end"] == pytest.approx(f["achieved_gflops"] / denominator, rel=REL)
        assert f["efficiency_compute"] == pytest.approx(f["compute_phase_gflops"] / denominator, rel=REL)
        assert f["efficiency_compute_probe"] == pytest.approx(f["compute_phase_gflops"] / (sum(SOLO) / 1e9), rel=REL)
    assert s["measurement_faults"] == []
    # the same run against solo rates far below it: every efficiency above 1 is named a fault
    for a in at_parts:
        if a:
            a["gflops_median"] = 0.5
    s = run.summarize_job(CFG, run.rows(CFG, g), g)
    above = [(n, k) for n, f in s["splits"].items() for k in ("efficiency_end_to_end", "efficiency_compute")
             if f[k] > 1]
    assert above and len(s["measurement_faults"]) == len(above)
    for (name, key), fault in zip(above, s["measurement_faults"]):
        assert fault.startswith(f"{name} split {key} {s['splits'][name][key]:.3f} > 1: a measurement fault")
    split_report(run.rows(CFG, g), s)
    shown = capsys.readouterr().out
    assert shown.count("MEASUREMENT FAULT") >= len(above)
