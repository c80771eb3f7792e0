"""Under mpiexec: hetbench's uneven FSDP (hetbench.pytorch.shard_module) trains both tasks of hetbench.train.torch_frontend.models
with each weights set given on the command line, and every rank checks, per case:
- the losses and final parameters against the same training in one process (TOL_*);
- the bytes it holds: parameters, gradients and AdamW state of its shards, S_r elements summed over the units:
  4*S_r, 4*S_r and 8*S_r + 4 per unit (AdamW's step count), with S_r within one element per unit of its weight's
  share of the model and the ranks' S_r summing to the model;
- that a unit's gathered vector is freed once the unit's forward ends (a weak reference to it dies), except the
  root's and the last unit's, kept for the backward, and that those are freed by its end;
- the prefetched gathers a step waits for: as many as prefetched_units() says, one exposed time each; and the
  collectives counted in the hetbench group's metrics.
Rank 0 prints `CASE <task> <weights> loss=<max rel> param=<max rel> elements=<S_0,S_1,..> ok` per case; a failed
check raises on the rank that saw it (mpiexec then ends the job with a non-zero code). A last case caps rank 0's
memory and checks its share shrinks to fit and the training stays exact."""

import sys
import weakref

import torch
import torch.distributed as dist

import hetbench.pytorch as hb
from hetbench.harness.split_plan import PlacementError
from hetbench.pytorch import fsdp
from hetbench.train.torch_frontend.models import TaskConfig, build_model, make_batch, row_losses, units

TOL_LOSS = 1e-5  # relative, per step: only the order of float32 sums differs
# relative to each parameter tensor's norm. AdamW divides by sqrt(v), so an element whose true gradient is zero moves
# by about lr whichever way its rounding noise points: the key part of attention's qkv bias (softmax ignores a shift
# of every score) differs by 1e-4 between any two summation orders, where SGD agrees within 2e-7. 1e-3 still fails a
# wrong or lost shard by orders of magnitude.
TOL_PARAM = 1e-3
STEPS = 3
TASKS = {
    "mlp": TaskConfig(task="mlp", layers=3, hidden=16, batch=12, seed=3),
    "gpt": TaskConfig(task="gpt", layers=2, hidden=32, batch=12, seed=3, seq_len=16, heads=2),
}


def reference(task):
    model = build_model(task)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        x, y = make_batch(task, step, 0, task.batch)
        loss = row_losses(model, x, y).sum() / task.batch
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def unit_sizes(model, unit_list):
    """Each unit's elements counted from the plain model (the units', then the rest: the root's)."""
    sizes = [sum(p.numel() for p in u.parameters()) for u in unit_list]
    rest = sum(p.numel() for p in model.parameters()) - sum(sizes)
    return sizes + ([rest] if rest else [])


def run_case(task_name, weights, memory_bytes=None):
    task = TASKS[task_name]
    rank, size = dist.get_rank(), dist.get_world_size()
    ref_losses, ref_params = reference(task)
    model = build_model(task)
    plain_units = units(model)
    sizes = unit_sizes(model, plain_units)
    sharded = fsdp.shard_module(model, plain_units, weights, memory_bytes=memory_bytes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rows = hb.batch_rows(task.batch, sharded.weights)
    lo, hi = hb.row_range(rows)
    pg = hb.hetbench_group()
    pg.metrics.take()
    # weak references to every gathered vector, taken as each unit's forward starts (after the engine's own hook)
    refs = {}
    for u in sharded.units:
        if not u.root:
            u.module.register_forward_pre_hook(lambda m, a, u=u: refs.__setitem__(u.index, weakref.ref(u.full)))
    losses = []
    kept = {u.index for u in sharded.units if u.root} | {sharded.order[-1]}
    for step in range(STEPS):
        x, y = make_batch(task, step, lo, hi)
        loss = row_losses(model, x, y).sum() / task.batch
        alive = {i for i, r in refs.items() if r() is not None}
        assert alive <= kept, f"gathered vectors of units {sorted(alive - kept)} outlived their forward"
        loss.backward()
        assert all(r() is None for r in refs.values()) and not sharded._live, "gathered vectors outlived the backward"
        opt.step()
        opt.zero_grad(set_to_none=False)
        total = torch.tensor([float(loss)], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(float(total))
        figures = sharded.take_figures()
        expected = sharded.prefetched_units()
        assert len(figures.exposed_seconds) == len(expected) and figures.exposed_units == expected, (
            figures.exposed_units, expected)
        assert all(t >= 0 for t in figures.exposed_seconds)
        ops = pg.metrics.take()
        n_units = len(sharded.units)
        assert ops["reduce_scatter"]["count"] == n_units, ops
        # every unit gathered in the forward, and again in the backward but the root and the last one
        assert ops["allgather"]["count"] == 2 * n_units - (2 if sharded.root is not None else 1), ops
        assert ops["allreduce"]["count"] == 1  # the loss just above
        assert 2 * n_units - 1 >= len(expected) >= 0
    # bytes held: the shards, their gradients, AdamW's m and v and one step count per unit
    mine = sharded.elements
    held = sharded.state_bytes(opt)
    n_units = len(sharded.units)
    assert len(sizes) == n_units and sum(sizes) == sum(u.size for u in sharded.units)
    assert held == {"param_bytes": 4 * mine, "grad_bytes": 4 * mine, "optimizer_bytes": 8 * mine + 4 * n_units}, held
    every = [0] * size
    dist.all_gather_object(every, mine)
    assert sum(every) == sum(sizes)
    w = sharded.element_weights
    for r in range(size):
        share = w[r] / sum(w) * sum(sizes)
        assert abs(every[r] - share) <= n_units, (r, every[r], share)
    full = sharded.full_state_dict()
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    assert loss_diff <= TOL_LOSS, (losses, ref_losses)
    param_diff = 0.0
    if rank == 0:
        assert set(full) == set(ref_params)
        for k, want in ref_params.items():
            param_diff = max(param_diff, float((full[k] - want).norm() / want.norm()))
        assert param_diff <= TOL_PARAM, param_diff
        print(f"CASE {task_name} {weights} loss={loss_diff:.3g} param={param_diff:.3g} "
              f"elements={','.join(map(str, every))} ok", flush=True)
    return every


def starts_from_rank0():
    """Every rank's shards are rank 0's values, whatever the other ranks' copies held."""
    model = build_model(TASKS["mlp"])
    want = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if dist.get_rank() != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    full = fsdp.shard_module(model, units(model), "3" + ",1" * (dist.get_world_size() - 1)).full_state_dict()
    if dist.get_rank() == 0:
        assert all(torch.equal(full[k], want[k]) for k in want)
        print("RANK0VALUES ok", flush=True)


def main():
    hb.init()
    size = dist.get_world_size()
    starts_from_rank0()
    for weights in sys.argv[1:]:
        for task_name in TASKS:
            run_case(task_name, weights)
    # memory caps: rank 0 may hold 100 elements' state (AdamW: 16 bytes each); the others take the rest
    every = run_case("mlp", "even", memory_bytes=[16 * 100] + [None] * (size - 1))
    assert every[0] <= 100 + 3, every
    try:
        fsdp.shard_module(build_model(TASKS["mlp"]), [], "even", memory_bytes=[16 * 10] * size)
    except PlacementError as e:
        if dist.get_rank() == 0:
            print(f"CAPPED {e}", flush=True)
    else:
        raise AssertionError("caps too small for the model were accepted")
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # a failed check ends the whole job now, not at a collective the other ranks never reach
        import traceback

        from mpi4py import MPI

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
