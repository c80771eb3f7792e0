"""Under mpiexec (tests/mpi/test_zero_rows.py: 3 ranks, weights 2,1,0): transformers' GPT2LMHeadModel and
LlamaForCausalLM (2 layers, hidden 64, 4 heads, vocab 128, random weights, no dropout) trained with their batch
split by hb.local_batch under exact_ddp, exact_fully_shard (FSDP2) and shard_module, the zero-row rank running a
placeholder row, against the same training in one process (model(**batch, labels=...).loss: Hugging Face's mean over
the global batch's tokens). Two ways to the exact global mean over tokens, labels masked with -100:
- "hf": the model's own loss given the global token count, model(**rows, num_items_in_batch=TOKENS).loss, through
  LocalBatch.counted;
- "tokens": per-token cross-entropy summed per row from the logits, through LocalBatch.part_of_mean(rows, TOKENS).
Every case in one launch; each check is agreed over the ranks (tests/mpi_fail_fast.py), so a rank that fails says
so and ends the job within seconds. Rank 0 prints `CASE <model> <strategy> <loss> rows=.. loss=<max rel>
update=<rel> param=<max rel>` then `ok NAME` (or `FAILED NAME: rank R: ...`); the exit code is 0 only when every
case passed. The control counts the placeholder row with hb.part_of_mean (as if it were the rank's own): its
update differs, which shows the check can fail."""

from __future__ import annotations

import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI

import hetbench.pytorch as hb
from hetbench.pytorch import fsdp
from hetbench.pytorch.uneven import local_batch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_fail_fast import run_checks, say  # noqa: E402 - tests/ on the path first

warnings.filterwarnings("ignore")
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()  # GPT2Config's default bos/eos ids lie outside a vocab of 128: said on every build

WEIGHTS = sys.argv[1] if len(sys.argv) > 1 else "2,1,0"
STEPS, BATCH, SEQ, VOCAB, LR = 3, 6, 16, 128, 0.5
# fp32: only the order of the sums differs. update: the trained change of the whole parameter vector against one
# process's; param: each tensor against one process's, relative to its norm. Measured on 3 ranks at 2,1,0 (torch
# 2.13.0 CPU): loss <= 1.5e-7, update <= 2.9e-7, param <= 1.9e-7 in every case; the control's update is off by 0.43.
TOL_LOSS, TOL_UPDATE, TOL_PARAM = 1e-6, 1e-5, 1e-6
CONTROL_UPDATE = 1e-2


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank and in the reference
    if name == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                        num_key_value_heads=4, intermediate_size=128, vocab_size=VOCAB,
                                        max_position_embeddings=SEQ))


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    return list(model.transformer.h) if hasattr(model, "transformer") else list(model.model.layers)


def global_batch(step: int) -> dict[str, torch.Tensor]:
    """Step STEP's batch, the same on every rank: right-padded rows (row 0 too), labels -100 on the padding."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=g)
    lengths[0] = SEQ - 3
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def global_tokens(labels: torch.Tensor) -> int:
    """The tokens a causal LM's loss counts in the whole batch: labels shifted by one, -100 ignored."""
    return int((labels[:, 1:] != -100).sum())


def flat(params: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([params[k].reshape(-1) for k in sorted(params)])


def reference(name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process: the whole batch, Hugging Face's own mean loss, SGD."""
    model = build(name)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        loss = model(**global_batch(step)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}


def step_loss(model: torch.nn.Module, mine, tokens: int, how: str) -> torch.Tensor:
    if how == "hf":
        return mine.counted(model(**mine.data, num_items_in_batch=tokens).loss)
    data = mine.data
    logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
    per_token = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), data["labels"][:, 1:].reshape(-1),
                                ignore_index=-100, reduction="none").view(logits.shape[0], SEQ - 1)
    if how == "control":  # the placeholder counted as the rank's own row: wrong on purpose
        return hb.part_of_mean(per_token, tokens)
    return mine.part_of_mean(per_token, tokens)


def full_params(model: torch.nn.Module, strategy: str, sharded) -> dict[str, torch.Tensor] | None:
    """Collective: every parameter whole at rank 0 (None elsewhere)."""
    if strategy == "fsdp":
        return sharded.full_state_dict()
    if strategy == "fsdp2":
        full = {k: p.full_tensor().detach().clone() for k, p in model.named_parameters()}
    else:
        full = {k.removeprefix("module."): p.detach().clone() for k, p in model.named_parameters()}
    return full if dist.get_rank() == 0 else None


REFERENCES: dict[str, tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}


def run_case(name: str) -> None:
    model_name, strategy, how = name.split("-")
    if model_name not in REFERENCES:
        losses, trained = reference(model_name)
        REFERENCES[model_name] = (losses, trained, {k: v.detach().clone() for k, v in build(model_name)
                                                    .named_parameters()})
    ref_losses, ref_params, initial = REFERENCES[model_name]
    start = time.perf_counter()
    model = build(model_name)
    sharded = None
    rows = hb.batch_rows(BATCH, WEIGHTS)
    if strategy == "ddp":
        model = hb.exact_ddp(model)
    elif strategy == "fsdp2":
        hb.exact_fully_shard(model, units=blocks(model))
    else:
        sharded = fsdp.shard_module(model, blocks(model), WEIGHTS)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        batch = global_batch(step)
        mine = local_batch(batch, rows)
        loss = step_loss(model, mine, global_tokens(batch["labels"]), how)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().reshape(1).double()
        dist.all_reduce(total)
        losses.append(float(total))
    full = full_params(model, strategy, sharded)
    seconds = time.perf_counter() - start
    if dist.get_rank() != 0:
        return
    assert full is not None and set(full) == set(ref_params), sorted(set(full or {}) ^ set(ref_params))[:4]
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    change, ref_change = flat(full) - flat(initial), flat(ref_params) - flat(initial)
    update_diff = float((change - ref_change).norm() / ref_change.norm())
    param_diff = max(float((full[k] - v).norm() / v.norm()) for k, v in ref_params.items())
    say(f"CASE {model_name} {strategy} {how} rows={','.join(map(str, rows))} loss={loss_diff:.2g} "
        f"update={update_diff:.2g} param={param_diff:.2g} seconds={seconds:.2f}")
    if how == "control":
        assert update_diff > CONTROL_UPDATE, f"the control's update differs by only {update_diff:.3g}"
        return
    assert loss_diff <= TOL_LOSS, f"loss differs by {loss_diff:.3g} (tolerance {TOL_LOSS:g}): {losses} {ref_losses}"
    assert update_diff <= TOL_UPDATE, f"update differs by {update_diff:.3g} (tolerance {TOL_UPDATE:g})"
    assert param_diff <= TOL_PARAM, f"parameters differ by {param_diff:.3g} (tolerance {TOL_PARAM:g})"


CASES = [f"{m}-{s}-{h}" for m in ("gpt2", "llama") for s in ("ddp", "fsdp2", "fsdp") for h in ("hf", "tokens")]
CASES.append("gpt2-ddp-control")


def main() -> int:
    hb.init()
    ok = run_checks(MPI.COMM_WORLD, CASES, run_case)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
