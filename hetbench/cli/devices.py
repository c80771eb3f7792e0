"""`hetbench devices`: every device every rank can see, merged into one table on rank 0."""

from __future__ import annotations

import click

from hetbench.backends.base import BACKEND_NAMES, BackendUnavailable, DeviceInfo, backend_module, spec_of
from hetbench.benchmarks import UNAVAILABLE as unavailable_benchmarks
from hetbench.comm import watchdog
from hetbench.comm.world import World
from hetbench.options import timeout_option
from hetbench.results.io import to_json


def timeout_decorator(f):
    f.__click_params__ = [*getattr(f, "__click_params__", []), timeout_option()]
    return f


def backend_spec(info: DeviceInfo) -> str:
    """What to give --backend for this device: `opencl:0`, `host:0`; a simulated GPU by its catalog key,
    `sim:h100`, since its place in the catalog is no index `--backend` takes."""
    return spec_of(info)


@click.command()
@click.option("--sim", "with_sim", is_flag=True, help="Also list the simulated GPUs of the sim catalog (modelled).")
@click.option("--json", "json_stdout", is_flag=True, help="Print JSON on stdout and nothing else.")
@timeout_decorator
def devices(with_sim: bool, json_stdout: bool, timeout_seconds: float) -> int:
    """List the devices of every backend on every rank's node."""
    watchdog.arm(timeout_seconds)
    world = World()
    rows, unavailable = [], []
    for name in BACKEND_NAMES:
        # a plugin backend that fails anywhere here (BackendUnavailable: its import, its unavailable_reason or its
        # list_devices raised or exited) is listed as unavailable with why; the others are listed as ever
        try:
            module = backend_module(name)
            if module.CAPABILITIES.simulated and not with_sim:
                continue
            reason = module.unavailable_reason()
            if reason is not None and not isinstance(reason, str):
                reason = f"backend {name!r}: its unavailable_reason() gave {reason!r}, not None or a text"
            found = [] if reason is not None else _device_rows(name, module.list_devices())
        except BackendUnavailable as e:
            reason = str(e)
        if reason is not None:
            unavailable.append({"rank": world.rank, "host": world.host, "backend": name, "reason": reason})
            continue
        rows += [{"rank": world.rank, "host": world.host, **row} for row in found]
    benchmarks = [{"rank": world.rank, "host": world.host, "benchmark": u.name, "module": u.module,
                   "reason": u.reason} for u in unavailable_benchmarks]
    gathered = world.gather((rows, unavailable, benchmarks))
    if not world.is_root:
        return 0
    assert gathered is not None
    all_rows = [r for rows_, _, _ in gathered for r in rows_]
    all_unavailable = [u for _, us, _ in gathered for u in us]
    all_benchmarks = [u for _, _, us in gathered for u in us]
    if json_stdout:
        click.echo(to_json({"devices": all_rows, "unavailable": all_unavailable,
                            "unavailable_benchmarks": all_benchmarks}), nl=False)
        return 0
    from hetbench.report.console import console, devices_table  # rich: loaded only to print a table

    out = console()
    out.print(devices_table(all_rows, out.width))
    for u in all_unavailable:
        out.print(f"rank {u['rank']} ({u['host']}): backend {u['backend']} unavailable: {u['reason']}", markup=False)
    for u in all_benchmarks:
        out.print(f"rank {u['rank']} ({u['host']}): benchmark {u['benchmark']} unavailable: {u['reason']}",
                  markup=False)
    return 0


def _device_rows(name: str, infos: object) -> list[dict]:
    """The table's rows of backend `name`'s devices; BackendUnavailable where its list_devices gave no list of
    DeviceInfo (a plugin's)."""
    if not isinstance(infos, list) or not all(isinstance(i, DeviceInfo) for i in infos):
        raise BackendUnavailable(f"backend {name!r}: its list_devices() gave {type(infos).__name__}, not a list of "
                                 "DeviceInfo")
    return [{**info.to_dict(), "backend_spec": backend_spec(info)} for info in infos]
