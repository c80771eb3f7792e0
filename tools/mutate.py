"""A small mutation run over the modules that compute hetbench's figures (issue 17): each mutant changes one thing a
reader would not notice at a glance (an operator, a comparison, a number, max for min, an index), and the tests that
pin that module's figures run against it. A mutant the tests do not fail ("survives") is a figure nothing pins, or
a change that cannot alter any result (an equivalent mutant): the first needs a test, the second an entry in
tools/mutate_equivalents.py (the file, the function, a fragment of the line's code, the changes as this script prints
them, and why), which this script then skips, so that the line's other mutants still run.

    .venv/bin/python tools/mutate.py --list                      # the targets and their mutant counts
    .venv/bin/python tools/mutate.py hetbench/comm/busbw.py       # one target's mutants, its tests against each
    .venv/bin/python tools/mutate.py --all --out mutants.json     # every target (long: minutes per target)

Each mutant runs in a copy of the checkout (the tree without .venv, results/ and .git), the target file rewritten
there (ast.unparse of the mutated tree: comments and layout go, the code is the same), with the venv's python and
`pytest -x -q` over the target's tests, each run under a timeout (ten times the unmutated run, 1 to 5 minutes: a
mutant that hangs counts as killed, as a hang fails CI). Prints every survivor as FILE:LINE: the change; exits 1
when any survives, 0 when none does.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from mutate_equivalents import EQUIVALENTS  # noqa: E402
TIMEOUT_S = 300

# make bench's goals' pins: the lines and verdicts from hand-made documents, and from real split and train runs
_BENCH_GOAL_TESTS = ["tests/unit/test_pin_overhead.py", "tests/cli/test_makefile_bench.py::test_bench_goal_verdicts",
                     "tests/cli/test_makefile_bench.py::test_split_figures_are_the_runs_and_unmet_goals_fail",
                     "tests/mpi/test_train_balance.py::test_bench_train_figures_are_the_runs"]

# the modules that compute figures, and the tests that pin them (kept fast: these run once per mutant)
TARGETS: dict[str, list[str]] = {
    "hetbench/comm/busbw.py": ["tests/unit/test_collectives_spec.py", "tests/mpi/test_torch_backend.py"],
    "hetbench/pytorch/metrics.py": ["tests/mpi/test_torch_backend.py"],
    "hetbench/harness/stats.py": ["tests/unit/test_pin_stats.py"],
    "hetbench/train/numpy_frontend/run.py": ["tests/unit/test_pin_train.py", "tests/unit/test_pin_train_run.py"],
    "hetbench/train/summary.py": ["tests/unit/test_pin_train.py", "tests/unit/test_pin_train_run.py"],
    "hetbench/train/torch_frontend/parallel.py": ["tests/unit/test_pin_torch_strategies.py"],
    "hetbench/train/torch_frontend/run.py": ["tests/unit/test_pin_torch_strategies.py"],
    "hetbench/train/outcome.py": ["tests/unit/test_pin_train.py", "tests/unit/test_pin_train_run.py",
                                  "tests/unit/test_train_tolerance.py"],
    "hetbench/benchmarks/collectives/run.py": ["tests/unit/test_pin_collectives.py", "tests/unit/test_pin_collectives_plan.py"],
    "hetbench/benchmarks/split/run.py": ["tests/unit/test_pin_split.py", "tests/unit/test_pin_split_run.py"],
    "hetbench/benchmarks/split/phases.py": ["tests/unit/test_pin_split.py", "tests/unit/test_pin_split_run.py"],
    "hetbench/harness/probe.py": ["tests/unit/test_pin_calibrate.py"],
    "hetbench/report/compare.py": ["tests/unit/test_pin_compare.py", "tests/cli/test_compare.py"],
    "hetbench/report/significance.py": ["tests/unit/test_pin_significance.py", "tests/unit/test_pin_compare.py", "tests/cli/test_compare.py"],
    "hetbench/report/figures.py": ["tests/unit/test_pin_report.py", "tests/unit/test_pin_compare.py"],
    "hetbench/pytorch/fsdp.py": ["tests/unit/test_pin_fsdp.py"],
    # the pins first: their alarm fails a mutant that loops in balanced_parts within seconds
    "hetbench/harness/split_plan.py": ["tests/unit/test_pin_split_plan.py", "tests/unit/test_split_plan.py"],
    "hetbench/benchmarks/matmul/run.py": ["tests/unit/test_matmul_figures.py", "tests/unit/test_pin_matmul.py"],
    "hetbench/pytorch/logger.py": ["tests/unit/test_pin_torch_train.py"],
    "hetbench/benchmarks/calibrate/__init__.py": ["tests/unit/test_pin_calibrate.py", "tests/unit/test_pin_calibrate_profile.py"],
    "hetbench/results/profile.py": ["tests/unit/test_pin_calibrate.py", "tests/unit/test_pin_calibrate_profile.py"],
    # make bench's goals: the verdict bands and the split and train benches' figures (hetbench/bench/)
    "hetbench/bench/verdict.py": _BENCH_GOAL_TESTS,
    "hetbench/bench/split_goals.py": _BENCH_GOAL_TESTS,
    "hetbench/bench/train_goals.py": _BENCH_GOAL_TESTS,
    # --pp: the cut, the schedule's model, the mesh and the replicas' rows; the run's pipeline summary; its bench
    "hetbench/pytorch/pipeline.py": ["tests/unit/test_pin_pipeline.py", "tests/unit/test_pipeline_plan.py"],
    "hetbench/train/torch_frontend/pipeline.py": ["tests/unit/test_pin_pipeline.py"],
    "hetbench/bench/pipeline_goals.py": ["tests/unit/test_pin_pipeline_goals.py"],
    # --tp: the run's tensor summary, the mesh's weights and rows; its bench
    "hetbench/train/torch_frontend/tensor.py": ["tests/unit/test_pin_tensor_summary.py",
                                                "tests/unit/test_tensor_plan.py"],
    "hetbench/bench/tensor_goals.py": ["tests/unit/test_pin_tensor_goals.py"],
    # hb.tensor_parallel: each rank's units of a layer (largest remainder, tiles within the slack), the slices
    "hetbench/pytorch/tensor.py": ["tests/unit/test_tensor_plan.py"],
    # the PMI server's node map (which ranks share a host: MPICH's shared memory follows it)
    "hetbench/comm/pmi_server.py": ["tests/unit/test_pmi_server.py"],
}

# Where a module is mostly mechanism, only the functions that compute its figures are mutated (a class's methods
# named Class.method): fsdp.py's hooks and gathers are pinned by the train check (the loss curve against one
# process, in the MPI tests, minutes a run), its figures (the shares under memory caps, the exposed and blocking
# gather seconds, the bytes held) by fast tests
SCOPES: dict[str, list[str]] = {
    "hetbench/comm/pmi_server.py": ["process_mapping"],
    "hetbench/pytorch/fsdp.py": ["numel", "UnitLayout.size", "ShardedModule._capped_weights",
                                 "ShardedModule.elements", "ShardedModule._record", "ShardedModule._wait",
                                 "ShardedModule.take_figures", "ShardedModule.blocking_gather_seconds",
                                 "ShardedModule.state_bytes", "ShardedModule._acquire",
                                 "ShardedModule._reduce_scatter", "ShardedModule._barrier",
                                 "ShardedModule.empty_units", "ShardedModule._start_next",
                                 "ShardedModule.prefetched_units", "ShardedModule._note_peak",
                                 "ShardedModule.poll"],
    # the numpy front end's run on a rank is mechanism (the strategy's loop, the solo runs, the saver: pinned by the
    # MPI tests' train runs); its figures are the check against one process and the step lines
    "hetbench/train/numpy_frontend/run.py": ["_check", "_step_lines"],
    # the torch front end's figures: hetbench fsdp's sharded state and hidden gathers, the steps' collectives, the
    # check's parameter figures (its step loop is mechanism, pinned by the MPI train runs)
    "hetbench/train/torch_frontend/parallel.py": ["UnevenSharded.summary", "UnevenSharded.details",
                                                  "UnevenSharded.param_bytes_held", "Parallel.param_bytes_held",
                                                  "local_bytes",
                                                  "UnevenSharded.finish_lines"],
    "hetbench/train/torch_frontend/run.py": ["check_against_one_process", "_steps_collectives"],
    # the bench's verdicts and the figures they judge (the ratio tools' timing loops are mechanism, checked by
    # make bench, and live in other modules)
    "hetbench/bench/verdict.py": ["judged"],
    "hetbench/bench/split_goals.py": ["split_figures", "_print_run", "_print_below_goal_n", "_judge_size",
                                      "_judge_goal", "_judge_model"],
    "hetbench/bench/train_goals.py": ["train_figures", "_complete_rounds", "_show", "_round", "_judge_rounds"],
    # the pipeline's library is mostly mechanism (torch's stages and schedules, the groups, the library call: pinned
    # by the MPI torch runs); its figures are the cut, the schedule's modelled time, the bytes counted, the probe's
    # medians, the mesh, the groups' backends and the replicas' rows
    "hetbench/pytorch/pipeline.py": ["Cut.blocks", "Cut.counts", "in_flight", "even_cut", "cut_stages", "fixed_cut",
                                     "schedule_order", "modelled_step_seconds", "theoretical_bubble",
                                     "matmul_parameters", "parameter_bytes", "saved_bytes", "measure_parts",
                                     "Mesh.stage_of", "Mesh.replica_of", "Mesh.pp_ranks", "Mesh.dp_ranks",
                                     "mesh_for", "native_backend", "group_backend_problem", "pipeline_rows",
                                     "stage_costs", "split_costs", "stage_parts"],
    # --pp's run on a rank is mechanism (the stages, the re-cut's state moved: pinned by the MPI torch runs); its
    # figures are the plan's costs and rows, the stage's parts and the summary of the ranks' details
    "hetbench/train/torch_frontend/pipeline.py": ["Plan.cut_for", "_costs", "_replica_rows", "_stage_parts",
                                                  "_median", "pipeline_summary", "_group_bytes"],
    "hetbench/bench/pipeline_goals.py": ["ideal_speedup", "balance", "_show", "_round", "pipeline_figures",
                                        "stage_layers"],
    # --tp's run on a rank is mechanism (the cut, its groups, the state moved: pinned by the MPI torch runs); its
    # figures are the mesh, the cut's weights, the replicas' rows and the summary of the ranks' details
    "hetbench/train/torch_frontend/tensor.py": ["TPMesh.replica_of", "TPMesh.tp_index", "TPMesh.tp_ranks",
                                                "TPMesh.dp_ranks", "tensor_weights", "replica_rows",
                                                "balanced_shares", "_cut_shares",
                                                "TensorParallel.rows", "TensorParallel.shares",
                                                "TensorParallel._step_figures", "TensorParallel.details",
                                                "TensorParallel.summary", "_TorchCut.take_figures", "_median",
                                                "tensor_summary"],
    # hb.tensor_parallel is mostly mechanism (the hooks, the autograd operators, the collectives: pinned by the MPI
    # torch runs against one process); its figures are each rank's units and its slices' offsets
    "hetbench/pytorch/tensor.py": ["ShardSpec.starts", "ShardSpec.local", "ShardSpec.whole", "CommFigures.take",
                                   "split_units", "_slowest", "tiled_units", "TensorParallel.summary",
                                   "resolve_weights"],
    "hetbench/bench/tensor_goals.py": ["rank_compute_seconds", "collective_floor_seconds", "ideal_speedup",
                                      "comm_share", "_share_text", "_show", "_round", "tensor_figures"],
}

_BINOPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
           ast.Pow: ast.Mult}
_CMPOPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
           ast.NotEq: ast.Eq}
_CALLS = {"max": "min", "min": "max", "sum": "len"}


@dataclass
class Mutant:
    path: str
    line: int
    change: str
    index: int  # the n-th mutable site of the file, in ast.walk order


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Every site a mutant can change, with what the change is, in ast.walk order."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            out.append((node, f"{type(node.op).__name__} -> {_BINOPS[type(node.op)].__name__}"))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
            out.append((node, f"{type(node.ops[0]).__name__} -> {_CMPOPS[type(node.ops[0])].__name__}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
            out.append((node, f"{node.func.id}() -> {_CALLS[node.func.id]}()"))
        elif (isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool)
              and node.value not in (0,)):
            out.append((node, f"{node.value!r} -> {_bumped(node.value)!r}"))
    return out


def _bumped(value: float) -> float:
    return value * 1000 if isinstance(value, float) and value >= 1e3 else value + 1


def _mutated(tree: ast.AST, index: int) -> ast.AST:
    tree = copy.deepcopy(tree)
    node, _ = _sites(tree)[index]
    if isinstance(node, ast.BinOp):
        node.op = _BINOPS[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops = [_CMPOPS[type(node.ops[0])]()]
    elif isinstance(node, ast.Call):
        node.func.id = _CALLS[node.func.id]  # type: ignore[attr-defined]
    elif isinstance(node, ast.Constant):
        node.value = _bumped(node.value)
    return tree


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Lines of docstrings and of `if TYPE_CHECKING`-style annotations: nothing to mutate there."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
        if isinstance(node, (ast.AnnAssign, ast.arg)) and getattr(node, "annotation", None) is not None:
            ann = node.annotation
            out.update(range(ann.lineno, (ann.end_lineno or ann.lineno) + 1))
    return out


def _functions_of_lines(tree: ast.AST) -> dict[int, str]:
    """Each line's innermost function, qualified (`Class.method`); lines outside any function are absent."""
    out: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out.update({line: name for line in range(child.lineno, (child.end_lineno or child.lineno) + 1)})
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def equivalent_changes(path: str, lines: list[str], tree: ast.AST) -> dict[int, set[str] | None]:
    """Line -> the changes marked equivalent there (None: all of them), from EQUIVALENTS; an entry of `path` that
    matches no line is an error."""
    owner = _functions_of_lines(tree)
    out: dict[int, set[str] | None] = {}
    for e in (e for e in EQUIVALENTS if e.file == path):
        hits = [i + 1 for i, text in enumerate(lines) if e.code in text and owner.get(i + 1, "") == e.function]
        if not hits:
            raise SystemExit(f"tools/mutate_equivalents.py: no line of {path} in {e.function or 'module level'} "
                             f"holds {e.code!r}: move the entry with the code")
        for line in hits:
            if not e.changes or out.get(line, set()) is None:
                out[line] = None
            else:
                out.setdefault(line, set()).update(e.changes)
    return out


def _scoped_lines(tree: ast.AST, names: list[str]) -> set[int]:
    """The lines of the named functions (`f`, or `Class.method`); every name must be found."""
    out: set[int] = set()
    found: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if name in names and not isinstance(child, ast.ClassDef):
                    found.add(name)
                    out.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
                visit(child, name + ".")

    visit(tree, "")
    missing = sorted(set(names) - found)
    if missing:
        raise SystemExit(f"SCOPES names functions that are not there: {', '.join(missing)}")
    return out


def mutants(path: str) -> list[Mutant]:
    source = (REPO / path).read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    skip = _docstring_lines(tree)
    scope = _scoped_lines(tree, SCOPES[path]) if path in SCOPES else None
    out = []
    equivalent = equivalent_changes(path, lines, tree)
    for i, (node, change) in enumerate(_sites(tree)):
        line = getattr(node, "lineno", 0)
        marked = line in equivalent and (equivalent[line] is None or change in equivalent[line])
        if line in skip or marked or (scope is not None and line not in scope):
            continue
        out.append(Mutant(path, line, change, i))
    return out


def _copy_tree(dest: Path) -> None:
    """The checkout without its virtualenvs, git data and results folder (top level only: hetbench/results is code)
    or caches."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder).resolve() == REPO
        return {n for n in names if n in ("__pycache__", ".pytest_cache") or n.endswith(".egg-info") or
                (top and (n.startswith(".venv") or n in (".git", "results", "build")))}

    shutil.copytree(REPO, dest, ignore=ignore, dirs_exist_ok=True)


def run_target(path: str, tests: list[str], python: str, limit: int | None = None) -> list[dict]:
    """Run every mutant of `path` against `tests`; returns one record per mutant."""
    records = []
    found = mutants(path)[:limit] if limit else mutants(path)
    tree = ast.parse((REPO / path).read_text())
    with tempfile.TemporaryDirectory(prefix="hetbench-mutate-") as tmp:
        work = Path(tmp) / "tree"
        _copy_tree(work)
        target = work / path
        original = target.read_text()
        env = dict(os.environ, PYTHONPATH=str(work), PYTHONDONTWRITEBYTECODE="1")
        start = time.perf_counter()
        baseline = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests], cwd=work,
                                  env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        if baseline.returncode != 0:
            raise SystemExit(f"{path}: its tests fail before any mutation:\n{baseline.stdout[-2000:]}")
        # a mutant that takes ten times the unmutated run (and at least a minute) hangs: killed, as a hang fails CI
        limit = min(TIMEOUT_S, max(60.0, 10 * (time.perf_counter() - start)))
        for m in found:
            target.write_text(ast.unparse(_mutated(tree, m.index)) + "\n")
            start = time.perf_counter()
            try:
                run = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests], cwd=work,
                                     env=env, capture_output=True, text=True, timeout=limit)
                killed = run.returncode != 0
                how = "failed" if killed else "passed"
            except subprocess.TimeoutExpired:
                killed, how = True, "timed out"
            finally:
                target.write_text(original)
            records.append({"file": m.path, "line": m.line, "change": m.change, "killed": killed, "tests": how,
                            "seconds": round(time.perf_counter() - start, 1)})
            mark = "killed  " if killed else "SURVIVED"
            print(f"{mark} {m.path}:{m.line}: {m.change} ({how})", flush=True)
    return records


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="targets (default with --all: every one in TARGETS)")
    p.add_argument("--all", action="store_true")
    p.add_argument("--list", action="store_true", help="list the targets and their mutant counts, run nothing")
    p.add_argument("--limit", type=int, default=None, help="at most this many mutants per target")
    p.add_argument("--out", default=None, help="write every mutant's record to this JSON file")
    p.add_argument("--python", default=str(REPO / ".venv" / "bin" / "python"))
    args = p.parse_args(argv)
    files = list(TARGETS) if args.all or args.list else args.files
    unknown = [f for f in files if f not in TARGETS]
    if unknown or not files:
        print(f"targets: {', '.join(TARGETS)} (got {', '.join(unknown) or 'none'})", file=sys.stderr)
        return 2
    if args.list:
        for f in files:
            scope = f" (only {', '.join(SCOPES[f])})" if f in SCOPES else ""
            print(f"{f}: {len(mutants(f))} mutants{scope}, tests {' '.join(TARGETS[f])}")
        return 0
    records = []
    for f in files:
        records += run_target(f, TARGETS[f], args.python, args.limit)
    survivors = [r for r in records if not r["killed"]]
    print(f"{len(records)} mutants, {len(records) - len(survivors)} killed, {len(survivors)} survived")
    if args.out:
        Path(args.out).write_text(json.dumps({"mutants": records, "survivors": survivors}, indent=1) + "\n")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
