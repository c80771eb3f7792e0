"""Every example command in README.md and docs/*.md is run (issue 18), and this test says by whom:

- RUN: here, as written, in the test's own folder (the checkout's .venv/bin programs are this interpreter's and
  the tests' launcher), with a check of what its doc says it prints or writes;
- REDUCED: too heavy as written on this 2-core CPU: here with a smaller step count, and parsed as written;
- DEMO: by `make demo` (its dry run holds the command, with only --warmup/--repeat/--out added), parsed as written;
- PARSED: not run here (CuPy, two nodes, Slurm; the torch bench, 33 s, is `make bench-torch`'s command): the
  hetbench command's own click parser accepts every option and value (the CuPy pair runs on 2 ranks here up to
  where it needs CuPy; hetbench.overhead accepts `torch`);
- NOT_RUN: templates with placeholders and setup that changes the machine (what can be checked is);
- MAKE: make targets of minutes (or the suite itself): their dry run (make -n) succeeds.

An example is a command in a fenced code block: a `$ ` line of a transcript (the lines after it are its output),
every line of an `sh` block, and in an unlabelled block without `$` a line that starts with hetbench, mpiexec,
mpirun, make or python; and an example in the README's table of commands. A new example that none of the tables
below names fails test_every_example_is_accounted_for, as does a listed one the docs no longer hold."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from helpers import (HAVE_OPENCL, MPIEXEC, MPIEXEC_KIND, REPO, Run, launcher_kind, needs_mpi, needs_opencl,
                      require_mpi_mark, run_python)

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PROGRAMS = {"hetbench", "mpiexec", "mpirun", "srun", "make", "python", "python3"}
LAUNCHERS = {"mpiexec", "mpirun", "srun"}
FENCE = re.compile(r"^\s*(```|~~~)")
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
TIMEOUT = 180


# ---------------------------------------------------------------------------------------------------------------
# finding the examples


def _normal(text: str) -> str:
    """The example as the tables below name it: its `# comment` and extra blanks left out."""
    return " ".join(re.sub(r"(^|\s)#(\s.*)?$", "", text).split())


def _starts_with_program(text: str) -> bool:
    words = text.split()
    while words and ENV_ASSIGN.match(words[0]):
        words = words[1:]
    if not words or Path(words[0]).name not in PROGRAMS:
        return False
    return not re.match(r"^\S+ \S+:", " ".join(words))  # output such as "hetbench matmul: 1024x1024x1024 fp32"


def _commands_in_block(lang: str, block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    if lang not in ("", "sh", "bash", "shell", "console"):
        return []
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in block:
        text = line.strip()
        if pending is not None:
            number, text = pending[0], pending[1] + " " + text
            pending = None
        if text.endswith("\\"):
            pending = (number, text[:-1].rstrip())
            continue
        joined.append((number, text))
    if pending is not None:
        joined.append(pending)
    prompted = [(n, t[2:]) for n, t in joined if t.startswith("$ ")]
    if prompted:
        return prompted
    if lang:
        return [(n, t) for n, t in joined if t and not t.startswith("#")]
    return [(n, t) for n, t in joined if _starts_with_program(t)]


def _table_examples(lines: list[str]) -> list[tuple[int, str]]:
    """The README's table of commands: a cell's code span with more than a command's name in it is an example."""
    found, in_table = [], False
    for number, line in enumerate(lines, 1):
        if re.match(r"^\|\s*command\s*\|", line):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            in_table = False
        if in_table:
            found += [(number, span) for span in re.findall(r"`([^`]+)`", line) if " " in span.strip()]
    return found


def examples_in(path: Path) -> list[tuple[int, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        lang = lines[i].strip()[3:].strip().lower()
        j, block = i + 1, []
        while j < len(lines) and not lines[j].strip().startswith(opening.group(1)):
            block.append((j + 1, lines[j]))
            j += 1
        found += _commands_in_block(lang, block)
        i = j + 1
    if path.name == "README.md":
        found += _table_examples(lines)
    return [(n, _normal(t)) for n, t in found if _normal(t)]


def all_examples() -> dict[str, list[str]]:
    """Each example, once, with where it appears (doc:line)."""
    found: dict[str, list[str]] = {}
    for path in DOCS:
        for number, text in examples_in(path):
            found.setdefault(text, []).append(f"{path.relative_to(REPO)}:{number}")
    return found


# ---------------------------------------------------------------------------------------------------------------
# running one as written


def _words(example: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(example, comments=True)
    env = {}
    while words and ENV_ASSIGN.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def _argv(example: str) -> tuple[dict[str, str], list[str], bool]:
    """The example's command line for this machine: `mpiexec` and `.venv/bin/mpiexec` are the tests' launcher,
    `hetbench` (from any virtualenv) is `python -m hetbench` and `python` this interpreter, both with this checkout
    on the path; files of the checkout (examples/, tests/, hostfiles/) are named from it, everything else (outputs,
    results/) is relative to the test's folder."""
    env, words = _words(example)
    argv: list[str] = []
    launched = False
    for word in words:
        name = Path(word).name
        if word == "/usr/bin/mpirun":
            argv.append(word)
            launched = True
        elif name in LAUNCHERS:
            assert MPIEXEC is not None
            argv.append(MPIEXEC)
            launched = True
        elif name == "hetbench":
            argv += [sys.executable, "-m", "hetbench"]
        elif name in ("python", "python3"):
            argv.append(sys.executable)
        elif name == "torchrun":  # PyTorch's launcher, from this interpreter's torch
            argv += [sys.executable, "-m", "torch.distributed.run"]
        elif word.split("/")[0] in ("examples", "tests", "hostfiles"):
            argv.append(str(REPO / word))
        else:
            argv.append(word)
    return env, argv, launched


SHOW_EXIT = '; echo "exit $?"'


def run_example(example: str, cwd: Path, replace: dict[str, str] | None = None) -> Run:
    """The example run in CWD; one ending `; echo "exit $?"` has that line added to its stdout, as the shell would."""
    for old, new in (replace or {}).items():
        assert old in example, (old, example)
        example = example.replace(old, new)
    show_exit = example.endswith(SHOW_EXIT)
    env, argv, launched = _argv(example.removesuffix(SHOW_EXIT))
    if launched:
        require_mpi_mark()
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (env.pop("PYTHONPATH", ""), str(REPO),
                                                          full_env.get("PYTHONPATH", "")) if p)
    full_env.setdefault("OMP_NUM_THREADS", "1")  # as conftest's run_python: the ranks share this machine's cores
    full_env.update(env)
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, env=full_env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{example} did not finish within {TIMEOUT} s\nstdout: {e.stdout}\nstderr: {e.stderr}")
    stdout = proc.stdout + (f"exit {proc.returncode}\n" if show_exit else "")
    return Run(proc.returncode, stdout, proc.stderr, time.monotonic() - start)


def ok(run: Run, example: str, codes: tuple[int, ...] = (0,), traceback: bool = False) -> None:
    assert run.returncode in codes, (f"{example}: exit {run.returncode}\nstdout: {run.stdout[-3000:]}\n"
                                     f"stderr: {run.stderr[-3000:]}")
    assert traceback or "Traceback" not in run.stderr, run.stderr


def has_lines(text: str, *needles: str) -> None:
    """Each needle printed, whitespace aside (rich wraps a title line to its table's width)."""
    flat = " ".join(text.split())
    for needle in needles:
        assert " ".join(needle.split()) in flat, f"{needle!r} not in:\n{text[-4000:]}"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def newest(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert found, f"no {pattern} in {folder}: {sorted(p.name for p in folder.iterdir()) if folder.is_dir() else '-'}"
    return found[-1]


def has_default_outputs(tmp_path: Path, command: str) -> dict:
    """The README's promise: a run without --out writes results/<command>-<UTC time>.{json,csv}."""
    doc = newest(tmp_path / "results", f"{command}-*.json")
    assert doc.with_suffix(".csv").is_file()
    return json.loads(doc.read_text())


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


HAVE_TORCH = _have("torch")
HAVE_MATPLOTLIB = _have("matplotlib")
OPENMPI = "/usr/bin/mpirun"
HAVE_OPENMPI = Path(OPENMPI).exists() and launcher_kind(OPENMPI) == "openmpi"


def _doc_block(doc: str, first_line: str) -> str:
    """A code block of a doc, found by its first line (a script the doc's example runs)."""
    text = (REPO / doc).read_text(encoding="utf-8")
    match = re.search(r"^```\w*\n(" + re.escape(first_line) + r"\n.*?)^```", text, re.M | re.S)
    assert match, f"no block starting {first_line!r} in {doc}"
    return match.group(1)


# ---------------------------------------------------------------------------------------------------------------
# the examples run as written: each one's check of what its doc says it prints or writes


@dataclass
class Case:
    examples: tuple[str, ...]  # run in this order, in one folder
    check: Callable[[list[Run], Path], None]
    prepare: Callable[[Path, pytest.FixtureRequest], None] | None = None  # makes what the examples read
    marks: list = field(default_factory=list)
    codes: tuple[int, ...] = (0,)  # the exit codes the doc allows
    traceback: bool = False  # the doc shows the last line of Python's traceback (a user's script that raises)


RUN: dict[tuple[str, ...], Case] = {}


def runs(*examples: str, prepare: Callable[[Path, pytest.FixtureRequest], None] | None = None, marks: list | None = None,
         codes: tuple[int, ...] = (0,), traceback: bool = False):
    def register(check):
        RUN[examples] = Case(examples, check, prepare, list(marks or []), codes, traceback)
        return check
    return register


@runs("hetbench devices --sim")
def _devices_sim(r, tmp):
    has_lines(r[0].stdout, "host:0", "sim:h100", "sim:mi300x", "sim:arc-a770", "(simulated)")


@runs("hetbench devices", ".venv-openmpi/bin/hetbench devices")  # the second: docs/multi-node.md's, on its node
def _devices(r, tmp):
    for run in r:
        has_lines(run.stdout, "Backend", "host:0", *(["opencl:0"] if HAVE_OPENCL else []))
        assert "sim:h100" not in run.stdout  # the simulated catalog only with --sim


@runs("mpiexec -n 3 hetbench matmul --size 1024 --backend 0=host,1=opencl,2=sim:mi300x")
def _matmul(r, tmp):
    out = r[0].stdout
    has_lines(out, "hetbench matmul: 1024x1024x1024 fp32, 3 ranks", "│ host ", "│ opencl ", "│ sim:mi300x ",
              "~ modelled (simulated device), not measured", "verified (Freivalds)")
    doc = has_default_outputs(tmp, "matmul")
    assert doc["summary"]["verified"] is True


@runs("mpiexec -n 2 hetbench matmul --sizes 64:512 --repeat 3 --backend 0=host,1=sim:mi300x")
def _matmul_sizes(r, tmp):
    out = r[0].stdout
    has_lines(out, "hetbench matmul: fp32, 2 ranks, 4 sizes", "64x64x64", "128x128x128", "256x256x256",
              "512x512x512", "sums of products at rank 0, every size: verified (Freivalds)")
    doc = has_default_outputs(tmp, "matmul")
    assert len(doc["summary"]["sizes"]) == 4


@runs("mpiexec -n 2 hetbench collectives --op allreduce --min-bytes 64K --max-bytes 1M --backend 0=sim:h100,1=sim:mi300x")
def _collectives(r, tmp):
    has_lines(r[0].stdout, "ranks: 0:sim:h100 NVIDIA H100 SXM5 80GB (simulated) [modelled], 1:sim:mi300x AMD "
              "Instinct MI300X (simulated) [modelled]", "allreduce  (path: host, 2 ranks, fp32, redop sum, busbw factor 1)")
    has_default_outputs(tmp, "collectives")


@runs("mpiexec -n 2 hetbench calibrate --size 1024 --backend 0=host,1=sim:mi300x --out profile.json")
def _calibrate(r, tmp):
    has_lines(r[0].stdout, "hetbench calibrate", "│ sim:mi300x ", "│ rows ", "│ k ")
    profile = json.loads((tmp / "profile.json").read_text())
    assert profile  # the profile `split --weights profile.json` reads


@runs("mpiexec -n 2 hetbench train --strategy fsdp --steps 500 --weights auto --backend 0=host,1=opencl --log train.jsonl")
def _train(r, tmp):
    has_lines(r[0].stdout, "hetbench train: fsdp, 4 layers x 32, batch 64, 500 steps, adamw lr 0.01, weights auto",
              "loss curve and final parameters: matches one process's", "result: all checks passed")
    steps = jsonl(tmp / "train.jsonl")
    assert [s["step"] for s in steps] == list(range(500)) and {"loss", "ranks"} <= set(steps[0])


@runs("mpiexec -n 2 hetbench train --steps 200 --weights 3,1 --checkpoint ck --checkpoint-every 100",
      "mpiexec -n 3 hetbench train --steps 300 --weights 0.5,0.3,0.2 --resume ck --checkpoint ck")
def _checkpoint_resume(r, tmp):
    assert {p.name for p in (tmp / "ck").iterdir()} >= {"latest", "step-100", "step-200", "step-300"}
    resumed = json.loads(newest(tmp / "results", "train-*.json").read_text())
    assert [s["step"] for s in resumed["steps"]] == list(range(200, 300))  # the doc's "steps 200..299"
    has_lines(r[1].stdout, "result: all checks passed")


@runs("mpiexec -n 3 hetbench train --dtype fp16 --weights 0.5,0.3,0.2 --backend 0=host,1=opencl,2=sim:mi300x --log fp16.jsonl")
def _train_fp16(r, tmp):
    has_lines(r[0].stdout, "precision: fp16 compute (rank 0 emulated, rank 1 emulated, rank 2 native), fp32 master "
              "weights, dynamic loss scaling", "loss curve (fp16): matches one process's in the same dtype",
              "result: all checks passed")
    steps = jsonl(tmp / "fp16.jsonl")
    assert len(steps) == 300 and "loss_scale" in steps[0] and "step_skipped" in steps[0]


@runs("hetbench split --plan --size 65536 --backend 0=sim:h100,1=sim:mi300x --link-gbps 100")
def _split_plan(r, tmp):
    """A plan is modelled from datasheets: every line of the doc's transcript outside its table is printed as is."""
    text = (REPO / "docs" / "split.md").read_text(encoding="utf-8")
    transcript = text.split("$ hetbench split --plan --size 65536")[1].split("```")[0].splitlines()[1:]
    lines = [line for line in transcript if line.strip() and line.strip()[0] not in "┏┃┡│└"]
    assert len(lines) >= 7
    has_lines(r[0].stdout, *lines)


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory) -> Path:
    """Saved runs for the report and compare examples, made once: results/ (a run without --out), nvidia.json and
    amd.json (the H100 run and an MI300X one), base.json and new.json (two runs of one command)."""
    folder = tmp_path_factory.mktemp("saved-runs")
    for args in (["--backend", "sim:h100"], ["--backend", "sim:h100", "--out", "new.json"],
                 ["--backend", "sim:mi300x", "--out", "amd.json"]):
        made = run_python(["-m", "hetbench", "matmul", "--size", "64", "--repeat", "3", *args], cwd=folder)
        assert made.returncode == 0, made.stderr
    first = newest(folder / "results", "matmul-*.json")
    shutil.copy(first, folder / "nvidia.json")
    shutil.copy(first, folder / "base.json")
    return folder


def _results_to_report(tmp: Path, request) -> None:
    shutil.copytree(request.getfixturevalue("saved_runs"), tmp, dirs_exist_ok=True)


needs_matplotlib = pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="no matplotlib (pip install 'hetbench[report]')")


@runs("hetbench report results/", prepare=_results_to_report)
def _report(r, tmp):
    has_lines(r[0].stdout, "hetbench matmul: 1 run(s)", "result: all checks passed")


@runs("hetbench report results/ --html report.html", prepare=_results_to_report, marks=[needs_matplotlib])
def _report_html(r, tmp):
    html = (tmp / "report.html").read_text(encoding="utf-8")
    # one self-contained page: the plots inside it as SVG
    assert 'data-plot="matmul-' in html and 'src="data:image/svg+xml;base64' in html


@runs("hetbench report nvidia.json amd.json --html report.html", prepare=_results_to_report, marks=[needs_matplotlib])
def _report_two_files_html(r, tmp):
    has_lines(r[0].stdout, "hetbench matmul: 2 run(s)", "report page written to: report.html")
    html = (tmp / "report.html").read_text(encoding="utf-8")
    assert "NVIDIA H100" in html and "AMD Instinct MI300X" in html and html.count('data-plot="matmul-') >= 2


@runs("hetbench report results/ --plots plots/", prepare=_results_to_report, marks=[needs_matplotlib])
def _report_plots(r, tmp):
    names = [p.name for p in (tmp / "plots").iterdir()]
    pngs = sorted(n[:-4] for n in names if n.endswith(".png"))
    assert pngs and pngs == sorted(n[:-4] for n in names if n.endswith(".svg"))  # each plot as PNG and SVG


@runs("hetbench report results/ --csv merged.csv", prepare=_results_to_report)
def _report_csv(r, tmp):
    with open(tmp / "merged.csv", newline="") as f:
        header = next(csv.reader(f))
    # docs/report.md: "with run_id, benchmark, date_utc, command, ranks, hosts, rank_map, source_file first"
    assert header[:8] == ["run_id", "benchmark", "date_utc", "command", "ranks", "hosts", "rank_map", "source_file"]


@runs("hetbench compare base.json new.json", prepare=_results_to_report)
def _compare(r, tmp):
    has_lines(r[0].stdout, "hetbench compare (matmul): base.json -> new.json", "Verdict")


@runs("hetbench compare base.json new.json --fail-on-slowdown 5", prepare=_results_to_report, codes=(0, 1))
def _compare_gate(r, tmp):
    # the doc: exit 1 on a significant slowdown > 5 %; the two runs' modelled GEMM times are equal, their measured
    # reduce times (one rank) may differ either way
    if r[0].returncode == 0:
        has_lines(r[0].stdout, "ok: no significant slowdown over 5 %")
    else:
        assert re.search(r"FAIL: \d+ significant slowdown\(s\) over 5 %", r[0].stdout), r[0].stdout


# docs/pytorch.md: the PyTorch front end; the step lines printed are the doc's (the MLP and its batch are seeded)

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="no torch (pip install 'hetbench[torch]')")
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="no transformers (pip install 'hetbench[transformers]'): the example's "
                                               "model")


def _no_torch(tmp: Path, request) -> None:
    (tmp / "no-torch").mkdir()
    (tmp / "no-torch" / "torch.py").write_text("raise ImportError('No module named torch (docs/pytorch.md)')\n")


@runs('PYTHONPATH=no-torch .venv/bin/hetbench train --frontend torch; echo "exit $?"', prepare=_no_torch, codes=(2,))
def _without_torch(r, tmp):
    assert r[0].error_lines == ["Error: --frontend torch: the torch front end needs PyTorch, which is not installed; "
                                "pip install 'hetbench[torch]' (on a machine without a GPU, install torch's CPU build "
                                "first)"], r[0].stderr
    assert r[0].stdout.endswith("exit 2\n") and "Traceback" not in r[0].stderr


def _minimal_py(tmp: Path, request) -> None:
    (tmp / "minimal.py").write_text(_doc_block("docs/pytorch.md", "# minimal.py"))


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python minimal.py", prepare=_minimal_py, marks=[needs_torch])
def _minimal_two(r, tmp):
    has_lines(r[0].stdout, "rank 0 of 2: hetbench [3.0, 3.0, 3.0, 3.0]", "rank 1 of 2: hetbench [3.0, 3.0, 3.0, 3.0]")


@runs(".venv/bin/python minimal.py", prepare=_minimal_py, marks=[needs_torch])
def _minimal_one(r, tmp):
    assert r[0].stdout.strip() == "rank 0 of 1: hetbench [1.0, 1.0, 1.0, 1.0]"


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python tests/torch_workers/exact.py even 3,1", marks=[needs_torch])
def _exact(r, tmp):
    lines = r[0].stdout.splitlines()
    for case, verdict in (("CASE ddp 3,1 rows=9,3 ", " ok"), ("CASE fsdp2 3,1 rows=9,3 ", " ok"),
                          ("CASE plain-ddp 3,1 rows=9,3 ", " differs")):
        assert any(line.startswith(case) and line.endswith(verdict) for line in lines), (case, r[0].stdout)


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python examples/torch_uneven.py --strategy fsdp2 --weights 3,1 --log train.jsonl",
      marks=[needs_torch])
def _uneven_fsdp2(r, tmp):
    has_lines(r[0].stdout, "step   0  loss 0.513506", "step  19  loss 0.086483", "rows [48, 16]")
    assert len(jsonl(tmp / "train.jsonl")) == 20


@runs(".venv/bin/mpiexec -n 2 -f hostfiles/localhost.mpich .venv/bin/python examples/torch_uneven.py --strategy ddp "
      "--weights 3,1 --steps 5",
      marks=[needs_torch, pytest.mark.skipif(MPIEXEC_KIND != "mpich", reason="-f is MPICH's (hydra) option; the "
                                             "tests' launcher here is another MPI's")])
def _uneven_hostfile(r, tmp):
    has_lines(r[0].stdout, "step   0  loss 0.513506", "step   4  loss 0.445004", "rows [48, 16]")


@runs("/usr/bin/mpirun --allow-run-as-root -np 2 --hostfile hostfiles/localhost.openmpi -x MPI4PY_LIBMPI=libmpi.so.40 "
      ".venv/bin/python examples/torch_uneven.py --strategy ddp --weights 3,1 --steps 5",
      marks=[needs_torch, pytest.mark.skipif(not HAVE_OPENMPI, reason=f"no Open MPI at {OPENMPI} (apt-get install "
                                             "openmpi-bin)")])
def _uneven_openmpi(r, tmp):
    has_lines(r[0].stdout, "step   0  loss 0.513506", "step   4  loss 0.445004", "rows [48, 16]")


@runs(".venv/bin/mpiexec -n 1 .venv/bin/python -m mpi4py examples/torch_uneven.py --strategy ddp --weights 1,3 "
      "--steps 4 : -n 1 .venv/bin/python3 -m mpi4py examples/torch_uneven.py --strategy ddp --weights 1,3 --steps 4",
      marks=[needs_torch])
def _uneven_mpmd(r, tmp):
    has_lines(r[0].stdout, "step   0  loss 0.513506", "step   3  loss 0.684463", "rows [16, 48]")


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python examples/torch_uneven.py --strategy fsdp --weights 3,1",
      marks=[needs_torch])
def _uneven_fsdp(r, tmp):
    has_lines(r[0].stdout, "step   0  loss 0.513506", "rows [48, 16]")


@runs(".venv/bin/torchrun --standalone --nproc-per-node 2 examples/torch_uneven.py --strategy fsdp --weights 3,1",
      marks=[needs_torch])
def _uneven_fsdp_torchrun(r, tmp):  # the same losses as under mpiexec: MPI's world made from torch's rendezvous
    has_lines(r[0].stdout, "step   0  loss 0.513506", "step  19  loss 0.086483", "rows [48, 16]",
              "full state at rank 0: 8 tensors, 3201 parameters")


@runs("HETBENCH_JOIN_TIMEOUT=5 .venv/bin/torchrun --standalone --nproc-per-node 2 tests/torch_workers/join_late.py",
      marks=[needs_torch], codes=(1,), traceback=True)
def _join_late(r, tmp):
    has_lines(r[0].stderr, "JoinError: hetbench join: rank(s) 1 of 2 did not join within 5 s (HETBENCH_JOIN_TIMEOUT); "
                           "rank(s) 0 did")


# docs/pytorch.md, A rank with no rows: the doc's zero_share.py and the test worker (transformers' GPT-2 and Llama)

def _zero_share_py(tmp: Path, request) -> None:
    (tmp / "zero_share.py").write_text(_doc_block("docs/pytorch.md", "# zero_share.py"))


ZERO_SHARE_LOSSES = ("step 0 loss 4.837230", "step 1 loss 4.880049", "step 2 loss 4.863996")


@runs(".venv/bin/mpiexec -n 3 .venv/bin/python zero_share.py 2,1,0", prepare=_zero_share_py,
      marks=[needs_torch, needs_transformers])
def _zero_share_three(r, tmp):
    assert r[0].stdout.splitlines() == [f"{line} rows [4, 2, 0]" for line in ZERO_SHARE_LOSSES], r[0].stdout


@runs(".venv/bin/python zero_share.py", prepare=_zero_share_py, marks=[needs_torch, needs_transformers])
def _zero_share_one(r, tmp):
    assert r[0].stdout.splitlines() == [f"{line} rows [6]" for line in ZERO_SHARE_LOSSES], r[0].stdout


@runs(".venv/bin/mpiexec -n 3 .venv/bin/python tests/torch_workers/zero_rows.py 2,1,0",
      marks=[needs_torch, needs_transformers])
def _zero_rows_worker(r, tmp):
    cases = [f"{model}-{strategy}-{loss}" for model in ("gpt2", "llama") for strategy in ("ddp", "fsdp2", "fsdp")
             for loss in ("hf", "tokens")]
    assert re.findall(r"^ok (\S+)$", r[0].stdout, re.M) == [*cases, "gpt2-ddp-control"], r[0].stdout
    has_lines(r[0].stdout, "CASE gpt2 ddp hf rows=4,2,0 loss=9.5e-08 update=1.9e-07 param=1.9e-07",
              "CASE gpt2 ddp control rows=4,2,0 loss=0.18 update=0.43 param=0.81")


# docs/pytorch.md, A hetbench device for your rank: examples/user_device.py (transformers' GPT-2)

USER_DEVICE_LOSSES = ("step 0 loss 4.877473", "step 1 loss 4.862101", "step 2 loss 4.887029", "step 3 loss 4.885949")
ANY_DEVICE_FIGURES = "2097152 bytes up in 39 uploads, 0 cache hits"


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python examples/user_device.py host,sim:mi300x 3,1",
      marks=[needs_torch, needs_transformers])
def _user_device_sim(r, tmp):
    has_lines(r[0].stdout, *(f"{line} rows [12, 4]" for line in USER_DEVICE_LOSSES),
              f"rank 1: 219 GEMMs 2.191 ms (modelled), copies 0.847 ms, {ANY_DEVICE_FIGURES}",
              "calls {'addmm': 8, 'scaled_dot_product_attention': 2, 'linear': 1}",
              "rank 0: HetbenchDevice(host: ", "rank 1: torch cannot drive sim:mi300x (AMD Instinct MI300X (simulated))")
    last = jsonl(tmp / "train.jsonl")[-1]
    assert last["timing"] == "modelled" and last["step"] == 3, last
    assert {k: last["ranks"][1][k] for k in ("samples", "device_gemms", "device_timing")} == {
        "samples": 4, "device_gemms": 219, "device_timing": "modelled"}, last


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python examples/user_device.py host,opencl 3,1",
      marks=[needs_torch, needs_transformers])
def _user_device_opencl(r, tmp):
    has_lines(r[0].stdout, *(f"{line} rows [12, 4]" for line in USER_DEVICE_LOSSES),
              "rank 1: torch cannot drive opencl (")
    assert len(re.findall(rf"^  rank 1: 219 GEMMs \S+ ms \(measured\), copies \S+ ms, {ANY_DEVICE_FIGURES}, ",
                          r[0].stdout, re.M)) == 4, r[0].stdout


@runs(".venv/bin/python examples/user_device.py host", marks=[needs_torch, needs_transformers])
def _user_device_one(r, tmp):
    lines = r[0].stdout.splitlines()
    assert lines[:4] == [f"{line} rows [16]" for line in USER_DEVICE_LOSSES], r[0].stdout
    assert lines[4].startswith("rank 0: HetbenchDevice(host: ") and len(lines) == 5, r[0].stdout


def _last_lines(run: Run) -> list[str]:
    """The ranks' last lines of Python's traceback, as the doc shows them."""
    return sorted(line for line in run.stderr.splitlines() if re.match(r"^\[rank\d\]: [\w.]+(Error|Unavailable): ", line))


@runs(".venv/bin/python examples/user_device.py bogus", marks=[needs_torch, needs_transformers], codes=(1,),
      traceback=True)
def _user_device_bogus(r, tmp):
    assert _last_lines(r[0]) == ["[rank0]: ValueError: unknown backend 'bogus'; accepted: auto, host, opencl[:INDEX], "
                                 "cupy[:INDEX], sim:MODEL[:INDEX]"], r[0].stderr


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python examples/user_device.py host,sim:mi300",
      marks=[needs_torch, needs_transformers], codes=(1,), traceback=True)
def _user_device_bad_spec(r, tmp):
    line = ("ValueError: rank 1: unknown simulated GPU 'mi300' in 'sim:mi300'; accepted: h100, a100, v100, a10g, "
            "mi300x, mi250x, v520, rx7900xtx, arc-a770")
    assert _last_lines(r[0]) == [f"[rank0]: {line}", f"[rank1]: {line}"], r[0].stderr


@runs("OCL_ICD_VENDORS=/nonexistent .venv/bin/mpiexec -n 2 .venv/bin/python examples/user_device.py host,opencl",
      marks=[needs_torch, needs_transformers], codes=(1,), traceback=True)
def _user_device_no_opencl(r, tmp):
    lines = _last_lines(r[0])
    assert len(lines) == 2 and all(re.match(r"^\[rank[01]\]: hetbench.backends.base.BackendUnavailable: rank 1 on "
                                            r"\S+: backend opencl is unavailable: no OpenCL device found: ", line)
                                   for line in lines), r[0].stderr


# docs/pytorch.md, Uneven FSDP: examples/hf_llama_uneven.py (transformers' Llama under shard_module) and hf_methods.py

LLAMA_LOSSES = ("step 0  loss 5.578133  tokens 365", "step 1  loss 5.367810  tokens 391",
                "step 2  loss 5.205281  tokens 320", "step 3  loss 4.991796  tokens 375",
                "step 4  loss 4.863618  tokens 374", "step 5  loss 4.783433  tokens 354")
LLAMA_HELD = {"75": "80112 of 106816 parameters (75.0 %), 320448 + 320448 + 640908 bytes",
              "25": "26704 of 106816 parameters (25.0 %), 106816 + 106816 + 213644 bytes"}


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python examples/hf_llama_uneven.py --backends host,opencl --weights 3,1 "
      "--checkpointing", marks=[needs_torch, needs_transformers])
def _llama_two(r, tmp):
    out = r[0].stdout
    has_lines(out, "weights [3.0, 1.0], rows [12, 4] of 16", *LLAMA_LOSSES, f"rank 0: {LLAMA_HELD['75']}",
              f"rank 1: {LLAMA_HELD['25']}", "matches one process: losses within")
    assert len(re.findall(r"^  rank 1 opencl: 315 GEMMs \S+ ms \(measured\)", out, re.M)) == 6, out


@runs(".venv/bin/mpiexec -n 3 .venv/bin/python examples/hf_llama_uneven.py --backends host,opencl,sim:mi300x "
      "--weights 2,1,0 --steps 3 --save ck", "ls ck",
      ".venv/bin/mpiexec -n 2 .venv/bin/python examples/hf_llama_uneven.py --weights 1,3 --steps 6 --resume ck",
      marks=[needs_torch, needs_transformers])
def _llama_zero_share_saved_resumed(r, tmp):
    has_lines(r[0].stdout, "weights [2.0, 1.0, 0.0], rows [11, 5, 0] of 16", *LLAMA_LOSSES[:3],
              "rank 2 sim:mi300x: 93 GEMMs 0.930 ms (modelled), copies 1.165 ms",
              "rank 2 sim:mi300x: 69 GEMMs 0.690 ms (modelled), copies 1.165 ms",
              "rank 2: 0 of 106816 parameters (0.0 %), 0 + 0 + 12 bytes",
              "saved ck: read_checkpoint gives 21 tensors, the trained parameters", "matches one process: losses within")
    assert r[1].stdout.split() == ["manifest.json", *(f"rank-{rank}.{k}.npy" for rank in (0, 1)
                                                      for k in ("m", "param", "v"))], r[1].stdout  # rank 2 held none
    pieces = json.loads((tmp / "ck" / "manifest.json").read_text())["ranks"][1]["pieces"]
    assert pieces == [[0, 24661, 36992, 0], [1, 24661, 36992, 12331], [2, 21888, 32832, 24662]], pieces
    has_lines(r[2].stdout, "weights [1.0, 3.0], rows [4, 12] of 16, resumed from ck after 3 steps", *LLAMA_LOSSES[3:5],
              "step 5  loss 4.78343", f"rank 0: {LLAMA_HELD['25']}", f"rank 1: {LLAMA_HELD['75']}",
              "matches one process: losses within")
    assert "step 2 " not in r[2].stdout


def _hf_methods_py(tmp: Path, request) -> None:
    (tmp / "hf_methods.py").write_text(_doc_block("docs/pytorch.md", "# hf_methods.py: what a transformers user "
                                                  "calls on a model after shard_module"))


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python hf_methods.py", "ls gpt2-saved", prepare=_hf_methods_py,
      marks=[needs_torch, needs_transformers])
def _hf_methods(r, tmp):
    has_lines(r[0].stdout, "rank 0: num_parameters() 109312, this rank's shards 81984",
              "rank 1: num_parameters() 109312, this rank's shards 27328",
              "ShardedParameterError: Embedding 'transformer.wte': its 'weight' (parameter 'transformer.wte.weight') is "
              "sharded by hetbench's shard_module", "inside full_params: (128, 64) tied head: True",
              "plain_state_dict: 29 keys, the same as the unsharded model's: True",
              "from_pretrained gives the same logits: True")
    assert r[1].stdout.split() == ["config.json", "generation_config.json", "model.safetensors"], r[1].stdout


@runs("mpiexec -n 2 hetbench train --frontend torch --model gpt --layers 4 --pp 2 --weights auto --steps 20 "
      "--backend 0=host,1=sim:mi300x --out pp.json", marks=[needs_torch])
def _pipeline_two(r, tmp):
    has_lines(r[0].stdout, "4 layers x 64, batch 32, 20 steps, adamw lr 0.003, weights auto", "(samples [32, 32])",
              "result: all checks passed")
    piped = json.loads((tmp / "pp.json").read_text())["summary"]["pipeline"]
    assert (piped["pp"], piped["dp"], piped["bubble_theory_fraction"]) == (2, 1, 0.2)
    assert [g["backend"] for g in piped["groups"]] == ["hetbench", "gloo", "gloo"]
    # the cut's activations and gradients, 1 MiB a step, every step (a re-cut's new stages count on)
    assert piped["groups"][0]["bytes"] == 20 * 2 * 32 * 64 * 64 * 4
    assert sum(s["layers"] for s in piped["stages"]) == 4  # auto: the cut depends on the machine's load


@runs("mpiexec -n 4 hetbench train --frontend torch --model gpt --layers 4 --pp 2 --strategy ddp --weights auto "
      "--steps 10 --backend 0=host,1=sim:mi300x,2=host,3=sim:mi300x --out pp4.json", marks=[needs_torch])
def _pipeline_four(r, tmp):
    has_lines(r[0].stdout, "4 layers x 64, batch 32, 10 steps, adamw lr 0.003, weights auto",
              "result: all checks passed")  # the replicas' rows follow the speeds auto measures
    groups = json.loads((tmp / "pp4.json").read_text())["summary"]["pipeline"]["groups"]
    assert [(g["name"], g["ranks"], g["backend"]) for g in groups] == [
        ("pp 0", [0, 2], "gloo"), ("pp 1", [1, 3], "gloo"), ("dp 0", [0, 1], "hetbench"), ("dp 1", [2, 3], "hetbench")]
    assert all(g["bytes"] > 0 for g in groups)  # the pipelines' activations, the stages' gradients (hetbench's figures)


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python examples/pipeline_own_model.py --weights 3,1", marks=[needs_torch])
def _pipeline_example(r, tmp):
    has_lines(r[0].stdout, "step 0  loss 4.715329", "step 3  loss 4.738175",
              "cut: [3, 1] layers per stage (bounds [0, 3, 4]), rows per pipeline [16]",
              "group pp 0: ranks [0, 1] on gloo", "matches one process: losses within")


# docs/tensor.md (the 4-rank runs and the 3-rank example slow: make test's time on 2 cores)


@runs("mpiexec -n 2 hetbench train --frontend torch --model gpt --tp 2 --weights 3,1 --steps 6 --out A.json",
      marks=[needs_torch])
def _tensor_two(r, tmp):
    has_lines(r[0].stdout, "hetbench train: tensor parallel over 2 ranks, 2 layers x 64, batch 32, 6 steps, adamw lr "
              "0.003, weights list (samples [32, 32])",
              "each tensor rank's share of a layer: heads of 4: 3, 1; columns of 256: 192, 64",
              "rank 0 291 KiB (75 %, weight 75 %)", "rank 1 96.9 KiB (25 %, weight 25 %)",
              "groups: tp 0 ranks 0, 1 on gloo", "result: all checks passed")
    t = json.loads((tmp / "A.json").read_text())["summary"]["tensor"]
    assert [x["cut_param_bytes"] for x in t["ranks"]] == [297600, 99200]
    assert [x["param_bytes"] for x in t["ranks"]] == [348012, 149612]
    # 2 layers x 2 pairs x 2 all-reduces (g forward, f backward) of 32 rows x 64 positions x 64 wide x 4 bytes
    assert [x["tp_comm_bytes_per_step"] for x in t["ranks"]] == [2 * 2 * 2 * 32 * 64 * 64 * 4] * 2
    assert [(x["name"], x["counts"]) for x in t["layers"]][::2] == [("blocks.0.attn", [3, 1]),
                                                                     ("blocks.0.mlp", [192, 64])]


@runs("mpiexec -n 4 hetbench train --frontend torch --model gpt --tp 2 --strategy ddp --weights even --steps 3 "
      "--backend 0=host,1=host,2=sim:mi300x,3=sim:mi300x --out F.json", marks=[needs_torch, pytest.mark.slow])
def _tensor_four_kinds(r, tmp):
    has_lines(r[0].stdout, "hetbench train: tensor parallel over 2 ranks x ddp over 2 replicas",
              "groups: tp 0 ranks 0, 1 on gloo; tp 1 ranks 2, 3 on gloo; dp 0 ranks 0, 2 on hetbench; dp 1 ranks 1, 3 "
              "on hetbench", "result: all checks passed")


@runs("mpiexec -n 4 hetbench train --frontend torch --model gpt --tp 2 --pp 2 --steps 2 --out tppp.json",
      marks=[needs_torch, pytest.mark.slow])
def _tensor_in_stages(r, tmp):
    has_lines(r[0].stdout, "hetbench train: pipeline of 2 stages x tensor parallel over 2 ranks",
              "pipeline (1f1b, 4 micro-batches, each stage's layers cut over 2 tensor ranks): stage 0 ranks 0, 1: 1 "
              "layers [0, 1), 226 KiB", "result: all checks passed")
    groups = json.loads((tmp / "tppp.json").read_text())["summary"]["pipeline"]["groups"]
    assert {g["name"]: g["bytes"] for g in groups if g["name"].startswith("pp")} == {"pp 0.0": 2 * 2**20,
                                                                                     "pp 0.1": 2 * 2**20}


@runs("mpiexec -n 2 hetbench train --frontend torch --model gpt --tp 2 --weights 3,1 --steps 4 --checkpoint ck",
      "mpiexec -n 2 hetbench train --frontend torch --model gpt --strategy ddp --weights 1,1 --steps 6 --resume ck",
      "mpiexec -n 2 hetbench train --frontend torch --model gpt --tp 2 --weights 1,3 --steps 6 --resume ck",
      "mpiexec -n 2 hetbench train --frontend torch --model gpt --strategy fsdp --weights 3,1 --steps 6 --resume ck",
      marks=[needs_torch])
def _tensor_checkpoint(r, tmp):
    assert sorted(p.name for p in (tmp / "ck" / "step-4").iterdir()) == ["manifest.json", "state.pt"]
    for run in r[1:]:
        has_lines(run.stdout, "resumed from ck/step-4 after 4 steps", "loss: 3.41 at step 4 -> 3.382 at step 5",
                  "result: all checks passed")


@runs(".venv/bin/mpiexec -n 2 .venv/bin/python examples/tensor_own_model.py --weights 3,1",
      marks=[needs_torch, needs_transformers])
def _tensor_example(r, tmp):
    has_lines(r[0].stdout, "step 0  loss 4.584307", "step 3  loss 4.083669",
              "cut attention: 2 key/value heads, [2, 0] per rank (each of the 2 layers)",
              "cut mlp: 128 columns, [96, 32] per rank (each of the 2 layers)",
              "parameters held: rank 0 74048 (86%), rank 1 24896 (29%) of 86336",
              "rank 1 holds none of: model.layers.0.self_attn, model.layers.1.self_attn",
              "matches one process: losses within")


@runs(".venv/bin/mpiexec -n 3 .venv/bin/python examples/tensor_own_model.py --weights 0.5,0.3,0.2 --heads 8 "
      "--kv-heads 4 --cut-head", marks=[needs_torch, needs_transformers, pytest.mark.slow])
def _tensor_example_three(r, tmp):
    has_lines(r[0].stdout, "cut attention: 4 key/value heads, [2, 1, 1] per rank (each of the 2 layers)",
              "cut mlp: 128 columns, [64, 38, 26] per rank (each of the 2 layers)",
              "cut lm head: 96 columns, [48, 29, 19] per rank",
              "parameters held: rank 0 46400 (54%), rank 1 29056 (34%), rank 2 23808 (28%) of 86336",
              "matches one process: losses within")


# ---------------------------------------------------------------------------------------------------------------
# too heavy as written on this 2-core CPU: run here smaller (what changes, and why), and parsed as written


@dataclass
class Reduced:
    replace: dict[str, str]
    reason: str
    check: Callable[[Run, Path], None]
    marks: list = field(default_factory=list)


def _gpt_check(run: Run, tmp: Path) -> None:
    has_lines(run.stdout, "hetbench train: fsdp2, 2 layers x 64, batch 32, 4 steps, adamw lr 0.003",
              "loss curve and final parameters: matches one process's", "result: all checks passed")
    assert len(jsonl(tmp / "gpt.jsonl")) == 4


REDUCED: dict[str, Reduced] = {
    ".venv/bin/mpiexec -n 2 .venv/bin/hetbench train --frontend torch --model gpt --backend 0=host,1=opencl "
    "--layers 2 --hidden 64 --heads 4 --seq-len 64 --batch 32 --lr 3e-3 --steps 100 --weights 3,1 --log gpt.jsonl":
        Reduced({"--steps 100": "--steps 4"}, "100 steps and the one-process reference take 33 s here; 4 steps "
                 "run the same model, ranks and check", _gpt_check, [needs_torch]),
}


# ---------------------------------------------------------------------------------------------------------------
# run by `make demo` (its dry run shows the command, with only fewer repeats and an --out added)

DEMO: dict[str, str] = {
    "mpiexec -n 2 hetbench split --size 2048 --backend 0=host,1=opencl --strategy rows":
        "18-21 s here (PoCL's half of a 2048^3 GEMM takes 0.6 s, and the even split is measured beside); make "
        "demo runs it with --warmup 1 --repeat 3",
    "OPENBLAS_NUM_THREADS=1 POCL_MAX_PTHREAD_COUNT=1 mpiexec -n 2 hetbench split --size 2048 --backend 0=host,1=opencl "
    "--strategy rows":
        "docs/split.md's transcript of the same run with one thread per device (18 s here); make demo runs the "
        "hetbench command with --warmup 1 --repeat 3, its threads unpinned",
}
# the options the demo may add to an example: how many runs are timed, and where the results go
DEMO_EXTRA_OPTIONS = {"--warmup": 1, "--repeat": 1, "--out": 1, "--progress": 0}


# ---------------------------------------------------------------------------------------------------------------
# cannot run on this machine: parsed by the command's own parser

CUPY_PAIR = "matmul --size 8192 --backend 0=cupy,1=cupy"
PARSED: dict[str, str] = {
    "/usr/bin/mpirun -np 2 --hostfile hostfiles/nvidia-amd.openmpi --map-by node --mca btl_tcp_if_include eth0 --mca "
    "oob_tcp_if_include eth0 -x PATH -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=8 /opt/hetbench/.venv-openmpi/bin/hetbench "
    + CUPY_PAIR:
        "two nodes (an NVIDIA and an AMD one, the hostfile's addresses to be filled in) and CuPy on each; the "
        "hetbench part is parsed, and run on 2 ranks here up to the point where it needs CuPy",
    "/usr/bin/mpirun -np 2 --hostfile hostfiles/nvidia-amd.openmpi --map-by node --mca btl_tcp_if_include eth0 --mca "
    "oob_tcp_if_include eth0 -x PATH -x VIRTUAL_ENV -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=8 hetbench " + CUPY_PAIR:
        "the same two-node launch from an activated virtualenv",
    "/opt/hetbench/.venv/bin/mpiexec -n 2 -f hostfiles/nvidia-amd.mpich -iface eth0 -genv OMP_NUM_THREADS 8 "
    "/opt/hetbench/.venv/bin/hetbench " + CUPY_PAIR:
        "the same two-node launch under MPICH",
    "sbatch --nodelist=gpu-nv-01,gpu-amd-01 hostfiles/slurm-nvidia-amd.sbatch matmul --size 8192":
        "Slurm and two GPU nodes; the arguments the script hands hetbench are parsed (and the script is bash)",
    "sbatch hostfiles/slurm-nvidia-amd.sbatch collectives --op allreduce --max-bytes 256M":
        "the same Slurm script, a collectives sweep",
    ".venv/bin/mpiexec -n 2 .venv/bin/python -m hetbench.bench torch":
        "the torch bench: 33 s of measuring here; it is exactly `make bench-torch`'s command (checked in its dry "
        "run), and `torch` is a part hetbench.bench accepts",
}

# templates with placeholders, or setup that changes the machine: nothing to run; what is checked is said
NOT_RUN: dict[str, str] = {
    "mpiexec -n 1 -host nv venv-cuda/bin/python -m mpi4py train.py : -n 1 -host amd venv-rocm/bin/python -m mpi4py "
    "train.py": "a template (the doc says it was not run): two nodes, a CUDA and a ROCm build, your train.py; the "
                "same MPMD form with one build is run above",
    "mpiexec -n 1 -host nv venv-cuda/bin/hetbench train --frontend torch --model gpt --pp 2 --weights auto --backend "
    "0=cupy,1=cupy : -n 1 -host amd venv-rocm/bin/hetbench train --frontend torch --model gpt --pp 2 --weights auto "
    "--backend 0=cupy,1=cupy": "a template (the doc says it was not run): two GPU nodes of two vendors, a CUDA and a "
                               "ROCm build; --pp on 2 ranks is run above on the host and a simulated MI300X",
    "sudo apt-get install openmpi-bin": "installs a system package",
    "git clone <hetbench> /opt/hetbench && cd /opt/hetbench": "a template: the repository's address to fill in",
    "python3 -m venv .venv-openmpi": "makes a virtualenv (as `make env-openmpi` does)",
    ".venv-openmpi/bin/pip install -e '.[cuda12]'": "installs CuPy for CUDA 12: the extra exists (checked)",
    ".venv-openmpi/bin/pip install -e '.[rocm]'": "installs CuPy for ROCm: the extra exists (checked)",
    "source /opt/hetbench/.venv-openmpi/bin/activate": "activates the node's virtualenv",
    ".ci/run": "installs PoCL, CLBlast and Open MPI with apt, then runs both suites (the file exists, executable)",
}

# make targets: each is dry-run (make -n) here; the reason none is run by this test
MAKE: dict[str, str] = {
    "make demo": "minutes at its default sizes; tests/cli/test_makefile_demo.py runs its whole recipe at small sizes",
    "make test": "the whole suite (this test among it)",
    "make test-slow": "the tests `make test` leaves out (this one among them)",
    "make test SLOW=1": "every test in one session (this one among them), as .ci/run runs them",
    "make test-openmpi": "the MPI tests again under Open MPI, from a second virtualenv",
    "make bench": "minutes of measuring (docs/bench.md); its parts' recipes are checked by tests/cli/test_makefile_bench.py",
    "make bench-train": "about 3.5 minutes of measuring",
    "make bench-train-torch": "minutes of measuring",
}


# ---------------------------------------------------------------------------------------------------------------
# the tests


def _accounted() -> list[str]:
    return [*(e for case in RUN.values() for e in case.examples), *REDUCED, *DEMO, *PARSED, *NOT_RUN, *MAKE]


def test_every_example_is_accounted_for():
    found = all_examples()
    accounted = _accounted()
    assert len(accounted) == len(set(accounted)), "an example is named twice in the tables"
    new = {e: found[e] for e in found if e not in accounted}
    assert not new, ("examples in the docs that this test neither runs nor lists (run them in RUN, or say why not "
                     f"in REDUCED, DEMO, PARSED, NOT_RUN or MAKE): {json.dumps(new, indent=1)}")
    gone = sorted(set(accounted) - set(found))
    assert not gone, f"listed here but no longer in the docs: {gone}"


def test_the_finder_sees_transcripts_blocks_and_tables(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text("| command | x |\n|---|---|\n| `devices` | `hetbench devices --sim` |\n\n"
                   "```\n$ hetbench matmul --size 64   # a comment\nhetbench matmul: 64x64x64 fp32, 1 rank\n```\n\n"
                   "```sh\nmake demo  # the demo\n/usr/bin/mpirun -np 2 \\\n    hetbench devices\n```\n\n"
                   "```\nmpiexec -n 2 python x.py\nhetbench/cli/   the commands\n{\"step\": 0}\n```\n\n"
                   "```python\nimport hetbench\n```\n")
    assert [t for _, t in examples_in(doc)] == ["hetbench matmul --size 64", "make demo",
                                                "/usr/bin/mpirun -np 2 hetbench devices", "mpiexec -n 2 python x.py",
                                                "hetbench devices --sim"]


def _marks(examples: tuple[str, ...], extra: list) -> list:
    text = " ".join(examples)
    marks = list(extra)
    if any(Path(w).name in LAUNCHERS for e in examples for w in _words(e)[1]):
        marks.append(needs_mpi)
    if "opencl" in text:
        marks.append(needs_opencl)
    return marks


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, marks=_marks(c.examples, c.marks), id=c.examples[0][:70])
                                  for c in RUN.values()])
def test_example_runs_as_written(case: Case, tmp_path, request):
    if case.prepare:
        case.prepare(tmp_path, request)
    done = []
    for example in case.examples:
        run = run_example(example, tmp_path)
        ok(run, example, case.codes, case.traceback)
        done.append(run)
    case.check(done, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("example", [pytest.param(e, marks=_marks((e,), r.marks), id=e[:70])
                                     for e, r in REDUCED.items()])
def test_heavy_example_runs_smaller(example, tmp_path):
    reduced = REDUCED[example]
    run = run_example(example, tmp_path, reduced.replace)
    ok(run, example)
    reduced.check(run, tmp_path)


def _hetbench_args(example: str) -> list[str] | None:
    """What the example hands hetbench: the words after the hetbench program, or after the Slurm script that
    starts it."""
    words = _words(example)[1]
    for i, word in enumerate(words):
        if Path(word).name == "hetbench" or word.endswith(".sbatch"):
            return words[i + 1:]
    return None


def test_examples_not_run_as_written_parse():
    """Each example this test does not run as written: every option exists and every value is accepted by the
    command's own click parser."""
    commands = [args for e in (*REDUCED, *DEMO, *PARSED) if (args := _hetbench_args(e)) is not None]
    assert len(commands) == len(REDUCED) + len(DEMO) + len(PARSED) - 1  # all but the torch bench's
    snippet = ("import json, sys\nimport click\nfrom hetbench.cli import cli\nbad = []\n"
               "for argv in json.loads(sys.argv[1]):\n"
               "    ctx = click.Context(cli, info_name='hetbench')\n"
               "    cmd = cli.get_command(ctx, argv[0])\n"
               "    try:\n"
               "        assert cmd is not None, 'no such command'\n"
               "        cmd.make_context(argv[0], list(argv[1:]), parent=ctx)\n"
               "    except (click.ClickException, AssertionError) as e:\n"
               "        bad.append([argv, str(e)])\n"
               "print(json.dumps(bad))\n")
    run = run_python(["-c", snippet, json.dumps(commands)])
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == []


@needs_mpi
@pytest.mark.skipif(_have("cupy"), reason="CuPy is installed: the 8192 GEMM would run")
def test_cupy_example_stops_only_for_want_of_cupy(tmp_path):
    """docs/multi-node.md's two-node command, on 2 ranks here: all of its input is accepted, and it stops (exit 2,
    one line, nothing written) where it needs CuPy."""
    run = run_example("mpiexec -n 2 hetbench " + CUPY_PAIR, tmp_path)
    assert run.returncode == 2, run.stderr
    assert len(run.error_lines) == 1 and "backend cupy is unavailable" in run.error_lines[0], run.stderr
    assert not any(tmp_path.rglob("*.json")) and not any(tmp_path.rglob("*.csv"))


def test_the_torch_bench_example_is_make_bench_torch():
    example = ".venv/bin/mpiexec -n 2 .venv/bin/python -m hetbench.bench torch"
    assert example in PARSED
    assert _make_dry_run("bench-torch").strip() == example
    unknown = run_python(["-m", "hetbench.bench", "nonesuch"])
    assert unknown.returncode == 2
    accepted = unknown.stderr.split("accepted:")[1].strip()
    assert "torch" in [part.strip() for part in accepted.split(",")]


def _make_dry_run(*args: str) -> str:
    """make -n in the checkout: prints the recipe's commands without running them (HAVE_* as if torch and an OpenCL
    device were there, so the recipe's branches are printed rather than probed)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    proc = subprocess.run(["make", "-C", str(REPO), "-s", "-n", "-o", "system-deps", "-o", ".venv/.installed", "-o",
                           ".venv-openmpi/.installed", "VENV=.venv", "HAVE_TORCH=true", "HAVE_OPENCL_DEVICE=true",
                           *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _launched(words: list[str]) -> tuple[str, list[str]] | None:
    """(rank count, hetbench's arguments) of a command line: LAUNCHER -n N ... hetbench ARGS."""
    for i, word in enumerate(words):
        if Path(word).name == "hetbench":
            before = words[:i]
            n = before[before.index("-n") + 1] if "-n" in before else "1"
            return n, words[i + 1:]
    return None


def test_the_demo_runs_the_split_examples():
    text = _make_dry_run("demo").replace("\\\n", " ")
    ran = []
    for statement in re.split(r"[;\n]", text):
        try:
            words = shlex.split(statement)
        except ValueError:
            continue
        if words and words[0] != "echo" and (launched := _launched(words)) is not None:
            ran.append(launched)
    assert ran, text
    for example in DEMO:
        n, args = _launched(_words(example)[1])
        matches = []
        for demo_n, demo_args in ran:
            extra = demo_args[len(args):]
            if demo_n != n or demo_args[:len(args)] != args:
                continue
            i = 0
            while i < len(extra) and extra[i] in DEMO_EXTRA_OPTIONS:
                i += 1 + DEMO_EXTRA_OPTIONS[extra[i]]
            if i == len(extra):
                matches.append(demo_args)
        assert matches, f"make demo does not run {example!r}; it runs: {ran}"


@pytest.mark.parametrize("example", list(MAKE))
def test_make_example_is_a_target(example):
    target = example.split()[1]
    assert _make_dry_run(target).strip()


def test_setup_examples_name_what_exists():
    extras = (REPO / "pyproject.toml").read_text()
    for example in NOT_RUN:
        for extra in re.findall(r"'\.\[(\w+)\]'", example):
            assert re.search(rf"^{extra} = ", extras, re.M), extra
    assert os.access(REPO / ".ci" / "run", os.X_OK)
    if shutil.which("bash"):  # the Slurm script the sbatch examples submit
        assert subprocess.run(["bash", "-n", str(REPO / "hostfiles" / "slurm-nvidia-amd.sbatch")],
                              timeout=30).returncode == 0


def test_checkout_files_the_examples_name_exist():
    for example in all_examples():
        for word in _words(example)[1] if "<" not in example else []:
            if word.split("/")[0] in ("examples", "tests", "hostfiles", "kernels"):
                assert (REPO / word).exists(), (example, word)
