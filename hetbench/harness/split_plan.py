"""Planning one GEMM split across unequal devices: the weights a user gives, the whole-number shares, the
memory caps, and the cost model that predicts how long a split takes. Pure Python: no MPI, no devices.

C (m x n) = A (m x k) @ B (k x n) is computed by P ranks; A and B exist at the root only. Two strategies:

- "rows": rank r gets parts[r] whole rows of A and all of B, computes its parts[r] x n block of C, and the root
  gathers the blocks. Its "dim" (what the parts divide) is m.
- "k": rank r gets parts[r] columns of A (m x parts[r]) and the matching parts[r] rows of B, computes a full
  m x n partial product, and the partial products are summed at the root. Its dim is k.

A rank may get a part of 0: it then holds nothing, moves nothing and computes nothing.

The cost model (`predict`) assumes what the harness does:

- phased (split --no-overlap): three phases separated by barriers, so the predicted time is distribute + the
  slowest rank's compute + collect, with no overlap between them; streamed (`chunks`, the default), the transfers
  overlap the GEMMs and only the first chunk's arrival and the last chunk's return are exposed (predict's
  docstring);
- the root moves data to and from each other rank in turn, over that rank's link to the root (latency plus
  bytes / bandwidth per message), so the transfer times of the ranks add up; the root moves nothing to itself;
- a rank computes at its rate (flop/s, measured or modelled at about the shape of its part), or, where its
  measured (part, seconds) points at several slice sizes are given (`curves`), in the time interpolated through
  them (`seconds_at`); shares proportional to the rates balance the compute phase only where the rate holds at
  every size.

What it leaves out: host<->device copies on each rank (unless their rates are given: `copies`), the reduction's
arithmetic, the tree a real MPI Reduce may use, and contention between messages (and, without curves, a rate that
changes with the part's size). Those are why a measured split differs from its prediction, and why auto weights and
`--rebalance` balance measured times (`balanced_parts`: each rank's time against its part, interpolated through
every part it was timed at).

`best_root_share` searches the model's own best split: the root's part moves nothing, so over a slow link the
best split keeps more at the root than its rate's share, up to all of it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from operator import index
from typing import Any, Callable, Sequence

from hetbench.backends.sim import gemm_model_seconds, get_model
from hetbench.comm.link import Link

STRATEGIES = ("rows", "k")
IMBALANCE_GOAL = 0.05  # --rebalance stops once imbalance() is below this

# what a part counts, for messages
_UNIT = {"rows": "rows of A", "k": "columns of A"}

# the numbers a weight may be written as: ASCII digits, an optional decimal point and exponent
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class WeightsError(ValueError):
    """A --weights value that cannot be used; the one-line message names it and lists what is accepted."""


class PlacementError(ValueError):
    """The size cannot be placed on the devices' free memory; the message names the size and each cap."""


@dataclass(frozen=True)
class Weights:
    """A parsed --weights value.

    kind: "even" (equal weights), "auto" (each rank's measured rate), "list" (`values`, one per rank) or
    "profile" (the rates in the calibration profile at `path`).
    """

    kind: str
    values: tuple[float, ...] = ()
    path: str | None = None


def _accepted(ranks: int) -> str:
    example = ",".join(["3"] + ["1"] * (ranks - 1))
    plural = "rank" if ranks == 1 else "ranks"
    return (
        f"accepted: even, auto, a profile JSON from `hetbench calibrate`, or one weight >= 0 per rank "
        f"({ranks} {plural}), e.g. {example}"
    )


def _shown(item: str) -> str:
    """An item as a message shows it: as typed when plain printable ASCII, else quoted with escapes."""
    return item if item and item.isascii() and item.isprintable() and item.strip() == item else repr(item)


def _parse_weight(item: str, position: int, count: int) -> tuple[float | None, str | None]:
    """(value, None) for a valid weight, else (None, the problem)."""
    item = item.strip()
    if not item:
        return None, f"weight {position} of {count} is empty"
    if not item.isascii():
        return None, f"{_shown(item)} is not an ASCII number"
    try:
        value = float(item)
    except ValueError:
        value = None
    if value is not None and not math.isfinite(value):
        return None, f"{_shown(item)} is not a finite number"
    if value is None or not _NUMBER.fullmatch(item):
        return None, f"{_shown(item)} is not a number"
    if value < 0:
        return None, f"{_shown(item)} is negative"
    return value + 0.0, None  # + 0.0 turns -0.0 into 0.0


def _looks_numeric(text: str) -> bool:
    """Whether text reads as a number to Python (nan, inf and non-ASCII digits included): then a --weights
    value naming no file is taken as a (one-weight) list, so the message says what is wrong with the number."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_weights(text: str, ranks: int) -> Weights:
    """Parse a --weights value for a job of `ranks` ranks.

    Accepted: "even", "auto" (case and surrounding blanks ignored); "w0,w1,..." with exactly `ranks` finite
    numbers >= 0 written in ASCII (decimals and exponents allowed, e.g. 0.5 or 1e3; -0 counts as 0) whose sum is
    above 0; anything else is a profile path, which must exist and be a regular file (its contents are
    `hetbench.results.profile.load_profile`'s to check). A single number that names no file is read as a list
    of one weight (valid on a 1-rank job), so "2" on a 2-rank job is "1 weight for 2 ranks" and "nan" is "not
    a finite number" rather than "no such profile file".

    Raises WeightsError with a one-line message naming the value and what is accepted.
    """
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, not {ranks}")

    def fail(problem: str) -> WeightsError:
        return WeightsError(f"--weights {text!r}: {problem}; {_accepted(ranks)}")

    keyword = text.strip().lower()
    if keyword in ("even", "auto"):
        return Weights(kind=keyword)
    if not text.strip():
        raise fail("empty")
    if "," not in text:
        if os.path.exists(text):
            if not os.path.isfile(text):
                kind = "a directory" if os.path.isdir(text) else "not a regular file"
                raise fail(f"{_shown(text)} is {kind}, not a profile file")
            return Weights(kind="profile", path=text)
        if not _looks_numeric(text):
            raise fail(f"no such profile file {_shown(text)}")
    items = text.split(",")
    values: list[float] = []
    for position, item in enumerate(items, start=1):
        value, problem = _parse_weight(item, position, len(items))
        if problem is not None:
            raise fail(problem)
        assert value is not None
        values.append(value)
    if len(values) != ranks:
        noun = "weight" if len(values) == 1 else "weights"
        raise fail(f"{len(values)} {noun} for {ranks} {'rank' if ranks == 1 else 'ranks'}")
    if not sum(values) > 0:
        raise fail("the weights sum to 0")
    if not math.isfinite(sum(values)):
        raise fail("the weights sum to more than a float holds")
    return Weights(kind="list", values=tuple(values))


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; accepted: {', '.join(STRATEGIES)}")


def _check_shape(m: int, n: int, k: int) -> None:
    if min(m, n, k) < 1:
        raise ValueError(f"a GEMM's m, n and k must be at least 1, not m={m}, n={n}, k={k}")


def dim_of(strategy: str, m: int, n: int, k: int) -> int:
    """What a strategy's parts divide: m for "rows", k for "k"."""
    _check_strategy(strategy)
    return m if strategy == "rows" else k


def _part_flops(strategy: str, m: int, n: int, k: int, part: int) -> int:
    """Flops of a rank's GEMM for `part`: rows: part x n x k; k: m x n x part."""
    return 2 * part * n * k if strategy == "rows" else 2 * m * n * part


def _bytes_terms(strategy: str, m: int, n: int, k: int) -> tuple[int, int]:
    """(elements per unit of part, fixed elements) a rank's device holds: rows: part*(k+n) + k*n (its rows of A
    and of C, all of B); k: part*(m+n) + m*n (its columns of A, rows of B, a full C)."""
    return (k + n, k * n) if strategy == "rows" else (m + n, m * n)


def device_bytes(strategy: str, m: int, n: int, k: int, part: int, itemsize: int) -> int:
    """Bytes a rank's device holds for `part`: rows: (part*k + k*n + part*n) * itemsize;
    k: (m*part + part*n + m*n) * itemsize; 0 for part 0 (such a rank holds nothing)."""
    _check_strategy(strategy)
    if part < 0:
        raise ValueError(f"a part cannot be negative: {part}")
    if part == 0:
        return 0
    per, fixed = _bytes_terms(strategy, m, n, k)
    return (part * per + fixed) * itemsize


def max_part(strategy: str, m: int, n: int, k: int, itemsize: int, free_bytes: int | None) -> int:
    """The largest part in 0..dim whose device_bytes fits in free_bytes (None: unknown, so no cap: dim)."""
    _check_shape(m, n, k)
    dim = dim_of(strategy, m, n, k)
    if free_bytes is None:
        return dim
    per, fixed = _bytes_terms(strategy, m, n, k)
    # (part*per + fixed) * itemsize <= free  <=>  part*per + fixed <= free // itemsize (the left side is whole)
    part = (free_bytes // itemsize - fixed) // per
    return max(0, min(dim, part))


def _largest_remainder(weights: Sequence[Fraction], total: int) -> list[int]:
    """Whole numbers in proportion to weights (sum > 0) summing to total: each gets the floor of its quota, and
    the units left go one each to the largest remainders, ties to the lower index. Exact (Fractions)."""
    weight_sum = sum(weights)
    quotas = [total * w / weight_sum for w in weights]
    floors = [q.numerator // q.denominator for q in quotas]
    left = total - sum(floors)
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - floors[i]), i))
    for i in order[:left]:
        floors[i] += 1
    return floors


def shares(
    weights: Sequence[float], total: int, caps: Sequence[int | None] | None = None, *, unit: str = "rows"
) -> list[int]:
    """Split `total` into whole parts in proportion to `weights`, each within its cap.

    Rounding is largest remainder (floors, then one unit each to the largest remainders, ties to the lower
    rank), computed exactly, so the parts always sum to `total` and the same input gives the same split.
    A weight of 0 gets 0. A cap (None: no cap) is applied by water-filling: a rank whose proportional share
    exceeds its cap gets its cap, and the rest is shared again among the others in proportion to their
    weights, until all fit. If every rank with weight > 0 is full, what is left goes to the ranks of weight 0
    that have room (evenly among uncapped ones if any, else in proportion to their caps) rather than failing.

    Raises PlacementError when the caps add up to less than `total` (the message says how many `unit` could
    not be placed and each rank's cap), and ValueError for invalid arguments (negative or non-finite weights,
    weights summing to 0 while total > 0, a caps list of another length).
    """
    total, cap = _checked_share_args(weights, total, caps)
    if total == 0:
        return [0] * len(weights)
    _check_capacity(cap, total, unit)
    w = [Fraction(float(x)) for x in weights]
    if sum(w) == 0:
        raise ValueError(f"the weights sum to 0: nothing to share {total} {unit} by")
    parts, remaining = _water_fill(w, cap, total)
    if remaining > 0:
        _spill(parts, w, cap, remaining)
    return parts


def _checked_share_args(weights: Sequence[float], total: int,
                        caps: Sequence[int | None] | None) -> tuple[int, list[int | None]]:
    """(total, one cap per weight, None for no cap) as whole numbers, or ValueError for arguments shares refuses:
    no weights, a negative total, a weight negative or not finite, a negative cap, caps of another length."""
    count = len(weights)
    if count < 1:
        raise ValueError("shares needs at least one weight")
    total = index(total)
    if total < 0:
        raise ValueError(f"the total to share cannot be negative: {total}")
    for r, w in enumerate(weights):
        if not (math.isfinite(w) and w >= 0):
            raise ValueError(f"weight of rank {r} must be a finite number >= 0, not {w!r}")
    cap: list[int | None] = [None] * count if caps is None else [None if c is None else index(c) for c in caps]
    if len(cap) != count:
        raise ValueError(f"{len(cap)} caps for {count} weights")
    for r, c in enumerate(cap):
        if c is not None and c < 0:
            raise ValueError(f"cap of rank {r} cannot be negative: {c}")
    return total, cap


def _check_capacity(cap: Sequence[int | None], total: int, unit: str) -> None:
    """PlacementError where every rank has a cap and the caps add up to less than total."""
    if all(c is not None for c in cap):
        capacity = sum(c for c in cap if c is not None)
        if capacity < total:
            each = ", ".join(f"rank {r}: {c}" for r, c in enumerate(cap))
            raise PlacementError(
                f"{total} {unit} cannot be placed: the devices' free memory holds at most {capacity} ({each})"
            )


def _water_fill(w: Sequence[Fraction], cap: Sequence[int | None], total: int) -> tuple[list[int], int]:
    """(parts, what is left to place) after sharing total among the ranks of weight > 0: a rank whose quota
    exceeds its cap gets its cap, and the rest is shared again among the others, until every quota fits (then
    nothing is left) or every rank of weight > 0 is full."""
    count = len(w)
    parts = [0] * count
    full = [False] * count
    remaining = total
    while True:
        active = [r for r in range(count) if not full[r] and w[r] > 0]
        if not active:
            return parts, remaining
        weight_sum = sum(w[r] for r in active)
        over = [r for r in active if cap[r] is not None and remaining * w[r] / weight_sum > cap[r]]
        if not over:
            break
        # their caps sum to less than their quotas, so `remaining` stays >= 0
        for r in over:
            parts[r] = cap[r]  # type: ignore[assignment]
            full[r] = True
            remaining -= cap[r]  # type: ignore[operator]
    # every quota is <= its (whole) cap, so rounding up stays within it
    for r, part in zip(active, _largest_remainder([w[r] for r in active], remaining)):
        parts[r] = part
    return parts, 0


def _spill(parts: list[int], w: Sequence[Fraction], cap: Sequence[int | None], remaining: int) -> None:
    """Every rank with weight > 0 is full: the `remaining` units go to the weight-0 ranks with room, evenly among
    the uncapped ones if any, else in proportion to their caps (parts is updated in place)."""
    spare = [r for r in range(len(w)) if w[r] == 0 and (cap[r] is None or cap[r] > 0)]
    unlimited = [r for r in spare if cap[r] is None]
    if unlimited:
        receivers, by = unlimited, [Fraction(1)] * len(unlimited)
    else:
        # remaining <= the sum of these caps (checked above), so each quota is within its cap
        receivers, by = spare, [Fraction(cap[r]) for r in spare]  # type: ignore[arg-type]
    for r, part in zip(receivers, _largest_remainder(by, remaining)):
        parts[r] = part


@dataclass(frozen=True)
class Prediction:
    """The cost model's prediction of one split (see the module docstring)."""

    strategy: str
    parts: tuple[int, ...]
    distribute_seconds: float
    compute_seconds: tuple[float, ...]  # per rank, 0.0 for a part of 0
    collect_seconds: float
    # a streamed split (chunks): its end to end, the phases overlapping (predict's docstring); None: phased
    streamed_seconds: float | None = None
    chunks: int | None = None
    # per rank, its copies between the host and its device (0.0 where it computes on host arrays); None: not modelled
    copy_seconds: tuple[float, ...] | None = None

    @property
    def seconds(self) -> float:
        """End to end: phased, distribute, then the slowest rank's device phase (its compute and its copies),
        then collect; streamed, the overlapped time predict computed."""
        if self.streamed_seconds is not None:
            return self.streamed_seconds
        copies = self.copy_seconds or (0.0,) * len(self.compute_seconds)
        return self.distribute_seconds + max(c + x for c, x in zip(self.compute_seconds, copies)) + \
            self.collect_seconds

    def to_dict(self) -> dict:
        """Plain JSON types: strategy, parts, distribute_seconds, compute_seconds (list), collect_seconds,
        seconds, chunks (None: phased)."""
        return {
            "strategy": self.strategy,
            "parts": [int(p) for p in self.parts],
            "distribute_seconds": float(self.distribute_seconds),
            "compute_seconds": [float(s) for s in self.compute_seconds],
            "collect_seconds": float(self.collect_seconds),
            "seconds": float(self.seconds),
            "chunks": self.chunks,
            "copy_seconds": None if self.copy_seconds is None else [float(x) for x in self.copy_seconds],
        }


def seconds_at(points: Sequence[Sequence[float]], part: float) -> float:
    """A rank's GEMM time for `part`, from its measured (part, seconds) points at several slice sizes: piecewise
    linear through (0, 0) and the points (made non-decreasing; several points at one part: their median), past the
    largest part at that point's average rate. The inverse of the curve balanced_parts interpolates. ValueError
    without a usable point (part > 0, seconds finite and > 0)."""
    by_part: dict[int, list[float]] = {}
    for p, t in points:
        if p > 0 and math.isfinite(t) and t > 0:
            by_part.setdefault(int(p), []).append(float(t))
    if not by_part:
        raise ValueError(f"no measured point (part > 0, seconds > 0) among {list(points)!r}")
    curve = [(0, 0.0)]
    for p in sorted(by_part):
        ts = sorted(by_part[p])
        mid = len(ts) // 2
        t = ts[mid] if len(ts) % 2 else (ts[mid - 1] + ts[mid]) / 2
        curve.append((p, max(t, curve[-1][1])))
    for (p0, t0), (p1, t1) in zip(curve, curve[1:]):
        if part <= p1:
            return t0 + (part - p0) * (t1 - t0) / (p1 - p0)
    last_part, last_t = curve[-1]
    return last_t * part / last_part


def _check_split(strategy: str, m: int, n: int, k: int, parts: Sequence[int], rates: Sequence[float],
                 links: Sequence[Link | None], root: int, curves: Sequence[Any] | None,
                 copies: Sequence[float | None] | None) -> None:
    """ValueError unless predict's arguments describe one split: one part, rate and link (and curve and copy rate,
    where given) per rank, a root among them, parts >= 0 summing to the strategy's dim."""
    _check_shape(m, n, k)
    dim = dim_of(strategy, m, n, k)
    count = len(parts)
    if len(rates) != count or len(links) != count:
        raise ValueError(f"{count} parts, {len(rates)} rates and {len(links)} links: one each per rank")
    if not 0 <= root < count:
        raise ValueError(f"root {root} is not a rank of {count}")
    if any(p < 0 for p in parts) or sum(parts) != dim:
        raise ValueError(f"parts {list(parts)} must be >= 0 and sum to {dim} ({strategy}: dim of m={m}, k={k})")
    if curves is not None and len(curves) != count:
        raise ValueError(f"{count} parts and {len(curves)} curves: one each per rank")
    if copies is not None and len(copies) != count:
        raise ValueError(f"{count} parts and {len(copies)} copy rates: one each per rank")


def _copy_seconds(strategy: str, m: int, n: int, k: int, itemsize: int, parts: Sequence[int],
                  copies: Sequence[float | None] | None) -> list[float]:
    """Each rank's copies between the host and its device: all its part holds, in and out, at its copy rate
    (0.0 for a part of 0, a rate of None or no rates)."""
    copy_time = [0.0] * len(parts)
    if copies is None:
        return copy_time
    for r, part in enumerate(parts):
        rate = copies[r]
        if part and rate is not None:
            if not (math.isfinite(rate) and rate > 0):
                raise ValueError(f"rank {r} has a copy rate of {rate!r} bytes/s")
            copy_time[r] = device_bytes(strategy, m, n, k, part, itemsize) / rate
    return copy_time


def _compute_seconds(strategy: str, m: int, n: int, k: int, r: int, part: int, rate: float,
                     curve: Sequence[Sequence[float]] | None) -> float:
    """Rank r's GEMM time for its part: 0.0 for none, else interpolated through its curve where it has one, else
    its flops at its rate."""
    if part == 0:
        return 0.0
    if curve:
        return seconds_at(curve, part)
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rank {r} has a part of {part} but a rate of {rate!r} flop/s")
    return _part_flops(strategy, m, n, k, part) / rate


def _usable_link(link: Link | None, r: int, part: int, root: int) -> Link:
    """Rank r's link to the root, which its part moves over: ValueError where there is none to use."""
    if link is None or not link.bytes_per_s > 0 or not link.latency_s >= 0:
        raise ValueError(f"rank {r} has a part of {part} but no usable link to root {root}: {link!r}")
    return link


def _message_seconds(link: Link, elements: int, itemsize: int) -> float:
    """One message of `elements` over a link: its latency plus its bytes at its bandwidth."""
    return link.latency_s + elements * itemsize / link.bytes_per_s


def _elements_moved(strategy: str, m: int, n: int, k: int, part: int) -> tuple[int, int]:
    """(elements the root sends a rank, elements it gets back) for a part: rows, its rows of A and all of B, then
    its rows of C; k, its columns of A and rows of B, then a full partial C."""
    if strategy == "rows":
        return part * k + k * n, part * n
    return m * part + part * n, m * n


def _streamed_rank(strategy: str, m: int, n: int, k: int, itemsize: int, part: int, link: Link, busy: float,
                   chunks: int) -> tuple[float, float, float]:
    """(first, last, end) of a working rank other than the root in a streamed split: its wait for its A block and
    first B chunk, its last C chunk's return, and when that return ends (the first chunk, then its device phase
    `busy` or the other chunks' arrival plus one chunk's share of it, whichever is longer, then the last chunk)."""
    widths = chunk_widths(n, chunks)
    a_elems = part * k if strategy == "rows" else m * part
    b_rows = k if strategy == "rows" else part
    first = _message_seconds(link, a_elems + b_rows * widths[0], itemsize)
    rest = b_rows * (n - widths[0]) * itemsize / link.bytes_per_s
    last = _message_seconds(link, (part if strategy == "rows" else m) * widths[-1], itemsize)
    return first, last, first + max(busy, rest + busy / len(widths)) + last


def predict(
    strategy: str,
    m: int,
    n: int,
    k: int,
    itemsize: int,
    parts: Sequence[int],
    rates: Sequence[float],
    links: Sequence[Link | None],
    root: int = 0,
    curves: Sequence[Sequence[Sequence[float]] | None] | None = None,
    chunks: int | None = None,
    copies: Sequence[float | None] | None = None,
) -> Prediction:
    """Predict a split's phases (s = itemsize, bw_r and lat_r rank r's link; sums over ranks r != root with
    parts[r] > 0):

    rows: distribute = sum lat_r + (parts[r]*k + k*n) * s / bw_r      (its rows of A, all of B)
          compute_r  = 2 * parts[r] * n * k / rates[r]
          collect    = sum lat_r + parts[r]*n * s / bw_r               (its rows of C)
    k:    distribute = sum lat_r + (m*parts[r] + parts[r]*n) * s / bw_r (its columns of A, rows of B)
          compute_r  = 2 * m * n * parts[r] / rates[r]
          collect    = sum lat_r + m*n * s / bw_r                       (its full partial C)

    links[root] is not used (None by convention): the root moves nothing to itself. A rank with part 0
    computes for 0 s and needs neither a rate > 0 nor a link. parts must sum to the strategy's dim.

    `curves[r]`, where given (not None), is rank r's measured (part, seconds) points at several slice sizes: its
    compute is then seconds_at(curves[r], parts[r]), not flops / rates[r] (a device's rate changes with the
    slice's size, so one rate measured at a probe's slice can miss the time at another size by far).

    `chunks` (the streamed split, benchmarks/split/stream.py): B and C move in that many column chunks w_j while
    the ranks compute. Each working rank r != root waits for its first chunk, first_r = lat_r + (its A block +
    its B chunk 0) * s / bw_r; computes while the other chunks arrive, for max(compute_r, rest_r +
    compute_r / chunks) (rest_r: the other B chunks' transfer); and sends back its last chunk of C, last_r =
    lat_r + (rows: parts[r]*w_last; k: m*w_last) * s / bw_r. End to end: the latest of the root's own compute,
    every rank's first_r + that + last_r, and the root's link busy with all of its transfers (the sums above).
    distribute_seconds and collect_seconds are then the largest first_r and last_r: what is not hidden.

    `copies[r]`, where given (not None), is rank r's measured copy rate between the host and its device (bytes/s;
    None for a device that computes on host arrays): its device phase then also copies its slice in and its result
    out, copy_r = device_bytes(parts[r]) / copies[r] (rows: parts[r]*k + k*n + parts[r]*n elements), on the
    same stream as its GEMMs (added to compute_r wherever the rank's time is counted; the root's too). A GPU's
    copies through pageable host memory can cost it more than its GEMMs.
    """
    _check_split(strategy, m, n, k, parts, rates, links, root, curves, copies)
    copy_time = _copy_seconds(strategy, m, n, k, itemsize, parts, copies)
    distribute = 0.0
    collect = 0.0
    compute: list[float] = []
    ends: list[float] = []
    firsts: list[float] = []
    lasts: list[float] = []
    for r, part in enumerate(parts):
        compute.append(_compute_seconds(strategy, m, n, k, r, part, rates[r], None if curves is None else curves[r]))
        if part == 0 or r == root:
            continue
        link = _usable_link(links[r], r, part, root)
        sent, received = _elements_moved(strategy, m, n, k, part)
        distribute += _message_seconds(link, sent, itemsize)
        collect += _message_seconds(link, received, itemsize)
        if chunks is not None:
            first, last, end = _streamed_rank(strategy, m, n, k, itemsize, part, link, compute[r] + copy_time[r],
                                              chunks)
            firsts.append(first)
            lasts.append(last)
            ends.append(end)
    copy_seconds = None if copies is None else tuple(copy_time)
    whole = tuple(int(p) for p in parts)
    if chunks is None:
        return Prediction(strategy=strategy, parts=whole, distribute_seconds=distribute,
                          compute_seconds=tuple(compute), collect_seconds=collect, copy_seconds=copy_seconds)
    streamed = max([compute[root] + copy_time[root], distribute + collect, *ends])
    return Prediction(strategy=strategy, parts=whole, distribute_seconds=max(firsts, default=0.0),
                      compute_seconds=tuple(compute), collect_seconds=max(lasts, default=0.0),
                      streamed_seconds=streamed, chunks=int(chunks), copy_seconds=copy_seconds)


def chunk_widths(n: int, chunks: int) -> list[int]:
    """The widths of min(chunks, n) column chunks of n columns, differing by at most one, the wider first: how the
    streamed split cuts B and C (benchmarks/split/stream.py)."""
    if n < 1 or chunks < 1:
        raise ValueError(f"column chunks need n >= 1 and chunks >= 1, got n={n}, chunks={chunks}")
    count = min(int(chunks), n)
    base, extra = divmod(n, count)
    return [base + (1 if j < extra else 0) for j in range(count)]


def fastest(predictions: dict[str, Prediction]) -> str:
    """The strategy whose prediction takes the fewest seconds; a tie goes to the earlier one in STRATEGIES."""
    return min(predictions, key=lambda s: (predictions[s].seconds, STRATEGIES.index(s)))


def choose_strategy(
    m: int,
    n: int,
    k: int,
    itemsize: int,
    rates: Sequence[float],
    links: Sequence[Link | None],
    caps_for: Callable[[str], Sequence[int | None]],
    root: int = 0,
) -> tuple[str, dict[str, Prediction]]:
    """For each strategy, share its dim in proportion to `rates` within caps_for(strategy) and predict it;
    return the strategy with the lower predicted seconds (a tie goes to "rows") and the predictions of those
    that could be placed. A strategy that cannot be placed is skipped; PlacementError (both messages) if
    neither can."""
    predictions: dict[str, Prediction] = {}
    failures: list[str] = []
    for strategy in STRATEGIES:
        dim = dim_of(strategy, m, n, k)
        try:
            parts = shares(rates, dim, caps_for(strategy), unit=_UNIT[strategy])
        except PlacementError as e:
            failures.append(f"{strategy}: {e}")
            continue
        predictions[strategy] = predict(strategy, m, n, k, itemsize, parts, rates, links, root=root)
    if not predictions:
        raise PlacementError("; ".join(failures))
    return fastest(predictions), predictions


def best_root_share(strategy: str, m: int, n: int, k: int, itemsize: int, rates: Sequence[float],
                    links: Sequence[Link | None], caps: Sequence[int | None] | None = None, root: int = 0,
                    steps: int = 256, curves: Sequence[Sequence[Sequence[float]] | None] | None = None,
                    chunks: int | None = None, copies: Sequence[float | None] | None = None) -> Prediction:
    """The split the model predicts fastest when the root keeps more than its rate's share: the root's part
    moves no data, so over a slow link the best split gives it more (up to all of the work, where moving a slice
    costs more than computing it at the root). Tries the root's part at `steps` + 1 evenly spaced points of 0..dim
    (and the rate-proportional split), the other ranks sharing the rest in proportion to their rates within their
    caps; returns the prediction with the fewest seconds (ties: the larger root part). PlacementError where no
    point can be placed."""
    dim = dim_of(strategy, m, n, k)
    count = len(rates)
    cap = [None] * count if caps is None else list(caps)
    others = [r for r in range(count) if r != root]
    candidates: list[list[int]] = []
    try:
        candidates.append(shares(rates, dim, cap, unit=_UNIT[strategy]))
    except (PlacementError, ValueError):
        pass
    root_cap = dim if cap[root] is None else min(dim, cap[root])
    for i in range(steps + 1):
        mine = min(root_cap, round(dim * i / steps))
        rest = dim - mine
        parts = [0] * count
        parts[root] = mine
        if rest:
            weights = [rates[r] for r in others]
            if not others or sum(weights) <= 0:
                continue
            try:
                for r, p in zip(others, shares(weights, rest, [cap[r] for r in others], unit=_UNIT[strategy])):
                    parts[r] = p
            except PlacementError:
                continue
        candidates.append(parts)
    if not candidates:
        raise PlacementError(f"no split of {dim} {_UNIT[strategy]} fits the devices' free memory")
    predictions = [predict(strategy, m, n, k, itemsize, p, rates, links, root=root, curves=curves, chunks=chunks,
                           copies=copies) for p in candidates]
    return min(predictions, key=lambda p: (p.seconds, -p.parts[root]))


def imbalance(compute_seconds: Sequence[float], parts: Sequence[int]) -> float:
    """Slowest working rank's compute time / the working ranks' mean - 1, over ranks with parts > 0; 0.0 when
    fewer than two ranks work (or none took any time)."""
    if len(compute_seconds) != len(parts):
        raise ValueError(f"{len(compute_seconds)} compute times for {len(parts)} parts")
    working = [float(s) for s, p in zip(compute_seconds, parts) if p > 0]
    if len(working) < 2:
        return 0.0
    mean = sum(working) / len(working)
    if mean <= 0:
        return 0.0
    return max(working) / mean - 1.0


def _part_at(points: Sequence[tuple[int, float]], seconds: float) -> float:
    """The part a rank computes in `seconds`, by its time against its part: piecewise linear through (0, 0) and
    its measured (part, seconds), made non-decreasing, and past the largest part at that point's average rate."""
    curve = [(0, 0.0)]
    for part, t in sorted(points):
        if part <= 0 or not (math.isfinite(t) and t > 0):
            continue
        curve.append((part, max(t, curve[-1][1])))
    if len(curve) == 1:
        return 0.0
    for (p0, t0), (p1, t1) in zip(curve, curve[1:]):
        if seconds <= t1:
            return p1 if t1 == t0 else p0 + (seconds - t0) * (p1 - p0) / (t1 - t0)
    last_part, last_t = curve[-1]
    return last_part * seconds / last_t


def balanced_parts(points: Sequence[Sequence[tuple[int, float]]], total: int,
                   caps: Sequence[int | None] | None = None, *, unit: str = "rows") -> list[int]:
    """Whole parts, summing to `total`, that give every rank the same predicted compute time, from each rank's
    measured (part, seconds) points: its time against its part interpolated piecewise linearly through them (a
    device's rate changes with the size of its slice, so one rate per rank balances only at the size it was
    measured at). A rank without a measured point gets 0. Rounding is largest remainder within the caps.
    PlacementError where the ranks with points cannot hold `total` within their caps."""
    count = len(points)
    cap = [None] * count if caps is None else list(caps)
    limit = [total if c is None else min(c, total) for c in cap]
    usable = [any(p > 0 and t > 0 for p, t in pts) for pts in points]
    room = sum(limit[r] for r in range(count) if usable[r])
    if room < total:
        raise PlacementError(f"{total} {unit} cannot be placed on the ranks measured so far: they hold at most "
                             f"{room}")

    def placed(seconds: float) -> list[float]:
        return [min(limit[r], _part_at(points[r], seconds)) if usable[r] else 0.0 for r in range(count)]

    hi = 1e-9
    while sum(placed(hi)) < total:
        hi *= 2
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(placed(mid)) < total else (lo, mid)
    real = placed(hi)
    scale = total / sum(real) if sum(real) > 0 else 0.0
    real = [x * scale for x in real]
    parts = [min(limit[r], math.floor(x)) for r, x in enumerate(real)]
    order = sorted(range(count), key=lambda r: (-(real[r] - math.floor(real[r])), r))
    while sum(parts) < total:
        progressed = False
        for r in order:
            if sum(parts) == total:
                break
            if usable[r] and parts[r] < limit[r]:
                parts[r] += 1
                progressed = True
        if not progressed:
            break
    return parts


def sim_rate(model_key: str, strategy: str, m: int, n: int, k: int, dtype_name: str, parts_hint: int) -> float:
    """A simulated device's modelled rate (flop/s) on a part of `parts_hint` (clamped to 1..dim) of this GEMM:
    rows: a parts_hint x n x k GEMM; k: m x n x parts_hint; its flops / hetbench.backends.sim's
    gemm_model_seconds. ValueError for an unknown model, or a dtype the model has no arithmetic for."""
    _check_shape(m, n, k)
    dim = dim_of(strategy, m, n, k)
    part = max(1, min(dim, parts_hint))
    model = get_model(model_key)
    if strategy == "rows":
        seconds = gemm_model_seconds(model, part, n, k, dtype_name)
    else:
        seconds = gemm_model_seconds(model, m, n, part, dtype_name)
    return _part_flops(strategy, m, n, k, part) / seconds
