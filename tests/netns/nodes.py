"""Two "nodes" on this machine for tests/mpi/test_two_node.py: two network namespaces joined by a veth pair (iproute2),
each "node" also in an IPC and a UTS namespace of its own (tests/netns/nsrun), and the launch of an MPI job with one
rank on each, through nsrun standing in for ssh, under MPICH's hydra or Open MPI's mpirun.

Needs root (CI runs as root), `ip`, `tc` and `unshare`; why_not() says what is missing, for the tests' skip. Every
pair has names of its own (this process, a random token), and TwoNodes.remove() ends whatever still runs in them and
deletes them, also after a failure (the tests' fixture calls it in its finalizer); the pairs of a session killed
before its finalizers ran are deleted by the next (remove_stale)."""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

NSRUN = Path(__file__).resolve().parent / "nsrun"
IFACE = "hb0"  # the veth's name inside each namespace (the same on both "nodes")
ADDRESSES = ("10.231.0.1", "10.231.0.2")  # the nodes' addresses on the link (namespaced: no clash between pairs)
NODE_NAMES = ("nodea", "nodeb")  # each node's host name (its own UTS namespace)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


@functools.lru_cache(maxsize=None)
def why_not() -> str | None:
    """Why two namespaces cannot be made here (None where they can): not root, a tool missing, or the kernel
    refusing (tried for real, on a pair made and removed at once)."""
    if os.geteuid() != 0:
        return "two-node tests need root to make network namespaces (CI runs as root)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"two-node tests need `{tool}` (apt-get install iproute2 util-linux)"
    try:
        remove_stale()
        TwoNodes().remove()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"two-node tests cannot make network namespaces here: {e}"
    return None


STALE = re.compile(r"hb-(\d+)-[0-9a-f]{6}-[ab]")


def remove_stale() -> list[str]:
    """Delete the pairs of test sessions that are gone (their pid in the name no longer runs: a session killed
    without its finalizers, as `timeout` does with SIGTERM), ending what still runs in them; their names."""
    out = _run("ip", "netns", "list", check=False).stdout
    stale = [m.group(0) for m in (STALE.fullmatch(line.split()[0]) for line in out.splitlines() if line.split())
             if m and not Path(f"/proc/{m.group(1)}").exists()]
    for ns in stale:
        _kill_in(ns)
        _run("ip", "netns", "del", ns, check=False)
    return stale


def _kill_in(*netns: str) -> None:
    """SIGKILL whatever runs in these namespaces (a stopped process is continued as well), until nothing does."""
    for _ in range(50):
        pids = [int(p) for ns in netns for p in _run("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        time.sleep(0.1)


class TwoNodes:
    """Two network namespaces, hb-<pid>-<token>-a and -b, joined by a veth pair named IFACE on both sides, with
    ADDRESSES on it and loopback up; made at construction, removed by remove()."""

    def __init__(self) -> None:
        token = f"hb-{os.getpid()}-{secrets.token_hex(3)}"
        self.netns = (f"{token}-a", f"{token}-b")
        made: list[str] = []
        try:
            for ns in self.netns:
                _run("ip", "netns", "add", ns)
                made.append(ns)
            _run("ip", "link", "add", IFACE, "netns", self.netns[0], "type", "veth", "peer", "name", IFACE,
                 "netns", self.netns[1])
            for ns, addr in zip(self.netns, ADDRESSES):
                _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", ns, "link", "set", IFACE, "up")
            self.wait_for_carrier()
        except BaseException:
            for ns in made:
                _run("ip", "netns", "del", ns, check=False)
            raise

    # --- the link --------------------------------------------------------------------------------------------

    def wait_for_carrier(self, seconds: float = 10.0) -> None:
        """Until both ends are up with a carrier. The kernel sets a new veth's carrier up to a second after `ip link
        set up` (NO-CARRIER until then), and MPICH's UCX, which leaves out an interface without one, then finds no
        way to the other node: MPI_Init fails with "Destination is unreachable"."""
        deadline = time.monotonic() + seconds
        while True:
            states = [json.loads(_run("ip", "-n", ns, "-j", "link", "show", "dev", IFACE).stdout)[0]
                      for ns in self.netns]
            if all(s["operstate"] == "UP" and "NO-CARRIER" not in s["flags"] for s in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the veth pair has no carrier after {seconds} s: {states}")
            time.sleep(0.02)

    def shape(self, rate: str, burst: str) -> None:
        """The link's rate on both sides: a token bucket (tbf) of `rate` ("1gbit") and bucket `burst` ("256kb")."""
        for ns in self.netns:
            _run("tc", "-n", ns, "qdisc", "replace", "dev", IFACE, "root", "tbf", "rate", rate, "burst", burst,
                 "latency", "100ms")
        self.wait_for_carrier()

    def unshape(self) -> None:
        for ns in self.netns:
            _run("tc", "-n", ns, "qdisc", "del", "dev", IFACE, "root", check=False)

    def qdisc(self, node: int) -> str:
        return _run("tc", "-n", self.netns[node], "qdisc", "show", "dev", IFACE).stdout.strip()

    def set_tcp_retries(self, retries: int) -> None:
        """net.ipv4.tcp_retries2 on both nodes (a per-namespace setting): how many times TCP retransmits before it
        gives a connection up (the kernel's 15 is about 15 minutes)."""
        for ns in self.netns:
            _run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"net.ipv4.tcp_retries2={retries}")

    def cut(self) -> None:
        """The link down (both ends lose their carrier: nothing crosses, nothing says so to the ranks)."""
        _run("ip", "-n", self.netns[0], "link", "set", IFACE, "down")

    def tx_bytes(self, node: int) -> int:
        """Bytes node `node` has sent over the link."""
        out = _run("ip", "-n", self.netns[node], "-j", "-s", "link", "show", "dev", IFACE).stdout
        return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])

    # --- what runs on the nodes ------------------------------------------------------------------------------

    def pids(self, node: int) -> list[int]:
        out = _run("ip", "netns", "pids", self.netns[node], check=False).stdout
        return [int(p) for p in out.split()]

    def hetbench_pids(self, node: int) -> list[int]:
        """The processes on `node` that run `python -m hetbench` (its rank; not the launcher, its daemon or proxy)."""
        found = []
        for pid in self.pids(node):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
            except (OSError, IndexError):
                continue
            if argv[1:3] == [b"-m", b"hetbench"] and state != "Z":
                found.append(pid)
        return found

    @staticmethod
    def command_line(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return "(gone)"

    def env(self) -> dict[str, str]:
        """What nsrun needs in its environment (the launcher hands it on to every nsrun it starts)."""
        nodes = " ".join(f"{a}={ns}={name}" for a, ns, name in zip(ADDRESSES, self.netns, NODE_NAMES))
        return {"HETBENCH_NETNS_NODES": nodes}

    def command(self, kind: str, mpiexec: str, program: list[str]) -> list[str]:
        """The command line that starts `program` as a job of two ranks, rank 0 on node a and rank 1 on node b:
        the launcher itself runs on node a (through nsrun, the whole line quoted for its shell as for ssh) and
        starts the other node's part through nsrun as through ssh. hydra: -iface names the link's address as its
        own (the host name resolves to none here). Open MPI: --bind-to none (each node would bind its one rank to
        core 0, both on one core)."""
        hosts = ",".join(ADDRESSES)
        if kind == "mpich":
            launcher = [mpiexec, "-launcher", "ssh", "-launcher-exec", str(NSRUN), "-iface", IFACE, "-hosts", hosts]
        elif kind == "openmpi":
            launcher = [mpiexec, "--mca", "plm_rsh_agent", str(NSRUN), "--bind-to", "none", "--host", hosts]
        else:
            raise ValueError(f"no two-node launch for a launcher of kind {kind!r}")
        # one command line for nsrun's shell, as for ssh's
        return [str(NSRUN), ADDRESSES[0], shlex.join([*launcher, "-n", "2", *program])]

    def kill_all(self) -> None:
        """End whatever runs in the namespaces (SIGKILL; a stopped process is continued as well)."""
        _kill_in(*self.netns)

    def remove(self) -> None:
        """End what still runs in the namespaces, then delete them (the veth goes with them)."""
        self.kill_all()
        for ns in self.netns:
            _run("ip", "netns", "del", ns, check=False)
