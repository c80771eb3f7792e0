"""torch.multiprocessing.spawn as a user's script starts its ranks: `python spawn.py NPROCS SCRIPT ARGS...` runs
SCRIPT as __main__ in NPROCS spawned processes, each given RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a free
port) as such a script sets them, and no MPI launcher: init_process_group("hetbench") joins them into one MPI job.
Exits 1 when a process failed (spawn's ProcessRaisedException or ProcessExitedException, said in one line)."""

import os
import runpy
import socket
import sys

import torch.multiprocessing as mp


def run(rank: int, size: int, port: int, script: str, args: list[str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise


def main() -> int:
    size, script, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        mp.spawn(run, args=(size, port, script, args), nprocs=size)
    except Exception as e:  # noqa: BLE001 - one line for the test to show
        lines = [line for line in str(e).strip().splitlines() if line.strip()]  # the process's traceback's last
        print(f"spawn: {type(e).__name__}: {lines[0]} {lines[-1] if len(lines) > 1 else ''}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
