"""The tests' one helpers module (`from helpers import ...`): the checkout, the launcher found, markers, and the real CLI
run as a subprocess, alone or under `mpiexec -n N`, always with a timeout. tests/conftest.py holds only pytest's hooks
and the autouse fixture."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
# the running test, for run_python's check of the mpi mark (set by conftest's autouse fixture)
_CURRENT: dict[str, pytest.Item] = {}


def find_mpiexec() -> str | None:
    """The launcher the MPI tests use: $HETBENCH_TEST_MPIEXEC (`make test-openmpi` sets /usr/bin/mpirun), else the
    `mpiexec` beside this Python (the mpich wheel's), else the first on PATH."""
    chosen = os.environ.get("HETBENCH_TEST_MPIEXEC")
    if chosen:
        found = shutil.which(chosen)
        if found is None:
            raise pytest.UsageError(f"HETBENCH_TEST_MPIEXEC={chosen!r} is not an executable")
        return found
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


def launcher_kind(mpiexec: str | None) -> str | None:
    """'openmpi' or 'mpich' (hydra), from the launcher's --version."""
    if mpiexec is None:
        return None
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    if "Open MPI" in out or "OpenRTE" in out:
        return "openmpi"
    if "HYDRA" in out or "MPICH" in out:
        return "mpich"
    return None


MPIEXEC = find_mpiexec()
MPIEXEC_KIND = launcher_kind(MPIEXEC)
if MPIEXEC_KIND == "openmpi":
    # Open MPI's mpirun refuses root (CI and containers run as root) and more ranks than cores (the tests run 3
    # ranks on 2 cores) unless told; set in the environment, every launch in every test inherits it.
    # Open MPI 4 reads OMPI_MCA_rmaps_base_oversubscribe, Open MPI 5 (PRRTE) the PRTE_ one.
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    os.environ.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    os.environ.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
    # A waiting rank yields its core (Open MPI yields only once it sees more ranks than cores: a 2-rank job spun at
    # 100 % beside the suite's other jobs) and stays on the test worker's core (mpirun binds 2 ranks to 2 cores)
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    os.environ.setdefault("OMPI_MCA_hwloc_base_binding_policy", "none")
    os.environ.setdefault("PRTE_MCA_hwloc_default_binding_policy", "none")


def opencl_devices() -> int:
    try:
        import pyopencl as cl

        return sum(len(p.get_devices()) for p in cl.get_platforms())
    except Exception:
        return 0


HAVE_OPENCL = opencl_devices() > 0

ALL_OPS = ("allreduce", "reduce_scatter", "allgather", "reduce", "bcast", "gather", "scatter", "alltoall", "sendrecv")
# nccl-tests' busbw factors (its PERFORMANCE.md), written out here rather than taken from hetbench
HAND_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "bcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
# a test (or a module's pytestmark, or a parameter) that launches mpiexec carries a skipif whose reason starts so, as
# needs_mpi's does; it is marked `mpi` as well (pytest_collection_modifyitems), and the Open MPI pass (`make
# test-openmpi`: pytest -m mpi) runs exactly those
NO_MPIEXEC = "no mpiexec"
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason=f"{NO_MPIEXEC} (pip install mpich)")
needs_opencl = pytest.mark.skipif(not HAVE_OPENCL, reason="no OpenCL device (apt-get install pocl-opencl-icd)")


def _checkout_entries(root: Path = REPO) -> set[str]:
    """What a test could leave in the checkout (ROOT): the top folder's entries and results/'s."""
    results = root / "results"
    return {p.name for p in root.iterdir()} | ({f"results/{p.name}" for p in results.iterdir()}
                                               if results.is_dir() else set())


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> dict:
        return json.loads(self.stdout)

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("Error:")]


def require_mpi_mark() -> None:
    """Called wherever a test launches mpiexec: the running test must be marked `mpi` (a skipif whose reason starts
    "no mpiexec", as needs_mpi's, marks it so), or the Open MPI pass (pytest -m mpi) would leave it out."""
    item = _CURRENT.get("item")
    if item is not None and item.get_closest_marker("mpi") is None:
        pytest.fail(f"{item.nodeid} launches mpiexec but is not marked needs_mpi (or pytest.mark.mpi): the Open MPI "
                    "pass (pytest -m mpi) would leave it out")


def run_in_group(cmd: list[str], timeout: float, capture_output: bool = False,
                 **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(CMD, timeout=TIMEOUT, ...) in a session of its own: on the timeout (or an interrupt) every
    process of that session is killed, mpiexec's ranks and proxies too (killing mpiexec alone, as subprocess.run
    does, left its ranks spinning in their collective), then TimeoutExpired is raised as subprocess.run raises it."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with subprocess.Popen(cmd, start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # a process that left the session holds the pipes: give up on them
                out, err = None, None
            raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
        except BaseException:
            kill_group(proc)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_python(args: list[str], nprocs: int | None = None, cwd: Path | None = None, timeout: float = 120,
               env: dict[str, str] | None = None, launcher_args: list[str] | None = None,
               fork_ranks: bool = False) -> Run:
    """`python ARGS` (nprocs None), or `mpiexec [LAUNCHER_ARGS] -n NPROCS python ARGS`, with this checkout on the
    path. fork_ranks: the ranks forked from a server that has imported torch (_RankServers), where there is one."""
    cmd = [sys.executable, *args]
    if nprocs is not None:
        require_mpi_mark()
        assert MPIEXEC is not None
        cmd = [MPIEXEC, *(launcher_args or []), "-n", str(nprocs), *cmd]
    full_env = dict(os.environ)
    # the tables take COLUMNS wherever it is sane, a pipe too: a developer's exported COLUMNS must not narrow them
    full_env.pop("COLUMNS", None)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    # a rank's BLAS threads must not oversubscribe the CI machine's cores
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    start = time.monotonic()
    server = _FORKSERVER.get(full_env) if nprocs is None else None
    if server is not None:
        return server.run(args, cwd, timeout, start)
    ranks = _RANK_SERVERS.get(Path(args[0]), full_env) if fork_ranks and nprocs is not None else None
    if ranks is not None:
        cmd = [MPIEXEC, *(launcher_args or []), "-n", str(nprocs), *ranks.stub_command(sys.executable), *args]
    try:
        proc = run_in_group(cmd, timeout, cwd=cwd, capture_output=True, text=True, env=full_env,
                            stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s (a hang?)\nstdout: {e.stdout}\nstderr: {e.stderr}")
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


class _ForkServer:
    """tests/cli_forkserver.py, started with one environment: a one-process command whose environment is exactly
    that one runs in a child forked from it (hetbench's command line imported once, not once a command)."""

    # pytest's own, different in every test, read by nothing hetbench imports (the child gets the test's value)
    IGNORED = ("PYTEST_CURRENT_TEST",)

    def __init__(self, env: dict[str, str]) -> None:
        import tempfile

        self.env = env
        self.request_env = env
        self.folder = Path(tempfile.mkdtemp(prefix="hetbench-test-forkserver-"))
        self.count = 0
        self.proc = subprocess.Popen([sys.executable, str(TESTS / "cli_forkserver.py")], cwd=self.folder, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    @classmethod
    def key(cls, env: dict[str, str]) -> tuple:
        return tuple(sorted((k, v) for k, v in env.items() if k not in cls.IGNORED))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _reply(self, deadline: float) -> dict | None:
        import select

        assert self.proc.stdout is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the test fork server ended")
            return json.loads(line)

    def run(self, args: list[str], cwd: Path | None, timeout: float, start: float) -> Run:
        assert self.proc.stdin is not None
        self.count += 1
        out = self.folder / str(self.count)
        out.mkdir()
        self.proc.stdin.write(json.dumps({"argv": args, "cwd": str(cwd or os.getcwd()), "out": str(out),
                                          "env": self.request_env}) + "\n")
        self.proc.stdin.flush()
        pid = self._reply(time.monotonic() + 60)["pid"]
        reply = self._reply(start + timeout)
        if reply is None:
            os.kill(pid, signal.SIGKILL)
            self._reply(time.monotonic() + 60)
        stdout, stderr = ((out / name).read_text(errors="replace") for name in ("stdout", "stderr"))
        shutil.rmtree(out, ignore_errors=True)
        if reply is None:
            pytest.fail(f"python {' '.join(args)} did not finish within {timeout} s (a hang?)\nstdout: {stdout}\n"
                        f"stderr: {stderr}")
        return Run(reply["status"], stdout, stderr, time.monotonic() - start)


class _ForkServers:
    """The session's fork servers, one per environment a one-process command ran with, the LIMIT most recently used
    kept (a test's own variables, or monkeypatched ones, get a server of their own rather than leaving the default
    environment's, as when the first server took whatever the worker's first command had and every command in
    another environment ran as a new interpreter for the rest of the session). HETBENCH_TEST_NO_FORKSERVER=1 turns
    them off."""

    LIMIT = 2

    def __init__(self) -> None:
        self.servers: dict[tuple, _ForkServer] = {}  # in order of last use
        self.registered = False

    def get(self, env: dict[str, str]) -> _ForkServer | None:
        if os.environ.get("HETBENCH_TEST_NO_FORKSERVER") == "1":
            return None
        key = _ForkServer.key(env)
        server = self.servers.pop(key, None)
        if server is not None and not server.alive():
            server.stop()
            server = None
        if server is None:
            while len(self.servers) >= self.LIMIT:
                self.servers.pop(next(iter(self.servers))).stop()
            if not self.registered:
                import atexit

                atexit.register(self.stop)
                self.registered = True
            server = _ForkServer(env)
        self.servers[key] = server
        server.request_env = env
        return server

    def stop(self) -> None:
        while self.servers:
            self.servers.popitem()[1].stop()


_FORKSERVER = _ForkServers()


class _RankServers:
    """A torch batch job's ranks forked from a server that has imported hetbench, torch and what a torch run
    imports (tests/hostile/forkserver.py --ranks, the hostile battery's): mpiexec starts rank_stub.py as each rank,
    which hands the rank's descriptors, environment and folder to the server. The batch runners already run many
    commands in one process; this spares each rank torch's import (some 3 s of CPU). One server a worker, for one
    script and environment at a time; under MPICH's hydra only (the battery's own launcher);
    HETBENCH_TEST_NO_FORKSERVER=1 turns it off."""

    def __init__(self) -> None:
        self.server = None
        self.key: tuple | None = None
        self.folder: Path | None = None
        self.unavailable = False
        self.registered = False

    def get(self, script: Path, env: dict[str, str]):
        if MPIEXEC_KIND != "mpich" or self.unavailable or os.environ.get("HETBENCH_TEST_NO_FORKSERVER") == "1":
            return None
        key = (str(script), _ForkServer.key(env))
        if self.server is not None and (self.key != key or self.server.proc.poll() is not None):
            self.stop()
        if self.server is None:
            import atexit
            import tempfile

            sys.path.insert(0, str(TESTS / "hostile"))
            from forkserver import ForkServer, Unavailable

            self.folder = Path(tempfile.mkdtemp(prefix="hetbench-test-ranks-"))
            try:
                self.server = ForkServer(sys.executable, str(script), True, env, str(self.folder), ranks=True)
            except Unavailable:  # no torch, or its import said something: the ranks start as ever
                self.unavailable = True
                return None
            self.key = key
            if not self.registered:
                atexit.register(self.stop)
                self.registered = True
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


_RANK_SERVERS = _RankServers()


def run_cli(args: list[str], nprocs: int | None = None, cwd: Path | None = None, timeout: float = 120,
            env: dict[str, str] | None = None, launcher_args: list[str] | None = None) -> Run:
    """`hetbench ARGS` (nprocs None), or `mpiexec [LAUNCHER_ARGS] -n NPROCS hetbench ARGS`."""
    return run_python(["-m", "hetbench", *args], nprocs=nprocs, cwd=cwd, timeout=timeout, env=env,
                      launcher_args=launcher_args)


def run_cli_batch(commands: list[tuple[list[str], Path] | tuple[list[str], Path, dict[str, str]]],
                  nprocs: int | None, folder: Path, timeout: float = 300) -> list[Run]:
    """Several `hetbench ARGS` commands, each (ARGS, CWD[, ENV]), run one after another in ONE `mpiexec -n NPROCS`
    job (tests/mpi_cli_batch.py; NPROCS None: one process, no launcher): the start-up of the launcher and of every
    rank's interpreter (NumPy, MPI, torch) paid once. ENV holds variables the command reads when it runs (not at
    import: a variable read at import sees the first command's value). For
    commands that succeed (one that fails aborts the job, as alone). Each command's Run as run_cli would give it:
    every rank's stdout and every rank's stderr (rank by rank, where mpiexec would interleave them). A command the job did not finish gets exit code -1 and a
    stderr that names the command that ended the job, with the job's own output."""
    folder.mkdir(parents=True, exist_ok=True)
    cases = [{"args": [str(a) for a in c[0]], "cwd": str(c[1]), "env": c[2] if len(c) > 2 else {},
              "out": str(folder / f"case-{i}")} for i, c in enumerate(commands)]
    return _batch_job("mpi_cli_batch.py", cases, nprocs, folder, timeout,
                      lambda case: f"`hetbench {' '.join(case['args'])}`")


def _uses_torch(case: dict) -> bool:
    """A batch case of the torch front end, or a torch script (the torch workers, the torch examples)."""
    args = case.get("args", [])
    return (any(a == "--frontend" and b == "torch" for a, b in zip(args, args[1:]))
            or "torch" in Path(case.get("script", "")).as_posix())


def _batch_job(runner: str, cases: list[dict], nprocs: int | None, folder: Path, timeout: float, name) -> list[Run]:
    """CASES run by tests/RUNNER in one job: each case's Run (every rank's stdout and stderr from the case's OUT
    folder); a case the job did not finish gets exit code -1 and a stderr naming (NAME(case)) the case that ended
    it, with the job's own output. A job with a torch case has its ranks forked (_RankServers)."""
    (folder / "cases.json").write_text(json.dumps(cases))
    results = folder / "results.jsonl"
    try:
        job = run_python([str(TESTS / runner), str(folder / "cases.json"), str(results)], nprocs=nprocs,
                         cwd=folder, timeout=timeout, fork_ranks=any(map(_uses_torch, cases)))
    except pytest.fail.Exception as e:  # a hang: the cases it finished stand, the rest say so
        job = Run(-1, "", str(e), timeout)
    done = {}
    if results.exists():
        for line in results.read_text().splitlines():
            entry = json.loads(line)
            done[entry["case"]] = entry
    runs = []
    for i, case in enumerate(cases):
        out = Path(case["out"])
        stdout = "".join((out / f"stdout-{r}").read_text() for r in range(nprocs or 1)
                         if (out / f"stdout-{r}").exists())
        stderr = "".join((out / f"stderr-{r}").read_text() for r in range(nprocs or 1)
                         if (out / f"stderr-{r}").exists())
        if i in done:
            runs.append(Run(done[i]["returncode"], stdout, stderr, done[i]["seconds"]))
        else:
            ended = min(set(range(len(cases))) - set(done))
            runs.append(Run(-1, stdout, f"{stderr}\n[batch] {name(case)} did not finish: the job (exit "
                            f"{job.returncode}) ended in case {ended}, {name(cases[ended])}\njob stdout: "
                            f"{job.stdout}\njob stderr: {job.stderr}", 0.0))
    return runs


def run_script_batch(scripts: list[tuple[Path, list[str]]], nprocs: int, folder: Path,
                     timeout: float = 300) -> list[tuple[Run, Path]]:
    """Python scripts, each (SCRIPT, ARGS), run one after another in ONE `mpiexec -n NPROCS` job
    (tests/mpi_cli_batch.py's script cases), each as `python SCRIPT ARGS` would run it, in its own folder FOLDER/case-I
    (its working directory): each one's (Run, folder), as run_cli_batch gives them."""
    folder.mkdir(parents=True, exist_ok=True)
    cases = []
    for i, (script, args) in enumerate(scripts):
        (folder / f"case-{i}").mkdir()
        cases.append({"script": str(script), "args": [str(a) for a in args], "cwd": str(folder / f"case-{i}"),
                      "out": str(folder / f"case-{i}" / "output")})
    runs = _batch_job("mpi_cli_batch.py", cases, nprocs, folder, timeout,
                      lambda case: f"`python {case['script']} {' '.join(case['args'])}`")
    return [(run, Path(case["cwd"])) for run, case in zip(runs, cases)]


# The torch workers' and the example's runs under mpiexec, shared by tests/mpi/test_torch_train.py and
# tests/mpi/test_torch_fsdp.py, in the torch group's launches (below). NAME -> (SCRIPT, ARGS); the example's --log
# is written into its own folder.
TORCH_SCRIPTS: dict[int, dict[str, tuple[Path, list[str]]]] = {
    2: {
        "exact": (TESTS / "torch_workers" / "exact.py", ["even", "3,1"]),
        "fsdp": (TESTS / "torch_workers" / "fsdp.py", ["3,1"]),
        "example-fsdp": (REPO / "examples" / "torch_uneven.py", ["--strategy", "fsdp", "--weights", "3,1", "--steps",
                                                                "6"]),
        "example-fsdp2-log": (REPO / "examples" / "torch_uneven.py", ["--strategy", "fsdp2", "--weights", "3,1",
                                                                     "--steps", "6", "--log", "ex.jsonl"]),
    },
    3: {
        "exact": (TESTS / "torch_workers" / "exact.py", ["even", "3,2,1", "2,1,0"]),
        "fsdp": (TESTS / "torch_workers" / "fsdp.py", ["0.5,0.3,0.2", "2,1,0"]),
    },
}
# The torch group (the torch scripts above, tests/mpi/test_torch_train.py's and test_torch_fsdp.py's commands): every
# command and script of theirs for one rank count in ONE launch (tests/mpi_cli_batch.py), each rank's torch import
# (2.6 s of a core) paid once a rank count, not once a file (18 torch processes a session, then 6). KEY -> a
# function of a folder that makes the commands' folders there and returns their stages [(NPROCS, [(NAME, SPEC,
# ENV), ...]), ...] in the order 2, 3, one process (a later stage may read what an earlier one wrote); SPEC is a
# command's arguments, or ("script", PATH, ARGS). A test module registers its function when it is imported (at
# collection, on every worker); the group's launches are made the first time a test asks for one of their runs.
TORCH_GROUP: dict[str, Callable[[Path], list[tuple[int | None, list[tuple[str, object, dict[str, str]]]]]]] = {
    "scripts": lambda root: [(n, [(f"{name}-{n}", ("script", script, args), {})
                                  for name, (script, args) in named.items()]) for n, named in TORCH_SCRIPTS.items()],
}
TORCH_GROUP_ORDER = (2, 3, None)


class _TorchGroup:
    """The torch group's stages, run in order up to the one a test asks for: KEY/NAME -> (its Run, its folder)."""

    def __init__(self) -> None:
        self.stages: list[tuple[int | None, list[tuple[str, str, object, dict[str, str]]]]] | None = None
        self.runs: dict[tuple[str, str], tuple[Run, Path]] = {}
        self.done = 0
        self.root: Path | None = None

    def _plan(self) -> None:
        import atexit
        import tempfile

        self.root = Path(tempfile.mkdtemp(prefix="hetbench-test-torch-group-"))
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)
        merged: dict[int | None, list[tuple[str, str, object, dict[str, str]]]] = {n: [] for n in TORCH_GROUP_ORDER}
        for key, build in TORCH_GROUP.items():
            stages = build(self.root / key)
            counts = [n for n, _ in stages]
            assert counts == sorted(counts, key=TORCH_GROUP_ORDER.index) and len(set(counts)) == len(counts), \
                f"{key}: stages {counts}, not in the order {TORCH_GROUP_ORDER}"
            for n, named in stages:
                for name, _, _ in named:
                    (self.root / key / name).mkdir(parents=True, exist_ok=True)
                merged[n] += [(key, name, spec, env) for name, spec, env in named]
        self.stages = [(n, merged[n]) for n in TORCH_GROUP_ORDER if merged[n]]

    def get(self, key: str, name: str) -> tuple[Run, Path]:
        if self.stages is None:
            self._plan()
        assert self.stages is not None and self.root is not None
        while (key, name) not in self.runs and self.done < len(self.stages):
            n, named = self.stages[self.done]
            (self.root / f"stage-{self.done}").mkdir()
            cases = []
            for i, (k, nm, spec, env) in enumerate(named):
                case = {"cwd": str(self.root / k / nm), "env": env, "out": str(self.root / f"stage-{self.done}" /
                                                                               f"case-{i}")}
                if isinstance(spec, tuple):
                    case.update(script=str(spec[1]), args=[str(a) for a in spec[2]])
                else:
                    case["args"] = [str(a) for a in spec]
                cases.append(case)
            runs = _batch_job("mpi_cli_batch.py", cases, n, self.root / f"stage-{self.done}", 280,
                              lambda case: f"`{case.get('script', 'hetbench')} {' '.join(case['args'])}`")
            self.runs.update({(k, nm): (run, self.root / k / nm) for (k, nm, _, _), run in zip(named, runs)})
            self.done += 1
        return self.runs[(key, name)]


_TORCH_GROUP = _TorchGroup()


def torch_group_run(key: str, name: str) -> tuple[Run, Path]:
    """KEY's command NAME in the torch group's launches (TORCH_GROUP): (its Run, its folder)."""
    return _TORCH_GROUP.get(key, name)


class TorchGroupRuns:
    """KEY's runs in the torch group as a mapping, NAME -> (its Run, its folder), each stage launched when first
    asked for (a module fixture's value)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __getitem__(self, name: str) -> tuple[Run, Path]:
        return torch_group_run(self.key, name)


# The torch library's workers (tests/mpi/test_torch_misuse.py's and test_torch_backend.py's): both in one launch
# per rank count (run_script_batch), each rank's torch import paid once, not once a file. The misuse
# cases first: the collectives battery sets the torch backend's path and its stand-in device's variable as it goes.
TORCH_LIB_SCRIPTS = {"misuse": (TESTS / "torch_workers" / "misuse.py", []),
                     "collectives": (TESTS / "torch_workers" / "collectives.py", [])}
_TORCH_LIB_RUNS: dict[int, dict[str, Run]] = {}


def torch_lib_runs(nprocs: int) -> dict[str, Run]:
    """TORCH_LIB_SCRIPTS' runs on NPROCS ranks, NAME -> its Run, made by the first test that asks."""
    if nprocs not in _TORCH_LIB_RUNS:
        import atexit
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix=f"hetbench-test-torch-lib-{nprocs}-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        runs = run_script_batch(list(TORCH_LIB_SCRIPTS.values()), nprocs, folder, timeout=240)
        _TORCH_LIB_RUNS[nprocs] = {name: run for name, (run, _) in zip(TORCH_LIB_SCRIPTS, runs)}
    return _TORCH_LIB_RUNS[nprocs]


def torch_script_runs(nprocs: int) -> dict[str, tuple[Run, Path]]:
    """TORCH_SCRIPTS[NPROCS]'s runs, NAME -> (its Run, its folder), in the torch group's launch for NPROCS."""
    return {name: torch_group_run("scripts", f"{name}-{nprocs}") for name in TORCH_SCRIPTS[nprocs]}


def run_cli_stages(root: Path, stages: list[tuple[int | None, list[tuple[str, list[str], dict[str, str]]]]],
                   timeout: float = 300) -> dict[str, tuple[Run, Path]]:
    """Named commands in stages, one run_cli_batch job a stage (NPROCS, [(NAME, ARGS, ENV), ...]), the stages in
    order (a later stage may read what an earlier one wrote): NAME -> (its Run, its folder ROOT/NAME, where it ran,
    made here)."""
    found = {}
    for i, (nprocs, named) in enumerate(stages):
        for name, _, _ in named:
            (root / name).mkdir(parents=True, exist_ok=True)
        runs = run_cli_batch([(args, root / name, env) for name, args, env in named], nprocs, root / f"batch-{i}",
                             timeout=timeout)
        found.update({name: (run, root / name) for (name, _, _), run in zip(named, runs)})
    return found


def check_run_group(name: str) -> str:
    """The launch a train check case (tests/mpi/test_train_check_runs.py) shares: its front end's, and for the
    torch front end's longer runs its strategy's too (three launches of a minute each would be one of three)."""
    words = name.split("-")
    return "-".join(words[:2] if words[0] == "torch" else words[:1])


class Batches:
    """A test module's commands, one job per rank count (run_cli_stages), run the first time a test asks for that
    rank count: a pass that deselects the MPI tests (or the one-process ones) launches none of theirs.
    `commands(nprocs, root)` makes the commands' folders under ROOT (and any files they read) and returns
    [(NAME, ARGS, ENV), ...]; get(nprocs) returns NAME -> (its Run, its folder ROOT/NAME)."""

    def __init__(self, root: Path, commands, timeout: float = 300):
        self.root, self.commands, self.timeout = root, commands, timeout
        self.done: dict[int | None, dict[str, tuple[Run, Path]]] = {}

    def get(self, nprocs: int | None) -> dict[str, tuple[Run, Path]]:
        if nprocs not in self.done:
            root = self.root / f"n{nprocs or 1}"
            root.mkdir()
            self.done[nprocs] = run_cli_stages(root, [(nprocs, self.commands(nprocs, root))], timeout=self.timeout)
        return self.done[nprocs]


def assert_solo_figures(doc: dict, lines: list[dict], batch: int, warmup: int) -> None:
    """`hetbench train --solo-between-steps`: every timed step (after `warmup`) carries each rank's solo step (the
    whole batch alone, > 0), the warm-up steps none; each rank's solo samples/s is the batch over the median of its
    solo steps, the efficiency the job's samples/s (the batch over the median step) over their sum, flagged above
    1: every figure recomputed from the raw values in the document."""
    import statistics

    s = doc["summary"]
    assert s["solo_between_steps"] is True
    for line in lines[:warmup]:
        assert all("solo_step_seconds" not in r for r in line["ranks"])
    timed = lines[warmup:]
    assert timed and all(r["solo_step_seconds"] > 0 for line in timed for r in line["ranks"])
    rates = []
    for rank, row in enumerate(doc["rows"]):
        median = statistics.median(line["ranks"][rank]["solo_step_seconds"] for line in timed)
        assert row["solo_step_seconds_median"] == pytest.approx(median, rel=1e-12)
        assert row["solo_samples_per_second"] == pytest.approx(batch / median, rel=1e-12)
        rates.append(batch / median)
    step = statistics.median(line["step_seconds"] for line in timed)
    assert s["samples_per_second"] == pytest.approx(batch / step, rel=1e-12)
    assert s["solo_samples_per_second_sum"] == pytest.approx(sum(rates), rel=1e-12)
    assert s["efficiency_vs_summed_solo"] == pytest.approx(batch / step / sum(rates), rel=1e-12)
    assert s["efficiency_above_1"] is (s["efficiency_vs_summed_solo"] > 1)


def assert_usage_error(run: Run, tmp_path: Path, *needles: str) -> None:
    """Bad input: exit code 2, one line (said once, by rank 0) holding every needle, no traceback, nothing on
    stdout, and no results file left behind."""
    assert run.returncode == 2, f"exit {run.returncode}\nstdout: {run.stdout}\nstderr: {run.stderr}"
    assert "Traceback" not in run.stderr
    assert len(run.error_lines) == 1, run.stderr
    line = run.error_lines[0]
    for needle in needles:
        assert needle in line, line
    assert run.stdout == ""
    leftovers = [p.name for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".json", ".csv", ".tmp")]
    assert leftovers == [], leftovers
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


# Processes of a launched job: who they are, whether they live (for tests that signal, stop or time out a rank)

RANK_VARIABLES = (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK=")


def process_parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return parents


def descendants(root: int) -> list[int]:
    parents = process_parents()
    found = []
    for pid in parents:
        p = pid
        while p in parents and p not in (root, 0, 1):
            p = parents[p]
        if p == root and pid != root:
            found.append(pid)
    return found


def environ_of(pid: int) -> list[bytes] | None:
    """A process's environment as its NAME=VALUE entries, None where it cannot be read (gone, or not ours)."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None


def rank_of(pid: int) -> int | None:
    environ = environ_of(pid)
    if environ is None:
        return None
    for item in environ:
        for name in RANK_VARIABLES:
            if item.startswith(name) and item[len(name):].isdigit():
                return int(item[len(name):])
    return None


def handles_sigterm(pid: int) -> bool:
    """Whether hetbench's handlers are in place: Python itself catches SIGINT only, hetbench SIGTERM as well."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def unignore_sigint() -> None:
    """A run started in the background of a script (`make test &`: POSIX ignores SIGINT there) passes that on to
    every command it launches, and hetbench rightly keeps an ignored SIGINT ignored: the tests of Ctrl-C then fail.
    Python's own handler again (a child starts with the default action, as from a terminal)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


# Every process the test session starts, however deep (launchers, ranks, fork servers, commands), inherits this
# variable from the session's first process (tests/conftest.py sets it); at the session's end any still alive is
# an orphan of the suite's, which fails the run (conftest's pytest_sessionfinish)
SESSION_MARK = "HETBENCH_TEST_SESSION"


def processes_with(variable: str, exclude: tuple[int, ...] = ()) -> list[tuple[int, str]]:
    """Live processes (not zombies) whose environment holds VARIABLE ("NAME=VALUE"), but those in EXCLUDE: (pid,
    command line)."""
    needle = variable.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        environ = environ_of(int(entry))
        if environ is None or needle not in environ or not alive(int(entry)):
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append((int(entry), cmdline.strip()))
    return found


def wait_gone(variable: str, seconds: float, exclude: tuple[int, ...] = ()) -> list[tuple[int, str]]:
    """processes_with(VARIABLE), polled until none is left or SECONDS have passed: those still there."""
    deadline = time.monotonic() + seconds
    while True:
        left = processes_with(variable, exclude)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_CHECK_JOBS: dict[tuple, tuple[int, dict[str, str], str]] = {}


def script_checks(script: Path, args: list[str], nprocs: int | None, timeout: float = 120,
                  env: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """A worker script's checks, every one in one launch (`python -m mpi4py SCRIPT ARGS`, alone or under mpiexec
    -n NPROCS; mpi4py's runner aborts every rank when one raises): (exit code, each check's outcome line from rank
    0 keyed by its name: "ok NAME" or "FAILED NAME: ...", stderr). Made by the first test that asks, kept for the
    others (mpi4py's own suite runs its cases so)."""
    key = (str(script), tuple(args), nprocs, tuple(sorted((env or {}).items())))
    if key not in _CHECK_JOBS:
        run = run_python(["-m", "mpi4py", str(script), *args], nprocs=nprocs, timeout=timeout, env=env)
        said = {}
        for line in run.stdout.splitlines():
            word, _, rest = line.partition(" ")
            if word in ("ok", "FAILED"):
                said[rest.split(":")[0]] = line
        _CHECK_JOBS[key] = (run.returncode, said, run.stderr)
    return _CHECK_JOBS[key]


# Shared-memory segments that MPI jobs leave in /dev/shm (RAM) when a rank is killed or aborts, as many tests and the
# hostile battery make them do: MPICH's mpich_shm_*, Open MPI's vader_segment.*, UCX's ucx_shm_*. A session found
# 10 GB of them left by earlier ones. The test session and the battery remove those they made that no live process
# maps when they end.
SHM = Path("/dev/shm")
SHM_PREFIXES = ("mpich_shm_", "vader_segment.", "ucx_shm_")


def shm_segments() -> set[str]:
    try:
        return {name for name in os.listdir(SHM) if name.startswith(SHM_PREFIXES)}
    except OSError:
        return set()


def _mapped_segments() -> set[str]:
    mapped: set[str] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "maps").read_text(errors="replace")
            except OSError:
                continue
            mapped.update(line.rsplit("/", 1)[-1].split(" ")[0] for line in text.splitlines() if "/dev/shm/" in line)
    return mapped


def remove_left_segments(before: set[str]) -> int:
    """Remove the segments made since BEFORE (shm_segments() then) that no live process maps; how many."""
    left = shm_segments() - before
    removed = 0
    for name in left - _mapped_segments() if left else ():
        try:
            (SHM / name).unlink()
            removed += 1
        except OSError:
            pass
    return removed
