"""A fork server for tests/helpers.py's run_python: one process that has imported hetbench's command line (NumPy,
click, the benchmarks: about 0.3 s of every `python -m hetbench` on the 2-core CI machine) and forks a child per
command. Each child is a process of its own, as `python -m hetbench ARGS` started by subprocess would be: it runs
`-m hetbench` (or `-c CODE`, or a script) through runpy from its first line, in its own folder, stdin /dev/null,
stdout and stderr to files, and exits as that interpreter would (SystemExit, atexit handlers, flushed streams).
What differs is only that the modules imported here before the fork are not imported again: run_python uses this
server only where the command's environment is exactly the one the server started with (a variable read at import
would otherwise be read with another value), and never under mpiexec.

Protocol (stdin/stdout, one JSON object a line): {"argv": [...], "cwd": DIR, "out": DIR, "env": {...}} -> {"pid": PID}, then
{"status": RETURNCODE} (negative: the signal that ended it, as subprocess says).
"""

from __future__ import annotations

import json
import os
import runpy
import sys


def _serve() -> dict:
    """Answer requests until stdin closes (then exit); in a forked child, return its request."""
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            return request
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        replies.write(json.dumps({"status": code}) + "\n")
        replies.flush()
    sys.exit(0)


def _child(request: dict) -> None:
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(os.path.join(request["out"], "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(os.path.join(request["out"], "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    # fresh text streams on the new descriptors, as a new interpreter has (the old ones may hold buffered bytes)
    sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    import hetbench.cli  # noqa: F401 - the import every command pays, paid here once

    # What the server imported is never collected in a child: moved out of the collector's sight (the permanent
    # generation, as gc.freeze's documentation advises before fork), a child's collections, and the ones at its
    # exit, no longer walk it (each child's exit took 40 ms, 20 ms so). The modules are still torn down at exit as
    # in any interpreter; only the collector skips these objects.
    import gc

    gc.freeze()
    sys.path[0] = ""  # as `python -m` and `python -c` have it; a script's child sets its own folder
    _child(_serve())
