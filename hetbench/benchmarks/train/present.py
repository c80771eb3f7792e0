"""How `report`, `compare` and the HTML page show `hetbench train`'s runs, either front end (drawn by
hetbench/report/): the loss at the first and last step, the samples per second, each rank's share and how much of
the gathers' time prefetching hid; each rank's row and where its step went, and the series logged over the steps;
compare tests the step time and each rank's compute and communication on the steps, and shows the last loss's
change (one value a run: no significance verdict)."""

from __future__ import annotations

from functools import cache
from typing import Any

from hetbench.benchmarks.base import (
    Column,
    Compared,
    CompareRows,
    PlotSpec,
    Presentation,
    Row,
    RunFigure,
    Table,
    columns_of,
    rank_label,
    raw_of,
    shown,
)

NAME = "train"
RUN_MATCH = ("frontend", "strategy", "model", "dtype", "layers", "hidden", "batch")
RANK_MATCH = ("rank", "backend", "device", "strategy")
TIME_PARTS = ("compute_seconds_median", "comm_seconds_median", "idle_seconds_median")

# the run's figures compare reads (summary), as one row
RUN_COLUMNS: tuple[Column, ...] = (
    Column("step_seconds_median", "step", "ms", 1e3, better="lower"),
    Column("samples_per_second", "throughput", "samples/s", better="higher"),
    Column("loss_last", "loss at the last step", digits=4, better="lower"),
)


@cache
def rank_columns() -> tuple[Column, ...]:
    """Each rank's row as the command's compact table shows it."""
    return tuple(c for c in columns_of(NAME) if c.shown(False))


def _frontend(document: dict[str, Any]) -> str:
    summary, config = document.get("summary") or {}, document.get("config") or {}
    return str(summary.get("frontend") or config.get("frontend") or "numpy")


def run_figures(document: dict[str, Any]) -> list[RunFigure]:
    summary, config = document.get("summary") or {}, document.get("config") or {}
    frontend = _frontend(document)
    model = f", model {config.get('model')}" if frontend == "torch" and config.get("model") else ""
    shares = summary.get("shares")
    check = summary.get("check")
    return [
        RunFigure("frontend", "front end, strategy", f"{frontend}, {summary.get('strategy')}{model}"),
        RunFigure("model", "layers x hidden, batch, steps, dtype",
                  f"{config.get('layers')} x {config.get('hidden')}, {config.get('batch')}, {summary.get('steps')}, "
                  f"{summary.get('dtype', config.get('dtype'))}", headline=False),
        RunFigure("loss_first", f"loss at step {summary.get('first_step') or 0}", shown(summary.get("loss_first")),
                  digits=4),
        RunFigure("loss_last", "loss at the last step", shown(summary.get("loss_last")), digits=4),
        RunFigure("samples_per_second", "throughput", shown(summary.get("samples_per_second")), "samples/s",
                  note=f"the global batch over the median step ({summary.get('step_timing') or 'wall time'})"),
        RunFigure("shares", "shares", f"{summary.get('shares_of')} {', '.join(map(str, shares))}"
                  if isinstance(shares, list) else "-", note=f"weights {summary.get('weights_kind')}"),
        RunFigure("comm_hidden_percent", "comm hidden", shown(summary.get("comm_hidden_percent")), "%",
                  note="fsdp's prefetch: the share of the layer gathers' time hidden behind compute"),
        *_pipeline_figures(summary.get("pipeline")),
        *_tensor_figures(summary.get("tensor")),
        RunFigure("verified", "checks", "not checked" if check is None else "passed" if check.get("ok") else "FAILED",
                  headline=False),
    ]


# --pp: one row per pipeline stage (summary["pipeline"]["stages"])
STAGE_COLUMNS: tuple[Column, ...] = (
    Column("stage", "stage", text=True),
    Column("ranks_text", "ranks", text=True, derived=True),
    Column("layers", "layers", text=True),
    Column("param_bytes", "parameters", "bytes", digits=4),
    Column("microbatch_compute_seconds", "compute a micro-batch", "ms", 1e3, modelled="timing", better="lower"),
    Column("bubble_measured_fraction", "idle share of the step", better="lower"),
)


def _pipeline_figures(p: dict[str, Any] | None) -> list[RunFigure]:
    """--pp: the stages' layers, the bubble against the schedule's theory, the step modelled against measured."""
    if not p:
        return []
    return [
        RunFigure("pipeline_layers", "stage layers", ", ".join(str(s["layers"]) for s in p["stages"]),
                  note=f"{p['pp']} stages x {p['dp']} replicas"),
        RunFigure("pipeline_bubble", "pipeline bubble", shown(p.get("bubble_measured_fraction")),
                  note=f"the slowest stage's idle share; the schedule's theory {p.get('bubble_theory_fraction'):.3g}"),
        RunFigure("pipeline_step_modelled", "step modelled", shown(p.get("step_seconds_modelled")), "s",
                  note="the schedule at the stages' measured times, messages free", headline=False),
    ]


def _tensor_figures(t: dict[str, Any] | None) -> list[RunFigure]:
    """--tp: each rank's share of the cut layers, the largest share of a step spent in tp's collectives."""
    if not t:
        return []
    return [
        RunFigure("tensor_cut_percent", "tp cut", ", ".join(f"{r['cut_param_percent']:.3g}" for r in t["ranks"]),
                  "%", note=f"each rank's share of the cut layers' parameters; {t['tp']} ranks x {t['dp']} groups"),
        RunFigure("tensor_comm_step_fraction", "tp collectives", shown(t.get("tp_comm_step_fraction_max")),
                  note="the largest share of a rank's step spent in tp's collectives (median over timed steps)"),
    ]


# --tp: one row per rank (summary["tensor"]["ranks"])
TENSOR_COLUMNS: tuple[Column, ...] = (
    Column("rank", "rank", text=True),
    Column("tp_index", "tensor rank", text=True),
    Column("cut_param_bytes", "cut parameters", "bytes", digits=4),
    Column("cut_param_percent", "cut share", "%", digits=3),
    Column("weight_percent", "weight share", "%", digits=3),
    Column("tp_comm_seconds_median", "tp collectives", "ms", 1e3, better="lower"),
    Column("tp_comm_step_fraction", "share of the step in tp collectives", better="lower"),
)


def tables(document: dict[str, Any]) -> list[Table]:
    out = [Table("rows", "per rank", rank_columns(), document["rows"])]
    piped = (document.get("summary") or {}).get("pipeline")
    if piped:
        rows = [{**s, "ranks_text": ", ".join(map(str, s["ranks"]))} for s in piped["stages"]]
        out.append(Table("stages", f"per pipeline stage ({piped['schedule']}, {piped['micro_batches']} "
                                   "micro-batches)", STAGE_COLUMNS, rows))
    tensor = (document.get("summary") or {}).get("tensor")
    if tensor:
        out.append(Table("tensor", f"per rank, tensor parallel over {tensor['tp']} ranks a group", TENSOR_COLUMNS,
                         tensor["ranks"]))
    return out


PLOTS = (
    PlotSpec("stacked", "train-time", panels=(TIME_PARTS,), label=rank_label, axis="time of one step, median (ms)",
             title=lambda rows, run: f"train: where each rank's step went (run {run})"),
)


def _timed_steps(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps the timing figures are the medians of: those after the run's --warmup-steps."""
    steps = document.get("steps")
    warmup = (document.get("summary") or {}).get("warmup_steps") or 0
    return [s for s in steps[warmup:] if isinstance(s, dict)] if isinstance(steps, list) else []


def run_rows(document: dict[str, Any]) -> list[Row]:
    """The run's figures as one row, with each timed step's seconds as its repeats."""
    summary, config = document.get("summary") or {}, document.get("config") or {}
    row: Row = {"frontend": _frontend(document), "strategy": summary.get("strategy", config.get("strategy")),
                "model": config.get("model", "mlp"), "dtype": summary.get("dtype", config.get("dtype")),
                **{k: config.get(k) for k in ("layers", "hidden", "batch")},
                **{c.key: summary.get(c.key) for c in RUN_COLUMNS},
                "raw": {"step_seconds": [s.get("step_seconds") for s in _timed_steps(document)]}}
    return [row]


def rank_rows(document: dict[str, Any]) -> list[Row]:
    """Each rank's row, with its compute and communication seconds of each timed step (the document's step log)."""
    steps = _timed_steps(document)
    out = []
    for row in document["rows"]:
        per_step = [next((r for r in s.get("ranks") or [] if r.get("rank") == row.get("rank")), {}) for s in steps]
        out.append({**row, "raw": {k: [r.get(k) for r in per_step] for k in ("compute_seconds", "comm_seconds")}})
    return out


def _compare() -> tuple[CompareRows, ...]:
    run = {c.key: c for c in RUN_COLUMNS}
    ranks = {c.key: c for c in columns_of(NAME)}
    return (
        CompareRows(rows=run_rows, match=RUN_MATCH,
                    figures=(Compared(run["step_seconds_median"], raw_of("step_seconds")),
                             Compared(run["samples_per_second"], raw_of("step_seconds")),
                             Compared(run["loss_last"], None)),
                    describe=lambda r: f"{r.get('frontend')} {r.get('strategy')} {r.get('model')} {r.get('dtype')} "
                                       f"{r.get('layers')}x{r.get('hidden')} batch {r.get('batch')}"),
        CompareRows(rows=rank_rows, match=RANK_MATCH,
                    figures=(Compared(ranks["compute_seconds_median"], raw_of("compute_seconds")),
                             Compared(ranks["comm_seconds_median"], raw_of("comm_seconds"))),
                    describe=lambda r: f"rank {r.get('rank')} {r.get('backend')} {r.get('device')}"),
    )


PRESENTATION = Presentation(run_figures, tables, PLOTS, _compare)
