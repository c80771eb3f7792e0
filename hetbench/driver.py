"""The one benchmark driver (after pyperf's Runner and nccl-tests' TimeTest): it turns a Benchmark into a `hetbench`
command and runs it the same way for every benchmark.

On every rank: parse -> config -> check output paths -> open the rank's device -> prepare -> cross-rank checks
(every error agreed over all ranks, exit 2) -> the timed run -> gather to rank 0 -> rows and summary -> the results
document -> all outputs staged and committed together -> rank 0 renders the tables (or prints the JSON alone).
Exit code 0 when every check passed, 1 when one failed, on every rank alike.
"""

from __future__ import annotations

from typing import Any

import click

from hetbench.benchmarks.base import Benchmark, RankResult, optional_hooks
from hetbench.comm import watchdog
from hetbench.comm.world import World
from hetbench.harness.devices import open_rank_device
from hetbench.harness.metadata import job_metadata, rank_description
from hetbench.results import check_writable, make_document
from hetbench.options import common_options
from hetbench.outputs import (agree_or_exit, check_distinct_outputs, emit, output_path_errors, overwritten_inputs,
                              resolve_outputs, utc_stamp)

COMMON_PARAMS = ("backend", "out_json", "out_csv", "json_stdout", "progress", "wide", "timeout_seconds")


def command_for(benchmark: Benchmark) -> click.Command:
    """The click command of `benchmark`: its own options, then the ones every benchmark shares."""

    def callback(**params: Any) -> int:
        return run(benchmark, params)

    params = [*benchmark.options(), *common_options(benchmark.name)]
    return click.Command(benchmark.name, params=params, callback=callback, help=benchmark.summary,
                         short_help=benchmark.summary)


def run(benchmark: Benchmark, params: dict[str, Any]) -> int:
    """Run `benchmark` with the parsed `params` on this rank. Collective: every rank of the job calls it."""
    own = {k: v for k, v in params.items() if k not in COMMON_PARAMS}
    watchdog.arm(params["timeout_seconds"])
    world = World()
    stamp = world.bcast(utc_stamp())
    output = resolve_outputs(benchmark.name, params["out_json"], params["out_csv"], params["json_stdout"], stamp)
    cfg = benchmark.configure(own, world, output)
    extra = benchmark.output_paths(cfg)  # option -> (path, the rank that writes it)
    check_distinct_outputs({"--out": output.out_json, "--csv": output.out_csv,
                            **{option: path for option, (path, _) in extra.items()}})

    # Everything that can be wrong is found before any computing, and every rank learns of every error
    errors = output_path_errors(output) if world.is_root else []
    errors += [e for option, (path, writer) in extra.items() if path is not None and writer == world.rank
               for e in [check_writable(path, option)] if e]
    # an output on this rank that names a file this rank reads
    mine = {**({"--out": output.out_json, "--csv": output.out_csv} if world.is_root else {}),
            **{option: path for option, (path, writer) in extra.items() if writer == world.rank}}
    hooks = optional_hooks(benchmark)
    inputs = hooks.input_paths(cfg, world)
    errors += overwritten_inputs(mine, inputs)
    backends = cfg.backends
    opened, open_errors = open_rank_device(backends[world.rank], benchmark.dtype(cfg), world)
    agree_or_exit(world, errors + open_errors)
    assert opened is not None
    try:
        state, prepare_errors = benchmark.prepare(cfg, world, opened)
        agree_or_exit(world, prepare_errors)
        agree_or_exit(world, benchmark.check(cfg, world, state))
        notices = hooks.notices(cfg, world, state)
        if world.is_root and notices and not params["json_stdout"]:
            from hetbench.report.console import notice_line  # rich: loaded only where rank 0 prints

            for line in notices:
                notice_line(line)

        from hetbench.report.console import sweep_progress  # rich: not at the command's start

        show = world.is_root and not params["json_stdout"]
        with sweep_progress(enabled=show, force=params["progress"], description=benchmark.name) as on_step:
            result: RankResult = benchmark.run(cfg, world, state, on_step)
    finally:
        opened.backend.close()

    gathered = world.gather(result.data)
    ranks = world.gather({**rank_description(world, opened), **result.description})
    document = render = None
    verified: bool | None = None
    if world.is_root:
        assert gathered is not None and ranks is not None
        rows = benchmark.rows(cfg, gathered)
        summary = benchmark.summarize(cfg, rows, gathered)
        verified = summary["verified"]
        metadata = {**job_metadata(world), "ranks": ranks}
        document = make_document(benchmark.name, metadata, cfg.to_dict(), rows, summary, verified)
        document.update(hooks.document_extra(cfg, gathered))  # e.g. train's "steps" (report plots them)

        def render() -> None:
            from hetbench.report.console import render_document  # rich: loaded only where rank 0 prints

            render_document(document, wide=params["wide"])

    # the files are written even when a check failed: they record the failure
    emit(world, document, output, render, files=result.files)
    return 1 if world.bcast(verified) is False else 0

