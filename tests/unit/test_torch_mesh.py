"""exact_fully_shard's mesh: without one, each rank's mesh is the world group on the device its parameters lie on.
FSDP2's own default takes the machine's accelerator, so on an H100 node a CPU (host or simulated) rank's parameters
moved to cuda:0 and its host-side work failed ("can't convert cuda:0 device type tensor to numpy")."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import hetbench.pytorch.uneven as uneven  # noqa: E402


@pytest.fixture
def recorded(monkeypatch):
    """fully_shard and DeviceMesh.from_group replaced by recorders: what exact_fully_shard hands them."""
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp

    calls: list[tuple[nn.Module, dict]] = []
    meshes: list[tuple[object, str]] = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kwargs: calls.append((module, kwargs)))
    monkeypatch.setattr(device_mesh.DeviceMesh, "from_group",
                        staticmethod(lambda group, device_type: meshes.append((group, device_type)) or
                                     ("mesh", device_type)))
    monkeypatch.setattr(uneven, "sum_gradients", lambda model: 0)
    return calls, meshes


def test_a_cpu_model_gets_a_cpu_mesh_over_the_world(recorded):
    calls, meshes = recorded
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    uneven.exact_fully_shard(model, units=list(model))
    assert meshes == [(dist.group.WORLD, "cpu")]
    # every unit and then the root, each with the same mesh
    assert [m for m, _ in calls] == [model[0], model[1], model]
    assert all(kwargs["mesh"] == ("mesh", "cpu") for _, kwargs in calls)


def test_the_mesh_follows_the_parameters_device(recorded):
    _, meshes = recorded
    model = nn.Linear(3, 4, device="meta")  # a device other than the CPU, without a GPU
    uneven.exact_fully_shard(model)
    assert meshes == [(dist.group.WORLD, "meta")]


def test_a_mesh_given_is_used_as_it_is(recorded):
    calls, meshes = recorded
    model = nn.Linear(3, 4)
    uneven.exact_fully_shard(model, mesh="mine", reshard_after_forward=False)
    assert meshes == []
    assert calls == [(model, {"mesh": "mine", "reshard_after_forward": False})]


def test_rank_mesh_of_a_model_without_parameters_is_the_cpu(recorded):
    _, meshes = recorded
    assert uneven.rank_mesh(nn.ReLU(), group="g") == ("mesh", "cpu")
    assert meshes == [("g", "cpu")]
