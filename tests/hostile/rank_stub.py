"""One rank of a forked MPI case (forkserver.py --ranks): mpiexec starts this in the rank's place; it hands the
rank's argv, folder, environment, CPU affinity and open descriptors (stdio, MPICH's PMI_FD) to the fork server at
SOCKET, forwards the signals it gets to the forked child, and exits as the child did (a signal's end by that
signal). Run as `python -I -S rank_stub.py SOCKET SCRIPT ARGS...`: the standard library only, started in a few ms.
"""

import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _open_descriptors(exclude: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc/self/fd"):  # the listing's own descriptor is closed by now: fstat drops it
        fd = int(entry)
        try:
            os.fstat(fd)
        except OSError:
            continue
        if fd != exclude:
            found.append(fd)
    return sorted(found)


def main() -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.connect(sys.argv[1])
    fds = _open_descriptors(server.fileno())
    request = {"argv": sys.argv[3:], "cwd": os.getcwd(), "env": dict(os.environ), "fds": fds,
               "affinity": sorted(os.sched_getaffinity(0))}
    socket.send_fds(server, [json.dumps(request).encode()], fds)
    json.loads(server.recv(65536))  # {"pid": ...}: the child runs

    def forward(signum, frame):
        server.send(json.dumps({"signal": signum}).encode())

    for signum in FORWARDED:
        signal.signal(signum, forward)
    reply = server.recv(65536)
    if not reply:
        sys.stderr.write("rank_stub: the fork server ended before the rank\n")
        os._exit(1)
    code = json.loads(reply)["status"]
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main()
