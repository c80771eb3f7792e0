"""Under mpiexec -n 2 (tests/mpi/test_user_device.py): a user's own script in which rank 0 computes on the host and
rank 1 opens a hetbench device by its spec (open_device: sim:mi300x, or opencl) and offloads every product of a
transformers model there (offload: GPT-2's Conv1D, Llama's nn.Linear, attention's scaled_dot_product_attention),
then trains it with hb.exact_ddp (or hb.exact_fully_shard: `-fsdp2`) under weights 3,1: every step's loss and the
final parameters are those of the same steps in one process on the CPU, rank 1's device counted every product of
its rows (from the config), and hb.StepLogger's lines carry its figures (device_* keys, the simulated one's timing
modelled). A device rank 1 cannot have (`bad-spec`: a spec --backend refuses; `no-device`: opencl:99) is refused on
every rank in the same line naming rank 1.

Each case named on the command line (`gpt2-sim`, `llama-sim`, `gpt2-opencl`, `llama-opencl`, `llama-sim-fsdp2`,
`bad-spec`, `no-device`) runs in turn on every rank (tests/mpi_fail_fast.py: rank 0 prints `ok CASE` or `FAILED
CASE: rank R: ...`; a rank left waiting on a peer that raised ends the job within seconds). The watchdog ends a rank
stuck in MPI with a line naming where.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI

import hetbench.pytorch as hb
from hetbench.comm import watchdog
from hetbench.pytorch.offload import offload
from hetbench.pytorch.rank_backend import open_device

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_fail_fast import run_checks  # noqa: E402 - tests/ on the path first

warnings.filterwarnings("ignore")

WORLD = MPI.COMM_WORLD
WATCHDOG_SECONDS = 60
STEPS, BATCH, SEQ, VOCAB = 3, 8, 12, 128
WEIGHTS = "3,1"
SPECS = {"sim": "sim:mi300x", "opencl": "opencl"}
TOL_LOSS = 1e-5  # relative, per step: fp32, only the order of the sums differs
TOL_PARAM = 1e-5  # relative to each parameter tensor's norm
REFUSALS = ("bad-spec", "no-device")


def config(kind: str):
    """2 layers, hidden 64, 4 heads (Llama: 2 key/value heads), vocab 128, no dropout (each rank would draw its
    own masks for its rows, one process one set for the whole batch)."""
    from transformers import GPT2Config, LlamaConfig

    if kind == "gpt2":
        return GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
                          eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          attn_implementation="sdpa")
    return LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=SEQ,
                       attn_implementation="sdpa")


def build(kind: str) -> torch.nn.Module:
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    torch.manual_seed(0)  # the same initial weights on every rank and in the one-process run
    return (GPT2LMHeadModel if kind == "gpt2" else LlamaForCausalLM)(config(kind)).train()


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(100 + step))


def row_losses(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Each sequence's mean next-token loss (part_of_mean sums them over the global batch)."""
    logits = model(input_ids=x).logits
    tokens = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1), reduction="none")
    return tokens.view(len(x), -1).mean(1)


def expected_gemms(kind: str, rows: int) -> int:
    """One step's 2-D GEMMs for `rows` sequences (tests/unit/test_offload_hf.py says how they are counted)."""
    cfg = config(kind)
    projections, heads = (4, cfg.num_attention_heads) if kind == "gpt2" else (7, cfg.num_key_value_heads)
    return cfg.num_hidden_layers * (3 * projections + 2 * 3 * rows * heads) + 3


def train(kind: str, dev=None, rows=None, wrap: str = "ddp"):
    """STEPS steps of SGD: in one process (rows None), or this rank's rows under exact_ddp (or exact_fully_shard,
    each layer a unit) with its products on `dev`. Returns (losses, final parameters, this rank's device figures per
    step, rank 0's step lines)."""
    model = build(kind)
    if dev is not None:
        offload(model, dev)
    net = model
    if rows and wrap == "ddp":
        net = hb.exact_ddp(model)
    elif rows:
        hb.exact_fully_shard(model, units=list(model.transformer.h if kind == "gpt2" else model.model.layers))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    start, stop = hb.row_range(rows) if rows else (0, BATCH)
    log = hb.StepLogger(None, BATCH, model=model, optimizer=opt) if rows else None
    if log is not None and dev is not None and dev.offloads:
        log.device_ops = dev.ops  # its step lines carry the device's GEMM and copy figures
    losses, figures = [], []
    for step in range(STEPS):
        x = batch(step)[start:stop]
        if log is not None:
            with log.step(samples=stop - start) as rec, dev.step() as fig:
                loss = hb.part_of_mean(row_losses(net, x), BATCH)
                loss.backward()
                opt.step()
                opt.zero_grad()
                rec.loss = loss
            figures.append(fig)
            losses.append(log.lines[-1]["loss"] if log.lines else None)
        else:
            loss = hb.part_of_mean(row_losses(net, x), BATCH)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
    if rows and wrap == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    else:
        state = model.state_dict()
    state = {k: v.detach().clone() for k, v in state.items()}
    return losses, state, figures, (log.lines if log is not None else [])


def case(name: str) -> None:
    kind, where, wrap = (name.split("-") + ["ddp"])[:3]
    rank = dist.get_rank()
    want_losses, want_state, _, _ = train(kind)
    dev = open_device("host" if rank == 0 else SPECS[where])
    rows = hb.batch_rows(BATCH, WEIGHTS)
    losses, state, figures, lines = train(kind, dev, rows, wrap)
    if rank == 0:
        assert not dev.offloads, dev
        diffs = [abs(a - b) / abs(b) for a, b in zip(losses, want_losses)]
        assert max(diffs) <= TOL_LOSS, f"losses {losses} against one process's {want_losses}"
        for line in lines:
            r0, r1 = line["ranks"]
            assert "device_gemms" not in r0 and r1["device_gemms"] == expected_gemms(kind, rows[1]), line
            assert r1["device_timing"] == line["timing"] == ("modelled" if where == "sim" else "measured"), line
    else:
        assert dev.offloads and dev.timing == ("modelled" if where == "sim" else "measured"), dev
        for fig in figures:
            assert fig["device_gemms"] == expected_gemms(kind, rows[1]), fig
            assert fig["torch_calls"] == {} and fig["device_uploads"] > 0 and fig["device_copy_seconds"] > 0, fig
            calls = fig["device_calls"]
            assert calls.get("scaled_dot_product_attention") == 2, calls
            assert calls.get("addmm" if kind == "gpt2" else "linear", 0) >= 8, calls
    param = max(float((state[k] - v).norm() / v.norm()) for k, v in want_state.items() if v.norm() > 0)
    assert param <= TOL_PARAM, f"parameters {param:.2e} from one process's"
    dev.close()


def refused(name: str) -> None:
    """Rank 1 names a spec --backend refuses (`bad-spec`) or one it cannot open (`no-device`): every rank raises the
    same line naming rank 1, none is left waiting for it."""
    from hetbench.backends.base import BackendUnavailable

    rank = dist.get_rank()
    spec, kind, start = {"bad-spec": ("sim:mi300", ValueError, "rank 1: unknown simulated GPU 'mi300' in 'sim:mi300'; "
                                                                 "accepted: "),
                         "no-device": ("opencl:99", BackendUnavailable, "rank 1 on ")}[name]
    try:
        open_device("host" if rank == 0 else spec)
    except kind as e:
        message = str(e)
    else:
        raise AssertionError(f"{spec} was not refused")
    assert message.startswith(start) and "\n" not in message and "rank 0" not in message, message
    lines = hb.all_ranks(message)
    assert lines[0] == lines[1], lines


def main() -> int:
    watchdog.arm(WATCHDOG_SECONDS)
    hb.init()
    passed = run_checks(WORLD, sys.argv[1:], lambda name: (refused if name in REFUSALS else case)(name))
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
