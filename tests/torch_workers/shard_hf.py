"""Under mpiexec -n 2 and -n 3 (tests/mpi/test_shard_hf.py): hetbench's uneven FSDP (hetbench.pytorch.fsdp.shard_module)
on transformers' GPT2LMHeadModel (tied embeddings) and LlamaForCausalLM from small configs with random weights,
the decoder layers the units, against the same steps in one process:
- activation checkpointing in each of its forms (transformers' gradient_checkpointing_enable, reentrant or not;
  torch.utils.checkpoint around each unit, reentrant or not) trains what one process trains (TOL_*), with one
  reduce-scatter per unit per step and no gathered vector left after a backward;
- a sharded checkpoint (model and AdamW state) saved mid-run and loaded onto other weights or rank counts continues
  the run's losses; one of another model, or truncated, is refused in one line;
- what a transformers user calls on the model: num_parameters, save_pretrained (a collective: the whole model from
  rank 0), a sharded parameter read outside the forward (one line naming shard_module), full_params(),
  plain_state_dict() into an unsharded model;
- SGD's momentum, a frozen parameter and a buffer through a checkpoint loaded at other weights (sgd-roundtrip).

Each case named on the command line runs in turn on every rank (tests/mpi_fail_fast.py: rank 0 prints `ok CASE` or
`FAILED CASE: rank R: ...`; a rank left waiting on a peer that raised ends the job within seconds). Figures are said
in lines `FIG CASE key=value ...` from rank 0. `--weights W` sets the weights, `--folder F` where checkpoints go
(a folder every rank sees; the 3-rank job reads what the 2-rank job saved there).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI
from torch.utils.checkpoint import checkpoint

import hetbench.pytorch as hb
from hetbench.comm import watchdog
from hetbench.pytorch import fsdp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_fail_fast import run_checks, say  # noqa: E402 - tests/ on the path first

warnings.filterwarnings("ignore")
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()

WORLD = MPI.COMM_WORLD
ME, N = WORLD.Get_rank(), WORLD.Get_size()
WATCHDOG_SECONDS = 60
BATCH, SEQ, VOCAB = 8, 16, 128
STEPS = 3
LR = 1e-2
# relative, per step: only the order of float32 sums differs
TOL_LOSS = 1e-5
# relative to each parameter tensor's norm (AdamW turns the rounding noise of near-zero gradients into steps of
# about lr: tests/torch_workers/fsdp.py TOL_PARAM)
TOL_PARAM = 1e-3
TOL_PARAM_SGD = 1e-5  # SGD moves every element by lr times its gradient: only the float32 rounding differs


def build(kind: str, hidden: int = 64):
    """The model (seeded: the same on every rank and in the reference) and its decoder layers."""
    torch.manual_seed(0)
    if kind == "gpt2":
        config = GPT2Config(n_layer=2, n_embd=hidden, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
                            eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            tie_word_embeddings=True)
        model = GPT2LMHeadModel(config)
        return model, list(model.transformer.h)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=SEQ, bos_token_id=0,
                         eos_token_id=1, pad_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    return model, list(model.model.layers)


def batch(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def row_losses(model, x: torch.Tensor) -> torch.Tensor:
    """Each row's mean next-token loss."""
    logits = model(x, use_cache=False).logits  # a cache would be written again by a checkpoint's recomputation
    per = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="none")
    return per.view(x.size(0), -1).mean(1)


def train(model, opt, steps, rows=None) -> list[float]:
    """Steps of the global mean loss, each rank its rows' part (rows None: one process, the whole batch)."""
    lo, hi = hb.row_range(rows) if rows is not None else (0, BATCH)
    losses = []
    for step in steps:
        loss = row_losses(model, batch(step)[lo:hi]).sum() / BATCH
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        total = torch.tensor([float(loss)], dtype=torch.float64)
        if rows is not None:
            dist.all_reduce(total)
        losses.append(float(total))
    return losses


@functools.lru_cache(maxsize=None)
def reference(kind: str, steps: int = STEPS):
    """(losses, parameters by name) of `steps` steps in one process, no checkpointing."""
    model, _ = build(kind)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = train(model, opt, range(steps))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def compare(case: str, losses, full, kind: str, steps: int = STEPS) -> None:
    ref_losses, ref_params = reference(kind, steps)
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    assert len(losses) == len(ref_losses) and loss_diff <= TOL_LOSS, (losses, ref_losses)
    if ME == 0:
        assert set(full) == set(ref_params), sorted(set(full) ^ set(ref_params))
        param_diff = max(float((full[k] - v).norm() / v.norm()) for k, v in ref_params.items())
        assert param_diff <= TOL_PARAM, param_diff
        say(f"FIG {case} loss={loss_diff:.3g} param={param_diff:.3g}")


class Checkpointed(torch.nn.Module):
    """torch.utils.checkpoint around a whole unit (its hooks inside the checkpoint)."""

    def __init__(self, inner: torch.nn.Module, reentrant: bool) -> None:
        super().__init__()
        self.inner, self.reentrant = inner, reentrant

    def forward(self, *args, **kwargs):
        return checkpoint(functools.partial(self.inner, **kwargs), *args, use_reentrant=self.reentrant)


def checkpointing(kind: str, mode: str) -> None:
    """`mode` none, hf-reentrant, hf-nonreentrant (transformers' switch), torch-reentrant, torch-nonreentrant."""
    case = f"{kind}-{mode}"
    model, units = build(kind)
    model.train()
    sharded = fsdp.shard_module(model, units, WEIGHTS)
    if mode.startswith("hf-"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": mode == "hf-reentrant"})
    elif mode.startswith("torch-"):
        layers = model.transformer.h if kind == "gpt2" else model.model.layers
        for i, u in enumerate(units):
            layers[i] = Checkpointed(u, mode == "torch-reentrant")
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    pg = hb.hetbench_group()
    pg.metrics.take()
    rows = hb.batch_rows(BATCH, sharded.weights)
    lo, hi = hb.row_range(rows)
    losses = []
    for step in range(STEPS):
        loss = row_losses(model, batch(step)[lo:hi]).sum() / BATCH
        loss.backward()
        assert not sharded._live and all(u.full is None and not u.pointed for u in sharded.units), \
            "gathered vectors or views outlived the backward"
        opt.step()
        opt.zero_grad(set_to_none=False)
        ops = pg.metrics.take()
        # one reduce-scatter a unit; every unit gathered in the forward and again in the backward but the root and
        # the last layer (kept): a recomputation gathers nothing more
        n_units = len(sharded.units)
        assert ops["reduce_scatter"]["count"] == n_units, ops
        # (a reentrant checkpoint around a unit's call runs its forward without grad: the last layer is not kept
        # and is gathered once more)
        assert ops["allgather"]["count"] == 2 * n_units - 2 + (mode == "torch-reentrant"), ops
        total = torch.tensor([float(loss)], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(float(total))
    compare(case, losses, sharded.plain_state_dict(), kind)
    sharded.close()


def sharded_model(kind: str, weights: str = ""):
    model, units = build(kind)
    model.train()
    return model, fsdp.shard_module(model, units, weights or WEIGHTS)


SAVE_AT, RUN_TO = 2, 4  # the 2-rank run saves after step 2 and goes on to step 4; the 3-rank run resumes at step 2


def save_midway(kind: str) -> None:
    """2 ranks: train, save the sharded model and AdamW state after SAVE_AT steps, go on to RUN_TO; the losses of
    the run (uninterrupted) go to FOLDER/<kind>-losses.json for the resumed run, checked against one process."""
    model, sharded = sharded_model(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    rows = hb.batch_rows(BATCH, sharded.weights)
    losses = train(model, opt, range(SAVE_AT), rows)
    folder = FOLDER / f"{kind}-ck"
    assert sharded.save_checkpoint(folder, opt, extra={"steps": SAVE_AT}) == folder
    losses += train(model, opt, range(SAVE_AT, RUN_TO), rows)
    compare(f"{kind}-save", losses, sharded.plain_state_dict(), kind, RUN_TO)
    if ME == 0:
        # rank r's slice of every unit, AdamW's moments beside it (the CLI's fsdp names), the manifest; nothing else,
        # no temporary folder left beside it
        names = sorted(p.name for p in folder.iterdir())
        assert names == sorted(["manifest.json"] + [f"rank-{r}.{a}.npy" for r in range(N) for a in ("param", "m", "v")]
                               ), names
        assert not [p for p in FOLDER.iterdir() if ".tmp-" in p.name]
        m = json.loads((folder / "manifest.json").read_text())
        assert m["optimizer"]["class"] == "AdamW" and m["optimizer"]["state"] == ["exp_avg", "exp_avg_sq"]
        assert all(u["scalars"]["step"]["value"] == SAVE_AT for u in m["optimizer"]["units"])
        (FOLDER / f"{kind}-losses.json").write_text(json.dumps(losses))
    sharded.close()


def resume(kind: str) -> None:
    """Any other ranks and weights (3 ranks, 0.5,0.3,0.2): the 2-rank run's checkpoint loaded, its steps continued."""
    model, sharded = sharded_model(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    assert sharded.load_checkpoint(FOLDER / f"{kind}-ck", opt) == {"steps": SAVE_AT}
    rows = hb.batch_rows(BATCH, sharded.weights)
    losses = train(model, opt, range(SAVE_AT, RUN_TO), rows)
    first = json.loads((FOLDER / f"{kind}-losses.json").read_text())
    diff = max(abs(a - b) / abs(b) for a, b in zip(losses, first[SAVE_AT:]))
    assert diff <= TOL_LOSS, (losses, first)
    if ME == 0:
        say(f"FIG {kind}-resume continued={diff:.3g}")
    compare(f"{kind}-resume", first[:SAVE_AT] + losses, sharded.plain_state_dict(), kind, RUN_TO)
    # one process, no ranks: the checkpoint as the plain model's state dict, which an unsharded model loads whole
    plain, _ = build(kind)
    got = fsdp.read_checkpoint(FOLDER / f"{kind}-ck")
    plain.load_state_dict(got["model"])  # strict: every key, the tied head too
    assert got["extra"] == {"steps": SAVE_AT} and set(got["optimizer"]) == {n for n, _ in plain.named_parameters()}
    sharded.close()


def refusals() -> None:
    """Checkpoints that cannot be loaded, and saves that cannot be made: one line, the same on every rank, the model
    left as it was."""
    source = FOLDER / "gpt2-ck"
    model, sharded = sharded_model("gpt2")
    before = sharded.plain_state_dict()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def refused(needle: str, folder, optimizer=None, sharding=sharded) -> str:
        try:
            sharding.load_checkpoint(folder, optimizer)
        except fsdp.ShardedCheckpointError as e:
            text = str(e)
            assert needle in text and "\n" not in text, text
            assert len(set(hb.all_ranks(text))) == 1, "the ranks said different lines"
            return text
        raise AssertionError(f"load_checkpoint({folder}) was not refused")

    lines = [refused("holds AdamW's state, this optimizer is SGD", source, torch.optim.SGD(model.parameters(), lr=1))]
    other, other_units = build("gpt2", hidden=32)
    lines.append(refused("holds another model: transformer.h.0.ln_1.weight [64] in unit 'transformer.h.0' where "
                         "this model has transformer.h.0.ln_1.weight [32]", source,
                         sharding=fsdp.shard_module(other, other_units, WEIGHTS)))
    damaged = FOLDER / f"damaged-{N}"
    if ME == 0:
        import shutil

        shutil.copytree(source, damaged)
        path = damaged / "rank-1.param.npy"
        path.write_bytes(path.read_bytes()[:-100])  # truncated: a copy that did not finish
    dist.barrier()
    lines.append(refused("rank-1.param.npy' is not a .npy array (truncated or damaged)", damaged, opt))
    if ME == 0:
        (damaged / "manifest.json").unlink()
    dist.barrier()
    lines.append(refused("has no manifest.json: not a complete checkpoint", damaged))
    lines.append(refused("does not exist", FOLDER / "nowhere"))
    after = sharded.plain_state_dict()
    if ME == 0:
        assert all(torch.equal(before[k], after[k]) for k in before), "a refused load changed the model"
    try:
        sharded.save_checkpoint(source, opt)
    except fsdp.ShardedCheckpointError as e:
        assert "exists already; save each checkpoint to a new folder" in str(e), e
        lines.append(str(e))
    else:
        raise AssertionError("a save over an existing checkpoint was not refused")
    def save_refused(needle: str, folder, optimizer=None, extra=None) -> None:
        try:
            sharded.save_checkpoint(folder, optimizer, extra)
        except fsdp.ShardedCheckpointError as e:
            assert needle in str(e) and len(set(hb.all_ranks(str(e)))) == 1, str(e)
            lines.append(str(e))
        else:
            raise AssertionError(f"save_checkpoint({folder}) was not refused")
        assert not folder.exists() and not [p for p in FOLDER.iterdir() if ".tmp-" in p.name], folder
        dist.barrier()  # before rank 0 starts the next save's temporary folder

    save_refused("save_checkpoint: extra is not JSON", FOLDER / f"extra-{N}", opt, {"model": model})
    partial = torch.optim.AdamW([model.transformer.h[0].hetbench_flat_shard], lr=LR)
    save_refused("the optimizer does not hold the flat shard of unit 'transformer.h.1'", FOLDER / f"partial-{N}",
                 partial)
    bare = FOLDER / f"bare-{N}"
    sharded.save_checkpoint(bare)  # the model alone
    lines.append(refused("holds no optimizer state: load it without an optimizer", bare, opt))
    sharded.load_checkpoint(bare)
    # activation checkpointing around the whole sharded model: refused as its recomputation starts
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    x = batch(0)[:2]
    embedded = torch.randn(2, SEQ, 64, requires_grad=True)  # a reentrant checkpoint needs an input needing grad
    for reentrant in (False, True):
        try:
            out = torch_checkpoint(lambda t: model(inputs_embeds=t, use_cache=False).logits, embedded,
                                   use_reentrant=reentrant)
            out.float().sum().backward()
        except fsdp.WrapError as e:
            assert "ran its forward inside a backward" in str(e), e
            lines.append(str(e))
        else:
            raise AssertionError("a checkpoint around the whole model was not refused")
    row_losses(model, x).sum().backward()  # and the model trains on after it
    if ME == 0:
        for line in lines:
            say(f"LINE {line}")
    sharded.close()


def transformers_methods() -> None:
    """num_parameters, save_pretrained, a sharded parameter read outside the forward, full_params, and
    plain_state_dict into an unsharded model, each against the unsharded model."""
    from transformers import GPT2LMHeadModel as Loader

    plain, _ = build("gpt2")
    model, sharded = sharded_model("gpt2")
    for kwargs in ({}, {"only_trainable": True}, {"exclude_embeddings": True}):
        assert model.num_parameters(**kwargs) == plain.num_parameters(**kwargs), kwargs
    assert fsdp.sharded(model) is sharded and sum(p.numel() for p in model.parameters()) < plain.num_parameters()
    # outside the forward: one line naming shard_module and what to call
    embeddings = model.get_input_embeddings()
    try:
        embeddings.weight
    except AttributeError as e:
        assert isinstance(e, fsdp.ShardedParameterError)
        assert "'transformer.wte': its 'weight' (parameter 'transformer.wte.weight') is sharded by hetbench's " \
               "shard_module" in str(e) and "sharded.full_params()" in str(e), str(e)
        line = str(e)
    else:
        raise AssertionError("a sharded parameter was read outside the forward")
    assert not hasattr(model.lm_head, "weight") and not hasattr(model.transformer.h[0].ln_1, "bias")
    with sharded.full_params() as whole:
        assert whole is model and torch.equal(embeddings.weight, plain.transformer.wte.weight)
        assert model.lm_head.weight is embeddings.weight  # tied, as unsharded
    assert not hasattr(embeddings, "weight")
    with torch.no_grad():  # a forward without grad (evaluation, generation) as the unsharded model's
        x = batch(2)
        assert torch.equal(model(x).logits, plain(x).logits)
    with sharded.full_params(writeback=True):
        with torch.no_grad():
            model.transformer.ln_f.weight.mul_(2.0)
    full = sharded.plain_state_dict()
    params = sharded.full_state_dict()
    if ME == 0:
        # full_state_dict: each parameter once, under its first name, as named_parameters() gives them
        assert set(params) == {n for n, _ in plain.named_parameters()} and "lm_head.weight" not in params
        assert torch.equal(full["transformer.ln_f.weight"], 2.0 * plain.transformer.ln_f.weight.detach())
        assert list(full) == list(plain.state_dict()) and full["lm_head.weight"] is full["transformer.wte.weight"]
        with torch.no_grad():
            plain.transformer.ln_f.weight.mul_(2.0)
        copy, _ = build("gpt2")
        copy.load_state_dict(full)  # strict
        x = batch(0)
        assert torch.equal(copy(x).logits, plain(x).logits)
    # save_pretrained: collective, the whole model from rank 0; from_pretrained reads it back as the unsharded one
    folder = FOLDER / f"pretrained-{N}"
    model.save_pretrained(folder)
    if ME == 0:
        names = sorted(p.name for p in folder.iterdir())
        assert "model.safetensors" in names and "config.json" in names, names
        loaded = Loader.from_pretrained(folder)
        x = batch(1)
        assert torch.equal(loaded(x).logits, plain(x).logits)
        assert loaded.lm_head.weight is loaded.transformer.wte.weight
        say(f"LINE {line}")
    dist.barrier()
    sharded.close()


class Frozen(torch.nn.Module):
    """A small model with what the transformers models lack: a frozen parameter and a persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))
        self.head = torch.nn.Linear(16, 1)
        self.blocks[1].bias.requires_grad_(False)
        self.register_buffer("scale", torch.full((16,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = torch.tanh(b(x * self.scale))
        return self.head(x).squeeze(1)


def sgd_roundtrip() -> None:
    """SGD with momentum over a model with a frozen parameter and a buffer: saved at this run's weights, loaded at
    others on the same ranks (even), the run continued as the uninterrupted one; read_checkpoint's plain state."""
    def make(weights):
        model = Frozen()
        sharded = fsdp.shard_module(model, list(model.blocks), weights)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9)
        return model, sharded, opt

    def steps(model, sharded, opt, which):
        lo, hi = hb.row_range(hb.batch_rows(BATCH, sharded.weights))
        out = []
        for step in which:
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, generator=g)
            loss = ((model(x[lo:hi]) - y[lo:hi]) ** 2).sum() / BATCH
            loss.backward()
            opt.step()
            opt.zero_grad()
            total = torch.tensor([float(loss)], dtype=torch.float64)
            dist.all_reduce(total)
            out.append(float(total))
        return out

    model, sharded, opt = make(WEIGHTS)
    steps(model, sharded, opt, range(2))
    with torch.no_grad():
        model.scale.fill_(0.25)  # a buffer changed in training: saved as it is
    folder = FOLDER / f"sgd-{N}"
    sharded.save_checkpoint(folder, opt)
    first = steps(model, sharded, opt, range(2, 4))
    model2, sharded2, opt2 = make("even")
    sharded2.load_checkpoint(folder, opt2)
    second = steps(model2, sharded2, opt2, range(2, 4))
    diff = max(abs(a - b) / abs(b) for a, b in zip(first, second))
    assert diff <= TOL_LOSS, (first, second)
    assert float(model2.scale[0]) == 0.25 and opt2.param_groups[0]["momentum"] == 0.9
    whole, again = sharded.plain_state_dict(), sharded2.plain_state_dict()
    if ME == 0:
        param = max(float((whole[k] - again[k]).norm() / again[k].norm()) for k in whole)
        assert param <= TOL_PARAM and torch.equal(whole["blocks.1.bias"], again["blocks.1.bias"]), param
        got = fsdp.read_checkpoint(folder)
        plain = Frozen()
        plain.load_state_dict(got["model"])  # strict: the buffer too
        assert float(plain.scale[0]) == 0.25 and "blocks.1.bias" not in got["optimizer"]
        assert set(got["optimizer"]["blocks.0.weight"]) == {"momentum_buffer"}
        say(f"FIG sgd-roundtrip continued={diff:.3g} param={param:.3g}")
    sharded.close()
    sharded2.close()


class Checkpointing(torch.nn.Module):
    """Four blocks, the units; `mode` checkpoints two of them in one torch checkpoint (span-reentrant,
    span-nonreentrant), a Linear inside each block (inside-reentrant, inside-nonreentrant), or nothing (plain)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.mode = mode
        self.blocks = torch.nn.ModuleList(InnerCheckpoint(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), mode=mode)
                                          for _ in range(4))
        self.head = torch.nn.Linear(16, 1)

    def two(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[2](torch.tanh(self.blocks[1](x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.blocks[0](x))
        x = checkpoint(self.two, x, use_reentrant=self.mode == "span-reentrant") if self.mode.startswith("span") \
            else self.two(x)
        return self.head(torch.tanh(self.blocks[3](x))).squeeze(1)


class InnerCheckpoint(torch.nn.Sequential):
    def __init__(self, *modules: torch.nn.Module, mode: str) -> None:
        super().__init__(*modules)
        self.checkpointed = mode.startswith("inside")
        self.reentrant = mode == "inside-reentrant"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed:
            return self[1](checkpoint(self[0], x, use_reentrant=self.reentrant))
        return super().forward(x)


def checkpoint_forms() -> None:
    """torch's checkpoint around two units at once, and around a module inside each unit, reentrant or not: what
    one process trains without checkpointing, as the sharded model without checkpointing does (plain)."""
    def run(mode: str, sharded: bool):
        model = Checkpointing(mode)
        engine = fsdp.shard_module(model, list(model.blocks), WEIGHTS) if sharded else None
        lo, hi = hb.row_range(hb.batch_rows(BATCH, engine.weights)) if engine else (0, BATCH)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(STEPS):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(BATCH, 16, generator=g, requires_grad=True), torch.randn(BATCH, generator=g)
            loss = ((model(x[lo:hi]) - y[lo:hi]) ** 2).sum() / BATCH
            loss.backward()
            opt.step()
            opt.zero_grad()
            total = torch.tensor([float(loss)], dtype=torch.float64)
            if engine:
                dist.all_reduce(total)
                assert all(u.full is None and not u.pointed for u in engine.units)
            losses.append(float(total))
        return losses, engine.full_state_dict() if engine else dict(model.named_parameters())

    ref_losses, ref_params = run("plain", False)
    for mode in ("plain", "span-reentrant", "span-nonreentrant", "inside-reentrant", "inside-nonreentrant"):
        losses, full = run(mode, True)
        loss = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        assert loss <= TOL_LOSS, (mode, losses, ref_losses)
        if ME == 0:
            param = max(float((full[k] - v).norm() / v.norm()) for k, v in ref_params.items())
            assert param <= TOL_PARAM_SGD, (mode, param)
            say(f"FIG checkpoint-forms {mode} loss={loss:.3g} param={param:.3g}")


def make_case(kind, mode):
    return lambda: checkpointing(kind, mode)


CASES = {f"{k}-{m}": make_case(k, m) for k in ("gpt2", "llama")
         for m in ("none", "hf-nonreentrant", "hf-reentrant", "torch-nonreentrant", "torch-reentrant")}
CASES.update({f"{k}-save": functools.partial(save_midway, k) for k in ("gpt2", "llama")})
CASES.update({f"{k}-resume": functools.partial(resume, k) for k in ("gpt2", "llama")})
CASES.update({"refusals": refusals, "transformers-methods": transformers_methods, "sgd-roundtrip": sgd_roundtrip,
              "checkpoint-forms": checkpoint_forms})
WEIGHTS = "3,1"
FOLDER = Path(".")


def main() -> int:
    global WEIGHTS, FOLDER
    args = sys.argv[1:]
    for option in ("--weights", "--folder"):
        if option in args:
            i = args.index(option)
            if option == "--weights":
                WEIGHTS = args[i + 1]
            else:
                FOLDER = Path(args[i + 1])
            del args[i:i + 2]
    watchdog.arm(WATCHDOG_SECONDS)
    hb.init()
    chosen = args or list(CASES)
    passed = run_checks(WORLD, chosen, lambda name: CASES[name]())
    dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
