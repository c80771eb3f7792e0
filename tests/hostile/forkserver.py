"""The hostile battery's fork server: one process that has imported hetbench's command line (and, for the torch
cases, torch and hetbench's torch trainer: some 2.6 s of CPU a case) and forks a child per case. The child is what
`SCRIPT ARGS` (the `hetbench` console script) started by subprocess would be: a session of its own (as
start_new_session), its own folder, stdin /dev/null, stdout and stderr to files, fresh standard streams made as
Python makes them at start-up (PYTHONUNBUFFERED honoured), and the script run from its first line through runpy,
so hetbench/__main__.py and its exit path run as always; it exits as that interpreter would. Only the modules
imported here before the fork are not imported again: the battery sends only cases whose environment is the
server's (but for the case's mark), with no signal, special stdout or wrapper (battery.py `forkable`).

The server is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever a child leaves behind is re-parented here, not
to init, so the battery finds a case's processes as this server's descendants (a forked child's /proc/PID/environ
is the server's, without the case's mark). It serves one case at a time (the battery starts one per worker).

Protocol (one JSON object a line; requests on stdin, replies on stdout): first {"ready": PID} once the imports are
done (or the server exits non-zero), then per request {"argv": [...], "cwd": DIR, "out": DIR, "env": {...}} ->
{"pid": PID}, then {"status": RETURNCODE} (negative: the signal that ended it, as subprocess says). EOF on stdin
ends the server.

With --ranks SOCKET it serves the ranks of MPI cases instead: mpiexec starts tests/hostile/rank_stub.py as each
rank, which connects to SOCKET (AF_UNIX, SOCK_SEQPACKET) and sends its argv, folder, environment, CPU affinity and
open descriptors (its stdio and MPICH's PMI_FD); the server forks the rank's child at once (a job's ranks together),
puts those descriptors on their numbers, and sends the stub {"pid": PID}, then {"status": RETURNCODE}; the stub
forwards the signals it gets ({"signal": N}) and exits as the child did. A stub gone (killed by mpiexec on an
abort) is a child SIGKILLed: no rank outlives its launch. MPI itself starts in the child, never in the server.
The test suite's torch batch jobs use this mode too (tests/helpers.py `_RankServers`).

Usage: python forkserver.py SCRIPT [--torch] [--ranks SOCKET]   (the battery's ForkServer class starts it)
"""

from __future__ import annotations

import ctypes
import fcntl
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
READY_SECONDS = 180.0  # torch's import on a loaded 2-core machine


# --- the server (its own process) --------------------------------------------------------------------------------

def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def _serve(requests, replies) -> dict:
    """Answer requests until stdin closes (then exit); in a forked child, return its request."""
    for line in requests:
        request = json.loads(line)
        _reap()
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            return request
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        while True:  # the case's child; what it left behind and re-parented here is reaped on the way
            got, status = os.waitpid(-1, 0)
            if got == pid:
                break
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        replies.write(json.dumps({"status": code}) + "\n")
        replies.flush()
    sys.exit(0)


def _reap() -> None:
    """Collect the zombies of earlier cases' leftovers (killed by the battery)."""
    while True:
        try:
            got, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if got == 0:
            return


def _serve_ranks(requests, replies, listener: socket.socket) -> tuple[dict, list[int]]:
    """Fork a child per connecting rank stub and answer its stub until stdin closes (then exit); in a forked child,
    return its request and the descriptors received."""
    stubs: dict[int, list] = {}  # stub socket's fd -> [socket, child pid, stub still connected]
    exits: dict[int, int] = {}  # pidfd -> stub socket's fd
    while True:
        watched = [requests.fileno(), listener.fileno(), *exits, *(fd for fd, s in stubs.items() if s[2])]
        for fd in select.select(watched, [], [], None if stubs else 1.0)[0]:
            if fd == requests.fileno():
                if not os.read(fd, 4096):  # the battery closed stdin: the end
                    sys.exit(0)
            elif fd == listener.fileno():
                stub = listener.accept()[0]
                message, fds, _, _ = socket.recv_fds(stub, 1 << 20, 64)
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in stubs.values():
                        other[0].close()
                    requests.close()
                    replies.close()
                    return json.loads(message), fds
                for received in fds:
                    os.close(received)
                try:
                    stub.send(json.dumps({"pid": pid}).encode())
                except OSError:  # the stub already gone: so is its rank (reported to no one)
                    os.kill(pid, signal.SIGKILL)
                stubs[stub.fileno()] = [stub, pid, True]
                exits[os.pidfd_open(pid)] = stub.fileno()
            elif fd in exits:  # a child ended: its status to its stub
                stub, pid, connected = stubs.pop(exits.pop(fd))
                os.close(fd)
                status = os.waitpid(pid, 0)[1]
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                if connected:
                    try:
                        stub.send(json.dumps({"status": code}).encode())
                    except OSError:
                        pass
                stub.close()
            else:  # a stub forwards a signal, or is gone (mpiexec killed it): its child is killed with it
                entry = stubs[fd]
                data = entry[0].recv(4096)
                signum = json.loads(data)["signal"] if data else signal.SIGKILL
                entry[2] = bool(data)
                try:
                    os.kill(entry[1], signum)
                except ProcessLookupError:
                    pass
        if not stubs:
            _reap()


def _rank_child(request: dict, fds: list[int], script: str) -> None:
    """Become the rank the stub stands for: its descriptors on their numbers (no other open), its CPUs, then the
    script as _child runs it."""
    targets = request["fds"]
    above = max([*targets, *fds, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(moved, targets):
        os.dup2(fd, target)
        os.close(fd)
    keep = set(targets)
    for entry in os.listdir("/proc/self/fd"):
        if int(entry) not in keep:
            try:
                os.close(int(entry))
            except OSError:
                pass
    os.sched_setaffinity(0, request["affinity"])
    _run_script(request, script)


def _stdio(fd: int, write: bool, like: io.TextIOWrapper, name: str, buffered: bool) -> io.TextIOWrapper:
    """A standard stream on fd as Python's start-up makes it (Python/pylifecycle.c create_stdio): unbuffered and
    write-through under PYTHONUNBUFFERED, line-buffered where a tty or stderr, the server's encoding and errors."""
    buf = io.open(fd, "wb" if write else "rb", -1 if buffered or not write else 0, closefd=False)
    raw = buf if isinstance(buf, io.FileIO) else buf.raw
    raw.name = name
    line_buffering = buffered and (raw.isatty() or fd == 2)
    stream = io.TextIOWrapper(buf, like.encoding, like.errors, "\n", line_buffering, not buffered)
    stream.mode = "w" if write else "r"
    return stream


def _child(request: dict, script: str) -> None:
    os.setsid()  # as subprocess's start_new_session
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(os.path.join(request["out"], "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(os.path.join(request["out"], "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    _run_script(request, script)


def _run_script(request: dict, script: str) -> None:
    """Fresh standard streams on descriptors 0-2, the request's environment, folder and argv, then the script."""
    # buffered or not as the server's own start-up made its streams (PYTHONUNBUFFERED, -u: write-through then)
    buffered = not sys.__stdout__.write_through
    sys.stdin = sys.__stdin__ = _stdio(0, False, sys.__stdin__, "<stdin>", buffered)
    sys.stdout = sys.__stdout__ = _stdio(1, True, sys.__stdout__, "<stdout>", buffered)
    sys.stderr = sys.__stderr__ = _stdio(2, True, sys.__stderr__, "<stderr>", buffered)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [script, *request["argv"]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    _script = sys.argv[1]
    # sys.path as the script's own interpreter has it: its folder first (imports below see what the case would)
    sys.path[0] = os.path.dirname(os.path.realpath(_script))
    _requests = os.fdopen(os.dup(0), "r")
    _replies = os.fdopen(os.dup(1), "w")
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the battery gone, so is the server (a child's setting is reset)
    import runpy

    import hetbench.cli  # noqa: F401 - the import every command pays, paid here once

    if "--torch" in sys.argv[2:]:
        import torch  # noqa: F401
        import hetbench.train.torch_frontend.run  # noqa: F401 - what `train --frontend torch` imports (torch.distributed too)
        # and what its run imports on the way (FSDP2, DTensor, dynamo and its sympy, the checkpoint's writer): a
        # forked torch case then takes 0.26 s of CPU, not 1.5 s
        import torch._dynamo  # noqa: F401
        import torch.distributed.checkpoint  # noqa: F401
        import torch.distributed.fsdp  # noqa: F401
        import torch.distributed.tensor  # noqa: F401
    # the console script imports hetbench.__main__, whose first lines hold the signals: it must run in the child
    sys.modules.pop("hetbench.__main__", None)
    import gc

    gc.freeze()  # what was imported here is never walked by a child's collections (cli_forkserver.py says why)
    _listener = None
    if "--ranks" in sys.argv[2:]:
        _listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        _listener.bind(sys.argv[sys.argv.index("--ranks") + 1])
        _listener.listen(16)
    _replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    _replies.flush()
    if _listener is None:
        _child(_serve(_requests, _replies), _script)
    else:
        _rank_child(*_serve_ranks(_requests, _replies, _listener), _script)


# --- the battery's side -------------------------------------------------------------------------------------------

class Unavailable(Exception):
    """The server could not start (torch missing, a warning at import, ...): its cases run as before."""


class ServerGone(Exception):
    """The server ended while serving a case."""


class ForkServer:
    """A running server (one per battery worker and flavour); start() forks a case's child."""

    def __init__(self, python: str, script: str, torch: bool, env: dict[str, str], folder: str, ranks: bool = False):
        self.env = env
        name = f"server-{os.getpid()}-{time.monotonic_ns()}"
        self.err_path = os.path.join(folder, f"{name}.err")
        # ranks: the socket its rank stubs connect to (a short path: AF_UNIX allows 107 bytes)
        self.socket = os.path.join(folder, f"{name}.sock") if ranks else None
        self._buf = b""
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([python, os.path.abspath(__file__), script, *(["--torch"] if torch else []),
                                          *(["--ranks", self.socket] if ranks else [])],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                                         cwd=folder, start_new_session=True)
        self.pid = self.proc.pid
        try:
            ready = self._reply(READY_SECONDS)
        except (ServerGone, subprocess.TimeoutExpired) as e:
            self.close()
            raise Unavailable(f"{type(e).__name__}: {self._err_tail()}") from None
        # anything the imports said (a warning) would be on every real case's stderr: then no server at all
        if "ready" not in ready or os.path.getsize(self.err_path):
            self.close()
            raise Unavailable(f"the preload said something: {self._err_tail()}")

    def stub_command(self, python: str) -> list[str]:
        """What mpiexec runs as each rank in place of the rank's own command (a --ranks server's): the rank's
        command follows it."""
        assert self.socket is not None, "a server started without ranks=True"
        return [python, "-I", "-S", os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_stub.py"),
                self.socket]

    def _err_tail(self) -> str:
        try:
            with open(self.err_path, "rb") as f:
                return f.read()[-400:].decode("utf-8", "replace").strip() or "(nothing on stderr)"
        except OSError:
            return "(no stderr)"

    def _reply(self, timeout: float | None) -> dict:
        """The next reply line; subprocess.TimeoutExpired past timeout, ServerGone on EOF."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                raise subprocess.TimeoutExpired("fork server", timeout)
            data = os.read(fd, 65536)
            if not data:
                raise ServerGone(f"the fork server (pid {self.pid}) ended: {self._err_tail()}")
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def start(self, argv: list[str], cwd: str, out: str, env: dict[str, str]) -> "ForkedProcess":
        self.proc.stdin.write((json.dumps({"argv": argv, "cwd": cwd, "out": out, "env": env}) + "\n").encode())
        self.proc.stdin.flush()
        return ForkedProcess(self, self._reply(30.0)["pid"])

    def descendants(self) -> list[int]:
        """Live (not zombie) processes under the server: the case's child and what it left (re-parented here)."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                text = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2:].split()
            children.setdefault(int(fields[1]), []).append((int(entry), fields[0] == "Z"))
        found, todo = [], [self.pid]
        while todo:  # through zombies too (a parent not yet reaped), listing only the live
            for pid, zombie in children.get(todo.pop(), []):
                if not zombie:
                    found.append(pid)
                todo.append(pid)
        return found

    def close(self) -> None:
        """End the server and whatever is under it."""
        for pid in self.descendants():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class ForkedProcess:
    """What the battery needs of a Popen for a forked case: pid, returncode, poll() and wait(timeout)."""

    def __init__(self, server: ForkServer, pid: int):
        self.server = server
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server._reply(timeout)["status"]
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the child, the process group it made (its session's), and everything under the server."""
        for pid in [self.pid, *self.server.descendants()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
