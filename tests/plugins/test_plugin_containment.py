"""Issue 33: a plugin, backend or benchmark, that fails to import, exits (sys.exit) or raises at import, or whose
list_devices / unavailable_reason / options raise, takes out itself alone: `hetbench devices` and `hetbench --help`
list it as unavailable with its own name and reason, naming it is one line and exit 2, and every other backend,
benchmark and command works. Before: a backend calling sys.exit(3) at import ended `hetbench devices` with exit 3 and
no word, one whose list_devices raised failed `devices`, and a broken benchmark took the whole `hetbench` command
down (exit 2) on every command. A plugin broken on one rank only: the ranks agree, one line naming that rank.

The plugins are a package in a folder of the test's own (a dist-info declaring its entry points, as an installed
package's would) beside tests/plugins/toy_dist (the healthy toy: `hetbench axpy`, `--backend toy`); one job runs
every command (tests/helpers.py run_cli_batch), alone and on 2 and 3 ranks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import REPO, needs_mpi, run_cli, run_cli_batch

PLUGINS = Path(__file__).resolve().parent / "toy_dist"
RANK = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")

# module -> source; every backend below but `exits`, `raises` and `onrank1` (on rank 1) imports
BROKEN = {
    "exits.py": "import sys\nsys.exit(3)\n",
    "raises.py": "raise RuntimeError('needs libfoo 2.0')\n",
    "onrank1.py": ("import os, sys\n"
                   f"if next((os.environ[v] for v in {RANK!r} if os.environ.get(v)), '0') == '1':\n"
                   "    sys.exit('no driver on this node')\n"
                   "from hetbench_toy.backend import *\n"
                   "from hetbench_toy.backend import _info\n"),
    "listfails.py": ("from hetbench.backends.host import CAPABILITIES, open_device\n"
                     "def unavailable_reason():\n    return None\n"
                     "def list_devices():\n    raise OSError('device table unreadable')\n"),
    "reasonfails.py": ("from hetbench.backends.host import CAPABILITIES, list_devices, open_device\n"
                       "def unavailable_reason():\n    raise SystemExit(7)\n"),
    "noprotocol.py": "def list_devices():\n    return []\n",
    "kbint.py": "raise KeyboardInterrupt\n",  # its own, no signal: as broken as any other exception
    "listjunk.py": ("from hetbench.backends.host import CAPABILITIES, open_device\n"
                    "def unavailable_reason():\n    return None\n"
                    "def list_devices():\n    return [1, 'two']\n"),
    "bench_exits.py": "import sys\nsys.exit(5)\n",
    "bench_raises.py": "raise ValueError('bad config table')\n",
    "bench_env.py": "import no_such_module_anywhere\n",
    "bench_options.py": ("from hetbench_toy.axpy import Axpy\n"
                         "from hetbench.benchmarks.base import register\n"
                         "class Bad(Axpy):\n    name = 'badopts'\n"
                         "    def options(self):\n        raise KeyError('n')\n"
                         "register(Bad())\n"),
    "bench_rank1.py": ("import os, sys\n"
                       f"if next((os.environ[v] for v in {RANK!r} if os.environ.get(v)), '0') == '1':\n"
                       "    raise ImportError('numpy too old on this node')\n"
                       "from hetbench_toy.axpy import Axpy\n"
                       "from hetbench.benchmarks.base import register\n"
                       "class Half(Axpy):\n    name = 'halfbench'\n"
                       "register(Half())\n"),
}
ENTRY_POINTS = """[hetbench.backends]
exits = broken_plugins.exits
raises = broken_plugins.raises
onrank1 = broken_plugins.onrank1
listfails = broken_plugins.listfails
reasonfails = broken_plugins.reasonfails
noprotocol = broken_plugins.noprotocol
kbint = broken_plugins.kbint
listjunk = broken_plugins.listjunk

[hetbench.benchmarks]
bexits = broken_plugins.bench_exits
braises = broken_plugins.bench_raises
badopts = broken_plugins.bench_options
halfbench = broken_plugins.bench_rank1
"""


def _plugins(root: Path) -> Path:
    dist = root / "dist"
    package = dist / "broken_plugins"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name, source in BROKEN.items():
        (package / name).write_text(source)
    info = dist / "broken_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return dist


COMMANDS = [
    ("devices-json", ["devices", "--json"]),
    ("devices", ["devices"]),
    ("help", ["--help"]),
    ("matmul-host", ["matmul", "--size", "16", "--repeat", "1", "--backend", "host", "--json"]),
    ("matmul-toy", ["matmul", "--size", "16", "--repeat", "1", "--backend", "toy", "--json"]),
    ("axpy", ["axpy", "--n", "8", "--json"]),
    ("report", ["report", "--help"]),
    ("bexits", ["bexits", "--n", "8"]),
    ("braises", ["braises"]),
    ("badopts", ["badopts"]),
    ("halfbench", ["halfbench", "--n", "8", "--json"]),
    ("backend-exits", ["matmul", "--size", "16", "--backend", "exits"]),
    ("backend-raises", ["matmul", "--size", "16", "--backend", "raises"]),
    ("backend-reasonfails", ["matmul", "--size", "16", "--backend", "reasonfails"]),
    ("backend-onrank1", ["matmul", "--size", "16", "--repeat", "1", "--backend", "onrank1", "--json"]),
]


@pytest.fixture(scope="module", params=[None, pytest.param(2, marks=needs_mpi), pytest.param(3, marks=needs_mpi)],
                ids=["1p", "2r", "3r"])
def runs(request, tmp_path_factory):
    nprocs = request.param
    root = tmp_path_factory.mktemp(f"contained-{nprocs or 1}")
    dist = _plugins(root)
    with pytest.MonkeyPatch.context() as mp:  # the job's own environment: plugins are found when hetbench imports
        mp.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(PLUGINS), str(dist)]))
        mp.setenv("HETBENCH_BENCHMARKS", "broken_plugins.bench_env")
        mp.setenv("HETBENCH_TEST_NO_FORKSERVER", "1")  # the fork server keeps the environment it starts with
        folders = {name: root / name for name, _ in COMMANDS}
        for folder in folders.values():
            folder.mkdir()
        done = run_cli_batch([(args, folders[name]) for name, args in COMMANDS], nprocs, root / "batch", timeout=240)
    return nprocs or 1, dict(zip((name for name, _ in COMMANDS), done))


def _one_error(run, *needles):
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), run.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_devices_lists_each_broken_plugin_with_its_reason(runs):
    ranks, found = runs
    run = found["devices-json"]
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    reasons: dict[tuple[int, str], str] = {(u["rank"], u["backend"]): u["reason"] for u in doc["unavailable"]}
    for rank in range(ranks):
        assert "SystemExit" in reasons[rank, "exits"] and "3" in reasons[rank, "exits"]
        assert "broken_plugins.exits" in reasons[rank, "exits"]
        assert "RuntimeError: needs libfoo 2.0" in reasons[rank, "raises"]
        assert "list_devices" in reasons[rank, "listfails"] and "device table unreadable" in reasons[rank, "listfails"]
        assert "unavailable_reason" in reasons[rank, "reasonfails"] and "SystemExit" in reasons[rank, "reasonfails"]
        assert "CAPABILITIES" in reasons[rank, "noprotocol"]
        assert "KeyboardInterrupt" in reasons[rank, "kbint"]
        assert "list_devices() gave list, not a list of DeviceInfo" in reasons[rank, "listjunk"]
    # the backend that exits on rank 1 alone: unavailable there, its device listed on the other ranks
    assert [r for r, b in reasons if b == "onrank1"] == ([1] if ranks > 1 else [])
    if ranks > 1:
        assert "no driver on this node" in reasons[1, "onrank1"]
    listed = [(d["rank"], d["backend"]) for d in doc["devices"]]
    for rank in range(ranks):
        assert (rank, "host") in listed
        # the toy's device, and onrank1's (the toy's module again) but on rank 1
        assert listed.count((rank, "toy")) == (1 if rank == 1 else 2), listed
    benches = {(u["rank"], u["benchmark"]): u for u in doc["unavailable_benchmarks"]}
    for rank in range(ranks):
        assert "SystemExit" in benches[rank, "bexits"]["reason"] and "5" in benches[rank, "bexits"]["reason"]
        assert "ValueError: bad config table" in benches[rank, "braises"]["reason"]
        assert "KeyError" in benches[rank, "badopts"]["reason"]
        assert "no_such_module_anywhere" in benches[rank, "broken_plugins.bench_env"]["reason"]
        assert benches[rank, "broken_plugins.bench_env"]["module"] == "broken_plugins.bench_env"
    assert [r for r, b in benches if b == "halfbench"] == ([1] if ranks > 1 else [])
    # the table too: a line per broken plugin and rank, and the working devices
    text = found["devices"]
    assert text.returncode == 0 and "Traceback" not in text.stderr, text.stderr
    flat = " ".join(text.stdout.split())  # the console wraps long lines at its width
    assert "Toy Device 0" in flat
    for rank in range(ranks):
        assert f"rank {rank} ({os.uname().nodename}): backend exits unavailable: backend 'exits'" in flat
        assert f"rank {rank} ({os.uname().nodename}): benchmark bexits unavailable: module" in flat


def test_the_rest_of_hetbench_works(runs):
    ranks, found = runs
    for name in ("matmul-host", "matmul-toy", "axpy"):
        run = found[name]
        assert run.returncode == 0, (name, run.stderr)
        assert json.loads(run.stdout)["verified"] is True
        assert len(json.loads(run.stdout)["rows"]) == ranks
    assert found["report"].returncode == 0 and "Usage: hetbench report" in found["report"].stdout
    helped = found["help"]
    assert helped.returncode == 0 and "Traceback" not in helped.stderr, helped.stderr
    assert "axpy" in helped.stdout and "matmul" in helped.stdout
    for name in ("bexits", "braises", "badopts", "broken_plugins.bench_env"):
        assert f"benchmark {name} unavailable: " in helped.stdout, helped.stdout


def test_naming_a_broken_plugin_is_one_line(runs):
    ranks, found = runs
    _one_error(found["bexits"], "benchmark bexits", "broken_plugins.bench_exits", "SystemExit")
    _one_error(found["braises"], "benchmark braises", "ValueError: bad config table")
    _one_error(found["badopts"], "benchmark badopts", "KeyError")
    _one_error(found["backend-exits"], "backend 'exits'", "SystemExit")
    _one_error(found["backend-raises"], "backend 'raises'", "needs libfoo 2.0")
    _one_error(found["backend-reasonfails"], "backend 'reasonfails'", "unavailable_reason", "SystemExit")
    half, onrank1 = found["halfbench"], found["backend-onrank1"]
    if ranks == 1:
        assert half.returncode == 0 and json.loads(half.stdout)["verified"] is True, half.stderr
        assert onrank1.returncode == 0 and json.loads(onrank1.stdout)["verified"] is True, onrank1.stderr
        return
    # broken on rank 1 alone: every rank stops alike, the line names rank 1 and the reason
    _one_error(half, f"rank 1 ({os.uname().nodename})", "benchmark halfbench", "numpy too old on this node")
    _one_error(onrank1, "rank 1 ", "onrank1", "no driver on this node")


def test_a_benchmark_plugin_raising_keyboard_interrupt_itself_is_out_alone(tmp_path, monkeypatch):
    """Its own `raise KeyboardInterrupt` at import, no signal (a real SIGINT raises hetbench's signals.Interrupted
    and stays a signal: tests/mpi/test_early_signals.py): listed with why, the rest works."""
    (tmp_path / "bench_kbint.py").write_text("raise KeyboardInterrupt\n")
    # (not through the test fork server: it imports the commands before any signal handling, as a script would)
    monkeypatch.setenv("HETBENCH_TEST_NO_FORKSERVER", "1")
    env = {"HETBENCH_BENCHMARKS": "bench_kbint", "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    run = run_cli(["devices", "--json"], cwd=tmp_path, env=env)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    (found,) = run.json()["unavailable_benchmarks"]
    assert found["benchmark"] == "bench_kbint" and found["reason"].endswith("cannot be imported: KeyboardInterrupt: ")
