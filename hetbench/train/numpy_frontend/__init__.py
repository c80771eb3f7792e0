"""The numpy front end: hetbench's own trainer (train/frontend.py's FrontEnd), its run on each rank in run.py."""

from hetbench.train.numpy_frontend.run import FRONTEND

__all__ = ["FRONTEND"]
