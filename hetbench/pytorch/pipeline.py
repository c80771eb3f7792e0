"""Pipeline parallelism for a user's torch model, its stages cut by each device's speed and memory, over
torch.distributed.pipelining's stages and schedules (GPipe, 1F1B), composed with data parallelism on a 2-D mesh
(pp x dp, torchtitan's layout: rank = stage * dp + replica), each group on the fastest backend it can use.

A model is given as its parts: what runs before the blocks (`pre`, an embedding), the blocks (a transformers
decoder's layers), what runs after (`post`, the final norm and head) and `loss_fn(output, target)`. A stage holds
contiguous blocks (the first also `pre`, the last `post`). `cut_stages` chooses the cut that minimises the slowest
stage's time from each stage's cost of each block (measured, or a block's matmul parameters over the stage's
speed), each stage's parameter, gradient, optimizer and in-flight activation bytes held within its ranks' memory.

Exactness: with `loss_fn` returning a micro-batch's part of the global batch's mean loss and the schedule's
gradient scaling off (`scale_grads=False`), the micro-batches' gradients sum to the whole batch's, as one process
computes them (only the order of the sums differs).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from hetbench.harness.split_plan import shares
from hetbench.pytorch_support import GROUP_BACKENDS, PIPELINE_SCHEDULES

# the bytes of training state per parameter byte beside the parameter itself: its gradient, and the optimizer's
# moments (AdamW: 2, SGD without momentum: 0)
STATE_FACTOR = {"adamw": 3, "sgd": 1}


class PipelineError(ValueError):
    """A pipeline that cannot be built as asked (said in one line, the same on every rank)."""


@dataclass
class Parts:
    """A model as a pipeline sees it: `pre`, then `blocks` in order, then `post` (either may be None), and the
    names its parameters have in the whole model (a prefix for each part) so that a stage's state reads as the
    model's."""

    blocks: list[nn.Module]
    pre: nn.Module | None = None
    post: nn.Module | None = None
    block_names: list[str] = field(default_factory=list)  # "blocks.3": the prefix of block i's parameters
    pre_names: dict[str, str] = field(default_factory=dict)  # pre's parameter name -> the model's
    post_names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.block_names:
            self.block_names = [f"blocks.{i}" for i in range(len(self.blocks))]


def parts_of(model: nn.Module, blocks: Sequence[nn.Module], pre: nn.Module | None = None,
             post: nn.Module | None = None) -> Parts:
    """Parts whose names are `model`'s own (each block found among model's submodules by identity; pre and post
    may be modules of the caller's that hold model's submodules). Raises PipelineError naming a block that is not
    one of model's modules, or one given twice."""
    where = {id(m): name for name, m in model.named_modules()}
    names = {id(p): name for name, p in model.named_parameters()}
    block_names = []
    for i, b in enumerate(blocks):
        if id(b) not in where:
            raise PipelineError(f"block {i} ({type(b).__name__}) is not a module of the model: give the model's own "
                                "blocks (for a transformers decoder, model.model.layers)")
        block_names.append(where[id(b)])
    if len(set(block_names)) != len(block_names):
        raise PipelineError("a block is given twice: each of the model's blocks goes to one stage")

    def own(part: nn.Module | None, what: str) -> dict[str, str]:
        out = {}
        for n, p in (part.named_parameters() if part is not None else ()):
            if id(p) not in names:
                raise PipelineError(f"{what}'s parameter {n} is not one of the model's: its state could not be "
                                    "checked or saved as the model's")
            out[n] = names[id(p)]
        return out

    return Parts(list(blocks), pre, post, block_names, own(pre, "pre"), own(post, "post"))


# -- the cut ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cut:
    """Stage s holds blocks [bounds[s], bounds[s + 1])."""

    bounds: tuple[int, ...]
    stage_seconds: tuple[float, ...]  # each stage's cost of a micro-batch's forward + backward, as planned
    stage_bytes: tuple[int, ...]  # each stage's planned bytes held (state + activations in flight)

    def blocks(self, stage: int) -> range:
        return range(self.bounds[stage], self.bounds[stage + 1])

    @property
    def counts(self) -> list[int]:
        return [self.bounds[s + 1] - self.bounds[s] for s in range(len(self.bounds) - 1)]


def in_flight(schedule: str, stage: int, stages: int, microbatches: int) -> int:
    """The micro-batches whose activations a stage holds at once: GPipe all of them; 1F1B at most the stages after
    it, itself included."""
    return microbatches if schedule == "gpipe" else min(microbatches, stages - stage)


def even_cut(blocks: int, stages: int) -> tuple[int, ...]:
    """Blocks as even as whole blocks allow, the first stages taking one more (what a user cuts by hand)."""
    base, extra = divmod(blocks, stages)
    bounds = [0]
    for s in range(stages):
        bounds.append(bounds[-1] + base + (1 if s < extra else 0))
    return tuple(bounds)


def cut_stages(costs: Sequence[Sequence[float]], fixed: Sequence[float] = (), block_bytes: Sequence[int] = (),
               act_bytes: Sequence[int] = (), fixed_bytes: Sequence[int] = (),
               caps: Sequence[int | None] = (), flights: Sequence[int] = ()) -> Cut:
    """The contiguous cut of the blocks into len(costs) stages (each holding at least one) that minimises the
    slowest stage's time, stage s's time the sum of costs[s][b] over its blocks plus fixed[s] (pre on the first,
    post on the last), among the cuts whose every stage holds its blocks' state bytes + their activations of one
    micro-batch times flights[s], plus fixed_bytes[s], within caps[s] (None: no cap). Ties go to the cut with
    more blocks early. Raises PipelineError where no cut fits."""
    stages, blocks = len(costs), len(costs[0]) if costs else 0
    if stages < 1 or blocks < stages:
        raise PipelineError(f"{stages} stages need at least {stages} blocks, the model has {blocks}")
    fixed = list(fixed) or [0.0] * stages
    block_bytes = list(block_bytes) or [0] * blocks
    act_bytes = list(act_bytes) or [0] * blocks
    fixed_bytes = list(fixed_bytes) or [0] * stages
    caps = list(caps) or [None] * stages
    flights = list(flights) or [1] * stages
    prefix = [[0.0] * (blocks + 1) for _ in range(stages)]
    for s in range(stages):
        for b in range(blocks):
            prefix[s][b + 1] = prefix[s][b] + float(costs[s][b])

    def seconds(s: int, a: int, b: int) -> float:
        return prefix[s][b] - prefix[s][a] + fixed[s]

    def held(s: int, a: int, b: int) -> int:
        return sum(block_bytes[a:b]) + sum(act_bytes[a:b]) * flights[s] + fixed_bytes[s]

    def fits(s: int, a: int, b: int) -> bool:
        return caps[s] is None or held(s, a, b) <= caps[s]

    # best[s][b]: the least slowest-stage time of stages 0..s holding blocks [0, b)
    best = [[math.inf] * (blocks + 1) for _ in range(stages)]
    back = [[0] * (blocks + 1) for _ in range(stages)]
    for b in range(1, blocks - stages + 2):
        if fits(0, 0, b):
            best[0][b] = seconds(0, 0, b)
    for s in range(1, stages):
        for b in range(s + 1, blocks - (stages - 1 - s) + 1):
            for a in range(b - 1, s - 1, -1):
                if best[s - 1][a] == math.inf or not fits(s, a, b):
                    continue
                t = max(best[s - 1][a], seconds(s, a, b))
                if t < best[s][b] - 1e-15:
                    best[s][b], back[s][b] = t, a
    if best[stages - 1][blocks] == math.inf:
        raise PipelineError(f"no cut of the {blocks} blocks into {stages} stages fits the ranks' memory "
                            f"({', '.join(_cap_text(c) for c in caps)})")
    bounds = [blocks]
    for s in range(stages - 1, 0, -1):
        bounds.append(back[s][bounds[-1]])
    bounds = tuple([0] + bounds[::-1])
    return Cut(bounds, tuple(seconds(s, bounds[s], bounds[s + 1]) for s in range(stages)),
               tuple(held(s, bounds[s], bounds[s + 1]) for s in range(stages)))


def _cap_text(cap: int | None) -> str:
    return "unknown" if cap is None else f"{cap} bytes"


def fixed_cut(bounds: Sequence[int], costs: Sequence[Sequence[float]], fixed: Sequence[float] = ()) -> Cut:
    """A given cut (the even one) with its planned stage times."""
    fixed = list(fixed) or [0.0] * len(costs)
    secs = tuple(sum(costs[s][b] for b in range(bounds[s], bounds[s + 1])) + fixed[s] for s in range(len(costs)))
    return Cut(tuple(bounds), secs, tuple(0 for _ in costs))


# -- the schedule's time, modelled ------------------------------------------------------------------------------------

def schedule_order(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The order a stage runs its micro-batches' forwards ("F") and backwards ("B") in."""
    if schedule == "gpipe":
        return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]
    warm = min(microbatches, stages - stage - 1)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while b < microbatches:
        if f < microbatches:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
        b += 1
    return order


def modelled_step_seconds(schedule: str, forward: Sequence[float], backward: Sequence[float],
                          microbatches: int) -> tuple[float, list[float]]:
    """The step's time when stage s takes forward[s] and backward[s] seconds per micro-batch and messages cost
    nothing: each action starts when its stage is free and its input has come (a forward after the previous
    stage's forward of it, a backward after the next stage's backward of it). Returns (the step's seconds, each
    stage's idle share of it)."""
    stages = len(forward)
    orders = [schedule_order(schedule, s, stages, microbatches) for s in range(stages)]
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * stages
    pos = [0] * stages
    while any(pos[s] < len(orders[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            if pos[s] >= len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            need = (("F", s - 1, i) if s > 0 else None) if kind == "F" else \
                (("B", s + 1, i) if s < stages - 1 else ("F", s, i))
            if need is not None and need not in done:
                continue
            start = max(free[s], done[need] if need is not None else 0.0)
            free[s] = done[(kind, s, i)] = start + (forward[s] if kind == "F" else backward[s])
            pos[s] += 1
            moved = True
        if not moved:  # pragma: no cover - the orders above always move
            raise RuntimeError("the modelled schedule is stuck")
    step = max(free)
    busy = [microbatches * (forward[s] + backward[s]) for s in range(stages)]
    return step, [1.0 - b / step if step > 0 else 0.0 for b in busy]


def theoretical_bubble(stages: int, microbatches: int) -> float:
    """GPipe's and 1F1B's idle share of a step with equal stages: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


# -- what each block costs -------------------------------------------------------------------------------------------

def matmul_parameters(module: nn.Module | None) -> int:
    """A part's cost proxy where none is measured: the elements of its nn.Linear (and transformers Conv1D)
    weights, which a row's forward and backward multiply by (embeddings, norms and biases cost next to nothing)."""
    if module is None:
        return 0
    total = 0
    for m in module.modules():
        if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D":
            total += m.weight.numel()
    return total


def parameter_bytes(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() * p.element_size() for p in module.parameters())


def saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """The bytes autograd saves for backward while `fn()` runs (its activations), counted by saved-tensor hooks."""
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def measure_parts(parts: Parts, x: torch.Tensor, repeats: int = 4,
                  clock: Callable[[Callable[[], Any]], float] | None = None) -> tuple[list[float], list[int]]:
    """Forward + backward seconds of one micro-batch `x` through each part on this rank ([pre, *blocks, post],
    0 for a part that is None), the best of `repeats` after one warm-up, and each part's saved activation bytes.
    `clock(fn)` times fn (default: wall time, the caller's device synchronised by fn)."""
    import time

    def wall(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    clock = clock or wall
    modules = [parts.pre, *parts.blocks, parts.post]
    inputs, acts = [], []
    h = x
    for m in modules:  # each part's input: the chain's activation before it
        inp = h.detach().requires_grad_(h.is_floating_point())
        inputs.append(inp)
        acts.append(saved_bytes(lambda: m(inp)) if m is not None else 0)
        if m is not None:
            with torch.no_grad():
                h = m(inp)
    rounds: list[list[float]] = [[] for _ in modules]
    for r in range(repeats + 1):  # round by round over the chain: a drift of the machine touches every part alike
        for i, (m, inp) in enumerate(zip(modules, inputs)):
            if m is not None:
                t = clock(lambda: _forward_backward(m, inp))
                if r:
                    rounds[i].append(t)
    for m in modules:
        if m is not None:
            m.zero_grad(set_to_none=True)
    return [statistics.median(t) if t else 0.0 for t in rounds], acts


def _forward_backward(m: nn.Module, inp: torch.Tensor) -> None:
    out = m(inp)
    # a dense gradient, as a next stage sends (sum()'s is a stride-0 view, which some paths copy first)
    if out.is_floating_point():
        out.backward(torch.ones(out.shape, dtype=out.dtype, device=out.device))
    else:
        out.float().sum().backward()


# -- the mesh and its groups ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mesh:
    """pp x dp (x tp) ranks, torchtitan's layout: rank r is stage r // (dp tp), replica (r // tp) % dp, tensor rank
    r % tp (tp innermost: a stage's tensor-parallel ranks are neighbours, on one node where they can be)."""

    pp: int
    dp: int
    tp: int = 1

    def stage_of(self, rank: int) -> int:
        return rank // (self.dp * self.tp)

    def replica_of(self, rank: int) -> int:
        return (rank // self.tp) % self.dp

    def tp_of(self, rank: int) -> int:
        return rank % self.tp

    def rank(self, stage: int, replica: int, t: int = 0) -> int:
        return (stage * self.dp + replica) * self.tp + t

    def pp_ranks(self, replica: int, t: int = 0) -> list[int]:
        return [self.rank(s, replica, t) for s in range(self.pp)]

    def dp_ranks(self, stage: int, t: int = 0) -> list[int]:
        return [self.rank(stage, j, t) for j in range(self.dp)]

    def tp_ranks(self, stage: int, replica: int) -> list[int]:
        return [self.rank(stage, replica, t) for t in range(self.tp)]

    def stage_ranks(self, stage: int) -> list[int]:
        return [self.rank(stage, j, t) for j in range(self.dp) for t in range(self.tp)]


def mesh_for(world_size: int, pp: int, tp: int = 1) -> Mesh:
    if pp < 1 or world_size % pp:
        divisors = ", ".join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)
        raise PipelineError(f"--pp {pp} does not divide the {world_size} ranks (accepted: {divisors})")
    if tp < 1 or (world_size // pp) % tp:
        per = world_size // pp
        divisors = ", ".join(str(d) for d in range(1, per + 1) if per % d == 0)
        raise PipelineError(f"--tp {tp} does not divide a stage's {per} ranks (accepted: {divisors})")
    return Mesh(pp, world_size // (pp * tp), tp)


def native_backend(kinds: Sequence[tuple[str, str]]) -> str | None:
    """The torch backend that serves a group whose ranks are of `kinds` ((device kind, torch device type) each),
    or None: one kind on the CPU (host ranks, or ranks of one simulated or OpenCL model whose tensors torch keeps
    on the CPU) is Gloo's, one GPU vendor's CUDA (or ROCm) devices NCCL's (RCCL's); two kinds are no native
    backend's (as two vendors' GPUs would be)."""
    if len(set(kinds)) != 1:
        return None
    kind, device_type = kinds[0]
    if device_type == "cpu" and dist.is_gloo_available():
        return "gloo"
    if device_type == "cuda" and dist.is_nccl_available():
        return "nccl"
    return None


def group_backend_problem(choice: str, kinds: Sequence[tuple[str, str]]) -> str | None:
    """Why every group cannot run on `choice` (a torch backend named outright), or None: auto and hetbench always
    can; gloo where this torch has it; nccl where it has it and every rank's tensors are CUDA's."""
    if choice not in GROUP_BACKENDS:
        return f"--group-backend {choice!r} is not one of {', '.join(GROUP_BACKENDS)}"
    available = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available()}
    if choice in available and not available[choice]:
        return f"--group-backend {choice}: this torch ({torch.__version__}) has no {choice} backend"
    if choice == "nccl":
        cpu = [r for r, (_, device_type) in enumerate(kinds) if device_type != "cuda"]
        if cpu:
            return (f"--group-backend nccl carries GPU tensors, and rank {cpu[0]}'s are on the "
                    f"{kinds[cpu[0]][1]} (accepted here: auto, hetbench, gloo)")
    return None


@dataclass
class GroupInfo:
    name: str  # "pp 0" (replica 0's pipeline), "dp 1" (stage 1's replicas)
    ranks: list[int]
    backend: str
    group: Any = None


def group_specs(mesh: Mesh) -> list[tuple[str, str, list[int]]]:
    """(name, dimension, ranks) of every group of the mesh, in the order make_groups makes them: each replica's
    pipeline ("pp j"; "pp j.t" per tensor rank t with tp), each stage's replicas ("dp s"; "dp s.t"), and with tp
    each stage replica's tensor-parallel group ("tp s.j")."""
    def tag(a: int, t: int) -> str:
        return f"{a}.{t}" if mesh.tp > 1 else str(a)

    specs = [(f"pp {tag(j, t)}", "pp", mesh.pp_ranks(j, t)) for j in range(mesh.dp) for t in range(mesh.tp)]
    specs += [(f"dp {tag(s, t)}", "dp", mesh.dp_ranks(s, t)) for s in range(mesh.pp) for t in range(mesh.tp)]
    if mesh.tp > 1:
        specs += [(f"tp {s}.{j}", "tp", mesh.tp_ranks(s, j)) for s in range(mesh.pp) for j in range(mesh.dp)]
    return specs


def group_of(groups: Sequence["GroupInfo"], rank: int, dim: str) -> "GroupInfo":
    """The group of dimension `dim` ("pp", "dp", "tp") that `rank` belongs to."""
    return next(g for g in groups if g.name.split(" ")[0] == dim and rank in g.ranks)


def make_groups(mesh: Mesh, kinds: Sequence[tuple[str, str]], choice: str = "auto",
                hetbench_only: Sequence[str] = ()) -> list[GroupInfo]:
    """Collective over the world: every pipeline's group (a replica's stages) and every stage's data-parallel
    group (its replicas), made in the same order on every rank, each on its native backend where one serves it
    (choice "auto") and the hetbench backend otherwise (or always with choice "hetbench"; for dims named in
    `hetbench_only`, "pp" or "dp", whose strategy needs the hetbench backend). A group of one rank is made too."""
    problem = group_backend_problem(choice, kinds)
    if problem:
        raise PipelineError(problem)
    return groups_for(group_specs(mesh), kinds, choice, hetbench_only)


def groups_for(specs: Sequence[tuple[str, str, list[int]]], kinds: Sequence[tuple[str, str]], choice: str = "auto",
               hetbench_only: Sequence[str] = ()) -> list[GroupInfo]:
    """Collective over the world: a group for each (name, dimension, ranks) of `specs`, in their order, on its
    native backend where one serves its ranks' kinds (choice "auto"), else hetbench's (or `choice` named outright;
    a dimension in `hetbench_only` always on hetbench's)."""
    out = []
    for name, dim, ranks in specs:
        native = native_backend([tuple(kinds[r]) for r in ranks]) if choice == "auto" else None
        backend = native if native is not None and dim not in hetbench_only else "hetbench"
        if choice not in ("auto", "hetbench") and dim not in hetbench_only:
            backend = choice
        info = GroupInfo(name, ranks, backend)
        info.group = dist.new_group(ranks, backend=backend)
        out.append(info)
    return out


# -- a stage and its schedule -----------------------------------------------------------------------------------------

class StageModule(nn.Module):
    """One stage: pre (first stage), its blocks, post (last stage), run in order. `model_names` maps each of its
    parameter names to the whole model's."""

    def __init__(self, parts: Parts, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.pre = parts.pre if first else None
        self.blocks = nn.ModuleList(parts.blocks[b] for b in blocks)
        self.post = parts.post if last else None
        self.block_indices = list(blocks)
        names: dict[str, str] = {}
        if self.pre is not None:
            names.update({f"pre.{k}": v for k, v in parts.pre_names.items()})
        for i, b in enumerate(blocks):
            for n, _ in parts.blocks[b].named_parameters():
                names[f"blocks.{i}.{n}"] = f"{parts.block_names[b]}.{n}"
        if self.post is not None:
            names.update({f"post.{k}": v for k, v in parts.post_names.items()})
        self.model_names = names

    autocast: Callable[[], Any] | None = None  # mixed precision: the context each forward runs in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.autocast is not None:
            with self.autocast():
                return self._forward(x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre is not None:
            x = self.pre(x)
        for block in self.blocks:
            x = block(x)
        if self.post is not None:
            x = self.post(x)
        return x


def _schedule_class(schedule: str) -> Any:
    from torch.distributed import pipelining  # torch's pipelining loads only where a pipeline is built

    classes = dict(zip(PIPELINE_SCHEDULES, (pipelining.ScheduleGPipe, pipelining.Schedule1F1B)))
    if schedule not in classes:
        raise PipelineError(f"--schedule {schedule!r} is not one of {', '.join(classes)}")
    return classes[schedule]


class StageTimes:
    """Each micro-batch's forward and backward seconds on this stage, this step (the schedule's compute: its
    waits for messages are not in them)."""

    def __init__(self) -> None:
        self.forward: list[float] = []
        self.backward: list[float] = []
        self.schedule: list[float] = []  # each step's whole schedule on this rank, its waits included

    def take(self) -> tuple[list[float], list[float], list[float]]:
        out = (list(self.forward), list(self.backward), list(self.schedule))
        for times in (self.forward, self.backward, self.schedule):
            times.clear()  # cleared in place: the timed calls append to these lists
        return out


def _timed(fn: Callable[..., Any], into: list[float], clock: Callable[[], float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        out = fn(*args, **kwargs)
        into.append(clock() - t0)
        return out

    return wrapper


class Pipeline:
    """This rank's stage of a pipeline and its schedule. `module` is the stage (wrapped by `wrap(module)` for data
    parallelism where given); `step(x, y)` runs one step's micro-batches (x given on the first stage, y on the
    last) and returns the micro-batches' losses on the last stage ([] elsewhere), gradients accumulated."""

    def __init__(self, parts: Parts, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], cut: Cut,
                 stage: int, group: Any, device: torch.device, schedule: str = "1f1b", microbatches: int = 4,
                 wrap: Callable[[nn.Module], nn.Module] | None = None,
                 clock: Callable[[], float] | None = None, group_name: str = "pp",
                 autocast: Callable[[], Any] | None = None) -> None:
        from torch.distributed.pipelining import PipelineStage

        import time

        stages = len(cut.bounds) - 1
        if schedule == "1f1b" and microbatches < stages:
            raise PipelineError(f"--microbatches {microbatches} is below the {stages} stages: 1F1B needs at least "
                                "one micro-batch per stage (or use --schedule gpipe)")
        self.stage, self.stages, self.cut = stage, stages, cut
        self.schedule_name, self.microbatches = schedule, microbatches
        self.inner = StageModule(parts, cut.blocks(stage), stage == 0, stage == stages - 1).to(device)
        self.module = wrap(self.inner) if wrap is not None else self.inner
        self.times = StageTimes()
        self._stage = PipelineStage(self.module, stage, stages, device, group=group)
        clock = self._clock = clock or time.perf_counter
        self.inner.autocast = autocast
        self._stage.forward_one_chunk = _timed(self._stage.forward_one_chunk, self.times.forward, clock)
        self._stage.backward_one_chunk = _timed(self._stage.backward_one_chunk, self.times.backward, clock)
        self.sent_bytes: dict[str, int] = {}  # P2P bytes this rank sent, by group name ("pp 0")
        self.group_name = group_name
        for getter in ("get_fwd_send_ops", "get_bwd_send_ops"):
            setattr(self._stage, getter, self._counted(getattr(self._stage, getter)))
        self.loss_scale = 1.0
        self._loss_fn = loss_fn
        self._schedule = _schedule_class(schedule)(self._stage, n_microbatches=microbatches, loss_fn=self._loss,
                                                   scale_grads=False)

    def _counted(self, get_ops: Callable[[int], list[Any]]) -> Callable[[int], list[Any]]:
        def counted(chunk: int) -> list[Any]:
            ops = get_ops(chunk)
            sent = sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
            self.sent_bytes[self.group_name] = self.sent_bytes.get(self.group_name, 0) + sent
            return ops

        return counted

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.inner.autocast() if self.inner.autocast is not None else contextlib.nullcontext():
            loss = self._loss_fn(out, y)
        return loss * self.loss_scale if self.loss_scale != 1.0 else loss

    def step(self, x: torch.Tensor | None, y: torch.Tensor | None) -> list[torch.Tensor]:
        """One step: the schedule over this rank's micro-batches. Rows must split into equal micro-batches (torch's
        stages receive into buffers of the first micro-batch's shape)."""
        for name, t in (("x", x), ("y", y)):
            if t is not None and t.shape[0] % self.microbatches:
                raise PipelineError(f"{t.shape[0]} rows of {name} do not split into {self.microbatches} equal "
                                    "micro-batches")
        losses: list[torch.Tensor] = []
        args = (x,) if self.is_first else ()
        start = self._clock()
        self._schedule.step(*args, target=y if self.is_last else None, losses=losses if self.is_last else None,
                            return_outputs=False)
        self.times.schedule.append(self._clock() - start)
        return [loss.detach() / self.loss_scale if self.loss_scale != 1.0 else loss.detach() for loss in losses]

    def model_state(self) -> dict[str, torch.Tensor]:
        """This stage's parameters under the whole model's names (the inner module's; a data-parallel wrapper
        that shards them must gather them first)."""
        return {self.inner.model_names[n]: p for n, p in self.inner.named_parameters()}


# -- the library call -------------------------------------------------------------------------------------------------

def _all(value: Any, group: Any = None) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


class PipelinedModel:
    """A user's model pipelined over the world (hb.pipeline): `step(x, y)` runs a step's micro-batches (x and y
    the rows of this rank's pipeline; only the first stage reads x, the last y) and sums each gradient over the
    stage's replicas; `parameters()` are this rank's stage's, for its optimizer; `state_dict()` its stage's under
    the model's names; `full_state_dict()` (collective) the whole model's at rank 0."""

    def __init__(self, pipe: Pipeline, mesh: Mesh, groups: list[GroupInfo], rows: list[int]) -> None:
        self.pipe, self.mesh, self.groups, self.replica_rows = pipe, mesh, groups, rows
        rank = dist.get_rank()
        self.stage, self.replica = mesh.stage_of(rank), mesh.replica_of(rank)
        self.dp_group = groups[mesh.dp + self.stage].group

    def parameters(self) -> Any:
        return self.pipe.inner.parameters()

    def rows(self) -> tuple[int, int]:
        """This rank's rows [start, stop) of the global batch: its pipeline's."""
        start = sum(self.replica_rows[:self.replica])
        return start, start + self.replica_rows[self.replica]

    def step(self, x: torch.Tensor | None, y: torch.Tensor | None) -> torch.Tensor:
        """Collective: forward and backward of the rows' micro-batches; returns this rank's part of the loss (the
        sum of its micro-batches' losses on a last stage, 0 elsewhere)."""
        losses = self.pipe.step(x if self.pipe.is_first else None, y if self.pipe.is_last else None)
        if self.mesh.dp > 1:
            sum_gradients_over(self.pipe.inner.parameters(), self.dp_group)
        return torch.stack(losses).sum() if losses else torch.zeros(())

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.pipe.model_state().items()}

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        every = _all({k: v.cpu() for k, v in self.state_dict().items()} if self.replica == 0 else None)
        if dist.get_rank() != 0:
            return None
        out: dict[str, torch.Tensor] = {}
        for part in every:
            out.update(part or {})
        return out

    def summary(self) -> dict[str, Any]:
        """The cut (each stage's blocks), the groups and their backends."""
        return {"bounds": list(self.pipe.cut.bounds), "blocks_per_stage": self.pipe.cut.counts,
                "replica_rows": list(self.replica_rows),
                "groups": [{"name": g.name, "ranks": g.ranks, "backend": g.backend} for g in self.groups]}


def sum_gradients_over(params: Any, group: Any) -> int:
    """Collective over `group`: every gradient of `params` summed over its ranks in one flat all-reduce (a stage's
    replicas after a schedule's micro-batches); returns the bytes reduced."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return flat.numel() * flat.element_size()


def pipeline(model: nn.Module, blocks: Sequence[nn.Module], loss_fn: Callable[[torch.Tensor, torch.Tensor], Any],
             example: torch.Tensor, pre: nn.Module | None = None, post: nn.Module | None = None,
             weights: str | Sequence[float] = "even", pp: int | None = None, schedule: str = "1f1b",
             microbatches: int = 4, batch: int | None = None, device: torch.device | str = "cpu",
             group_backend: str = "auto", kind: str | None = None) -> PipelinedModel:
    """Collective: `model` (its `blocks`, with `pre` before and `post` after them) pipelined over the world's ranks
    in `pp` stages (default: every rank a stage), the rest data parallel (gradients summed). The stages are cut
    by `weights`: "even" (equal block counts), a list of one relative speed per rank, or "auto" (each rank's
    forward + backward seconds per part on `example`, one micro-batch of input). `loss_fn(output, target)` must
    return the micro-batch's part of the global batch's loss (its rows' sum over the global batch size) for the
    step to be exact. `batch` (default: microbatches x example rows x replicas): the global batch, shared among
    the pipelines by their speed in whole micro-batches. `kind`: this rank's device kind for the groups' backends
    (default: its torch device type; give e.g. "nvidia" or "amd" where ranks of two vendors share a type)."""
    if not dist.is_initialized():
        raise PipelineError("hetbench.pytorch.pipeline needs a process group: call hetbench.pytorch.init() first")
    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device(device)
    mesh = mesh_for(world, pp or world)
    parts = parts_of(model, blocks, pre, post)
    modules = [parts.pre, *parts.blocks, parts.post]
    if weights == "auto":
        seconds, _ = measure_parts(parts, example.to(device))
        every = _all(seconds)
        speeds = [1.0 / max(sum(s), 1e-12) for s in every]
    else:
        speeds = [1.0] * world if weights == "even" else [float(w) for w in weights]
        if len(speeds) != world or min(speeds) <= 0:
            raise PipelineError(f"weights {list(weights)!r}: give one speed > 0 per rank ({world}), 'even' or 'auto'")
        every = [[float(matmul_parameters(m)) / speeds[r] for m in modules] for r in range(world)]
    block_costs, fixed = split_costs(stage_costs(mesh, every))
    cut = fixed_cut(even_cut(len(parts.blocks), mesh.pp), block_costs, fixed) if weights == "even" else \
        cut_stages(block_costs, fixed)
    kinds = _all((kind or device.type, device.type))
    groups = make_groups(mesh, [tuple(k) for k in kinds], group_backend)
    rows = pipeline_rows(mesh, cut, every, microbatches, batch or microbatches * example.shape[0] * mesh.dp)
    stage = mesh.stage_of(rank)
    pipe = Pipeline(parts, loss_fn, cut, stage, groups[mesh.replica_of(rank)].group, device, schedule,
                    microbatches, group_name=groups[mesh.replica_of(rank)].name)
    return PipelinedModel(pipe, mesh, groups, rows)


def stage_costs(mesh: Mesh, every: Sequence[Sequence[float]]) -> list[list[float]]:
    """Each stage's cost of each part from each rank's (`every[r][i]`): its ranks' rates added (its replicas', and
    its tensor ranks' where tp cuts each layer by their speed; a part of no time counts 1e-12 s)."""
    parts = len(every[0])
    return [[1.0 / sum(1.0 / max(every[r][i], 1e-12) for r in mesh.stage_ranks(s)) for i in range(parts)]
            for s in range(mesh.pp)]


def split_costs(costs: Sequence[Sequence[float]]) -> tuple[list[list[float]], list[float]]:
    """(each stage's cost of each block, each stage's fixed cost: pre on the first stage, post on the last), from
    each stage's cost of each part [pre, *blocks, post]: cut_stages's arguments."""
    last = len(costs) - 1
    return [list(c[1:-1]) for c in costs], [c[0] * (s == 0) + c[-1] * (s == last) for s, c in enumerate(costs)]


def stage_parts(cut: Cut, stage: int) -> list[int]:
    """The part indices stage `stage` holds under `cut` (0: pre, on the first stage; 1 + b: block b; the last,
    post, on the last stage)."""
    stages = len(cut.bounds) - 1
    return [0] * (stage == 0) + [1 + b for b in cut.blocks(stage)] + [cut.bounds[-1] + 1] * (stage == stages - 1)


def pipeline_rows(mesh: Mesh, cut: Cut, every: list[list[float]], microbatches: int, batch: int) -> list[int]:
    """Each pipeline's rows in whole micro-batches, by the inverse of its slowest stage's time per row (`every`:
    each rank's cost of each part)."""
    if batch % microbatches or batch // microbatches < mesh.dp:
        raise PipelineError(f"a batch of {batch} rows does not split into {microbatches} equal micro-batches for "
                            f"each of {mesh.dp} pipelines")
    if mesh.dp == 1:
        return [batch]
    speeds = []
    for j in range(mesh.dp):
        # a stage of a replica: its tensor ranks' rates added (one rank without tp)
        slowest = max(1.0 / sum(1.0 / max(sum(every[r][i] for i in stage_parts(cut, s)), 1e-12)
                                for r in mesh.tp_ranks(s, j)) for s in range(mesh.pp))
        speeds.append(1.0 / max(slowest, 1e-12))
    counts = shares(speeds, batch // microbatches - mesh.dp)
    return [(c + 1) * microbatches for c in counts]
