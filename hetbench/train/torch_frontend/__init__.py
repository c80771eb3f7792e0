"""The torch front end: a PyTorch model trained over the hetbench backend (train/frontend.py's FrontEnd): its run on
each rank (run.py), the strategies' parallel models (parallel.py), its tasks (models.py) and checkpoints
(checkpoint.py). Importing it imports torch."""

from hetbench.train.torch_frontend.run import FRONTEND

__all__ = ["FRONTEND"]
