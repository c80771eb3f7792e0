"""The toy training strategies: plain data parallel for each front end, registered as "toy" (records only: their
code loads when a run uses them, so that `hetbench --help` imports no torch)."""

from hetbench.train.strategies import Strategy, register

register(Strategy("toy", "torch", "plain data parallel: whole replicas, each gradient all-reduced as it is made",
                  "hetbench_toy.torch_toy:PlainDataParallel"))
register(Strategy("toy", "numpy", "plain data parallel: whole replicas, one Allreduce of the gradient a step",
                  "hetbench_toy.numpy_toy:train_plain"))
