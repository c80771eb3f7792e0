"""A user's script gives each rank a hetbench device: rank r computes where the r-th spec of argv[1] says (host,
opencl, sim:MODEL, cupy, auto), and transformers' GPT-2 (random weights) trains under exact_ddp with the batch
split by argv[2] (even, or w0,w1,...), each offloaded rank's device figures printed every step and written into
the StepLogger's train.jsonl (docs/pytorch.md, "A hetbench device for your rank").

    mpiexec -n 2 python examples/user_device.py host,sim:mi300x 3,1
    mpiexec -n 2 python examples/user_device.py host,opencl 3,1
    python examples/user_device.py host
"""
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

import hetbench.pytorch as hb

BATCH, SEQ, VOCAB = 16, 32, 128
hb.init()
rank = dist.get_rank()
specs = sys.argv[1].split(",") if len(sys.argv) > 1 else ["host"]
specs *= dist.get_world_size() if len(specs) == 1 else 1   # one spec: every rank's
if len(specs) != dist.get_world_size():              # every rank reads the same argv: each leaves alike
    if rank == 0:
        print(f"{len(specs)} device specs for {dist.get_world_size()} ranks: one each, or one for all", file=sys.stderr)
    sys.exit(2)
dev = hb.open_device(specs[rank])                    # this rank's hetbench device, by --backend's specs
torch.manual_seed(0)                                 # the same initial weights on every rank
cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
                 eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(cfg).to(dev.device)          # torch's device: the CPU here on every rank
dev.offload(model)                                   # its products on the hetbench device (none on the host)
ddp = hb.exact_ddp(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
rows = hb.batch_rows(BATCH, sys.argv[2] if len(sys.argv) > 2 else "even")
start, stop = hb.row_range(rows)
log = hb.StepLogger("train.jsonl", BATCH, model=model, optimizer=opt)
log.device_ops = dev.ops                             # the step lines carry the device's figures (None: no device)
for step in range(4):
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(step))[start:stop]
    with log.step(samples=stop - start) as rec, dev.step() as fig:   # fig: the device's figures for the block
        logits = ddp(input_ids=x).logits
        per_row = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1),
                                  reduction="none").view(len(x), -1).mean(1)
        loss = hb.part_of_mean(per_row, BATCH)
        loss.backward()
        opt.step()
        opt.zero_grad()
        rec.loss = loss
    total = loss.detach().clone()
    dist.all_reduce(total)
    every = hb.all_ranks(fig)
    if rank == 0:
        print(f"step {step} loss {total.item():.6f} rows {rows}")
        for r, f in enumerate(every):
            if "device_gemms" in f:
                print(f"  rank {r}: {f['device_gemms']} GEMMs {f['device_gemm_seconds'] * 1e3:.3f} ms "
                      f"({f['device_timing']}), copies {f['device_copy_seconds'] * 1e3:.3f} ms, "
                      f"{f['device_upload_bytes']} bytes up in {f['device_uploads']} uploads, "
                      f"{f['device_cache_hits']} cache hits, step {f['step_seconds'] * 1e3:.1f} ms; "
                      f"calls {f['device_calls']}")
if rank == 0:
    print(f"rank 0: {dev}")
if rank:
    print(f"rank {rank}: {dev.note}")
log.close()
dist.destroy_process_group()
