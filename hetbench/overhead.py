"""`python -m hetbench.overhead PART` forwards to hetbench.bench's parts (`python -m hetbench.bench PART`, where
`make bench`'s tools now live), kept so that the scripts and docs naming this module still run."""

from __future__ import annotations

import sys

from hetbench.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
