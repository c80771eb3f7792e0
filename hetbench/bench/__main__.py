"""`python -m hetbench.bench PART [ARGS]`: one part of `make bench` (hetbench/bench/__init__.py lists them)."""

from __future__ import annotations

import sys

from hetbench.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
