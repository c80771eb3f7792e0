"""Under torchrun or spawn.py: a join that cannot complete. JOIN_CASE=late: the rank given by LATE_RANK never calls
init_process_group (it sleeps); JOIN_CASE=killed: that rank kills itself (SIGKILL) before it. The others call
init_process_group("hetbench") and must end within the join's timeout (HETBENCH_JOIN_TIMEOUT) with one line; each
says when it calls it (`rank R joins at UNIX-TIME`), after its imports, which a loaded machine slows."""

import os
import signal
import sys
import time

import torch.distributed as dist

import hetbench.pytorch  # noqa: F401 - registers the backend

rank = int(os.environ["RANK"])
if rank == int(os.environ.get("LATE_RANK", "1")):
    if os.environ.get("JOIN_CASE") == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)
sys.stdout.write(f"rank {rank} joins at {time.time():.3f}\n")  # the test's clock for the join's timeout starts here
sys.stdout.flush()
dist.init_process_group("hetbench")
print(f"rank {rank} joined", flush=True)
