"""The hostile battery's cases (tests/hostile/battery.py runs them). Each is a hetbench command line with
placeholders ({d}: the case's own folder, also its working directory; {data}: tests/data; {repo}: the checkout),
what it expects, and what to make in its folder first.

expect: "usage" bad input (exit 2, one `Error:` line, nothing on stdout, nothing written); "ok" good input
(exit 0, only whole files); "ok_or_usage" either of those (a judgement call either way is fine, but a refusal is
still one line); "fail" a fault while running, such as a disk that fills (exit 1 or 2, one `Error:` line, no half
or staged file, every file there before kept); "signal" (exit 128+N, one line naming the rank); "pipe" (stdout closed: ended quietly by SIGPIPE, a shell's 141, no line);
"raises" a library call misused from a user's script (tests/hostile/lib_cases.py, program "python"): every rank
prints one line `rank R raised TYPE: MESSAGE` (the script catches the exception), no MPI stack, exit 0.

Issue 33's cases (the torch front end, the library API, the tuning cache, backend plugins, `split --zero-copy`,
`--timeout`, signals while a run shuts down) are in cases_round3.py.

KNOWN lists the ids of failures still open that the battery must not hide: they still fail the run and are
printed loudly. It is meant to stay empty.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KNOWN: set[str] = set()

REPO = Path(__file__).resolve().parent.parent.parent
DATA = REPO / "tests" / "data"
TEMPLATES: dict[str, Path] = {}
MPI_TIMEOUT = ["--timeout", "20"]  # the watchdog, on every MPI command
# the signal cases' watchdog: a signal before hetbench's first line ran on a rank (Python itself starting) ends that
# rank by the signal's default action, and the others then wait in MPI_Init for this long (MPICH); the battery's
# bound for those cases is this plus END_SECONDS (battery.py)
SIGNAL_TIMEOUT = ["--timeout", "8"]
LONG_NAME = "x" * 300 + ".json"  # past NAME_MAX (255)
NEAR_LONG_NAME = "y" * 248 + ".json"  # fits, but a staged copy's longer name would not


@dataclass
class Case:
    id: str
    command: str
    kind: str
    argv: list[str]
    expect: str = "usage"
    nprocs: int | None = None
    setup: Callable[[Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 40.0
    needles: list[str] = field(default_factory=list)
    special: str | None = None  # "pipe", "gone_cwd", "signal"
    signal: tuple[int, int, str] | None = None  # (rank, signum, "early"|"late")
    may_change: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # a good run must leave these (whole)
    known: bool = False
    program: str = "hetbench"  # or "python": the virtualenv's python runs argv (a user's script)
    needs: tuple[str, ...] = ()  # templates or devices the case needs (see prepare): skipped where one cannot be
    out_needles: list[str] = field(default_factory=list)  # a good run's stdout or stderr must say each of these
    # cases of one batch (and rank count) run in one launch, each judged by its own lines (battery.py run_batch):
    # the library cases, whose every launch pays torch's import on every rank
    batch: str | None = None


# --- templates made once per battery run ------------------------------------------------------------------------

# what a case needs that this machine cannot give (no OpenCL device, no torch): the case is skipped, with the reason
UNAVAILABLE: dict[str, str] = {}
# a template that this machine could make but whose making failed: the cases needing it fail (setup), with the reason
BROKEN: dict[str, str] = {}


def missing_needs(case: Case) -> str | None:
    """Why the case cannot run here (it is then skipped), or None."""
    for need in case.needs:
        if need in UNAVAILABLE:
            return UNAVAILABLE[need]
    return None


def template(name: str) -> Path:
    """A template made by prepare(); a RuntimeError (the case's setup fails) where its making failed."""
    if name in BROKEN:
        raise RuntimeError(f"the {name} template could not be made: {BROKEN[name]}")
    return TEMPLATES[name]


def prepare(folder: Path, hb: str, cases: list[Case] | None = None) -> None:
    """A numpy checkpoint and a calibrate profile, made by hetbench itself, for the doctored-file cases; and the
    templates the selected cases need (torch checkpoints, an OpenCL tuning cache: cases_round3.prepare_round3)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = {
        "ck": [hb, "train", "--steps", "2", "--layers", "2", "--hidden", "8", "--batch", "8", "--checkpoint",
               str(folder / "ck"), "--out", str(folder / "train.json")],
        "profile": [hb, "calibrate", "--size", "64", "--backend", "host", "--min-seconds", "0.01", "--repeat", "1",
                    "--out", str(folder / "profile.json")],
    }
    for name, cmd in runs.items():
        done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise SystemExit(f"battery: making the {name} template failed: {done.stderr[-2000:]}")
    TEMPLATES["ck"] = folder / "ck"
    TEMPLATES["profile"] = folder / "profile.json"
    TEMPLATES["train"] = folder / "train.json"
    from cases_round3 import prepare_round3

    prepare_round3(folder, hb, cases)


# --- setup helpers ----------------------------------------------------------------------------------------------

def _write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return setup


def _fifo(name: str) -> Callable[[Path], None]:
    return lambda d: os.mkfifo(d / name)


def _chain(*steps: Callable[[Path], None] | None) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        for step in steps:
            if step:
                step(d)
    return setup


def _prev(*names: str) -> Callable[[Path], None]:
    """Files already where a run would write: they must survive a refused run byte for byte."""
    def setup(d: Path) -> None:
        for name in names:
            path = d / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"precious {name}\n")
    return setup


def _sparse(name: str, size: int) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        with open(d / name, "wb") as f:
            f.truncate(size)
    return setup


def _symlink(name: str, target: str) -> Callable[[Path], None]:
    return lambda d: os.symlink(target.replace("{d}", str(d)), d / name)


def _npy(name: str, array) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        np.save(d / name, array)
    return setup


def _npy_header(name: str, shape: tuple, descr: str = "<f4", payload: bytes = b"") -> Callable[[Path], None]:
    """An .npy whose header claims SHAPE (a huge one, say) over a payload that is not there."""
    def setup(d: Path) -> None:
        header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
        header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
        data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + payload
        (d / name).write_bytes(data)
    return setup


def _copy_ck(d: Path) -> Path:
    shutil.copytree(TEMPLATES["ck"], d / "ck")
    return d / "ck"


def _ck(edit: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        ck = _copy_ck(d)
        if edit:
            edit(ck)
    return setup


def _manifest(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def edit(ck: Path) -> None:
        path = ck / "step-2" / "manifest.json"
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))
    return edit


def _doctored(source: Callable[[], Path], name: str, change: Callable[[dict], object] | None,
              raw: Callable[[str], str] | None) -> Callable[[Path], None]:
    """A copy of the JSON document at `source()` (found when the case runs), as `name`, with one thing changed (in
    the object, or in its text)."""
    def setup(d: Path) -> None:
        doc = json.loads(source().read_text())
        if change:
            result = change(doc)
            if result is not None:
                doc = result
        text = json.dumps(doc)
        if raw:
            text = raw(text)
        (d / name).write_text(text)
    return setup


def _results(change: Callable[[dict], object] | None = None, source: str = "matmul-v1.json",
             name: str = "bad.json", raw: Callable[[str], str] | None = None) -> Callable[[Path], None]:
    """A copy of a saved results document with one thing changed."""
    return _doctored(lambda: DATA / source, name, change, raw)


def _profile(change: Callable[[dict], object] | None = None, raw: Callable[[str], str] | None = None,
             name: str = "profile.json") -> Callable[[Path], None]:
    """A copy of the calibration profile template with one thing changed."""
    return _doctored(lambda: TEMPLATES["profile"], name, change, raw)


def _set(path: str, value) -> Callable[[dict], None]:
    """Set doc[a][b][0]... to value; path as 'rows.0.gemm_seconds_median'."""
    def change(doc: dict) -> None:
        keys = path.split(".")
        node = doc
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


def _del(path: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        keys = path.split(".")
        node = doc
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            del node[int(keys[-1])]
        else:
            del node[keys[-1]]
    return change


# --- the cases --------------------------------------------------------------------------------------------------

MM = ["matmul", "--size", "16", "--warmup", "0", "--repeat", "1", "--backend", "host"]
COLL = ["collectives", "--op", "allreduce", "--min-bytes", "64", "--max-bytes", "1K", "--warmup", "0", "--iters",
        "1", "--backend", "host"]
CAL = ["calibrate", "--size", "32", "--backend", "host", "--min-seconds", "0.01", "--repeat", "1"]
SPLIT = ["split", "--size", "32", "--warmup", "0", "--repeat", "1", "--backend", "host"]
PLAN = ["split", "--plan", "--backend", "sim:h100", "--size", "64"]
TRAIN = ["train", "--steps", "2", "--layers", "2", "--hidden", "8", "--batch", "8"]
TORCH = ["train", "--frontend", "torch", "--steps", "2", "--layers", "1", "--hidden", "8", "--batch", "8"]
RESUME = ["train", "--steps", "4", "--layers", "2", "--hidden", "8", "--batch", "8", "--resume", "{d}/ck",
          "--out", "{d}/r.json"]
GOOD = "{data}/matmul-v1.json"
GOOD_C = "{data}/collectives-v1.json"

BAD_INTS = {"abc": "abc", "empty": "", "space": " ", "nan": "nan", "inf": "inf", "neg": "-1", "zero": "0",
            "float": "16.5", "huge": str(10**30), "arabic": "\u0661\u0666", "fullwidth": "\uff11\uff16",
            "hex": "0x10", "exp": "1e3", "nul": "1\x01"}


def _cases() -> list[Case]:
    cs: list[Case] = []

    def add(id_: str, command: str, kind: str, argv: list[str], **kw) -> None:
        cs.append(Case(id_, command, kind, argv, **kw))

    # ---------- matmul: option values
    for opt in ("--size", "--m", "--n", "--k"):
        for tag, value in BAD_INTS.items():
            if opt != "--size" and tag not in ("abc", "nan", "huge", "arabic", "zero"):
                continue
            add(f"matmul-{opt[2:]}-{tag}", "matmul", "value", [*MM, opt, value, "--out", "{d}/o.json"])
    for opt in ("--warmup", "--repeat", "--seed", "--root"):
        for tag in ("neg", "huge", "arabic", "empty"):
            add(f"matmul-{opt[2:]}-{tag}", "matmul", "value", [*MM, opt, BAD_INTS[tag], "--out", "{d}/o.json"])
    add("matmul-repeat-zero", "matmul", "value", [*MM, "--repeat", "0"])
    add("matmul-root-beyond-world", "matmul", "value", [*MM, "--root", "1"])
    add("matmul-root-beyond-world-2", "matmul", "value", [*MM, "--root", "2", *MPI_TIMEOUT], nprocs=2)
    for tag, value in {"empty": "", "colon": ":", "open": "16:", "words": "a:b", "down": "64:16", "zero": "0:16",
                       "factor1": "16:64:1", "factor0": "16:64:0", "factorneg": "16:64:-2", "gap": "16,,32",
                       "nan": "nan", "factorx": "16:64:x", "huge": f"16:{10**30}", "arabic": "\u0661\u0666,32",
                       "neg": "-16,32", "trailing": "16,32,", "toomany": "1:2:3:4"}.items():
        add(f"matmul-sizes-{tag}", "matmul", "value", [*MM[:1], "--sizes", value, *MM[3:]])
    for tag, value in {"fp8": "fp8", "empty": "", "upper": "FP32", "list": "fp32,fp16", "int8": "int8"}.items():
        add(f"matmul-dtype-{tag}", "matmul", "value", [*MM, "--dtype", value])
    add("matmul-reduce-max", "matmul", "value", [*MM, "--reduce", "max"])
    for tag, value in {"nan": "nan", "neg": "-1", "abc": "abc", "inf": "inf", "empty": ""}.items():
        add(f"matmul-timeout-{tag}", "matmul", "value", [*MM, "--timeout", value])
    add("matmul-unknown-option", "matmul", "value", [*MM, "--bogus"])
    add("matmul-extra-arg", "matmul", "value", [*MM, "extra"])
    add("matmul-no-such-command", "matmul", "value", ["matmull"])
    # backends and rank maps
    for tag, value in {"empty": "", "nosuch": "nosuch", "sim-nosuch": "sim:nosuch", "dup-rank": "0=host,0=host",
                       "rank-missing": "5=host", "no-value": "0=", "no-rank": "=host", "gap": "0=host,,1=host",
                       "neg-index": "host:-1", "big-index": "host:99", "word-index": "opencl:abc",
                       "semicolon": "0=host;1=host", "arabic-rank": "\u0661=host",
                       "neg-rank": "-1=host", "huge-rank": f"{10**30}=host", "spaces": " = ",
                       "unicode": "h\u00f6st", "cupy": "cupy", "colon": "host:", "newline": "host\nhost"}.items():
        add(f"matmul-backend-{tag}", "matmul", "value", ["matmul", "--size", "16", "--backend", value])
    add("matmul-backend-rank-missing-2", "matmul", "value",
        ["matmul", "--size", "16", "--backend", "0=host,2=host", *MPI_TIMEOUT], nprocs=2)
    add("matmul-backend-arabic-3", "matmul", "value",
        ["matmul", "--size", "16", "--backend", "0=host,\u0662=host", *MPI_TIMEOUT], nprocs=3)
    # a simulated GPU's index is free: the catalog models as many of each as asked for
    add("matmul-backend-sim-index-999", "matmul", "value", ["matmul", "--size", "16", "--backend", "sim:h100:999"],
        expect="ok_or_usage")
    add("matmul-dtype-sim-cannot", "matmul", "value", ["matmul", "--size", "16", "--backend", "sim:v520",
                                                         "--dtype", "bf16"], expect="ok_or_usage")
    add("matmul-too-big-for-memory", "matmul", "value", ["matmul", "--size", "2000000", "--backend", "host"])
    add("matmul-too-big-sim", "matmul", "value", ["matmul", "--size", "1000000", "--backend", "sim:a10g"])
    # input files
    add("matmul-a-missing", "matmul", "file", [*MM, "--a", "{d}/nope.npy", "--b", "{d}/nope.npy"])
    add("matmul-a-dir", "matmul", "file", [*MM, "--a", "{d}", "--b", "{d}"])
    add("matmul-a-fifo", "matmul", "file", [*MM, "--a", "{d}/f.npy", "--b", "{d}/f.npy"], setup=_fifo("f.npy"))
    add("matmul-a-empty", "matmul", "file", [*MM, "--a", "{d}/e.npy", "--b", "{d}/e.npy"], setup=_write("e.npy", ""))
    add("matmul-a-text", "matmul", "file", [*MM, "--a", "{d}/t.npy", "--b", "{d}/t.npy"],
        setup=_write("t.npy", "1 2 3\n"))
    add("matmul-a-1d", "matmul", "file", ["matmul", "--a", "{d}/v.npy", "--b", "{d}/v.npy", "--backend", "host"],
        setup=_npy("v.npy", np.ones(8, np.float32)))
    add("matmul-a-3d", "matmul", "file", ["matmul", "--a", "{d}/v.npy", "--b", "{d}/v.npy", "--backend", "host"],
        setup=_npy("v.npy", np.ones((2, 2, 2), np.float32)))
    add("matmul-a-object", "matmul", "file", ["matmul", "--a", "{d}/o.npy", "--b", "{d}/o.npy", "--backend", "host"],
        setup=lambda d: np.save(d / "o.npy", np.array([[None, 1]], dtype=object), allow_pickle=True))
    add("matmul-a-strings", "matmul", "file", ["matmul", "--a", "{d}/s.npy", "--b", "{d}/s.npy", "--backend", "host"],
        setup=_npy("s.npy", np.array([["a", "b"], ["c", "d"]])))
    add("matmul-a-b-mismatch", "matmul", "file",
        ["matmul", "--a", "{d}/a.npy", "--b", "{d}/b.npy", "--backend", "host"],
        setup=_chain(_npy("a.npy", np.ones((4, 5), np.float32)), _npy("b.npy", np.ones((4, 5), np.float32))))
    add("matmul-a-nan", "matmul", "file", ["matmul", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend", "host"],
        setup=_npy("a.npy", np.full((4, 4), np.nan, np.float32)))
    add("matmul-a-inf", "matmul", "file", ["matmul", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend", "host"],
        setup=_npy("a.npy", np.full((4, 4), np.inf, np.float32)))
    add("matmul-a-overflow", "matmul", "file", ["matmul", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend",
                                                 "host", "--dtype", "fp16"],
        setup=_npy("a.npy", np.full((4, 4), 60000, np.float16)))
    add("matmul-a-truncated", "matmul", "file", ["matmul", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend",
                                                  "host"],
        setup=_npy_header("a.npy", (64, 64), payload=b"\0" * 100))
    add("matmul-a-huge-header", "matmul", "file", ["matmul", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend",
                                                    "host"],
        setup=_npy_header("a.npy", (10**9, 10**9)))
    add("matmul-a-bad-header", "matmul", "file", ["matmul", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend",
                                                   "host"],
        setup=_write("a.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4}  \n"))
    add("matmul-a-complex", "matmul", "file", ["matmul", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend",
                                                "host"],
        setup=_npy("a.npy", np.ones((4, 4), np.complex64)))
    add("matmul-a-zero-size", "matmul", "file", ["matmul", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend",
                                                  "host"],
        setup=_npy("a.npy", np.ones((0, 4), np.float32)))
    add("matmul-b-without-a", "matmul", "file", [*MM, "--b", "{d}/b.npy"], setup=_npy("b.npy", np.ones((4, 4))))
    add("matmul-a-devzero", "matmul", "file", [*MM, "--a", "/dev/zero", "--b", "/dev/zero"])
    add("matmul-a-sparse-giant", "matmul", "file", ["matmul", "--a", "{d}/g.npy", "--b", "{d}/g.npy", "--backend",
                                                     "host"], setup=_sparse("g.npy", 3 * 2**30))
    add("matmul-a-rank-pattern-missing", "matmul", "file",
        ["matmul", "--a", "{d}/a{rank}.npy", "--b", "{d}/a{rank}.npy", "--backend", "host", *MPI_TIMEOUT],
        nprocs=2, setup=_npy("a0.npy", np.ones((4, 4), np.float32)))
    add("matmul-a-rank-mismatch-3", "matmul", "file",
        ["matmul", "--a", "{d}/a{rank}.npy", "--b", "{d}/a{rank}.npy", "--backend", "host", "--reduce", "sum",
         *MPI_TIMEOUT], nprocs=3,
        setup=_chain(_npy("a0.npy", np.ones((4, 4), np.float32)), _npy("a1.npy", np.ones((4, 4), np.float32)),
                     _npy("a2.npy", np.ones((8, 8), np.float32))))
    add("matmul-a-symlink-loop", "matmul", "file", [*MM, "--a", "{d}/loop.npy", "--b", "{d}/loop.npy"],
        setup=_symlink("loop.npy", "{d}/loop.npy"))

    # ---------- output paths, for every writing command
    writers = {
        "matmul": (MM, ["--out", "--csv", "--save"]),
        "collectives": (COLL, ["--out", "--csv"]),
        "calibrate": (CAL, ["--out", "--csv"]),
        "split": (SPLIT, ["--out", "--csv", "--save"]),
        "plan": (PLAN, ["--out", "--csv"]),
        "train": (TRAIN, ["--out", "--csv", "--log", "--checkpoint"]),
        "report": (["report", GOOD], ["--html", "--csv", "--plots"]),
    }
    paths = {
        "dir": ("{d}/sub", _chain(lambda d: (d / "sub").mkdir())),
        "slash": ("{d}/new/", None),
        "slash-existing": ("{d}/sub/", lambda d: (d / "sub").mkdir()),
        "no-parent": ("{d}/no/such/dir/x.out", None),
        "parent-is-file": ("{d}/file.txt/x.out", _prev("file.txt")),
        "devfull": ("/dev/full", None),
        "proc": ("/proc/hetbench-hostile.out", None),
        "too-long": ("{d}/" + LONG_NAME, None),
        "near-long": ("{d}/" + NEAR_LONG_NAME, None),
        "fifo": ("{d}/f.out", _fifo("f.out")),
        "empty": ("", None),
        "dangling-link-loop": ("{d}/loop.out", _symlink("loop.out", "{d}/loop.out")),
    }
    for command, (base, options) in writers.items():
        name = "split" if command == "plan" else command
        for opt in options:
            for tag, (path, setup) in paths.items():
                # every kind of path for --out and the folders; the other outputs share the same checks: a few
                if opt not in ("--out", "--checkpoint", "--plots", "--html") and tag not in (
                        "slash", "no-parent", "devfull", "proc", "too-long", "fifo", "empty"):
                    continue
                # a folder is what --checkpoint and --plots take: an existing one is good input
                expect = "ok" if opt in ("--checkpoint", "--plots") and tag in ("dir", "slash-existing", "slash",
                                                                               "no-parent") else "usage"
                if opt in ("--checkpoint", "--plots") and tag == "near-long":
                    continue
                add(f"{command}{opt[1:]}-{tag}", name, "path", [*base, opt, path], setup=setup, expect=expect,
                    timeout=60 if command == "report" else 40)
    # all or nothing: one good target (already there, precious) beside one that cannot be written
    add("matmul-out-kept-csv-devfull", "matmul", "path", [*MM, "--out", "{d}/prev.json", "--csv", "/dev/full"],
        setup=_prev("prev.json"))
    add("matmul-csv-kept-out-nodir", "matmul", "path", [*MM, "--out", "{d}/no/x.json", "--csv", "{d}/prev.csv"],
        setup=_prev("prev.csv"))
    add("matmul-out-kept-bad-size", "matmul", "path", [*MM, "--size", "0", "--out", "{d}/prev.json"],
        setup=_prev("prev.json"))
    add("matmul-save-kept-out-devfull", "matmul", "path", [*MM, "--save", "{d}/prev.npy", "--out", "/dev/full"],
        setup=_prev("prev.npy"))
    add("matmul-out-equals-csv", "matmul", "path", [*MM, "--out", "{d}/same", "--csv", "{d}/same"])
    add("matmul-out-over-input", "matmul", "path",
        ["matmul", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend", "host", "--out", "{d}/a.npy"],
        setup=_npy("a.npy", np.ones((4, 4), np.float32)))
    add("train-log-kept-out-devfull", "train", "path", [*TRAIN, "--log", "{d}/prev.jsonl", "--out", "/dev/full"],
        setup=_prev("prev.jsonl"))
    add("train-checkpoint-is-file", "train", "path", [*TRAIN, "--checkpoint", "{d}/prev.txt"],
        setup=_prev("prev.txt"))
    add("report-csv-kept-html-devfull", "report", "path", ["report", GOOD, "--csv", "{d}/prev.csv", "--html",
                                                           "/dev/full"], setup=_prev("prev.csv"), timeout=60)
    add("report-html-kept-csv-nodir", "report", "path", ["report", GOOD, "--html", "{d}/prev.html", "--csv",
                                                         "{d}/no/x.csv"], setup=_prev("prev.html"), timeout=60)
    add("report-plots-is-file", "report", "path", ["report", GOOD, "--plots", "{d}/prev.txt"],
        setup=_prev("prev.txt"), timeout=60)
    add("report-html-equals-csv", "report", "path", ["report", GOOD, "--html", "{d}/same", "--csv", "{d}/same"],
        timeout=60)
    add("matmul-default-out-results-is-file", "matmul", "path", [*MM], setup=_prev("results"))
    # good runs: files whole, nothing staged left
    add("matmul-good", "matmul", "good", [*MM, "--out", "{d}/o.json", "--csv", "{d}/o.csv", "--save", "{d}/c.npy"],
        expect="ok", outputs=["o.json", "o.csv", "c.npy"])
    add("matmul-good-default-out", "matmul", "good", [*MM], expect="ok")
    add("matmul-good-replaces-prev", "matmul", "good", [*MM, "--out", "{d}/prev.json"], expect="ok",
        setup=_prev("prev.json"), may_change=["prev.json"], outputs=["prev.json"])
    add("matmul-good-2", "matmul", "good", [*MM, "--out", "{d}/o.json", "--csv", "{d}/o.csv", *MPI_TIMEOUT],
        nprocs=2, expect="ok", outputs=["o.json", "o.csv"])
    add("collectives-good-3", "collectives", "good", [*COLL, "--op", "allreduce,alltoall", "--min-bytes", "96", "--max-bytes", "768", "--out", "{d}/o.json",
                                                      *MPI_TIMEOUT], nprocs=3, expect="ok", outputs=["o.json"])
    add("report-good", "report", "good", ["report", GOOD, GOOD_C, "--html", "{d}/r.html", "--csv", "{d}/r.csv"],
        expect="ok", timeout=90, outputs=["r.html", "r.csv"])
    add("train-good-ck", "train", "good", [*TRAIN, "--checkpoint", "{d}/ck", "--log", "{d}/l.jsonl", "--out",
                                           "{d}/o.json"], expect="ok",
        outputs=["ck/latest", "l.jsonl", "o.json"])
    add("devices-good", "devices", "good", ["devices", "--sim"], expect="ok")
    add("devices-good-json-2", "devices", "good", ["devices", "--json"], nprocs=2, expect="ok")

    # ---------- collectives
    for tag, value in {"empty": "", "bogus": "bogus", "trailing": "allreduce,", "mixed": "allreduce,bogus",
                       "upper": "ALLREDUCE", "dup": "allreduce,allreduce", "space": " ", "unicode": "all\u0072educe\u200b"
                       }.items():
        add(f"collectives-op-{tag}", "collectives", "value", [*COLL[:1], "--op", value, *COLL[3:]],
            expect="ok_or_usage" if tag in ("dup", "upper") else "usage")
    for opt in ("--min-bytes", "--max-bytes"):
        for tag, value in {"abc": "abc", "neg": "-1", "zero": "0", "frac": "1.5K", "unit": "1Q", "huge": "1E",
                           "huge2": "99999999999999999999999", "arabic": "\u0661\u0666K", "empty": "", "nan": "nan",
                           "inf": "inf"}.items():
            add(f"collectives{opt[1:]}-{tag}", "collectives", "value", [*COLL, opt, value])
    add("collectives-max-below-min", "collectives", "value", [*COLL[:3], "--min-bytes", "1M", "--max-bytes", "1K",
                                                              *COLL[7:]])
    for tag in ("zero", "neg", "huge", "abc", "arabic"):
        # a huge factor leaves the first size alone: harmless either way
        add(f"collectives-factor-{tag}", "collectives", "value", [*COLL, "--factor", BAD_INTS[tag]],
            expect="ok_or_usage" if tag == "huge" else "usage")
    add("collectives-factor-one", "collectives", "value", [*COLL, "--factor", "1"])
    for opt in ("--iters", "--warmup", "--root"):
        for tag in ("neg", "huge", "abc"):
            add(f"collectives{opt[1:]}-{tag}", "collectives", "value", [*COLL, opt, BAD_INTS[tag]])
    add("collectives-iters-zero", "collectives", "value", [*COLL, "--iters", "0"])
    add("collectives-dtype-fp16", "collectives", "value", [*COLL, "--dtype", "fp16"])
    add("collectives-path-bogus", "collectives", "value", [*COLL, "--path", "bogus"])
    add("collectives-root-beyond-3", "collectives", "value", [*COLL, "--op", "bcast", "--root", "3", *MPI_TIMEOUT],
        nprocs=3)
    add("collectives-backend-bad-2", "collectives", "value",
        ["collectives", "--backend", "0=host,1=sim:nosuch", *MPI_TIMEOUT], nprocs=2)
    add("collectives-too-big-sim", "collectives", "value",
        ["collectives", "--op", "allgather", "--min-bytes", "1G", "--max-bytes", "1G", "--backend", "sim:a10g",
         "--path", "device"], expect="ok_or_usage", timeout=60)

    # ---------- calibrate
    for tag, value in {"fp8": "fp8", "empty": "", "trailing": "fp32,", "gap": "fp32,,fp64", "upper": "FP32",
                       "unicode": "fp\uff13\uff12"}.items():
        add(f"calibrate-dtype-{tag}", "calibrate", "value", [*CAL, "--dtype", value],
            expect="ok_or_usage" if tag == "upper" else "usage")
    add("calibrate-strategy-bogus", "calibrate", "value", [*CAL, "--strategy", "bogus"])
    for tag, value in {"nan": "nan", "inf": "inf", "neg": "-1", "zero": "0", "abc": "abc", "huge": "1e300",
                       "empty": ""}.items():
        add(f"calibrate-min-seconds-{tag}", "calibrate", "value", [*CAL, "--min-seconds", value])
    for tag, value in {"abc": "abc", "zero": "0", "neg": "-1", "huge": "1E", "arabic": "\u0661K"}.items():
        add(f"calibrate-link-bytes-{tag}", "calibrate", "value", [*CAL, "--link-bytes", value])
    for tag in ("zero", "neg", "huge", "nan"):
        add(f"calibrate-size-{tag}", "calibrate", "value", [*CAL, "--size", BAD_INTS[tag]])
        add(f"calibrate-repeat-{tag}", "calibrate", "value", [*CAL, "--repeat", BAD_INTS[tag]])
    add("calibrate-backend-bad-3", "calibrate", "value",
        ["calibrate", "--size", "32", "--backend", "0=host,1=host,2=sim:h100:x", *MPI_TIMEOUT], nprocs=3)

    # ---------- split (a run, and --plan)
    add("split-strategy-bogus", "split", "value", [*SPLIT, "--strategy", "bogus"])
    for tag, value in {"empty": "", "nan": "nan", "neg": "-1", "zeros": "0", "inf": "inf", "word": "1,abc",
                       "count": "1,2,3", "gap": "1,,2", "arabic": "\u0661", "huge": "1e400", "missing": "{d}/nope.json",
                       "dir": "{d}", "fifo": "{d}/f.json", "devzero": "/dev/zero"}.items():
        add(f"split-weights-{tag}", "split", "value", [*SPLIT, "--weights", value],
            setup=_fifo("f.json") if tag == "fifo" else None)
    add("split-weights-count-2", "split", "value", [*SPLIT, "--weights", "1,2,3", *MPI_TIMEOUT], nprocs=2)
    add("split-weights-zeros-2", "split", "value", [*SPLIT, "--weights", "0,0", *MPI_TIMEOUT], nprocs=2)
    for tag in ("neg", "huge", "abc"):
        add(f"split-rebalance-{tag}", "split", "value", [*SPLIT, "--rebalance", BAD_INTS[tag]])
    for tag in ("zero", "neg", "huge", "arabic"):
        add(f"split-size-{tag}", "split", "value", [*SPLIT, "--size", BAD_INTS[tag]])
    for tag in ("zero", "neg", "huge", "abc", "empty", "float", "arabic"):  # --chunks auto|1..256
        add(f"split-chunks-{tag}", "split", "value", [*SPLIT, "--chunks", BAD_INTS[tag]])
    add("split-chunks-no-overlap", "split", "value", [*SPLIT, "--chunks", "4", "--no-overlap"])
    add("split-chunks-no-overlap-2", "split", "value", [*SPLIT, "--chunks", "2", "--no-overlap", *MPI_TIMEOUT],
        nprocs=2)
    add("split-a-missing", "split", "file", [*SPLIT, "--a", "{d}/no.npy", "--b", "{d}/no.npy"])
    add("split-a-fifo", "split", "file", [*SPLIT, "--a", "{d}/f.npy", "--b", "{d}/f.npy"], setup=_fifo("f.npy"))
    add("split-a-mismatch", "split", "file", ["split", "--a", "{d}/a.npy", "--b", "{d}/b.npy", "--backend", "host"],
        setup=_chain(_npy("a.npy", np.ones((4, 5), np.float32)), _npy("b.npy", np.ones((4, 5), np.float32))))
    add("split-a-huge-header", "split", "file", ["split", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend",
                                                  "host"], setup=_npy_header("a.npy", (10**9, 10**9)))
    for tag, value in {"nan": "nan", "inf": "inf", "neg": "-1", "zero": "0", "abc": "abc", "huge": "1e400",
                       "empty": ""}.items():
        add(f"plan-link-gbps-{tag}", "split", "value", [*PLAN, "--link-gbps", value],
            expect="ok_or_usage" if tag == "zero" else "usage")
        add(f"plan-link-latency-{tag}", "split", "value", [*PLAN, "--link-gbps", "10", "--link-latency-us", value],
            expect="ok_or_usage" if tag == "zero" else "usage")
    add("plan-backend-bad", "split", "value", ["split", "--plan", "--backend", "sim:nosuch"])
    add("plan-weights-count", "split", "value", [*PLAN, "--weights", "1,2"])
    add("plan-size-huge", "split", "value", ["split", "--plan", "--backend", "sim:h100", "--size", str(2**31)])
    add("plan-good", "split", "good", [*PLAN, "--out", "{d}/p.json"], expect="ok", outputs=["p.json"])
    # doctored profiles, for split --weights and train --weights
    profiles = {
        "empty": _write("profile.json", ""),
        "truncated": _profile(raw=lambda t: t[: len(t) // 2]),
        "binary": _write("profile.json", bytes(range(256)) * 4),
        "null": _write("profile.json", "null"),
        "list": _write("profile.json", "[]"),
        "schema-matmul": _results(name="profile.json"),
        "rows-null": _profile(_set("rows", None)),
        "rows-empty": _profile(_set("rows", [])),
        "rate-nan": _profile(raw=lambda t: t.replace('"gemm_gflops": ', '"gemm_gflops": NaN, "x": ', 1)),
        "rate-neg": _profile(_set("rows.0.gemm_gflops", -5.0)),
        "rate-zero": _profile(_set("rows.0.gemm_gflops", 0.0)),
        "rate-text": _profile(_set("rows.0.gemm_gflops", "fast")),
        "rate-huge": _profile(_set("rows.0.gemm_gflops", 1e308)),
        "rate-inf": _profile(raw=lambda t: t.replace('"gemm_gflops": ', '"gemm_gflops": 1e999, "x": ', 1)),
        "summary-null": _profile(_set("summary", None)),
        "config-list": _profile(_set("config", [])),
        "deep": _write("profile.json", "[" * 200000 + "]" * 200000),
        "sparse-giant": _sparse("profile.json", 3 * 2**30),
    }
    for tag, setup in profiles.items():
        add(f"split-profile-{tag}", "split", "file", [*SPLIT, "--weights", "{d}/profile.json"], setup=setup)
    for tag in ("truncated", "rate-nan", "rate-neg", "rows-empty", "deep"):
        add(f"train-profile-{tag}", "train", "file", [*TRAIN, "--weights", "{d}/profile.json"], setup=profiles[tag])
    add("split-profile-ranks-2", "split", "file", [*SPLIT, "--weights", "{d}/profile.json", *MPI_TIMEOUT], nprocs=2,
        setup=_profile(), expect="ok_or_usage")

    # ---------- train
    for opt, values in {"--frontend": ["bogus", ""], "--strategy": ["bogus", "fsdp2"], "--model": ["bogus"],
                        "--optimizer": ["bogus"], "--dtype": ["fp64", "int8"], "--path": ["bogus"]}.items():
        for value in values:
            add(f"train{opt[1:]}-{value or 'empty'}", "train", "value", [*TRAIN, opt, value])
    for opt in ("--layers", "--hidden", "--batch", "--steps", "--micro-batches", "--seq-len", "--heads", "--seed",
                "--warmup-steps", "--checkpoint-every"):
        for tag in ("neg", "huge", "arabic"):
            add(f"train{opt[1:]}-{tag}", "train", "value", [*TRAIN, opt, BAD_INTS[tag]])
    for opt in ("--layers", "--hidden", "--batch", "--steps"):
        add(f"train{opt[1:]}-zero", "train", "value", [*TRAIN, opt, "0"])
    for tag, value in {"nan": "nan", "inf": "inf", "neg": "-0.1", "zero": "0", "abc": "abc", "huge": "1e999",
                       "empty": "", "minus-nan": "-nan"}.items():
        add(f"train-lr-{tag}", "train", "value", [*TRAIN, "--lr", value])
    for tag, value in {"empty": "", "nan": "nan", "neg": "-1", "word": "x", "count": "1,1", "huge": "1e400"}.items():
        add(f"train-weights-{tag}", "train", "value", [*TRAIN, "--weights", value])
    add("train-too-big-hidden", "train", "value", ["train", "--steps", "1", "--hidden", "65536", "--layers",
                                                     "10000", "--batch", "8"])
    add("train-too-big-batch", "train", "value", ["train", "--steps", "1", "--hidden", "65536", "--batch",
                                                    "16777216"])
    add("train-micro-batches-beyond-batch", "train", "value", [*TRAIN, "--strategy", "pipeline", "--micro-batches",
                                                                 "64"], expect="ok_or_usage")
    add("train-pipeline-more-ranks-than-layers", "train", "value",
        ["train", "--steps", "2", "--layers", "1", "--hidden", "8", "--batch", "8", "--strategy", "pipeline",
         "--backend", "host", *MPI_TIMEOUT], nprocs=3, expect="ok_or_usage")
    add("train-weights-count-2", "train", "value", [*TRAIN, "--weights", "1,2,3", *MPI_TIMEOUT], nprocs=2)
    add("train-checkpoint-every-beyond", "train", "value", [*TRAIN, "--checkpoint-every", "5"],
        expect="ok_or_usage")
    # the torch front end (slow to import: a few cases)
    add("torch-strategy-pipeline", "train", "torch", [*TORCH, "--strategy", "pipeline"])
    add("torch-heads-not-dividing", "train", "torch", [*TORCH, "--model", "gpt", "--hidden", "30", "--heads", "4"])
    add("torch-lr-nan", "train", "torch", [*TORCH, "--lr", "nan"])
    add("torch-too-big", "train", "torch", ["train", "--frontend", "torch", "--steps", "1", "--hidden", "65536",
                                            "--layers", "10000", "--batch", "8"], timeout=90)
    add("torch-gpt-seq-huge", "train", "torch", ["train", "--frontend", "torch", "--model", "gpt", "--steps", "1",
                                                 "--seq-len", "65536", "--batch", "16777216"], timeout=90)
    add("torch-out-devfull", "train", "torch", [*TORCH, "--out", "/dev/full"])
    add("torch-resume-numpy-ck", "train", "torch", [*TORCH, "--steps", "4", "--resume", "{d}/ck"], setup=_ck(),
        expect="ok_or_usage", timeout=90)
    # doctored checkpoints: train --resume
    ckcases = {
        "missing": (None, RESUME),
        "is-file": (_prev("ck"), RESUME),
        "empty-dir": (lambda d: (d / "ck").mkdir(), RESUME),
        "latest-empty": (_ck(lambda ck: (ck / "latest").write_text("")), RESUME),
        "latest-space": (_ck(lambda ck: (ck / "latest").write_text(" \n\t")), RESUME),
        "latest-nosuch": (_ck(lambda ck: (ck / "latest").write_text("step-999")), RESUME),
        "latest-escape": (_ck(lambda ck: (ck / "latest").write_text("../../../../etc")), RESUME),
        "latest-absolute": (_ck(lambda ck: (ck / "latest").write_text("/etc")), RESUME),
        "latest-not-utf8": (_ck(lambda ck: (ck / "latest").write_bytes(b"\xff\xfe")), RESUME),
        "latest-fifo": (_ck(lambda ck: ((ck / "latest").unlink(), os.mkfifo(ck / "latest"))), RESUME),
        "latest-dir": (_ck(lambda ck: ((ck / "latest").unlink(), (ck / "latest").mkdir())), RESUME),
        "latest-two-lines": (_ck(lambda ck: (ck / "latest").write_text("step-2\nstep-3\n")), RESUME),
        "latest-giant": (_ck(lambda ck: (ck / "latest").write_text("step-2" + " " * 5_000_000)), RESUME),
        "manifest-missing": (_ck(lambda ck: (ck / "step-2" / "manifest.json").unlink()), RESUME),
        "manifest-empty": (_ck(lambda ck: (ck / "step-2" / "manifest.json").write_text("")), RESUME),
        "manifest-truncated": (_ck(lambda ck: (ck / "step-2" / "manifest.json").write_text('{"format": "hetb')),
                               RESUME),
        "manifest-list": (_ck(lambda ck: (ck / "step-2" / "manifest.json").write_text("[]")), RESUME),
        "manifest-binary": (_ck(lambda ck: (ck / "step-2" / "manifest.json").write_bytes(bytes(range(256)))), RESUME),
        "manifest-deep": (_ck(lambda ck: (ck / "step-2" / "manifest.json").write_text("[" * 200000)), RESUME),
        "format-other": (_ck(_manifest(_set("format", "other/9"))), RESUME),
        "steps-neg": (_ck(_manifest(_set("steps_done", -1))), RESUME),
        "steps-huge": (_ck(_manifest(_set("steps_done", 10**30))), RESUME),
        "steps-text": (_ck(_manifest(_set("steps_done", "2"))), RESUME),
        "steps-float": (_ck(_manifest(_set("steps_done", 2.5))), RESUME),
        "layers-zero": (_ck(_manifest(_set("model.layers", 0))), RESUME),
        "hidden-huge": (_ck(_manifest(_set("model.hidden", 10**12))), RESUME),
        "hidden-neg": (_ck(_manifest(_set("model.hidden", -8))), RESUME),
        "model-null": (_ck(_manifest(_set("model", None))), RESUME),
        "weights-empty": (_ck(_manifest(_set("weights", []))), RESUME),
        "shares-neg": (_ck(_manifest(_set("shares", [-8]))), RESUME),
        "ranks-empty": (_ck(_manifest(_set("ranks", []))), RESUME),
        "pieces-neg": (_ck(_manifest(_set("ranks.0.pieces.0", [0, 0, -72, 0]))), RESUME),
        "pieces-beyond": (_ck(_manifest(_set("ranks.0.pieces.0", [0, 0, 10**12, 0]))), RESUME),
        "pieces-text": (_ck(_manifest(_set("ranks.0.pieces", "all"))), RESUME),
        "lr-nan": (_ck(lambda ck: (ck / "step-2" / "manifest.json").write_text(
            (ck / "step-2" / "manifest.json").read_text().replace('"lr": 0.01', '"lr": NaN'))), RESUME),
        "dtype-bogus": (_ck(_manifest(_set("dtype", "fp8"))), RESUME),
        "strategy-bogus": (_ck(_manifest(_set("strategy", "bogus"))), RESUME),
        "history-huge": (_ck(_manifest(_set("history", [{"step": i} for i in range(3)] * 1))), RESUME),
        "scaler-null": (_ck(_manifest(_set("loss_scaler", None))), RESUME),
        "piece-empty": (_ck(lambda ck: (ck / "step-2" / "rank-0.param.npy").write_bytes(b"")), RESUME),
        "piece-truncated": (_ck(lambda ck: (ck / "step-2" / "rank-0.param.npy").write_bytes(
            (ck / "step-2" / "rank-0.param.npy").read_bytes()[:200])), RESUME),
        "piece-missing": (_ck(lambda ck: (ck / "step-2" / "rank-0.m.npy").unlink()), RESUME),
        "piece-fifo": (_ck(lambda ck: ((ck / "step-2" / "rank-0.v.npy").unlink(),
                                       os.mkfifo(ck / "step-2" / "rank-0.v.npy"))), RESUME),
        "piece-dir": (_ck(lambda ck: ((ck / "step-2" / "rank-0.v.npy").unlink(),
                                      (ck / "step-2" / "rank-0.v.npy").mkdir())), RESUME),
        "piece-wrong-shape": (_ck(lambda ck: np.save(ck / "step-2" / "rank-0.param.npy", np.ones(5, np.float32))),
                              RESUME),
        "piece-wrong-dtype": (_ck(lambda ck: np.save(ck / "step-2" / "rank-0.param.npy",
                                                     np.array(["a"] * 144))), RESUME),
        "piece-nan": (_ck(lambda ck: np.save(ck / "step-2" / "rank-0.param.npy", np.full(144, np.nan, np.float32))),
                      RESUME),
        "piece-huge-header": (_ck(lambda ck: _npy_header("rank-0.param.npy", (10**12,))(ck / "step-2")), RESUME),
        "piece-sparse-giant": (_ck(lambda ck: _sparse("rank-0.param.npy", 3 * 2**30)(ck / "step-2")), RESUME),
        "model-mismatch": (_ck(), ["train", "--steps", "4", "--layers", "3", "--hidden", "8", "--batch", "8",
                                   "--resume", "{d}/ck", "--out", "{d}/r.json"]),
        "steps-behind": (_ck(), ["train", "--steps", "1", "--layers", "2", "--hidden", "8", "--batch", "8",
                                 "--resume", "{d}/ck", "--out", "{d}/r.json"]),
        "step-folder-direct": (_ck(), [*RESUME[:-3], "{d}/ck/step-2", "--out", "{d}/r.json"]),
        "resume-devzero": (None, [*RESUME[:-3], "/dev/zero", "--out", "{d}/r.json"]),
    }
    for tag, (setup, argv) in ckcases.items():
        expect = "ok" if tag in ("step-folder-direct",) else ("ok_or_usage" if tag in ("steps-behind",
                                                                                       "piece-nan") else "usage")
        add(f"resume-{tag}", "train", "checkpoint", argv, setup=setup, expect=expect)
    add("resume-piece-empty-2", "train", "checkpoint", [*RESUME, *MPI_TIMEOUT], nprocs=2,
        setup=_ck(lambda ck: (ck / "step-2" / "rank-0.param.npy").write_bytes(b"")))
    add("resume-steps-neg-3", "train", "checkpoint", [*RESUME, *MPI_TIMEOUT], nprocs=3,
        setup=_ck(_manifest(_set("steps_done", -1))))
    add("resume-good-2", "train", "checkpoint", [*RESUME, *MPI_TIMEOUT], nprocs=2, setup=_ck(), expect="ok",
        outputs=["r.json"])

    # ---------- report and compare: doctored results documents
    deep_rows = '{"x": ' * 50000 + "1" + "}" * 50000
    docs = {
        "empty": _write("bad.json", ""),
        "null": _write("bad.json", "null"),
        "list": _write("bad.json", "[]"),
        "object-empty": _write("bad.json", "{}"),
        "number": _write("bad.json", "42"),
        "truncated": _results(raw=lambda t: t[: len(t) // 2]),
        "binary": _write("bad.json", bytes(range(256)) * 8),
        "utf16": _write("bad.json", json.dumps({"schema": "hetbench.matmul"}).encode("utf-16")),
        "lone-surrogate": _write("bad.json", '{"schema": "\\ud800"}'),
        "schema-unknown": _results(_set("schema", "hetbench.nosuch")),
        "schema-missing": _results(_del("schema")),
        "schema-number": _results(_set("schema", 7)),
        "version-999": _results(_set("schema_version", 999)),
        "version-text": _results(_set("schema_version", "1")),
        "summary-null": _results(_set("summary", None)),
        "summary-list": _results(_set("summary", [])),
        "config-null": _results(_set("config", None)),
        "metadata-null": _results(_set("metadata", None)),
        "rows-null": _results(_set("rows", None)),
        "rows-object": _results(_set("rows", {})),
        "rows-empty": _results(_set("rows", [])),
        "rows-empty-objects": _results(_set("rows", [{}, {}])),
        "rows-numbers": _results(_set("rows", [1, 2])),
        "row-field-missing": _results(_del("rows.0.gemm_seconds_median")),
        "value-text": _results(_set("rows.0.gemm_seconds_median", "fast")),
        "value-nan": _results(raw=lambda t: t.replace('"gemm_seconds_median": ', '"gemm_seconds_median": NaN, "y": ',
                                                      1)),
        "value-inf": _results(raw=lambda t: t.replace('"gemm_seconds_median": ',
                                                      '"gemm_seconds_median": Infinity, "y": ', 1)),
        "value-huge": _results(_set("rows.0.gemm_seconds_median", 1e300)),
        "value-bigint": _results(raw=lambda t: t.replace('"gemm_flops": ', '"gemm_flops": ' + "9" * 5000 + ', "y": ',
                                                         1)),
        "value-neg": _results(_set("rows.0.gemm_seconds_median", -1.0)),
        "raw-text": _results(lambda doc: [r.update(raw={"gemm_seconds": "abc"}) for r in doc["rows"]] and None),
        "raw-nan": _results(lambda doc: [r.update(raw={"gemm_seconds": [float("nan")] * 3}) for r in doc["rows"]]
                            and None),
        "deep-list": _write("bad.json", "[" * 200000 + "]" * 200000),
        "deep-row": _results(raw=lambda t: t.replace('"rows": [', '"rows": [' + deep_rows + ", ", 1)),
        "sparse-giant": _sparse("bad.json", 3 * 2**30),
        "fifo": _fifo("bad.json"),
        "dir": lambda d: (d / "bad.json").mkdir(),
        "missing": None,
        "link-devzero": _symlink("bad.json", "/dev/zero"),
        "link-loop": _symlink("bad.json", "{d}/bad.json"),
        "csv": lambda d: shutil.copy(DATA / "matmul-v1.csv", d / "bad.json"),
        "checkpoint-manifest": lambda d: shutil.copy(TEMPLATES["ck"] / "step-2" / "manifest.json", d / "bad.json"),
    }
    # a row's derived figure that is missing, text, NaN, infinite, huge or negative: report shows what is there
    # (a dash, the text) and compare compares the raw repeats, so either showing it or refusing it is fine
    shown = {"row-field-missing", "value-text", "value-nan", "value-inf", "value-huge", "value-neg"}
    for tag, setup in docs.items():
        lenient = "ok_or_usage" if tag in shown | {"schema-unknown", "rows-empty"} else "usage"
        add(f"report-doc-{tag}", "report", "file", ["report", "{d}/bad.json"], setup=setup, timeout=60,
            expect=lenient)
        add(f"compare-new-{tag}", "compare", "file", ["compare", GOOD, "{d}/bad.json"], setup=setup, timeout=60,
            expect="ok_or_usage" if tag in shown else "usage")
        if tag in ("empty", "truncated", "summary-null", "rows-empty-objects", "value-nan", "deep-list",
                   "sparse-giant", "fifo", "schema-unknown", "raw-text", "link-devzero", "value-bigint"):
            add(f"compare-base-{tag}", "compare", "file", ["compare", "{d}/bad.json", GOOD], setup=setup, timeout=60,
                expect="ok_or_usage" if tag in shown else "usage")
    add("report-devzero", "report", "file", ["report", "/dev/zero"], timeout=60)
    add("report-devurandom", "report", "file", ["report", "/dev/urandom"], timeout=60)
    add("report-devnull", "report", "file", ["report", "/dev/null"], timeout=60)
    add("report-no-args", "report", "value", ["report"])
    add("report-empty-dir", "report", "file", ["report", "{d}/runs"], setup=lambda d: (d / "runs").mkdir(),
        timeout=60)
    add("report-dir-with-junk", "report", "file", ["report", "{d}/runs"], expect="ok_or_usage", timeout=60,
        setup=_chain(lambda d: (d / "runs").mkdir(), lambda d: shutil.copy(DATA / "matmul-v1.json", d / "runs"),
                     _write("runs/junk.json", "{"), _write("runs/notes.txt", "hello")))
    add("report-dir-with-fifo-only", "report", "file", ["report", "{d}/runs"], timeout=60,
        setup=_chain(lambda d: (d / "runs").mkdir(), _fifo("runs/stuck.json")))
    add("compare-different-benchmarks", "compare", "value", ["compare", GOOD, GOOD_C])
    add("compare-one-arg", "compare", "value", ["compare", GOOD])
    add("compare-three-args", "compare", "value", ["compare", GOOD, GOOD, GOOD])
    for tag, value in {"nan": "nan", "inf": "inf", "neg": "-1", "abc": "abc", "empty": "", "arabic": "\u0665"
                       }.items():
        add(f"compare-fail-on-{tag}", "compare", "value", ["compare", GOOD, GOOD, "--fail-on-slowdown", value])
    add("compare-good", "compare", "good", ["compare", GOOD, GOOD], expect="ok")
    add("compare-good-json", "compare", "good", ["compare", GOOD, GOOD, "--json"], expect="ok")

    # ---------- devices, the top level, plugins (HETBENCH_BENCHMARKS)
    add("devices-extra-arg", "devices", "value", ["devices", "extra"])
    add("devices-bogus-option", "devices", "value", ["devices", "--bogus"])
    add("top-no-such-command", "top", "value", ["nosuch"])
    add("top-empty-command", "top", "value", [""])
    add("top-unicode-command", "top", "value", ["m\u0430tmul"])
    plugin_src = {
        "raises": "raise RuntimeError('plugin broke')\n",
        "syntax": "def (:\n",
        "exit": "import sys\nsys.exit(3)\n",
        "dependency": "import nosuch_dependency_xyz\n",
        "recursion": "def f():\n    return f()\nf()\n",
    }
    for tag, src in plugin_src.items():
        # issue 33: a plugin that breaks is contained (the rest of hetbench works) or refused in one line
        add(f"plugin-{tag}", "plugins", "plugin", ["devices"], setup=_write(f"hb_plugin_{tag}.py", src),
            env={"HETBENCH_BENCHMARKS": f"hb_plugin_{tag}", "PYTHONPATH": "{d}"}, expect="ok_or_usage")
    for tag, value in {"missing": "nosuch_module_xyz", "relative": ".x", "path": "../x", "unicode": "m\u00f6d",
                       "nul-ish": "a b", "dots": "a..b"}.items():
        add(f"plugin-name-{tag}", "plugins", "plugin", ["devices"], env={"HETBENCH_BENCHMARKS": value},
            expect="ok_or_usage")
    add("plugin-empty-list", "plugins", "plugin", ["devices"], env={"HETBENCH_BENCHMARKS": " , ,"}, expect="ok")
    add("plugin-toy-bad-option", "plugins", "plugin", ["axpy", "--n", "0"],
        env={"HETBENCH_BENCHMARKS": "hetbench_toy.axpy", "PYTHONPATH": "{repo}/tests/plugins/toy_dist"})
    add("plugin-toy-out-devfull", "plugins", "plugin", ["axpy", "--n", "8", "--out", "/dev/full"],
        env={"HETBENCH_BENCHMARKS": "hetbench_toy.axpy", "PYTHONPATH": "{repo}/tests/plugins/toy_dist"})
    add("plugin-raises-2", "plugins", "plugin", ["devices"], nprocs=2, setup=_write("hb_plugin_r2.py", "1/0\n"),
        env={"HETBENCH_BENCHMARKS": "hb_plugin_r2", "PYTHONPATH": "{d}"}, expect="ok_or_usage")

    # ---------- a full disk: DIR/full is a tmpfs filled to its last byte before the run (the battery mounts it;
    # without root these cases are skipped and said so). A precious file already there must stay whole, and no
    # staged or half file may be left; outputs elsewhere must not be committed without the one that failed
    F = "{d}/full"
    full = [
        ("matmul", [*MM, "--out", F + "/prev.json"], "full/prev.json"),
        ("matmul", [*MM, "--out", F + "/o.json", "--csv", "{d}/prev.csv"], "prev.csv"),
        ("matmul", [*MM, "--out", "{d}/o.json", "--csv", F + "/o.csv"], None),
        ("matmul", ["matmul", "--size", "64", "--backend", "host", "--warmup", "0", "--repeat", "1", "--save",
                    F + "/prev.npy", "--out", "{d}/prev.json"], "full/prev.npy"),
        ("collectives", [*COLL, "--out", F + "/prev.json"], "full/prev.json"),
        ("calibrate", [*CAL, "--out", F + "/prev.json"], "full/prev.json"),
        ("split", [*SPLIT, "--out", F + "/prev.json"], "full/prev.json"),
        ("split", [*SPLIT, "--save", F + "/c.npy", "--out", "{d}/prev.json"], "prev.json"),
        ("split", [*PLAN, "--out", F + "/prev.json"], "full/prev.json"),
        ("train", [*TRAIN, "--out", F + "/prev.json"], "full/prev.json"),
        ("train", [*TRAIN, "--log", F + "/prev.jsonl", "--out", "{d}/o.json"], "full/prev.jsonl"),
        ("train", [*TRAIN, "--checkpoint", F + "/ck", "--out", "{d}/prev.json"], "prev.json"),
        ("train", [*TORCH, "--out", F + "/prev.json"], "full/prev.json"),
        ("report", ["report", GOOD, "--html", F + "/prev.html"], "full/prev.html"),
        ("report", ["report", GOOD, "--csv", F + "/prev.csv", "--html", "{d}/r.html"], "full/prev.csv"),
        ("report", ["report", GOOD, "--plots", F + "/plots"], None),
        ("devices", ["devices", "--json"], None),
    ]
    for i, (command, argv, prev) in enumerate(full):
        add(f"full-disk-{command}-{i}", command, "diskfull", argv, special="full",
            expect="ok" if command == "devices" else "fail", setup=_prev(prev) if prev else None,
            timeout=90 if command in ("report", "train") else 40)
    add("full-disk-matmul-mpi-2", "matmul", "diskfull", [*MM, "--out", F + "/prev.json", *MPI_TIMEOUT], nprocs=2,
        special="full", expect="fail", setup=_prev("full/prev.json"))
    add("full-disk-train-mpi-3", "train", "diskfull", [*TRAIN, "--backend", "host", "--checkpoint", F + "/ck",
                                                       "--out", "{d}/prev.json", *MPI_TIMEOUT], nprocs=3,
        special="full", expect="fail", setup=_prev("prev.json"))

    # ---------- a deleted working directory
    for command, argv, expect in [
        ("matmul", MM, "usage"), ("matmul", [*MM, "--out", "{d}/o.json"], "ok_or_usage"),
        ("collectives", COLL, "usage"), ("calibrate", CAL, "usage"), ("split", SPLIT, "usage"),
        ("split", PLAN, "usage"), ("train", TRAIN, "usage"), ("report", ["report", GOOD], "ok_or_usage"),
        ("report", ["report", "runs"], "usage"), ("compare", ["compare", GOOD, GOOD], "ok_or_usage"),
        ("devices", ["devices"], "ok_or_usage"), ("matmul", ["matmul", "--a", "a.npy", "--b", "a.npy"], "usage"),
    ]:
        tag = f"{command}-{len([c for c in cs if c.special == 'gone_cwd' and c.command == command])}"
        add(f"gone-cwd-{tag}", command, "cwd", argv, special="gone_cwd", expect=expect)
    add("gone-cwd-matmul-mpi-2", "matmul", "cwd", [*MM, *MPI_TIMEOUT], special="gone_cwd", nprocs=2)

    # ---------- a closed stdout
    for command, argv in [("devices", ["devices", "--sim"]), ("devices", ["devices", "--json"]),
                          ("matmul", [*MM, "--out", "{d}/o.json"]), ("matmul", [*MM, "--json"]),
                          ("collectives", [*COLL, "--out", "{d}/o.json"]), ("calibrate", [*CAL, "--json"]),
                          ("split", [*SPLIT, "--out", "{d}/o.json"]), ("split", PLAN),
                          ("train", [*TRAIN, "--out", "{d}/o.json"]), ("report", ["report", GOOD]),
                          ("compare", ["compare", GOOD, GOOD]), ("compare", ["compare", GOOD, GOOD, "--json"]),
                          ("top", ["--help"]), ("matmul", ["matmul", "--help"])]:
        n = len([c for c in cs if c.special == "pipe" and c.command == command])
        add(f"pipe-{command}-{n}", command, "pipe", argv, special="pipe", expect="pipe", timeout=60)
    add("pipe-matmul-mpi-2", "matmul", "pipe", [*MM, "--out", "{d}/o.json", *MPI_TIMEOUT], nprocs=2,
        special="pipe", expect="pipe")
    add("pipe-train-mpi-3", "train", "pipe", [*TRAIN, "--backend", "host", "--out", "{d}/o.json", *MPI_TIMEOUT],
        nprocs=3, special="pipe", expect="pipe")

    # ---------- signals to one rank (and to a single process)
    long_runs = {
        "matmul": ["matmul", "--size", "192", "--warmup", "0", "--repeat", "1000000", "--backend", "host"],
        "collectives": ["collectives", "--op", "allreduce", "--min-bytes", "256K", "--max-bytes", "256K",
                        "--warmup", "0", "--iters", "1000000", "--backend", "host"],
        "split": ["split", "--size", "256", "--warmup", "0", "--repeat", "1000000", "--backend", "host"],
        "train": ["train", "--steps", "10000000", "--layers", "2", "--hidden", "64", "--batch", "64", "--no-check",
                  "--backend", "host"],
        "calibrate": ["calibrate", "--size", "256", "--backend", "host", "--repeat", "1000000"],
    }
    plan = [  # (command, ranks, target rank, signal, when)
        ("matmul", 2, 1, signal.SIGINT, "early"), ("matmul", 2, 0, signal.SIGTERM, "early"),
        ("matmul", 3, 2, signal.SIGINT, "early"), ("matmul", 3, 1, signal.SIGTERM, "early"),
        ("matmul", 3, 0, signal.SIGINT, "late"), ("matmul", 2, 1, signal.SIGTERM, "late"),
        ("collectives", 2, 0, signal.SIGINT, "early"), ("collectives", 3, 2, signal.SIGTERM, "early"),
        ("collectives", 2, 1, signal.SIGINT, "late"), ("collectives", 3, 1, signal.SIGTERM, "late"),
        ("split", 2, 1, signal.SIGTERM, "early"), ("split", 3, 0, signal.SIGINT, "early"),
        ("split", 3, 2, signal.SIGINT, "late"),
        ("train", 2, 1, signal.SIGINT, "early"), ("train", 3, 2, signal.SIGTERM, "early"),
        ("train", 2, 0, signal.SIGTERM, "late"), ("train", 3, 1, signal.SIGINT, "late"),
        ("calibrate", 2, 1, signal.SIGINT, "early"), ("calibrate", 3, 2, signal.SIGTERM, "late"),
        ("matmul", 2, 0, signal.SIGINT, "early"), ("train", 2, 1, signal.SIGTERM, "early"),
        ("collectives", 2, 1, signal.SIGTERM, "early"),
    ]
    # a sweep of the first half second: the signal this long after the rank's process has started
    sweep = [("matmul", 2, 1, signal.SIGTERM), ("train", 3, 0, signal.SIGINT), ("collectives", 3, 1, signal.SIGTERM),
             ("split", 2, 0, signal.SIGINT), ("calibrate", 3, 2, signal.SIGINT), ("train", 2, 1, signal.SIGTERM)]
    for j, offset in enumerate((0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.45)):
        for k, (command, ranks, rank, signum) in enumerate(sweep):
            if (j + k) % 2 == 0:  # half the grid: every command and every offset, 21 cases
                plan.append((command, ranks, rank, signum, f"at:{offset:.2f}"))
    for i, (command, ranks, rank, signum, when) in enumerate(plan):
        name = signal.Signals(signum).name.lower()
        add(f"signal-{command}-{ranks}r-rank{rank}-{name}-{when}-{i}", command, "signal",
            [*long_runs[command], "--out", "{d}/r.json", *SIGNAL_TIMEOUT], nprocs=ranks, special="signal",
            signal=(rank, signum, when), expect="signal", timeout=30)
    for i, (command, signum, when) in enumerate([("matmul", signal.SIGINT, "early"), ("train", signal.SIGTERM, "early"),
                                                 ("split", signal.SIGTERM, "late"), ("collectives", signal.SIGINT,
                                                                                     "late")]):
        name = signal.Signals(signum).name.lower()
        add(f"signal-{command}-1p-{name}-{when}-{i}", command, "signal", [*long_runs[command], "--out", "{d}/r.json"],
            special="signal", signal=(0, signum, when), expect="signal", timeout=25)
    return cs


def build_cases() -> list[Case]:
    from cases_round3 import round3_cases

    cases = _cases() + round3_cases()
    for case in cases:
        case.known = case.id in KNOWN
    return cases
