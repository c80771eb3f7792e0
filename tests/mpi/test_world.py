"""The world of ranks with one process (hetbench/comm/world.py), and how rank errors are shown (outputs.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hetbench.outputs import format_rank_errors
from hetbench.comm.world import RankError, World

SEPARATOR = "\n       "  # how format_rank_errors joins lines, aligned under "Error: "


@pytest.fixture(scope="module")
def world() -> World:
    pytest.importorskip("mpi4py")
    return World()


def test_single_process_world(world: World) -> None:
    assert world.rank == 0
    assert world.size == 1
    assert world.local_rank == 0
    assert world.local_size == 1
    assert world.is_root
    assert isinstance(world.host, str) and world.host
    assert world.hosts == [world.host]


def test_agree(world: World) -> None:
    assert world.agree([]) == []
    assert world.agree(None) == []
    assert world.agree("x") == [RankError(rank=0, host=world.host, message="x")]
    assert world.agree(["a", "b"]) == [RankError(0, world.host, "a"), RankError(0, world.host, "b")]


def test_collectives(world: World) -> None:
    assert world.allgather({"k": 1}) == [{"k": 1}]
    assert world.gather(5) == [5]
    assert world.bcast("v") == "v"
    world.barrier()


def test_mpi_library(world: World) -> None:
    library = world.mpi_library()
    assert isinstance(library, str)
    assert library.strip()
    assert "\n" not in library


def fake_world(size: int, hosts: list[str]) -> SimpleNamespace:
    return SimpleNamespace(size=size, hosts=hosts)


def test_same_message_on_every_rank_printed_once() -> None:
    world = fake_world(3, ["hostA", "hostB", "hostC"])
    errors = [RankError(r, world.hosts[r], "--out 'x/r.json' cannot be written") for r in range(3)]
    assert format_rank_errors(world, errors) == "--out 'x/r.json' cannot be written"


def test_distinct_messages_name_rank_and_host() -> None:
    world = fake_world(3, ["hostA", "hostB", "hostC"])
    errors = [RankError(1, "hostB", "no file a_1.npy"), RankError(2, "hostC", "no OpenCL device")]
    text = format_rank_errors(world, errors)
    assert text.split(SEPARATOR) == ["rank 1 (hostB): no file a_1.npy", "rank 2 (hostC): no OpenCL device"]


def test_message_on_some_ranks_lists_them() -> None:
    world = fake_world(4, ["hostA", "hostA", "hostB", "hostB"])
    errors = [
        RankError(0, "hostA", "common"),
        RankError(1, "hostA", "common"),
        RankError(2, "hostB", "common"),
        RankError(3, "hostB", "common"),
        RankError(3, "hostB", "only three"),
        RankError(2, "hostB", "pair"),
        RankError(0, "hostA", "pair"),
    ]
    lines = format_rank_errors(world, errors).split(SEPARATOR)
    assert lines == ["common", "rank 3 (hostB): only three", "rank 0,2 (hostA,hostB): pair"]


def test_single_rank_world_has_no_prefix() -> None:
    world = fake_world(1, ["hostA"])
    errors = [RankError(0, "hostA", "first"), RankError(0, "hostA", "second")]
    assert format_rank_errors(world, errors).split(SEPARATOR) == ["first", "second"]


def test_no_errors_formats_empty() -> None:
    assert format_rank_errors(fake_world(2, ["a", "b"]), []) == ""
