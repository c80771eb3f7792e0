#!/usr/bin/env python3
"""Issue 19's hostile battery: every case of tests/hostile/cases.py run as the real `hetbench` (alone, or under
`mpiexec -n 2|3`), each in a folder and a session of its own, under a timeout, and judged.

A case passes when it shows
- no hang: it ended within its time (a signalled job: within END_SECONDS of the signal);
- no traceback (on stderr or stdout);
- the exit code it should: 2 for bad input, 0 for good input, 128+N for signal N, the end by SIGPIPE for a closed
  stdout (quietly, as `yes | head -1`);
- one line: bad input and a signal say exactly one non-empty line on stderr, `Error: ...`, and bad input prints
  nothing on stdout (what tests/helpers.assert_usage_error asks, made strict: no other line at all, only MPICH's
  own `Abort(N) on node ...` and `[mpiexec@host] ...` lines are left out); a closed stdout says nothing;
- no lost file: every file in the case's folder before the run is there after it, byte for byte (unless the case
  names it as an output it may replace);
- no partial file: bad input and a signal write nothing at all; a good run leaves only complete files (JSON that
  parses, CSV with a header and a final newline, .npy that loads) and no staged or temporary ones;
- no orphan: no process of the case's session outlives it.

Usage: python tests/hostile/battery.py [--jobs 2] [--only SUBSTRING[,...]] [--failed-from REPORT] [--report FILE]
       [--keep] [--list]
Exit status: 0 when every case passes, 1 when any fails, 2 on a bad command line.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # tests/: the suite's helpers

from cases import Case, build_cases  # noqa: E402
from forkserver import ForkServer, ServerGone, Unavailable  # noqa: E402
from helpers import handles_sigterm, remove_left_segments, shm_segments, unignore_sigint  # noqa: E402
from helpers import rank_of as environment_rank  # noqa: E402

TRACEBACK = "Traceback (most recent call last)"
PACKAGE_DIR = str(Path(__file__).resolve().parents[2] / "hetbench")  # a traceback frame in it is hetbench's
END_SECONDS = 10.0  # a signalled job must end this soon after the signal (tests/mpi/test_signals.py's bound)
ORPHAN_GRACE = 3.0  # seconds a case's processes get to go after its launcher ended
TEMP_MARKERS = (".tmp", ".partial", ".part", ".staged", "~", ".swp")
LAUNCHER_LINE = re.compile(r"^(Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): application called MPI_Abort"
                           r"|\[mpiexec@[^\]]+\] )")
CATEGORIES = ("hang", "traceback", "crash", "silent", "exit", "message", "lost", "partial", "orphan", "setup")
# an MPI library's crash dump (MPICH's "Fatal error in internal_Allgather: Message truncated, error stack:"), or a
# process ended by SIGABRT/SIGSEGV (PoCL's assertion): never what a user should see, whatever the exit code
CRASH_TEXT = ("Fatal error in ", "error stack:")
CRASH_CODES = (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGBUS, 128 + signal.SIGABRT, 128 + signal.SIGSEGV,
               128 + signal.SIGBUS)
# a library case's line (tests/hostile/lib_cases.py): each rank prints exactly one
RAISED_LINE = re.compile(r"^rank (\d+) raised ([A-Za-z_][\w.]*): (.*)$")
NOT_RAISED_LINE = re.compile(r"^rank (\d+) did not raise\b")


def python_of(hb: str) -> str:
    """The Python beside the hetbench command (the virtualenv's): what a case of program "python" runs."""
    here = Path(hb).parent
    return str(here / "python") if (here / "python").exists() else sys.executable


def find_tools() -> tuple[str, str | None]:
    """The hetbench command and the mpiexec to use: $HETBENCH_HOSTILE_BIN / $HETBENCH_HOSTILE_MPIEXEC, else the
    ones beside this Python (the virtualenv's), else PATH's."""
    here = Path(sys.executable).parent
    hb = os.environ.get("HETBENCH_HOSTILE_BIN") or (str(here / "hetbench") if (here / "hetbench").exists()
                                                    else shutil.which("hetbench"))
    if not hb:
        sys.exit("battery: no hetbench command (run it with the virtualenv's python)")
    mpi = os.environ.get("HETBENCH_HOSTILE_MPIEXEC") or (str(here / "mpiexec") if (here / "mpiexec").exists()
                                                         else shutil.which("mpiexec"))
    return hb, mpi


# --- processes --------------------------------------------------------------------------------------------------

def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


MARK = "HETBENCH_HOSTILE_CASE"  # set in every case's environment: MPI's proxies start new sessions, env is kept


def members(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment carries this case's mark: the launcher, its proxies, the
    ranks, and whatever any of them left behind."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        fields = _stat_fields(int(entry))
        if not fields or fields[0] == "Z":
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def case_members(mark: str, server: ForkServer | None = None) -> list[int]:
    """A case's live processes: those with its mark, and for a forked case (whose /proc/PID/environ is its fork
    server's, without the mark) everything under the server, to which what the child left is re-parented."""
    found = members(mark)
    return found if server is None else sorted(set(found) | set(server.descendants()))


def rank_of(pid: int) -> int | None:
    """The MPI rank of a process (from its environment), for a Python process running hetbench."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if b"hetbench" not in cmdline or b"mpiexec" in cmdline or b"hydra" in cmdline:
        return None
    return environment_rank(pid)


def kill_case(mark: str, server: ForkServer | None = None) -> list[int]:
    """SIGKILL every process left of a case (only ever ours: found by the mark the battery gave the case, and for
    a forked case, as what is under its fork server, which serves one case at a time)."""
    left = case_members(mark, server)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


# --- fork servers: one-process cases forked from a process that has imported hetbench (and torch) ------------------

SERVER_DIR: list[Path] = []  # the servers' working folder (their stderr logs), set by main
SERVERS: list[ForkServer] = []  # every server started, ended by main
NO_SERVER: dict[str, str] = {}  # flavour -> why its server could not start (its cases then run as before)
FORKED: set[str] = set()  # ids of the cases that ran forked
_servers_lock = threading.Lock()
_local = threading.local()  # each worker thread's servers by flavour: one case at a time each


def forkable(case: Case) -> bool:
    """Whether nothing special is done to the case's processes, so that a fork of a server that imported hetbench
    runs each as `hetbench ARGS` would run: the hetbench command, no variable of its own (one could be read at
    import), no signal (a signal case finds its rank by the rank's own environment), stdout a plain file, its
    folder kept, no tmpfs or other wrapper. One process, or each rank of an MPI case (forkserver.py --ranks)."""
    return (case.program == "hetbench" and case.special is None and not case.env and case.signal is None
            and case.batch is None and case.expect not in ("batch", "signal", "pipe"))


def flavour_of(case: Case) -> str:
    """"torch" for a case of the torch front end (its server has imported torch and the trainer), else "cli"; with
    "-ranks" for an MPI case's (its server forks ranks for rank_stub.py)."""
    args = list(case.argv)
    torch_frontend = any(a == "--frontend" and b == "torch" for a, b in zip(args, args[1:]))
    flavour = "torch" if torch_frontend or any(n.startswith("torch") for n in case.needs) else "cli"
    return f"{flavour}-ranks" if case.nprocs else flavour


def _without_mark(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != MARK}


def server_for(case: Case, env: dict[str, str], hb: str) -> ForkServer | None:
    """This worker's server for the case's flavour (started on first use), or None: the case runs as before."""
    if not SERVER_DIR or not forkable(case):
        return None
    flavour = flavour_of(case)
    servers = _local.__dict__.setdefault("servers", {})
    server = servers.get(flavour)
    if server is not None and _without_mark(server.env) != _without_mark(env):
        return None  # another environment than the server's (not expected of a forkable case): run as before
    if server is not None and server.proc.poll() is not None:  # the server ended: a new one
        _drop_server(server)
        server = None
    if server is None:
        if flavour in NO_SERVER:
            return None
        try:
            server = ForkServer(python_of(hb), hb, flavour.startswith("torch"), {**env, MARK: f"forkserver-{flavour}"},
                                str(SERVER_DIR[0]), ranks=flavour.endswith("-ranks"))
        except Unavailable as e:
            with _servers_lock:
                if flavour not in NO_SERVER:
                    NO_SERVER[flavour] = str(e)
                    print(f"note: no {flavour} fork server ({e}); its cases run as separate launches", flush=True)
            return None
        with _servers_lock:
            if not SERVER_DIR:  # the battery is ending (main closed the servers): none started now
                server.close()
                return None
            SERVERS.append(server)
        servers[flavour] = server
    return server


def _drop_server(server: ForkServer) -> None:
    server.close()
    servers = _local.__dict__.get("servers", {})
    for flavour, s in list(servers.items()):
        if s is server:
            del servers[flavour]


# --- files ------------------------------------------------------------------------------------------------------

def snapshot(folder: Path) -> dict[str, tuple[str, str]]:
    """relative path -> (kind, digest) of everything under folder, without following links, but for Python's
    bytecode caches (__pycache__: a plugin the case put there, imported by a Python that writes them)."""
    found: dict[str, tuple[str, str]] = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in dirs + files:
            path = Path(root) / name
            rel = str(path.relative_to(folder))
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", "")
            elif stat.S_ISREG(st.st_mode):
                if st.st_size > 64 * 1024 * 1024:  # a sparse giant made by a case: its size and mtime stand in
                    found[rel] = ("file", f"size={st.st_size} mtime={st.st_mtime_ns}")
                else:
                    h = hashlib.sha256()
                    with open(path, "rb") as f:
                        for block in iter(lambda: f.read(1 << 20), b""):
                            h.update(block)
                    found[rel] = ("file", h.hexdigest())
            else:
                found[rel] = ("special", oct(stat.S_IFMT(st.st_mode)))
    return found


def complete(path: Path) -> str | None:
    """Why a file a good run wrote is not a whole one (None: it is)."""
    name = path.name
    if any(marker in name for marker in TEMP_MARKERS) or (name.startswith(".") and name != ".keep"):
        return "a staged or temporary file"
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"unreadable ({e})"
    if name.endswith(".json"):
        try:
            json.loads(data)
        except ValueError as e:
            return f"not whole JSON ({e})"
    elif name.endswith(".jsonl"):
        if data and not data.endswith(b"\n"):
            return "a JSON-lines file without its last newline"
        for line in data.splitlines():
            try:
                json.loads(line)
            except ValueError as e:
                return f"a JSON line that does not parse ({e})"
    elif name.endswith(".csv"):
        if not data or not data.endswith(b"\n") or b"," not in data.split(b"\n", 1)[0]:
            return "an empty or unterminated CSV"
    elif name.endswith(".npy"):
        try:
            import numpy as np

            np.load(path, allow_pickle=False)
        except Exception as e:  # noqa: BLE001 - any failure to load is the finding
            return f"an .npy that does not load ({type(e).__name__})"
    elif name.endswith(".html"):
        if b"</html>" not in data[-4096:].lower():
            return "an HTML page without its end"
    return None


# --- one case ---------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    id: str
    command: str
    kind: str
    expect: str
    cmdline: str
    returncode: int | None = None
    seconds: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)
    stderr_tail: str = ""
    stdout_head: str = ""
    known: bool = False
    skipped: str = ""
    # a signal that reached its rank before hetbench's first line ran there (Python itself still starting: no
    # handler of hetbench's caught SIGTERM yet): judged by the start-up's own bound, see _judge_before_hetbench
    before_hetbench: bool = False

    @property
    def passed(self) -> bool:
        return not self.failures  # a skipped case (no tmpfs without root) is no failure: counted apart


def _fmt(text: str, subs: dict[str, str]) -> str:
    for key, value in subs.items():
        text = text.replace("{" + key + "}", value)
    return text


def run_case(case: Case, work: Path, hb: str, mpi: str | None) -> Outcome:
    folder = work / case.id
    folder.mkdir(parents=True)
    subs = {"d": str(folder), "data": str(REPO / "tests" / "data"), "repo": str(REPO)}
    args = [_fmt(a, subs) for a in case.argv]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_COMM_WORLD", "SLURM_", "HYDRA_"))}
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "COLUMNS": "100", "PYTHONUNBUFFERED": "1"})
    env.update({k: _fmt(v, subs) for k, v in case.env.items()})
    mark = f"{case.id}-{os.getpid()}-{time.monotonic_ns()}"
    env[MARK] = mark
    cmd = [python_of(hb) if case.program == "python" else hb, *args]
    if case.nprocs:
        if mpi is None:
            return Outcome(case.id, case.command, case.kind, case.expect, " ".join(cmd),
                           failures={"setup": "no mpiexec"})
        cmd = [mpi, "-n", str(case.nprocs), *cmd]
    shown = " ".join(cmd)
    if case.special == "pipe":
        shown += "  (stdout a pipe whose reader is gone)"
    elif case.special == "gone_cwd":
        shown = f"(cd DIR; rmdir DIR) && {shown}"
    elif case.special == "full":
        shown += "  (DIR/full: a tmpfs filled to the last byte)"
    elif case.special == "signal":
        rank, signum, when = case.signal
        shown += f"  ({signal.Signals(signum).name} to rank {rank} {when})"
    out = Outcome(case.id, case.command, case.kind, case.expect, shown, known=case.known)
    from cases import missing_needs  # what the case needs that this machine lacks (an OpenCL device, torch)

    lacking = missing_needs(case)
    if lacking:
        out.skipped = lacking
        return out
    mounted = None
    if case.special == "full":
        mounted = folder / "full"
        mounted.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mounted)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            out.skipped = f"no tmpfs for a full disk: {done.stderr.strip() or 'mount failed'} (needs root)"
            return out
    try:
        return _run_mounted(case, folder, out, cmd, env, mark, mounted)
    finally:
        if mounted is not None:
            if subprocess.run(["umount", str(mounted)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(mounted)], capture_output=True)


def _fill(folder: Path) -> None:
    """Fill the file system under folder to its last byte (a filler file that stays as it is)."""
    with open(folder / "filler.bin", "wb", buffering=0) as f:
        block = b"\0" * 4096
        try:
            while True:
                f.write(block)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0")
        except OSError:
            pass


def _run_mounted(case: Case, folder: Path, out: Outcome, cmd: list[str], env: dict[str, str], mark: str,
                 mounted: Path | None) -> Outcome:
    try:
        if case.setup:
            case.setup(folder)
        if mounted is not None:
            _fill(mounted)
    except Exception as e:  # noqa: BLE001
        out.failures["setup"] = f"{type(e).__name__}: {e}"
        return out
    before = snapshot(folder)
    cwd = folder
    if case.special == "gone_cwd":
        gone = folder / "gone"
        gone.mkdir()
        cmd = [sys.executable, "-c", "import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
               "os.execv(sys.argv[2], sys.argv[2:])", str(gone), *cmd]
        before = snapshot(folder)
        before.pop("gone", None)
    # stdout and stderr go to files, not pipes: a process left behind holding them cannot keep the case waiting
    # (it is found by its mark below)
    logs = folder.parent / f"{case.id}.out"
    logs.mkdir()
    out_file = open(logs / "stdout", "w+b")
    err_file = open(logs / "stderr", "w+b")
    stdout = out_file
    pipe_w = None
    if case.special == "pipe":
        pipe_r, pipe_w = os.pipe()
        os.close(pipe_r)  # the reader is gone before the first byte: every write is EPIPE
        stdout = pipe_w
    # a one-process case with nothing special done to it: a fork of a server that has imported hetbench (and
    # torch), running the same console script from its first line (forkserver.py); else a launch as ever
    server = server_for(case, env, cmd[3] if case.nprocs else cmd[0]) if case.program == "hetbench" else None
    start = time.monotonic()  # (a server's own start, on first use, is not the case's time)
    proc = None
    if server is not None and server.socket is not None:  # an MPI case: each rank a stub the server forks for
        cmd = [*cmd[:3], *server.stub_command(python_of(cmd[3])), *cmd[3:]]
        with _servers_lock:
            FORKED.add(case.id)
    elif server is not None:
        try:
            proc = server.start(cmd[1:], str(cwd), str(logs), env)
        except (ServerGone, subprocess.TimeoutExpired, OSError):  # nothing ran: the server is dropped
            _drop_server(server)
            server = None
            start = time.monotonic()
        else:
            with _servers_lock:
                FORKED.add(case.id)
    if proc is None:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=err_file, start_new_session=True)
    if pipe_w is not None:
        os.close(pipe_w)
    signalled_at = None
    if case.special == "signal":
        signalled_at = _send_signal(case, proc, out, mark, logs)
    hang = None
    try:
        proc.wait(timeout=case.timeout)
    except subprocess.TimeoutExpired:
        hang = f"still running after {case.timeout:.0f} s: killed"
        if server is not None:
            proc.kill()  # the child, the group it made, and what is under its server
        kill_case(mark, server)
        proc.wait()
    out.seconds = time.monotonic() - start
    out.returncode = proc.returncode
    # orphans: whatever of the session outlives the launcher
    deadline = time.monotonic() + ORPHAN_GRACE
    while case_members(mark, server) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = kill_case(mark, server)
    if left:
        out.failures["orphan"] = f"{len(left)} process(es) of the case still alive {ORPHAN_GRACE:.0f} s after it ended"
    out_file.seek(0)
    err_file.seek(0)
    o, e = out_file.read(), err_file.read()
    out_file.close()
    err_file.close()
    shutil.rmtree(logs, ignore_errors=True)
    stdout_text = (o or b"").decode("utf-8", "replace")
    stderr_text = (e or b"").decode("utf-8", "replace")
    out.stderr_tail = stderr_text[-1500:]
    out.stdout_head = stdout_text[:300]
    if hang:
        out.failures["hang"] = hang
    if signalled_at is not None and hang is None:
        took = (start + out.seconds) - signalled_at
        # before hetbench's first line ran on the rank, its peers wait in MPI_Init for the watchdog's --timeout
        bound = END_SECONDS + (_timeout_of(case) if out.before_hetbench else 0.0)
        if took > bound:
            out.failures["hang"] = f"ended {took:.1f} s after the signal (bound {bound:.0f} s)"
    if "signal_missed" in out.failures and case.signal[2].startswith("end:") and out.returncode == 0:
        # a shutdown case whose job ended first (25-65 ms after its last line): it tested nothing; said as a skip
        out.skipped = out.failures.pop("signal_missed")
        return out
    if "signal_missed" in out.failures:
        out.failures["setup"] = out.failures.pop("signal_missed")
    if case.expect == "signal" and out.before_hetbench and "interrupted by" not in stderr_text:
        _judge_before_hetbench(out, stdout_text, stderr_text)
        _judge_files(case, folder, before, out)
        return out
    if TRACEBACK in stderr_text or TRACEBACK in stdout_text:
        out.failures["traceback"] = "a Python traceback on " + ("stderr" if TRACEBACK in stderr_text else "stdout")
    _judge_crash(out, stdout_text, stderr_text)
    if case.expect == "batch":  # its cases are judged by their own lines (split_batch)
        BATCH_STDOUT[case.id] = stdout_text
        return out
    if case.expect == "raises":
        _judge_raises(case, out, stdout_text, stderr_text)
        _judge_files(case, folder, before, out)
        return out
    _judge_exit_and_message(case, out, stdout_text, stderr_text)
    for needle in case.out_needles:  # what a good run must say (a broken plugin named in `devices`)
        if needle not in stdout_text + stderr_text:
            out.failures.setdefault("message", f"the output lacks {needle!r}")
    _judge_files(case, folder, before, out)
    return out


def _send_signal(case: Case, proc: subprocess.Popen, out: Outcome, mark: str, logs: Path) -> float | None:
    """Find the target rank's process, wait as the case says, signal it; returns when it was signalled.
    when: "early" (the first half second), "late" (after the handlers are in place, while it runs), "at:S" (S
    seconds after the rank's process showed), "end:S" (S seconds after the run's last line, "results written
    to", reached stdout: the job shutting down)."""
    rank, signum, when = case.signal
    rng = random.Random(case.id)
    deadline = time.monotonic() + 30
    pid = None
    while time.monotonic() < deadline and proc.poll() is None:
        if not case.nprocs:
            pid = proc.pid  # the hetbench process itself
            break
        pid = next((p for p in members(mark) if rank_of(p) == rank), None)
        if pid is not None:
            break
        time.sleep(0.002)
    if pid is None:
        out.failures["signal_missed"] = "the rank's process never showed (the job ended or did not start)"
        return None
    if when == "early":  # within its first half second, handlers in place or not
        time.sleep(rng.uniform(0.0, 0.5))
    elif when.startswith("at:"):  # this long after the rank's process showed
        time.sleep(float(when[3:]))
    elif when.startswith("end:"):  # this long after the job's last line: in its shutdown
        while proc.poll() is None and time.monotonic() < deadline + 60:
            try:
                if b"results written to" in (logs / "stdout").read_bytes():
                    break
            except OSError:
                pass
            time.sleep(0.002)
        time.sleep(float(when[4:]))
    else:  # after its handlers are in place, while it runs
        while not handles_sigterm(pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.5, 2.5))
    if proc.poll() is not None or (_stat_fields(pid) or ["Z"])[0] == "Z":  # gone, or a zombie: nothing can catch it
        out.failures["signal_missed"] = "the job (or the rank) ended before the signal"
        return None
    # hetbench/__main__.py holds SIGINT and SIGTERM from its first line; Python alone catches SIGINT only
    out.before_hetbench = not handles_sigterm(pid)
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        out.failures["signal_missed"] = "the rank was gone before the signal"
        return None
    if when.startswith("end:") and _ignores(pid, signum):  # past hetbench's last check (signals.finish): the process was ending, as if gone
        out.failures["signal_missed"] = "the rank was past its last check, ending (the signal ignored)"
        return None
    return time.monotonic()


def _ignores(pid: int, signum: int) -> bool:
    """Whether the process ignores SIGNUM (SigIgn in /proc; False where it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = int(next((line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), "0"), 16)
    return bool(ignored & (1 << (signum - 1)))


def _timeout_of(case: Case) -> float:
    """The --timeout a case gives its command (0 where none)."""
    args = list(case.argv)
    return float(args[args.index("--timeout") + 1]) if "--timeout" in args else 0.0


def _judge_before_hetbench(out: Outcome, stdout: str, stderr: str) -> None:
    """A signal to a rank whose Python had not yet run hetbench's first line (hetbench/__main__.py holds the
    signals from there on): no program handles it there, the signal's default action does, SIGTERM ending the rank
    and SIGINT raising Python's KeyboardInterrupt in its own start-up. What the issue asks of that instant is a
    start-up that cannot deadlock: the job must end within the bound (the hang check above) and not with 0, and any
    traceback must be Python's own start-up's, holding no frame of hetbench's: one there is hetbench's fault."""
    if out.returncode == 0:
        out.failures["exit"] = "exit 0 after a signal"
    for text, where in ((stderr, "stderr"), (stdout, "stdout")):
        if TRACEBACK in text and (f'File "{PACKAGE_DIR}{os.sep}' in text or "KeyboardInterrupt" not in text):
            out.failures["traceback"] = f"a traceback on {where} that is not Python's own start-up's"


def _judge_crash(out: Outcome, stdout: str, stderr: str) -> None:
    """An MPI crash dump or a process ended by an abort or a segfault."""
    for marker in CRASH_TEXT:
        if marker in stderr or marker in stdout:
            where = "stderr" if marker in stderr else "stdout"
            out.failures["crash"] = f"an MPI crash dump ({marker.strip()!r} on {where})"
            return
    if out.returncode in CRASH_CODES:
        out.failures["crash"] = f"ended by a crash (exit {out.returncode})"


def _judge_raises(case: Case, out: Outcome, stdout: str, stderr: str) -> None:
    """A library call misused from a user's script (tests/hostile/lib_cases.py): every rank must raise one
    exception, and the script, which catches it, print `rank R raised TYPE: MESSAGE` once per rank, each message one
    line; the script then ends with 0. A rank that printed `rank R did not raise` went on as if nothing were wrong."""
    ranks = case.nprocs or 1
    lines = [line for line in stdout.splitlines() if line.strip()]
    raised: dict[int, list[str]] = {}
    quiet = []
    other = []
    for line in lines:
        m = RAISED_LINE.match(line)
        if m:
            raised.setdefault(int(m.group(1)), []).append(m.group(3))
        elif NOT_RAISED_LINE.match(line):
            quiet.append(int(NOT_RAISED_LINE.match(line).group(1)))
        elif line.startswith("WRONG:"):  # the script's own verdict: the group broken after the error
            out.failures["silent"] = line[:200]
        else:
            other.append(line)
    if quiet:
        out.failures["silent"] = f"rank(s) {sorted(quiet)} did not raise: the call went on"
    missing = [r for r in range(ranks) if r not in raised and r not in quiet]
    twice = [r for r, msgs in raised.items() if len(msgs) > 1]
    if missing and "hang" not in out.failures:
        out.failures["message"] = f"rank(s) {missing} printed no line"
    elif missing:
        out.failures["hang"] += f"; rank(s) {missing} never raised"
    if twice:
        out.failures.setdefault("message", f"rank(s) {twice} printed more than one line")
    bad = [m for msgs in raised.values() for m in msgs
           if not m.strip() or any(x in m for x in ("error stack", "Fatal error", "Traceback"))]
    if bad:
        out.failures.setdefault("message", f"a message that is empty or carries MPI's stack: {bad[0][:120]!r}")
    if other:
        out.failures.setdefault("message", f"{len(other)} line(s) besides the ranks' own (a message of several "
                                           f"lines?): {other[0][:120]!r}")
    if out.returncode != 0 and "hang" not in out.failures:
        out.failures["exit"] = f"exit {out.returncode}, expected 0 (the script catches the exception)"
    for needle in case.needles:
        if raised and not all(needle in msgs[0] for msgs in raised.values()):
            out.failures.setdefault("message", f"a rank's message lacks {needle!r}")


def _judge_exit_and_message(case: Case, out: Outcome, stdout: str, stderr: str) -> None:
    # MPICH's MPI_Abort says "Abort(N) on node R (rank R in comm 0): application called MPI_Abort(...)" itself
    # after the rank's own line, and its mpiexec says "[mpiexec@host] ..." of its own troubles (a deleted working
    # directory) before any rank starts: the launcher's and the library's lines, not hetbench's, left out
    lines = [line for line in stderr.splitlines() if line.strip() and not LAUNCHER_LINE.match(line)]
    errors = [line for line in lines if line.startswith("Error:")]
    rc = out.returncode
    one_line = len(lines) == 1 and len(errors) == 1

    def need_one_line(what: str) -> None:
        if not one_line:
            out.failures["message"] = f"{what}: {len(lines)} stderr line(s), {len(errors)} 'Error:' line(s)"
        else:
            for needle in case.needles:
                if needle not in errors[0]:
                    out.failures["message"] = f"the line lacks {needle!r}"

    if case.expect == "usage":
        if rc != 2:
            out.failures["exit"] = f"exit {rc}, expected 2 (bad input)"
        need_one_line("bad input must say one line")
        if stdout.strip():
            out.failures.setdefault("message", "bad input printed on stdout")
    elif case.expect == "fail":  # a fault while running (a full disk): exit 1, one line, nothing half-written
        if rc not in (1, 2):
            out.failures["exit"] = f"exit {rc}, expected 1 (a failure while running) or 2"
        errors_only = [line for line in lines if line.startswith("Error:")]
        if len(errors_only) != 1:
            out.failures["message"] = f"a failure must say one line: {len(errors_only)} 'Error:' line(s)"
    elif case.expect == "ok":
        if rc != 0:
            out.failures["exit"] = f"exit {rc}, expected 0"
            # a library script's own verdict (tests/hostile/lib_cases.py exits 4 on a silent wrong state)
            wrong = [line for line in stdout.splitlines() if line.startswith("WRONG:")]
            if case.program == "python" and wrong:
                out.failures["silent"] = wrong[0][:300]
    elif case.expect == "ok_or_usage":
        if rc == 2:
            need_one_line("refused input must say one line")
        elif rc != 0:
            out.failures["exit"] = f"exit {rc}, expected 0 or 2"
    elif case.expect == "signal":
        rank, signum, when = case.signal
        name = signal.Signals(signum).name
        late = [line for line in lines
                if line.startswith(f"Note: rank {rank} (") and f"got {name} after the job" in line]
        if when.startswith("end:") and case.nprocs and rc == 0 and late and len(lines) == 1:
            return  # it came once MPI_Finalize had begun: the job had ended, and the rank said so (docs/matmul.md)
        if rc != 128 + signum:
            out.failures["exit"] = f"exit {rc}, expected {128 + signum}"
        name = signal.Signals(signum).name
        need_one_line("a signal must end with one line")
        if one_line and (f"interrupted by {name}" not in errors[0]
                         or (case.nprocs and f"rank {rank} (" not in errors[0])):
            out.failures["message"] = f"the line does not say rank {rank} was interrupted by {name}"
    elif case.expect == "pipe":
        # hetbench ends quietly by SIGPIPE, as `yes | head -1` and mpiexec do (a shell says 141)
        if rc not in (-signal.SIGPIPE, 128 + signal.SIGPIPE):
            out.failures["exit"] = f"exit {rc}, expected the end by SIGPIPE (-13, or 141 from a shell)"
        if lines:
            out.failures["message"] = f"a closed stdout ends quietly; said {len(lines)} line(s)"
    else:
        raise ValueError(case.expect)


def _judge_files(case: Case, folder: Path, before: dict, out: Outcome) -> None:
    after = snapshot(folder)
    def may(p: str) -> bool:  # a name the case lets change (a pattern: cache/opencl-gemm-*.json)
        return any(fnmatch.fnmatchcase(p, pattern) for pattern in case.may_change)

    lost = [p for p, v in before.items() if not may(p) and after.get(p) != v
            and not (v[0] == "dir" and after.get(p, ("",))[0] == "dir")]
    if lost:
        out.failures["lost"] = "changed or gone: " + ", ".join(sorted(lost)[:5])
    new = sorted(p for p in after if p not in before or (may(p) and after[p] != before.get(p)))
    if case.expect in ("usage", "signal", "fail") or (case.expect == "ok_or_usage" and out.returncode == 2):
        # an empty folder (results/ made before the refusal) is no file: tests/helpers.assert_usage_error allows it
        written = [p for p in new if after[p][0] != "dir"]
        if case.expect in ("signal", "fail"):  # committed files may stay; only half or staged ones are findings
            written = [p for p in new if after[p][0] == "file" and complete(folder / p)]
        if written:
            out.failures["partial"] = "written on refused input: " + ", ".join(written[:5]) \
                if case.expect not in ("signal", "fail") else "half or staged: " + ", ".join(written[:5])
    else:
        if out.returncode == 0:
            missing = [p for p in case.outputs if p not in after]
            if missing:
                out.failures["partial"] = "a good run left out: " + ", ".join(missing)
                return
        bad = [f"{p} ({why})" for p in new if after[p][0] == "file" and (why := complete(folder / p))]
        if bad:
            out.failures["partial"] = "; ".join(bad[:3])


# --- batches: cases sharing one launch ---------------------------------------------------------------------------

BATCH_STDOUT: dict[str, str] = {}  # a batch launch's stdout, for split_batch
BATCH_SECONDS = 8.0  # a batched case's share of its launch's timeout, beyond one case's


def batch_launches(cases: list[Case]) -> tuple[list[Case], dict[str, list[Case]]]:
    """The launches to run: every unbatched case, and one per batch and rank count, whose argv names its cases
    (`SCRIPT --batch NAME...`); and each launch's cases by its id."""
    groups: dict[tuple[str, int | None], list[Case]] = {}
    launches: list[Case] = []
    for case in cases:
        if case.batch is None:
            launches.append(case)
        else:
            groups.setdefault((case.batch, case.nprocs), []).append(case)
    members: dict[str, list[Case]] = {}
    for (batch, nprocs), group in groups.items():
        first = group[0]
        launch = Case(f"{batch}-batch-{nprocs}", first.command, first.kind, [first.argv[0], "--batch",
                                                                             *(c.argv[1] for c in group)],
                      expect="batch", nprocs=nprocs, program=first.program, needs=first.needs,
                      timeout=first.timeout + BATCH_SECONDS * (len(group) - 1))
        launches.append(launch)
        members[launch.id] = group
    return launches, members


def split_batch(launch: Outcome, group: list[Case]) -> list[Outcome]:
    """Each case of a batch launch judged by its own lines ("NAME: ..."): as it would be alone (_judge_raises;
    an "ok" case by its WRONG lines), and every failure of the launch itself (a hang, an orphan, a traceback, a crash)
    charged to each."""
    stdout = BATCH_STDOUT.pop(launch.id, "")
    outs = []
    for case in group:
        name = case.argv[1]
        mine = "\n".join(line[len(name) + 2:] for line in stdout.splitlines() if line.startswith(f"{name}: "))
        out = Outcome(case.id, case.command, case.kind, case.expect, f"{launch.cmdline}  [its case {name}]",
                      returncode=launch.returncode, seconds=launch.seconds / len(group),
                      failures=dict(launch.failures), stderr_tail=launch.stderr_tail, stdout_head=mine[:300],
                      skipped=launch.skipped)
        wrong = [line for line in mine.splitlines() if line.startswith("WRONG:")]
        out.returncode = 4 if wrong else (0 if launch.returncode in (0, 4) else launch.returncode)
        if case.expect == "raises":
            _judge_raises(case, out, mine, "")
        elif wrong:
            out.failures["silent"] = wrong[0][:300]
        elif out.returncode != 0 and "hang" not in out.failures:
            out.failures["exit"] = f"exit {out.returncode}, expected 0"
        outs.append(out)
    return outs


# --- the battery ------------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="cases at a time (default 2)")
    parser.add_argument("--only", default=None, help="run the cases whose id contains this (comma: any of these)")
    parser.add_argument("--failed-from", default=None, metavar="REPORT",
                        help="run only the cases that failed in this earlier JSON report")
    parser.add_argument("--report", default=str(REPO / "results" / "hostile-report.json"),
                        help="write the JSON report here (default: results/hostile-report.json)")
    parser.add_argument("--keep", action="store_true", help="keep the cases' folders")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    opts = parser.parse_args()
    if opts.jobs < 1:
        parser.error("--jobs must be >= 1")
    unignore_sigint()  # the signal cases need SIGINT handled in what they launch, as from a terminal
    hb, mpi = find_tools()
    cases = build_cases()
    ids = [c.id for c in cases]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        sys.exit(f"battery: duplicate case ids: {sorted(dupes)}")
    if opts.only:
        cases = [c for c in cases if any(part in c.id for part in opts.only.split(","))]
    if opts.failed_from:
        failed_before = {o["id"] for o in json.loads(Path(opts.failed_from).read_text())["outcomes"]
                         if not o["passed"]}
        cases = [c for c in cases if c.id in failed_before]
    if opts.list:
        for c in cases:
            print(f"{c.id:60} {c.command:12} {c.kind:10} {c.expect}")
        print(f"{len(cases)} cases")
        return 0
    segments_before = shm_segments()  # those its killed jobs leave are removed at the end
    work = Path(tempfile.mkdtemp(prefix="hetbench-hostile-"))
    (work / "_forkservers").mkdir()
    SERVER_DIR.append(work / "_forkservers")
    print(f"hostile battery: {len(cases)} cases, {opts.jobs} at a time, hetbench {hb}, mpiexec {mpi}, in {work}",
          flush=True)
    from cases import prepare  # templates (a checkpoint, a profile) made once

    prepare(work / "_templates", hb, cases)
    launches, batched = batch_launches(cases)
    launches.sort(key=lambda c: c.id not in batched)  # the long batch launches first
    started = time.monotonic()
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def one(case: Case) -> None:
        try:
            result = run_case(case, work, hb, mpi)
        except Exception as e:  # noqa: BLE001 - a battery bug is a failed case, not a lost run
            result = Outcome(case.id, case.command, case.kind, case.expect, " ".join(case.argv),
                             failures={"setup": f"battery error: {type(e).__name__}: {e}"})
        results = split_batch(result, batched[case.id]) if case.id in batched else [result]
        with lock:
            for result in results:
                outcomes.append(result)
                mark = "ok  " if result.passed else ("KNOWN" if result.known else "FAIL")
                if result.skipped:
                    print(f"SKIP {result.id}: {result.skipped}", flush=True)
                if not result.passed:
                    print(f"{mark} {result.id} ({result.seconds:.1f} s): "
                          + "; ".join(f"{k}: {v}" for k, v in result.failures.items()), flush=True)
                if len(outcomes) % 50 == 0:
                    print(f"  ... {len(outcomes)}/{len(cases)} done, {time.monotonic() - started:.0f} s", flush=True)

    try:
        with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
            list(pool.map(one, launches))
    finally:  # no fork server left running, no full-disk tmpfs left mounted, whatever stopped the run
        with _servers_lock:
            SERVER_DIR.clear()  # no server started from here on
            running = list(SERVERS)
        for server in running:
            server.close()
        for line in Path("/proc/mounts").read_text().splitlines():
            target = line.split()[1] if len(line.split()) > 1 else ""
            if target.startswith(str(work) + "/"):
                subprocess.run(["umount", "-l", target], capture_output=True)
        remove_left_segments(segments_before)
    wall = time.monotonic() - started
    outcomes.sort(key=lambda o: ids.index(o.id))
    failed = [o for o in outcomes if not o.passed]
    skipped = [o for o in outcomes if o.skipped]
    counts = {"cases": len(outcomes), "passes": len(outcomes) - len(failed) - len(skipped), "failed": len(failed),
              "skipped": len(skipped)}
    for cat in CATEGORIES:
        counts[cat] = sum(cat in o.failures for o in outcomes)
    by: dict[str, dict[str, int]] = {}
    for o in outcomes:
        by.setdefault(o.command, {}).setdefault(o.kind, 0)
        by[o.command][o.kind] += 1
    print()
    print("cases per command and kind:")
    for command in sorted(by):
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(by[command].items()))
        print(f"  {command:12} {sum(by[command].values()):4}  ({kinds})")
    print()
    labels = {"hang": "hangs", "traceback": "tracebacks", "crash": "crash dumps", "silent": "silent wrong states",
              "exit": "wrong exit codes",
              "message": "multi-line/missing messages", "lost": "lost files", "partial": "partial files",
              "orphan": "orphan processes", "setup": "cases that could not run"}
    early = [o for o in outcomes if o.before_hetbench and o.command]
    counts["signalled_before_hetbench"] = len(early)
    counts["forked"] = sum(o.id in FORKED for o in outcomes)
    print(f"cases {counts['cases']}, passes {counts['passes']}, failed {counts['failed']}, skipped "
          f"{counts['skipped']}; wall {wall:.0f} s; {counts['forked']} forked from a preloaded server")
    if early:
        print(f"  of the signal cases, {len(early)} reached their rank before hetbench's first line ran there "
              "(Python starting): judged as a start-up that cannot deadlock (ended in bound, not 0, no traceback of "
              "hetbench's), not by the one-line rule: " + ", ".join(o.id for o in early))
    print("  " + ", ".join(f"{labels[c]} {counts[c]}" for c in CATEGORIES))
    if skipped:
        print(f"!!! {len(skipped)} case(s) SKIPPED, not run: " + "; ".join(sorted({o.skipped for o in skipped})))
    known = [o for o in failed if o.known]
    if known:
        print()
        print("!" * 100)
        print(f"!!! {len(known)} KNOWN FAILURE(S), listed in tests/hostile/cases.py KNOWN: still open, still failures")
        for o in known:
            print(f"!!!   {o.id}: " + "; ".join(f"{k}: {v}" for k, v in o.failures.items()))
        print("!" * 100)
    if failed:
        print()
        print("failed cases:")
        for o in failed:
            print(f"  {o.id}: {o.cmdline}")
            print("    " + "; ".join(f"{k}: {v}" for k, v in o.failures.items()))
            tail = " | ".join(line for line in o.stderr_tail.splitlines()[-3:] if line.strip())
            if tail:
                print(f"    stderr: {tail[:400]}")
    report = {"counts": counts, "wall_seconds": round(wall, 1), "per_command": by,
              "outcomes": [asdict(o) | {"passed": o.passed} for o in outcomes]}
    path = Path(opts.report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"report: {path}")
    if not opts.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
