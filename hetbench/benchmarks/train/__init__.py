"""`hetbench train`: a small training run (a deep residual MLP learning a fixed random teacher) across unequal,
mixed-vendor ranks, FSDP-style (uneven parameter shards), DDP (replicas) or as a pipeline (stages of layers); every
rank's GEMMs on its own device; the batch or the layers shared by the weights; every step logged; the loss curve
checked against the same run in one process.

This module declares the benchmark; the run on each rank is hetbench/train/numpy_frontend/run.py, the model and the
strategies hetbench/train/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import click

from hetbench.harness import split_plan as plan
from hetbench.benchmarks.base import (
    MODELLED_WITH_DEVICE,
    RANK_COLUMNS,
    SHOW_FILES,
    SHOW_WIDE,
    Column,
    RankResult,
    register,
)
from hetbench.benchmarks.train.config import TrainConfig
from hetbench.config import OutputConfig, parse_dtype
from hetbench.pytorch_support import GROUP_BACKENDS, PIPELINE_SCHEDULES, torch_problem
from hetbench.options import MAX_SEED, FolderPath, float_range, int_range, output_file, parse_backends
from hetbench.backends.host import host_memory_share_bytes
from hetbench.train import frontend as frontends
from hetbench.train import strategies, summary
from hetbench.train.memory import memory_errors
from hetbench.train.precision import TRAIN_DTYPES

FRONTENDS = strategies.FRONTENDS
DEFAULT_STRATEGY = strategies.DEFAULT
MODELS = ("mlp", "gpt")
MAX_SEQ_LEN = 1 << 16
OPTIMIZERS = ("adamw", "sgd")
MAX_LAYERS = 10_000
MAX_HIDDEN = 1 << 16
MAX_BATCH = 1 << 24
MAX_STEPS = 10_000_000

_M = MODELLED_WITH_DEVICE
COLUMNS: tuple[Column, ...] = (
    *RANK_COLUMNS,
    Column("strategy", "Strategy", text=True, show=SHOW_FILES),
    Column("weight_percent", "Share", "%", digits=3),
    Column("samples_per_step", "Samples", text=True, short_label="Samples\n/step"),
    Column("step_seconds_median", "Step", "ms", 1e3, better="lower"),
    Column("compute_seconds_median", "Compute", "ms", 1e3, modelled=_M, better="lower"),
    Column("comm_seconds_median", "Comm", "ms", 1e3, better="lower"),
    Column("idle_seconds_median", "Idle", "ms", 1e3, modelled=_M, better="lower"),
    Column("param_bytes", "Params", "KiB", 1 / 1024, show=SHOW_WIDE),
    Column("grad_bytes", "Grads", "KiB", 1 / 1024, show=SHOW_WIDE),
    Column("optimizer_bytes", "Optimizer", "KiB", 1 / 1024, show=SHOW_WIDE),
)


class Train:
    name = "train"
    summary = ("A model trained across the ranks' devices, every step logged, the loss curve checked against one "
               "process: hetbench's MLP (fsdp, ddp, pipeline) or, with --frontend torch, a PyTorch MLP or GPT (torch's "
               "ddp, fsdp2, or hetbench's uneven fsdp) over the hetbench backend; shares by weights.")
    columns = COLUMNS
    from hetbench.benchmarks.train.present import PRESENTATION as presentation  # report, compare, the page

    def options(self) -> list[click.Parameter]:
        strategies.load_plugins()  # the strategies of both front ends, from their registry (train/strategies.py)
        names = list(dict.fromkeys(name for _, name in strategies.REGISTRY))
        return [
            click.Option(["--frontend"], type=click.Choice(FRONTENDS), default="numpy", show_default=True,
                         help="numpy: hetbench's own trainer (every rank's GEMMs on its hetbench device); torch: a "
                              "PyTorch model trained by torch's DDP or FSDP2 over the hetbench torch.distributed "
                              "backend (needs torch: pip install 'hetbench[torch]')."),
            click.Option(["--strategy"], type=click.Choice(names), default=None,
                         show_default="fsdp; fsdp2 with --frontend torch",
                         help="numpy: fsdp (each layer's parameters sharded by the weights, gathered for use, "
                              "gradients reduce-scattered), ddp (replicas, gradients allreduced) or pipeline "
                              "(stages of layers by the weights, micro-batches, GPipe). torch: ddp (torch's "
                              "DistributedDataParallel), fsdp2 (torch's fully_shard: even parameter shards) or fsdp "
                              "(hetbench's own: each unit's parameters, gradients and optimizer state sharded by "
                              "the weights, capped by each rank's free memory), gradients summed so that uneven "
                              "batch shares are exact."),
            click.Option(["--model"], type=click.Choice(MODELS), default="mlp", show_default=True,
                         help="What --frontend torch trains: mlp (the residual MLP teacher task of the numpy "
                              "trainer) or gpt (a small char-level decoder-only transformer on a text shipped with "
                              "hetbench; --layers blocks of width --hidden)."),
            click.Option(["--seq-len"], type=int_range(1, MAX_SEQ_LEN), default=64, show_default=True,
                         help="--model gpt only: characters of context per sequence (a row of the batch)."),
            click.Option(["--heads"], type=int_range(1, MAX_HIDDEN), default=4, show_default=True,
                         help="--model gpt only: attention heads (must divide --hidden)."),
            click.Option(["--layers"], type=int_range(1, MAX_LAYERS), default=4, show_default=True,
                         help="Residual layers: h + relu(h W + b); --model gpt: transformer blocks (gpt default 2)."),
            click.Option(["--hidden"], type=int_range(1, MAX_HIDDEN), default=32, show_default=True,
                         help="Width of every layer (--model gpt: the embedding width, default 64)."),
            click.Option(["--batch"], type=int_range(1, MAX_BATCH), default=64, show_default=True,
                         help="The global batch, shared by the weights (fsdp, ddp) or cut into micro-batches."),
            click.Option(["--steps"], type=int_range(1, MAX_STEPS), default=300, show_default=True,
                         help="Optimizer steps."),
            click.Option(["--lr"], type=float_range(min=0, min_open=True), default=1e-2, show_default=True,
                         help="Learning rate."),
            click.Option(["--optimizer"], type=click.Choice(OPTIMIZERS), default="adamw", show_default=True,
                         help="AdamW (decoupled weight decay) or plain SGD; state sharded with the parameters."),
            click.Option(["--seed"], type=int_range(0, MAX_SEED), default=0, show_default=True,
                         help="Seeds the parameters, the teacher and the data."),
            click.Option(["--dtype"], type=click.Choice(list(TRAIN_DTYPES)), default="fp32", show_default=True,
                         help="What the GEMMs compute in. fp16/bf16: mixed precision: fp32 master weights, "
                              "gradients and optimizer state; GEMM operands and results rounded to the dtype "
                              "(natively where the device offers it, else emulated); fp16 with dynamic loss "
                              "scaling. --frontend torch: torch's autocast, the same loss scaling."),
            *_run_options(),
        ]

    def configure(self, params: dict[str, Any], world: Any, output: OutputConfig) -> TrainConfig:
        ctx = click.get_current_context()
        _check_frontend(params, world)
        try:
            weights = plan.parse_weights(params["weights"], world.size)
        except plan.WeightsError as e:
            raise click.BadParameter(str(e), param_hint="'--weights'") from None
        if params["frontend"] == "torch" and params["tp"] > 1:
            _check_tensor(params, weights, world.size)
        if params["frontend"] == "torch" and params["pp"] > 1:
            _check_pipeline(params, weights, world.size)
        elif not (params["frontend"] == "torch" and params["tp"] > 1):
            _check_work_for_every_rank(params, weights, world.size)
        if params["solo_between_steps"] and world.size < 2:
            raise click.BadParameter("sets each rank alone against the others' job; with 1 rank the run itself is "
                                     "the solo run (leave it out, or run 2 ranks or more)",
                                     param_hint="'--solo-between-steps'")
        if params["checkpoint_every"] and params["checkpoint"] is None:
            raise click.BadParameter("needs --checkpoint DIR to save in", param_hint="'--checkpoint-every'")
        return TrainConfig(
            strategy=params["strategy"], layers=params["layers"], hidden=params["hidden"], batch=params["batch"],
            steps=params["steps"], lr=params["lr"], optimizer=params["optimizer"], seed=params["seed"],
            dtype=parse_dtype(params["dtype"]), weights=weights, micro_batches=params["micro_batches"],
            path=params["path"], prefetch=params["prefetch"], warmup_steps=params["warmup_steps"],
            solo_between_steps=params["solo_between_steps"],
            check=params["check"], log=params["log_path"],
            checkpoint=params["checkpoint"], checkpoint_every=params["checkpoint_every"], resume=params["resume"],
            backends=parse_backends(world, ctx.params["backend"]), output=output,
            frontend=params["frontend"], model=params["model"], seq_len=params["seq_len"], heads=params["heads"],
            pp=params["pp"], schedule=params["schedule"], group_backend=params["group_backend"], tp=params["tp"],
            tp_impl=params["tp_impl"],
        )

    def output_paths(self, cfg: TrainConfig) -> dict[str, tuple[Any, int]]:
        return {"--log": (cfg.log, 0)}

    def dtype(self, cfg: TrainConfig) -> Any:
        """What every rank's device must compute in: fp32. Mixed precision computes fp16/bf16 natively where the
        device offers it and emulates it with fp32 GEMMs elsewhere (hetbench/harness/ops.py), so no device is
        refused for lacking the reduced dtype."""
        return parse_dtype("fp32")

    def prepare(self, cfg: TrainConfig, world: Any, device: Any) -> tuple[Any, list[str]]:
        errors = memory_errors(cfg, world.rank, host_memory_share_bytes(world.local_size))
        if errors:  # before the front end makes anything
            return None, errors
        return frontends.get(cfg.frontend).prepare(cfg, world, device)

    def check(self, cfg: TrainConfig, world: Any, state: Any) -> list[str]:
        return frontends.get(cfg.frontend).check(cfg, world, state)

    def run(self, cfg: TrainConfig, world: Any, state: Any, on_step: Any) -> RankResult:
        outcome = frontends.get(cfg.frontend).run_rank(cfg, world, state, on_step)
        files = [("--log", cfg.log, outcome.log_text)] if world.rank == 0 and cfg.log is not None else []
        outcome.log_text = None
        return RankResult(outcome, files)

    def rows(self, cfg: TrainConfig, gathered: Sequence[Any]) -> list[dict[str, Any]]:
        return summary.rows(cfg, list(gathered))

    def summarize(self, cfg: TrainConfig, rows: list[dict[str, Any]], gathered: Sequence[Any]) -> dict[str, Any]:
        return {**summary.summarize_job(cfg, rows, list(gathered)),
                **frontends.get(cfg.frontend).summary_extra(cfg, list(gathered))}

    def document_extra(self, cfg: TrainConfig, gathered: Sequence[Any]) -> dict[str, Any]:
        return {"steps": summary.step_lines(cfg, list(gathered))}


def _run_options() -> list[click.Parameter]:
    """The options of how the run goes: the shares, the strategies' own, timing, the check, the files."""
    return [
        click.Option(["--weights"], default="even", show_default=True, metavar="even|auto|PROFILE|W0,W1,..",
                     help="Each rank's share of the batch (fsdp, ddp) or of the layers (pipeline): even; auto "
                          "(each rank's GEMM rate at a layer's shape, measured beside the others; fsdp and ddp "
                          "then rebalance the batch by each rank's measured step in the first 4 steps; --frontend "
                          "torch: each rank's samples/s through the model, rebalanced the same way); a profile "
                          "from `hetbench calibrate`; or one weight >= 0 per rank."),
        click.Option(["--micro-batches", "--microbatches", "micro_batches"], type=int_range(1, MAX_BATCH), default=4,
                     show_default=True, help="--strategy pipeline (numpy), --pp (torch): micro-batches per step."),
        click.Option(["--pp"], type=int_range(1, MAX_LAYERS), default=1, show_default=True,
                     help="--frontend torch: pipeline stages, each a contiguous share of the model's blocks cut by "
                          "the weights (auto: each rank's measured time per block) and the ranks' memory; with more "
                          "ranks than stages the rest is data parallel by --strategy (a pp x dp mesh)."),
        click.Option(["--tp"], type=int_range(1, MAX_HIDDEN), default=1, show_default=True,
                     help="--frontend torch: tensor-parallel degree: each layer's columns, rows and attention heads "
                          "cut over groups of N ranks by the weights (Megatron's column/row pairs; uneven); with "
                          "more ranks than N the groups are data parallel by --strategy (a tp x dp mesh)."),
        click.Option(["--tp-impl"], type=click.Choice(["hetbench", "torch"]), default="hetbench", show_default=True,
                     help="--tp: hetbench's cut by the weights, or torch's own even tensor parallelism "
                          "(parallelize_module over the hetbench backend; even weights, --tp = the ranks, no "
                          "checkpoint): the baseline the tensor bench measures against."),
        click.Option(["--schedule"], type=click.Choice(PIPELINE_SCHEDULES), default="1f1b", show_default=True,
                     help="--pp: the pipeline's schedule (torch.distributed.pipelining's GPipe or 1F1B)."),
        click.Option(["--group-backend"], type=click.Choice(GROUP_BACKENDS), default="auto", show_default=True,
                     help="--pp, --tp: auto puts each pipeline, tensor or data-parallel group whose ranks are of "
                          "one kind on torch's native backend for it (gloo for CPU tensors, nccl for one vendor's "
                          "GPUs), and only a group that spans kinds on hetbench's; hetbench, gloo, nccl: every group "
                          "on that one (hetbench's fsdp's groups stay on hetbench's)."),
        click.Option(["--path"], type=click.Choice(["host", "device"]), default="host", show_default=True,
                     help="How a GPU rank's parameters, gradients and activations reach MPI: through host copies "
                          "(host), or as GPU memory (device: needs a GPU-aware MPI). Ranks whose training "
                          "state is in host memory (host, OpenCL) hand it to MPI directly either way."),
        click.Option(["--warmup-steps"], type=int_range(0, MAX_STEPS), default=0, show_default=True,
                     help="Leave the run's first N steps out of the timing figures (the medians and samples/s): "
                          "warm-up, and auto weights' rebalancing in the first 4. They are still logged and "
                          "checked."),
        click.Option(["--prefetch/--no-prefetch"], default=True, show_default=True,
                     help="fsdp: start gathering the next layer's (unit's) parameters while this one computes "
                          "(nonblocking MPI, tested after every GEMM); the summary says how much of the "
                          "gathers' time that hid."),
        click.Option(["--solo-between-steps"], is_flag=True, default=False,
                     help="Several ranks: after each timed step every rank in turn trains the whole batch "
                          "alone (numpy: a fresh one-rank run of the same strategy; torch: the plain model; 2 "
                          "steps, the last one timed) while the others wait; the summary divides the job's "
                          "samples/s by the sum of those solo rates, measured in the same seconds as the job's "
                          "steps."),
        click.Option(["--check/--no-check"], default=True, show_default=True,
                     help="Train the same run in one process at rank 0 afterwards and check the loss curve "
                          "against it (fp32 tolerance; mixed precision: the dtype's)."),
        click.Option(["--log", "log_path"], type=output_file(), default=None,
                     help="Write one JSON line per step here (rank 0), with the results."),
        click.Option(["--checkpoint", "checkpoint"], type=FolderPath(),
                         default=None,
                     help="Save the training state in this folder at the end (and every --checkpoint-every "
                          "steps): each rank its own part, DIR/step-N/, DIR/latest names the newest."),
        click.Option(["--checkpoint-every"], type=int_range(0, MAX_STEPS), default=0, show_default=True,
                     help="With --checkpoint: also save after every N steps (0: only at the end)."),
        click.Option(["--resume", "resume"], type=click.Path(path_type=Path), default=None,
                     help="Continue from this checkpoint folder (its latest step, or a step-N folder) to "
                          "--steps; any strategy, rank count or weights (re-sharded)."),
    ]


def _check_frontend(params: dict[str, Any], world: Any) -> None:
    """The front end's strategy, model and options agree, and torch is here on every rank (agreed: a rank
    without torch must not leave the others waiting); fills in the front end's default strategy."""
    frontend = params["frontend"]
    if params["strategy"] is None:
        params["strategy"] = DEFAULT_STRATEGY[frontend]
    strategy = params["strategy"]
    own = strategies.names(frontend)
    if strategy not in own:
        other = next(f for f in FRONTENDS if strategy in strategies.names(f))
        raise click.BadParameter(f"{strategy} is a strategy of --frontend {other}; accepted with --frontend "
                                 f"{frontend}: {', '.join(own)}", param_hint="'--strategy'")
    if frontend == "numpy" and params["model"] != "mlp":
        raise click.BadParameter(f"{params['model']} is trained by --frontend torch; the numpy trainer trains "
                                 "mlp", param_hint="'--model'")
    _refuse_options_that_do_not_apply(params)
    if frontend == "numpy":
        return
    errors = world.agree(torch_problem())
    if errors:
        e = errors[0]
        where = f"rank {e.rank} ({e.host}): " if world.size > 1 else ""
        raise click.UsageError(f"--frontend torch: {where}{e.message}")
    if params["model"] == "gpt":
        _gpt_defaults(params)
        if params["hidden"] % params["heads"]:
            raise click.BadParameter(f"--heads {params['heads']} does not divide --hidden {params['hidden']}",
                                     param_hint="'--heads'")


def _check_work_for_every_rank(params: dict[str, Any], weights: Any, ranks: int) -> None:
    """Every working rank (every rank; with a list of weights, those with a non-zero one) gets at least one of
    what the strategy shares: a sample of the batch, or a layer; micro-batches hold at least a sample each."""
    record = strategies.get(params["frontend"], params["strategy"])
    working = sum(1 for w in weights.values if w > 0) if weights.kind == "list" else ranks
    which = f"the {working} ranks with a non-zero weight" if weights.kind == "list" else f"the {ranks} ranks"
    if record.shares_of == "samples" and params["batch"] < working:
        raise click.BadParameter(f"{params['batch']} is smaller than {which}: each needs at least one sample",
                                 param_hint="'--batch'")
    if record.shares_of == "layers" and params["layers"] < working:
        raise click.BadParameter(f"{params['layers']} layers are fewer than {which}: each stage needs a layer",
                                 param_hint="'--layers'")
    if "micro_batches" in record.options and params["micro_batches"] > params["batch"]:
        raise click.BadParameter(f"{params['micro_batches']} micro-batches are more than the batch of "
                                 f"{params['batch']}", param_hint="'--micro-batches'")


def _check_pipeline(params: dict[str, Any], weights: Any, ranks: int) -> None:
    """--pp N: N divides the ranks, every stage a block, 1F1B a micro-batch per stage, every replica whole
    micro-batches of at least one row, every rank a weight (each holds a stage)."""
    stages, mbs, batch = params["pp"], params["micro_batches"], params["batch"]
    if ranks % stages:
        divisors = ", ".join(str(d) for d in range(1, ranks + 1) if ranks % d == 0)
        raise click.BadParameter(f"{stages} does not divide the {ranks} ranks (accepted: {divisors})",
                                 param_hint="'--pp'")
    if stages > params["layers"]:
        raise click.BadParameter(f"{stages} stages are more than the model's {params['layers']} blocks (--layers): "
                                 "each stage holds at least one", param_hint="'--pp'")
    if params["schedule"] == "1f1b" and mbs < stages:
        raise click.BadParameter(f"{mbs} is below the {stages} stages: 1F1B needs at least one micro-batch per "
                                 "stage (or --schedule gpipe)", param_hint="'--micro-batches'")
    replicas = ranks // (stages * params["tp"])
    if batch % mbs or batch // mbs < replicas:
        raise click.BadParameter(f"{batch} rows do not split into {mbs} equal micro-batches of at least one row for "
                                 f"each of the {replicas} pipelines (accepted: a multiple of {mbs * replicas})",
                                 param_hint="'--batch'")
    if weights.kind == "list" and min(weights.values) <= 0:
        rank = min(r for r, w in enumerate(weights.values) if w <= 0)
        raise click.BadParameter(f"rank {rank}'s weight {weights.values[rank]} leaves it nothing, and with --pp "
                                 "every rank holds a stage (give each a weight > 0)", param_hint="'--weights'")


def _check_tensor(params: dict[str, Any], weights: Any, ranks: int) -> None:
    """--tp N: N divides the ranks, every replica a row, no pipeline beside it (yet), a head per tensor rank."""
    tp, stages = params["tp"], params["pp"]
    per = ranks // stages if ranks % stages == 0 else ranks
    if per % tp:
        divisors = ", ".join(str(d) for d in range(1, per + 1) if per % d == 0)
        where = f"a stage's {per} ranks (--pp {stages})" if stages > 1 else f"the {ranks} ranks"
        raise click.BadParameter(f"{tp} does not divide {where} (accepted: {divisors})", param_hint="'--tp'")
    if params["model"] == "gpt" and params["heads"] < tp:
        raise click.BadParameter(f"{tp} is more than the gpt's {params['heads']} attention heads (--heads): each "
                                 f"tensor rank needs a whole head (accepted: --tp {params['heads']} or less)",
                                 param_hint="'--tp'")
    if params["batch"] < ranks // tp:
        raise click.BadParameter(f"{params['batch']} is smaller than the {ranks // tp} tensor-parallel groups: each "
                                 "needs at least one row", param_hint="'--batch'")
    if params["tp_impl"] == "torch":
        for bad, why in ((weights.kind != "even", f"--weights {params['weights']}: torch's cut is even only"),
                         (ranks != tp, f"--tp {tp} on {ranks} ranks: its groups beside data or pipeline "
                                       "parallelism are hetbench's"),
                         (params["checkpoint"] is not None or params["resume"] is not None,
                          "--checkpoint/--resume: its DTensor state is not saved")):
            if bad:
                raise click.BadParameter(f"torch with {why} (accepted: --tp-impl torch with even weights, --tp equal "
                                         "to the ranks, no checkpoint; or --tp-impl hetbench)",
                                         param_hint="'--tp-impl'")
    if weights.kind == "list" and stages == 1:
        for j in range(ranks // tp):
            if sum(weights.values[j * tp:(j + 1) * tp]) <= 0:
                raise click.BadParameter(f"ranks {j * tp}-{(j + 1) * tp - 1} (tensor-parallel group {j}) all have "
                                         "weight 0: a group needs one rank that computes", param_hint="'--weights'")


def _given(name: str) -> bool:
    """Whether the user gave option `name` (on the command line): one left at its default is not given."""
    from click.core import ParameterSource

    return click.get_current_context().get_parameter_source(name) not in (None, ParameterSource.DEFAULT,
                                                                           ParameterSource.DEFAULT_MAP)


def _refuse_options_that_do_not_apply(params: dict[str, Any]) -> None:
    """An option given where the chosen model or strategy has no use for it is a usage error (one line, alike on
    every rank: the command line decides it), never silently ignored."""
    frontend, model, strategy = params["frontend"], params["model"], params["strategy"]
    if model != "gpt":
        where = "--frontend torch --model gpt" if frontend == "numpy" else "--model gpt"
        for option, what in (("seq_len", "the gpt's characters of context per sequence"),
                             ("heads", "the gpt's attention heads")):
            if _given(option):
                flag = "--" + option.replace("_", "-")
                raise click.UsageError(f"{flag} {params[option]} does not apply: it sets {what} ({where}), and the "
                                       f"model here is {model}; leave it out")
    record = strategies.REGISTRY.get((frontend, strategy))
    piped = frontend == "torch" and params["pp"] > 1
    if params["pp"] > 1 and frontend != "torch":
        raise click.UsageError(f"--pp {params['pp']} does not apply: it cuts a PyTorch model into pipeline stages "
                               "(--frontend torch); the numpy trainer's pipeline is --strategy pipeline")
    if _given("tp_impl") and not (frontend == "torch" and params["tp"] > 1):
        raise click.UsageError(f"--tp-impl {params['tp_impl']} does not apply: it picks how --frontend torch --tp N "
                               "(N > 1) cuts the layers, and there is no --tp here; leave it out")
    if params["tp"] > 1 and frontend != "torch":
        raise click.UsageError(f"--tp {params['tp']} does not apply: it cuts a PyTorch model's layers across ranks "
                               "(--frontend torch)")
    if not piped and not (frontend == "torch" and params["tp"] > 1) and _given("group_backend"):
        raise click.UsageError(f"--group-backend {params['group_backend']} does not apply: it sets the groups of "
                               "--frontend torch --pp N or --tp N (N > 1), and there are none here; leave it out")
    for option, flag in (("schedule", "--schedule"),):
        if not piped and _given(option):
            raise click.UsageError(f"{flag} {params[option]} does not apply: it sets the pipeline of --frontend "
                                   "torch --pp N (N > 1), and there is none here; leave it out")
    if not (record and "micro_batches" in record.options) and not piped and _given("micro_batches"):
        takers = [s for s in strategies.REGISTRY.values() if "micro_batches" in s.options]
        where = ", ".join(f"--strategy {s.name} (--frontend {s.frontend})" for s in takers)
        why = (f"--frontend {frontend} has no such strategy (its strategies: {', '.join(strategies.names(frontend))})"
               if not any(s.frontend == frontend for s in takers) else f"the strategy here is {strategy}")
        raise click.UsageError(f"--micro-batches {params['micro_batches']} does not apply: it cuts the batch of "
                               f"{where}, and {why}; leave it out")


def _gpt_defaults(params: dict[str, Any]) -> None:
    """--model gpt: the options left at their defaults (the mlp's) take the gpt's (hetbench.train.torch_frontend.models
    GPT_DEFAULTS, GPT_LR: a loss that falls visibly in a few hundred CPU steps)."""
    from click.core import ParameterSource

    from hetbench.train.torch_frontend.models import GPT_DEFAULTS, GPT_LR  # torch: only for --frontend torch

    ctx = click.get_current_context()
    for name, value in {**GPT_DEFAULTS, "lr": GPT_LR}.items():
        if ctx.get_parameter_source(name) in (None, ParameterSource.DEFAULT):
            params[name] = value


register(Train())
