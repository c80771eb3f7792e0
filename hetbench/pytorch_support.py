"""Whether PyTorch is here, in a version the front end supports. It lives outside hetbench/pytorch/, whose import
needs torch, so that a command can refuse the torch front end in one line (exit 2) on a machine that lacks it."""

from __future__ import annotations

import re

# torch.distributed's Python ProcessGroup trampoline forwards what this front end needs from 2.11 on; 2.14 renamed
# some of the forwarded methods (the backend answers to both names, hetbench/pytorch/backend.py)
SUPPORTED = ((2, 11), (2, 14))
# the pipeline's schedules and group-backend choices (hetbench.pytorch.pipeline), named here so that `--help` needs
# no torch
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
GROUP_BACKENDS = ("auto", "hetbench", "gloo", "nccl")
INSTALL = "pip install 'hetbench[torch]' (on a machine without a GPU, install torch's CPU build first)"


def _version_tuple(text: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def version_problem(version: str) -> str | None:
    """Why torch `version` cannot be used, or None."""
    found = _version_tuple(version)
    low, high = SUPPORTED
    accepted = f"{low[0]}.{low[1]} to {high[0]}.{high[1]}"
    if found is None:
        return f"torch {version!r} has a version hetbench cannot read; supported: {accepted}"
    if not low <= found <= high:
        return f"torch {version} is not supported by hetbench's torch front end; supported: {accepted}"
    return None


def torch_problem() -> str | None:
    """Why the torch front end cannot run here (torch missing, too old or too new, or without torch.distributed),
    or None. Imports torch when it is installed."""
    try:
        import torch
    except ImportError:
        return f"the torch front end needs PyTorch, which is not installed; {INSTALL}"
    problem = version_problem(str(torch.__version__))
    if problem is not None:
        return problem
    import torch.distributed as dist

    if not dist.is_available():
        return f"torch {torch.__version__} was built without torch.distributed; {INSTALL}"
    return None
