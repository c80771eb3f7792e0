"""Under mpiexec: DDP (exact_ddp) and FSDP2 (exact_fully_shard) over the hetbench backend, with the batch split by
each weights set given on the command line, train the same steps as one process; rank 0 prints one line per case:
`CASE <strategy> <weights> rows=<rows> loss=<max rel diff> param=<max rel diff> ok|FAIL` and the script exits 1
when a case is outside the tolerances (TOL_*), every rank alike. The control, torch's DDP as it comes with each
rank's loss the mean of its own rows ("plain-ddp"), is reported too: with uneven rows it is silently wrong
("differs"), which shows the check can fail."""

import sys

import torch
import torch.distributed as dist
from torch import nn

import hetbench.pytorch as hb

TOL_LOSS = 1e-5  # relative, per step (fp32: only the order of the sums differs)
TOL_PARAM = 1e-5  # relative to each parameter tensor's norm
STEPS, BATCH, HIDDEN = 4, 12, 16


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, 1))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, HIDDEN, generator=g)
    return x, x.sum(1, keepdim=True).sin()


def train(m, rows=None, wrap=None):
    start, stop = hb.row_range(rows) if rows else (0, BATCH)
    if wrap == "ddp":
        m = hb.exact_ddp(m)
    elif wrap == "plain-ddp":  # the control: torch's DDP as it comes, each rank's loss the mean of its own rows
        m = nn.parallel.DistributedDataParallel(m)
    elif wrap == "fsdp2":
        hb.exact_fully_shard(m, units=[m[0], m[2]])
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        per_row = (m(x[start:stop]) - y[start:stop]).square().squeeze(1)
        loss = per_row.mean() if wrap == "plain-ddp" else hb.part_of_mean(per_row, BATCH)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = hb.part_of_mean(per_row.detach(), BATCH)
        if rows:
            dist.all_reduce(total)
        losses.append(float(total))
    if wrap == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True))
    else:
        state = (m.module if wrap in ("ddp", "plain-ddp") else m).state_dict()
    return losses, {k: v.detach().clone() for k, v in state.items()}


def main():
    hb.init()
    rank = dist.get_rank()
    ref_losses, ref_state = train(model())
    bad = 0
    for weights in sys.argv[1:]:
        rows = hb.batch_rows(BATCH, weights)
        for wrap in ("ddp", "fsdp2", "plain-ddp"):
            if wrap == "plain-ddp" and 0 in rows:
                continue  # the mean of no rows is NaN
            losses, state = train(model(), rows, wrap)
            loss_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
            param_diff = max(float((state[k] - v).norm() / v.norm()) for k, v in ref_state.items())
            ok = loss_diff <= TOL_LOSS and param_diff <= TOL_PARAM
            bad += not ok and wrap != "plain-ddp"
            if rank == 0:
                print(f"CASE {wrap} {weights} rows={','.join(map(str, rows))} loss={loss_diff:.2e} "
                      f"param={param_diff:.2e} {'ok' if ok else 'FAIL' if wrap != 'plain-ddp' else 'differs'}",
                      flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
