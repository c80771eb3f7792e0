"""`hetbench devices`: every device every rank can see, merged into one table on rank 0."""

from __future__ import annotations

import click

from hetbench.backends.base import DeviceInfo, spec_of
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
    from hetbench.backends.base import BACKEND_NAMES, BackendUnavailable, backend_module
    from hetbench.comm import watchdog
    from hetbench.comm.world import World

    watchdog.arm(timeout_seconds)
    world = World()
    rows, unavailable = [], []
    for name in BACKEND_NAMES:
        try:
            module = backend_module(name)
        except BackendUnavailable as e:
            unavailable.append({"rank": world.rank, "host": world.host, "backend": name, "reason": str(e)})
            continue
        if module.CAPABILITIES.simulated and not with_sim:
            continue
        reason = module.unavailable_reason()
        if reason is not None:
            unavailable.append({"rank": world.rank, "host": world.host, "backend": name, "reason": reason})
            continue
        for info in module.list_devices():
            rows.append({"rank": world.rank, "host": world.host, **info.to_dict(), "backend_spec": backend_spec(info)})
    gathered = world.gather((rows, unavailable))
    if not world.is_root:
        return 0
    assert gathered is not None
    all_rows = [r for rows_, _ in gathered for r in rows_]
    all_unavailable = [u for _, us in gathered for u in us]
    if json_stdout:
        click.echo(to_json({"devices": all_rows, "unavailable": all_unavailable}), nl=False)
        return 0
    from hetbench.report.console import console, devices_table

    out = console()
    out.print(devices_table(all_rows, out.width))
    for u in all_unavailable:
        out.print(f"rank {u['rank']} ({u['host']}): backend {u['backend']} unavailable: {u['reason']}", markup=False)
    return 0
