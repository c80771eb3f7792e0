"""hetbench.__main__'s start-up: a signal whose exception Python wrapped on its way out of the imports (a RuntimeError
from a class body's __set_name__) ends the command as that signal does, not as a broken install."""

from __future__ import annotations

import signal
import subprocess
import sys

from helpers import REPO

from hetbench.__main__ import _interrupt_in_chain
from hetbench.signals import Interrupted


def test_the_interrupt_behind_a_wrapped_error_is_found():
    interrupt = Interrupted(signal.SIGTERM)
    wrapped = RuntimeError("Error calling __set_name__ on 'Field' instance 'x' in 'C'")
    wrapped.__cause__ = interrupt
    assert _interrupt_in_chain(wrapped) is interrupt
    outer = ImportError("no")
    outer.__context__ = wrapped
    assert _interrupt_in_chain(outer) is interrupt
    plain = RuntimeError("broken install")
    assert _interrupt_in_chain(plain) is None
    loop = ValueError("a")
    other = ValueError("b")
    loop.__context__, other.__context__ = other, loop  # a cycle ends the search
    assert _interrupt_in_chain(loop) is None


def test_a_wrapped_interrupt_during_the_imports_ends_with_the_signals_code():
    code = (
        "import sys, importlib.abc\n"
        "from hetbench.signals import Interrupted\n"
        "class Finder(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'hetbench.cli':\n"
        "            try:\n"
        "                raise Interrupted(15)\n"
        "            except Interrupted as e:\n"
        "                raise RuntimeError('Error calling __set_name__') from e\n"
        "sys.meta_path.insert(0, Finder())\n"
        "from hetbench.__main__ import run\n"
        "run()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stderr.strip().splitlines() == ["Error: interrupted by SIGTERM"]
    assert "could not start" not in done.stderr and "Traceback" not in done.stderr


# what `hetbench --help` (every command's declaration, the built-in benchmarks loaded) must not load: MPI starts in
# mpi4py.MPI's import, the others take seconds or are optional
HEAVY_AT_START = ("mpi4py", "torch", "pyopencl", "cupy", "rich", "matplotlib")


def test_the_commands_load_without_mpi_torch_or_a_device_library():
    code = ("import sys\n"
            "import hetbench.cli\n"
            "from hetbench.benchmarks import load\n"
            "load()\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    loaded = set(run.stdout.split())
    assert "hetbench" in loaded and "click" in loaded
    assert not loaded & set(HEAVY_AT_START), sorted(loaded & set(HEAVY_AT_START))
