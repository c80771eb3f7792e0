"""Under torchrun or spawn.py: each rank prints torch's rank and size beside MPI's, its host, and an all-reduce of
rank + 1 over the hetbench backend: `torch R/N mpi R/N host H sum S`."""

import socket
import sys

import torch
import torch.distributed as dist

import hetbench.pytorch  # noqa: F401 - registers the backend

dist.init_process_group("hetbench")
from hetbench.comm.watchdog import raw_world  # noqa: E402 - the job's world: COMM_WORLD, or Open MPI's merged one

t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
world = raw_world()
sys.stdout.write(f"torch {dist.get_rank()}/{dist.get_world_size()} mpi {world.Get_rank()}/{world.Get_size()} "
                 f"host {socket.gethostname()} sum {t.item()}\n")  # one write: torchrun interleaves the ranks' writes
sys.stdout.flush()
dist.destroy_process_group()
