"""tools/system-deps, the one place make and .ci/run install what pip cannot: with the machine's own tools stood in
for (dpkg-query, id, apt-get on a PATH of this test's), it installs exactly the missing packages as root with
apt-get, says in one line what is missing elsewhere, does nothing where all are there, and never fails the make."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers import REPO

SCRIPT = REPO / "tools" / "system-deps"
PACKAGES = ["pocl-opencl-icd", "ocl-icd-opencl-dev", "libclblast-dev", "openmpi-bin"]


def run(tmp_path, installed: list[str], uid: int, apt: bool = True, apt_fails: bool = False):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    stubs = {
        "dpkg-query": "case \" $INSTALLED \" in *\" ${@: -1} \"*) printf 'install ok installed';; *) exit 1;; esac",
        "id": f"echo {uid}",
    }
    if apt:
        stubs["apt-get"] = f"echo \"$@\" >> {tmp_path}/apt.log; exit {1 if apt_fails else 0}"
    for name, body in stubs.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {"PATH": str(bin_), "INSTALLED": " ".join(installed)}  # the stubs alone: no apt-get unless stood in
    proc = subprocess.run(["/bin/bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    log = (tmp_path / "apt.log").read_text().splitlines() if (tmp_path / "apt.log").exists() else []
    return proc, log


def test_root_with_apt_installs_exactly_the_missing_packages(tmp_path):
    proc, log = run(tmp_path, installed=["ocl-icd-opencl-dev", "libclblast-dev"], uid=0)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "system-deps: installing pocl-opencl-icd openmpi-bin (apt-get)\n"
    assert log[0] == "update -qq"
    assert log[1].split()[-2:] == ["pocl-opencl-icd", "openmpi-bin"] and log[1].startswith("install -y")


@pytest.mark.parametrize("uid, apt", [(1000, True), (0, False)])
def test_elsewhere_one_line_names_what_is_missing_and_make_goes_on(tmp_path, uid, apt):
    proc, log = run(tmp_path, installed=["openmpi-bin"], uid=uid, apt=apt)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.count("\n") == 1 and log == []
    assert proc.stdout.startswith("system-deps: missing pocl-opencl-icd ocl-icd-opencl-dev libclblast-dev ")
    assert "going on without" in proc.stdout


def test_all_there_is_silent_and_installs_nothing(tmp_path):
    proc, log = run(tmp_path, installed=PACKAGES, uid=0)
    assert (proc.returncode, proc.stdout, proc.stderr, log) == (0, "", "", [])


def test_a_failed_install_is_one_line_and_make_goes_on(tmp_path):
    proc, log = run(tmp_path, installed=[], uid=0, apt_fails=True)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0] == f"system-deps: installing {' '.join(PACKAGES)} (apt-get)"
    assert lines[1].startswith("system-deps: apt-get could not install") and len(lines) == 2


def test_make_and_ci_call_it(tmp_path):
    makefile = (REPO / "Makefile").read_text()
    assert "system-deps:\n\t@tools/system-deps\n" in makefile
    assert "env: system-deps $(VENV)/.installed" in makefile
    assert "\ntools/system-deps\n" in (REPO / ".ci" / "run").read_text()
    assert os.access(SCRIPT, os.X_OK)
