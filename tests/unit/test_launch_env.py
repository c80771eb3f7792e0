"""What the launcher's variables say before MPI starts (hetbench.signals: RANK_ENV, started_by_launcher,
launched_rank), and this process's rank in COMM_WORLD without a launcher (hetbench.comm.world.world_rank)."""

from __future__ import annotations

import pytest
from helpers import run_python

from hetbench import signals


@pytest.fixture
def no_launcher(monkeypatch):
    for name in signals.RANK_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_rank_variable_is_rank_0_and_no_launcher(no_launcher):
    assert signals.launched_rank() == 0
    assert signals.started_by_launcher() is False


@pytest.mark.parametrize("name", signals.RANK_ENV)
def test_each_launchers_rank_variable_is_read(no_launcher, name):
    no_launcher.setenv(name, "3")
    assert signals.launched_rank() == 3
    assert signals.started_by_launcher() is True


def test_the_first_variable_set_in_the_lists_order_wins_and_an_empty_one_is_unset(no_launcher):
    first, second, third = signals.RANK_ENV[:3]
    no_launcher.setenv(first, "")  # empty: as if unset
    no_launcher.setenv(second, "5")
    no_launcher.setenv(third, "7")
    assert signals.launched_rank() == 5
    no_launcher.delenv(second)
    no_launcher.delenv(third)
    assert signals.started_by_launcher() is False  # only an empty one left


@pytest.mark.parametrize("text", ["x", "-1", "1.0", " 2", "\u0663"])  # \u0663: ARABIC-INDIC DIGIT THREE
def test_a_rank_that_is_not_a_plain_number_is_rank_0(no_launcher, text):
    no_launcher.setenv(signals.RANK_ENV[0], text)
    assert signals.launched_rank() == 0
    assert signals.started_by_launcher() is True  # set all the same: MPI is asked (world_rank)


def test_without_a_launcher_the_rank_is_0_and_mpi_is_not_started(tmp_path):
    env_clear = "".join(f"os.environ.pop({n!r}, None)\n" for n in signals.RANK_ENV)
    code = ("import os, sys\n" + env_clear +
            "from hetbench.comm.world import world_rank\n"
            "print(world_rank(), 'mpi4py.MPI' in sys.modules)\n")
    done = run_python(["-c", code], cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"]
