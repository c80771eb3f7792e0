"""Issue 33's hostile cases (round three): the torch front end (`train --frontend torch`: bad option values on 1, 2
and 3 ranks, options that do not apply, doctored torch checkpoints), the library API misused from a user's script
under mpiexec (tests/hostile/lib_cases.py), the OpenCL GEMM tuning cache, backend and benchmark plugins that break,
`split --zero-copy`, `--timeout` far too small on every MPI command, and signals while a short run shuts down.

cases.py's build_cases adds them to the rest; prepare_round3 makes, once per battery run and only for the cases
selected, the templates they doctor: torch checkpoints (ddp/fsdp2's state.pt; fsdp's sharded pieces on 2 ranks;
another model's) and an OpenCL tuning cache (made by `hetbench tune`; without an OpenCL device the cases that need
it are skipped, and said so).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from cases import (
    BAD_INTS,
    BROKEN,
    COLL,
    CAL,
    MM,
    MPI_TIMEOUT,
    SIGNAL_TIMEOUT,
    SPLIT,
    TEMPLATES,
    TRAIN,
    UNAVAILABLE,
    Case,
    _chain,
    _fifo,
    _prev,
    _sparse,
    _symlink,
    _write,
    template,
)

HERE = Path(__file__).resolve().parent
LIB = "{repo}/tests/hostile/lib_cases.py"
# the torch front end, as small as it goes: 1 layer of 8, batch 8, 2 steps (torch's import is most of a case's time)
TORCH = ["train", "--frontend", "torch", "--steps", "2", "--layers", "1", "--hidden", "8", "--batch", "8"]
GPT = ["train", "--frontend", "torch", "--model", "gpt", "--steps", "1", "--layers", "1", "--hidden", "8", "--heads",
       "2", "--seq-len", "8", "--batch", "4"]
TORCH_TIMEOUT = 90.0
LIB_TIMEOUT = 60.0
# the OpenCL GEMM: size 64 is the "small" shape class
OCL_MM = ["matmul", "--size", "64", "--warmup", "0", "--repeat", "1", "--backend", "opencl"]
CACHE_ENV = "HETBENCH_CACHE_DIR"


# --- templates ----------------------------------------------------------------------------------------------------

def _needed(cases: list[Case] | None) -> set[str]:
    if cases is None:
        return {"torch-ck", "torch-ck-fsdp", "torch-ck-gpt", "opencl"}
    return {need for case in cases for need in case.needs}


def _run(cmd: list[str], folder: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str | None:
    """Run a template's command; None when it worked, else why not (its stderr's tail)."""
    try:
        done = subprocess.run(cmd, cwd=folder, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd)} ran past {timeout:.0f} s"
    if done.returncode != 0:
        tail = " | ".join(line.strip() for line in done.stderr.strip().splitlines()[-3:])
        return f"exit {done.returncode}: {tail[-400:]}"
    return None


def prepare_round3(folder: Path, hb: str, cases: list[Case] | None) -> None:
    """The torch checkpoints and the OpenCL tuning cache the selected cases doctor (see the module's doc)."""
    needed = _needed(cases)
    python = str(Path(hb).parent / "python") if (Path(hb).parent / "python").exists() else "python3"
    if any(n.startswith("torch") for n in needed):
        if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0:
            for name in ("torch", "torch-ck", "torch-ck-fsdp", "torch-ck-gpt"):
                UNAVAILABLE[name] = "torch is not installed (pip install 'hetbench[torch]')"
    mpiexec = str(Path(hb).parent / "mpiexec") if (Path(hb).parent / "mpiexec").exists() else shutil.which("mpiexec")
    runs = {
        "torch-ck": [hb, *TORCH, "--no-check", "--checkpoint", str(folder / "tck"), "--out", str(folder / "t1.json")],
        "torch-ck-gpt": [hb, *GPT, "--no-check", "--checkpoint", str(folder / "tckg"), "--out",
                         str(folder / "t2.json")],
        "torch-ck-fsdp": [str(mpiexec), "-n", "2", hb, *TORCH, "--strategy", "fsdp", "--backend", "host",
                          "--no-check", "--checkpoint", str(folder / "tckf"), "--out", str(folder / "t3.json"),
                          "--timeout", "60"],
    }
    places = {"torch-ck": "tck", "torch-ck-gpt": "tckg", "torch-ck-fsdp": "tckf"}
    for name, cmd in runs.items():
        if name in needed and name not in UNAVAILABLE:
            why = _run(cmd, folder)
            if why:
                BROKEN[name] = why
            else:
                TEMPLATES[name] = folder / places[name]
    if "opencl" in needed:
        cache = folder / "cache"
        why = _run([hb, "tune", "--backend", "opencl", "--shape-class", "small", "--budget", "1", "--out",
                    str(folder / "tune.json")], folder, env={CACHE_ENV: str(cache)})
        files = sorted(cache.glob("opencl-gemm-*.json")) if cache.is_dir() else []
        if why is not None:
            # no OpenCL device (PoCL missing): skipped, said so; a device that is there but fails: a finding
            listed = subprocess.run([hb, "devices", "--json"], capture_output=True, text=True, cwd=folder)
            try:
                has = any(d.get("backend") == "opencl" for d in json.loads(listed.stdout).get("devices", []))
            except ValueError:
                has = False
            if has:
                BROKEN["opencl"] = f"hetbench tune failed on this machine's OpenCL device: {why}"
            else:
                UNAVAILABLE["opencl"] = "no OpenCL device here (PoCL or a GPU driver's ICD missing)"
        elif len(files) != 1:
            BROKEN["opencl"] = f"hetbench tune left {len(files)} cache files in {cache}, not 1"
        else:
            TEMPLATES["opencl-cache"] = files[0]


# --- setup helpers --------------------------------------------------------------------------------------------------

def _tck(name: str = "torch-ck", edit: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    """A copy of a torch checkpoint template as DIR/ck, with one thing changed in its step folder."""
    def setup(d: Path) -> None:
        shutil.copytree(template(name), d / "ck")
        if edit:
            step = next((d / "ck").glob("step-*"))
            edit(step)
    return setup


def _state(change: Callable[[dict], object]) -> Callable[[Path], None]:
    """state.pt loaded, changed (or replaced by what change returns), saved again."""
    def edit(step: Path) -> None:
        import torch

        state = torch.load(step / "state.pt", weights_only=True)
        result = change(state)
        torch.save(state if result is None else result, step / "state.pt")
    return edit


def _raw(name: str, data: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def edit(step: Path) -> None:
        path = step / name
        path.write_bytes(data(path.read_bytes()))
    return edit


def _replace(name: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def edit(step: Path) -> None:
        (step / name).unlink()
        make(step / name)
    return edit


def _tmanifest(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def edit(step: Path) -> None:
        path = step / "manifest.json"
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))
    return edit


def _other_state(name: str) -> Callable[[Path], None]:
    """state.pt replaced by another template's (another model's)."""
    def edit(step: Path) -> None:
        other = next(template(name).glob("step-*"))
        shutil.copy(other / "state.pt", step / "state.pt")
    return edit


def _first_param(state: dict) -> str:
    return next(iter(state["model"]))


def _cache(change: Callable[[dict], object] | None = None, raw: bytes | str | None = None,
           make: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    """DIR/cache/ holding the tuning cache template's file, changed (its document, its bytes, or the path made
    into something else: a FIFO, a folder, a link)."""
    def setup(d: Path) -> None:
        src = template("opencl-cache")
        (d / "cache").mkdir()
        path = d / "cache" / src.name
        if make:
            make(path)
            return
        if raw is not None:
            path.write_bytes(raw.encode() if isinstance(raw, str) else raw)
            return
        doc = json.loads(src.read_text())
        if change:
            result = change(doc)
            if result is not None:
                doc = result
        path.write_text(json.dumps(doc))
    return setup


def _params(**values) -> Callable[[dict], None]:
    """Every entry's kernel parameters changed."""
    def change(doc: dict) -> None:
        for entry in doc["entries"].values():
            entry["params"].update(values)
    return change


def _entry(**values) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        for entry in doc["entries"].values():
            entry.update(values)
    return change


def _dist_plugin(name: str, module_src: str, group: str = "hetbench.backends") -> Callable[[Path], None]:
    """A backend (or benchmark) plugin 'installed' without touching the virtualenv: a package and its dist-info
    folder in DIR/site, which the case puts on PYTHONPATH (importlib.metadata finds its entry point there)."""
    def setup(d: Path) -> None:
        pkg = d / "site" / f"{name}_plugin"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "mod.py").write_text(module_src)
        info = d / "site" / f"{name}_plugin-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {name}_plugin.mod\n")
    return setup


# a backend module that works, from which the broken ones differ by one thing
GOOD_BACKEND = '''
from hetbench.backends.base import Capabilities, DeviceInfo
CAPABILITIES = Capabilities(array_module="numpy", buffers_in_host_memory=True)
def unavailable_reason():
    return None
def list_devices():
    return [DeviceInfo(backend="{name}", index=0, vendor="Hostile", name="Hostile Device", kind="accelerator",
                       memory_bytes=None, dtypes=("fp32",), runtime="none")]
def open_device(spec, local_rank, local_size):
    raise RuntimeError("{name}: open_device broke")
'''


# --- the cases ------------------------------------------------------------------------------------------------------

def round3_cases() -> list[Case]:
    cs: list[Case] = []

    def add(id_: str, command: str, kind: str, argv: list[str], **kw) -> None:
        cs.append(Case(id_, command, kind, argv, **kw))

    def torch_case(id_: str, argv: list[str], nprocs: int | None = None, kind: str = "torch", **kw) -> None:
        """A `train --frontend torch` case (MPI ones get the watchdog)."""
        kw.setdefault("needs", ("torch",))
        kw.setdefault("timeout", TORCH_TIMEOUT)
        watchdog = MPI_TIMEOUT if nprocs and "--timeout" not in argv else []  # a case's own --timeout is the last
        add(id_, "train", kind, [*argv, *watchdog], nprocs=nprocs, **kw)

    # ---------- the torch front end: every option it takes, bad values, on 1, 2 and 3 ranks
    int_opts = ("--layers", "--hidden", "--batch", "--steps", "--seq-len", "--heads", "--seed", "--warmup-steps",
                "--checkpoint-every")
    for opt in int_opts:
        for tag in ("neg", "huge", "abc", "fullwidth"):
            torch_case(f"torch{opt[1:]}-{tag}", [*TORCH, opt, BAD_INTS[tag]])
    for opt in ("--layers", "--hidden", "--batch", "--steps"):
        torch_case(f"torch{opt[1:]}-zero", [*TORCH, opt, "0"])
        torch_case(f"torch{opt[1:]}-neg-2", [*TORCH, opt, "-1"], nprocs=2)
        torch_case(f"torch{opt[1:]}-arabic-3", [*TORCH, opt, BAD_INTS["arabic"]], nprocs=3)
    for opt in ("--seq-len", "--heads"):  # gpt's own options, with the gpt
        for tag in ("zero", "neg", "huge"):
            torch_case(f"torch-gpt{opt[1:]}-{tag}", [*GPT, opt, BAD_INTS[tag]])
    torch_case("torch-gpt-heads-not-dividing-2", [*GPT, "--heads", "3"], nprocs=2)
    torch_case("torch-gpt-heads-over-hidden", [*GPT, "--heads", "16"])
    for tag, value in {"inf": "inf", "neg": "-0.1", "zero": "0", "abc": "abc", "huge": "1e999", "empty": "",
                       "minus-nan": "-nan", "neg-inf": "-inf"}.items():  # nan: cases.py's torch-lr-nan
        torch_case(f"torch-lr-{tag}", [*TORCH, "--lr", value])
    torch_case("torch-lr-nan-2", [*TORCH, "--lr", "nan"], nprocs=2)
    torch_case("torch-lr-neg-3", [*TORCH, "--lr", "-1"], nprocs=3)
    for opt, values in {"--model": ["bogus", "", "GPT", "mlp,gpt"], "--dtype": ["fp64", "int8", "", "FP16", "fp8"],
                        "--strategy": ["bogus", "", "FSDP2", "pipeline,ddp"], "--optimizer": ["bogus", "", "adam"],
                        "--path": ["bogus", "", "HOST"]}.items():
        for value in values:
            torch_case(f"torch{opt[1:]}-{value.replace(',', '-') or 'empty'}", [*TORCH, opt, value])
    torch_case("torch-strategy-pipeline-2", [*TORCH, "--strategy", "pipeline", "--backend", "host"], nprocs=2)
    torch_case("torch-dtype-fp64-3", [*TORCH, "--dtype", "fp64"], nprocs=3)
    for tag, value in {"count": "1,2,3", "nan": "nan", "neg": "-1,2", "zeros": "0,0", "word": "fast,slow",
                       "missing": "{d}/nope.json", "dir": "{d}", "empty": ""}.items():
        torch_case(f"torch-weights-{tag}-2", [*TORCH, "--weights", value, "--backend", "host"], nprocs=2)
    torch_case("torch-weights-count-3", [*TORCH, "--weights", "1,1", "--backend", "host"], nprocs=3)
    torch_case("torch-weights-one-1", [*TORCH, "--weights", "1,1"])
    for tag, value in {"nosuch": "nosuch", "sim-nosuch": "sim:nosuch", "opencl-99": "opencl:99", "cupy": "cupy",
                       "empty": "", "rank-beyond": "0=host,5=host"}.items():
        torch_case(f"torch-backend-{tag}", [*TORCH, "--backend", value])
    torch_case("torch-backend-rank-missing-2", [*TORCH, "--backend", "0=host,2=host"], nprocs=2)
    torch_case("torch-backend-bad-3", [*TORCH, "--backend", "0=host,1=host,2=sim:nosuch"], nprocs=3)
    for tag, value in {"nan": "nan", "neg": "-1", "abc": "abc", "inf": "inf"}.items():
        torch_case(f"torch-timeout-{tag}", [*TORCH, "--timeout", value])
    torch_case("torch-log-dir", [*TORCH, "--log", "{d}"])
    torch_case("torch-log-devfull", [*TORCH, "--log", "/dev/full"])
    torch_case("torch-csv-no-parent", [*TORCH, "--csv", "{d}/no/such/x.csv"])
    torch_case("torch-out-dir-2", [*TORCH, "--out", "{d}", "--backend", "host"], nprocs=2)
    torch_case("torch-checkpoint-is-file", [*TORCH, "--checkpoint", "{d}/prev.txt"], setup=_prev("prev.txt"))
    torch_case("torch-checkpoint-devfull", [*TORCH, "--checkpoint", "/dev/full"])
    torch_case("torch-checkpoint-proc", [*TORCH, "--checkpoint", "/proc/hetbench-hostile-ck"])
    torch_case("torch-resume-missing", [*TORCH, "--resume", "{d}/nope"])
    torch_case("torch-resume-is-file", [*TORCH, "--resume", "{d}/prev.txt"], setup=_prev("prev.txt"))
    torch_case("torch-resume-empty-dir", [*TORCH, "--resume", "{d}/ck"], setup=lambda d: (d / "ck").mkdir())
    torch_case("torch-resume-devzero", [*TORCH, "--resume", "/dev/zero"])
    torch_case("torch-resume-missing-2", [*TORCH, "--resume", "{d}/nope", "--backend", "host"], nprocs=2)
    # options that do not apply to the torch front end or to the model: refused in one line
    torch_case("torch-mlp-seq-len", [*TORCH, "--model", "mlp", "--seq-len", "16"])
    torch_case("torch-mlp-heads", [*TORCH, "--model", "mlp", "--heads", "2"])
    torch_case("torch-default-model-seq-len", [*TORCH, "--seq-len", "32"])
    torch_case("torch-mlp-seq-len-2", [*TORCH, "--seq-len", "16", "--backend", "host"], nprocs=2)
    torch_case("torch-mlp-heads-3", [*TORCH, "--heads", "2", "--backend", "host"], nprocs=3)
    torch_case("torch-micro-batches", [*TORCH, "--micro-batches", "2"])
    torch_case("torch-micro-batches-ddp-2", [*TORCH, "--strategy", "ddp", "--micro-batches", "4", "--backend",
                                             "host"], nprocs=2)
    torch_case("torch-micro-batches-gpt", [*GPT, "--micro-batches", "2"])
    torch_case("torch-path-device-sim", [*TORCH, "--path", "device", "--backend", "sim:h100"])
    torch_case("torch-path-device-sim-2", [*TORCH, "--path", "device", "--backend", "0=host,1=sim:a10g"], nprocs=2)
    torch_case("torch-path-device-sim-3", [*TORCH, "--path", "device", "--backend", "sim:mi300x"], nprocs=3)
    torch_case("torch-numpy-seq-len", [*TRAIN, "--seq-len", "16"], needs=())  # the numpy front end has no gpt
    torch_case("torch-numpy-heads", [*TRAIN, "--heads", "2"], needs=())
    torch_case("torch-numpy-model-gpt", [*TRAIN, "--model", "gpt"], needs=())
    torch_case("torch-numpy-strategy-fsdp2", [*TRAIN, "--strategy", "fsdp2"], needs=())
    # good runs of the front end, for the checks not to be vacuous (whole files, nothing left running)
    torch_case("torch-good-ddp-2", [*TORCH, "--strategy", "ddp", "--backend", "host", "--out", "{d}/o.json",
                                    "--log", "{d}/l.jsonl"], nprocs=2, expect="ok", outputs=["o.json", "l.jsonl"])
    torch_case("torch-good-fsdp-3", [*TORCH, "--strategy", "fsdp", "--backend", "host", "--weights", "2,1,1",
                                     "--checkpoint", "{d}/ck", "--out", "{d}/o.json"], nprocs=3, expect="ok",
               outputs=["o.json", "ck/latest"])

    # ---------- doctored torch checkpoints: --resume refuses each in one line naming the file (exit 2)
    resume = [*TORCH, "--steps", "3", "--resume", "{d}/ck", "--out", "{d}/r.json"]
    state_cases = {
        "truncated": _raw("state.pt", lambda b: b[: len(b) // 2]),
        "empty": _raw("state.pt", lambda b: b""),
        "one-byte": _raw("state.pt", lambda b: b[:1]),
        "text": _raw("state.pt", lambda b: b"not a torch file\n"),
        "binary": _raw("state.pt", lambda b: bytes(range(256)) * 16),
        "zip-junk": _raw("state.pt", lambda b: b"PK\x03\x04" + b"\0" * 200),
        "other-model": _other_state("torch-ck-gpt"),
        "optim-missing": _state(lambda s: s.pop("optim")),
        "model-missing": _state(lambda s: s.pop("model")),
        "param-missing": _state(lambda s: s["model"].pop(_first_param(s))),
        "param-extra": _state(lambda s: s["model"].update({"extra.weight": s["model"][_first_param(s)]})),
        "param-shape": _state(lambda s: s["model"].update({_first_param(s): s["model"][_first_param(s)].reshape(-1)})),
        "param-nan": _state(lambda s: s["model"][_first_param(s)].fill_(float("nan"))),
        "param-int": _state(lambda s: s["model"].update({_first_param(s): s["model"][_first_param(s)].long()})),
        "param-not-tensor": _state(lambda s: s["model"].update({_first_param(s): [1.0, 2.0]})),
        "optim-state-empty": _state(lambda s: s["optim"].update({"state": {}})),
        "optim-list": _state(lambda s: s.update({"optim": [1, 2, 3]})),
        "plain-tensor": _state(lambda s: __import__("torch").ones(3)),
        "list": _state(lambda s: [s["model"], s["optim"]]),
        "none": _state(lambda s: {"model": None, "optim": None}),
        "code": _raw("state.pt", lambda b: __import__("pickle").dumps(__import__("os").getcwd)),
        "missing": lambda step: (step / "state.pt").unlink(),
        "fifo": _replace("state.pt", lambda p: os.mkfifo(p)),
        "dir": _replace("state.pt", lambda p: p.mkdir()),
        "link-devzero": _replace("state.pt", lambda p: os.symlink("/dev/zero", p)),
        "link-loop": _replace("state.pt", lambda p: os.symlink(p, p)),
        "sparse-giant": _replace("state.pt", lambda p: _sparse(p.name, 3 * 2**30)(p.parent)),
    }
    for tag, edit in state_cases.items():
        needs = ("torch", "torch-ck", "torch-ck-gpt") if tag == "other-model" else ("torch", "torch-ck")
        torch_case(f"torch-resume-state-{tag}", resume, setup=_tck("torch-ck", edit), needs=needs, kind="checkpoint",
                   needles=["state.pt"])
    for tag in ("truncated", "empty", "other-model", "optim-missing", "plain-tensor"):
        for n in (2, 3):
            if (tag, n) in (("empty", 3), ("plain-tensor", 2), ("optim-missing", 3)):
                continue  # a pair of rank counts is enough for each
            torch_case(f"torch-resume-state-{tag}-{n}", [*resume, "--backend", "host"], nprocs=n,
                       setup=_tck("torch-ck", state_cases[tag]), kind="checkpoint", needles=["state.pt"],
                       needs=("torch", "torch-ck", "torch-ck-gpt") if tag == "other-model" else ("torch", "torch-ck"))
    manifest_cases = {
        "format-numpy": _tmanifest(lambda m: m.update({"format": "hetbench-checkpoint/1"})),
        "task-gpt": _tmanifest(lambda m: m["model"].update({"task": "gpt"})),
        "task-missing": _tmanifest(lambda m: m["model"].pop("task")),
        "hidden-other": _tmanifest(lambda m: m["model"].update({"hidden": 16})),
        "strategy-bogus": _tmanifest(lambda m: m.update({"strategy": "bogus"})),
        "optimizer-bogus": _tmanifest(lambda m: m.update({"optimizer": "adam9"})),
        "dtype-bogus": _tmanifest(lambda m: m.update({"dtype": "fp8"})),
        "steps-neg": _tmanifest(lambda m: m.update({"steps_done": -2})),
        "scaler-text": _tmanifest(lambda m: m.update({"loss_scaler": "dynamic"})),
        "manifest-missing": lambda step: (step / "manifest.json").unlink(),
        "manifest-fifo": _replace("manifest.json", lambda p: os.mkfifo(p)),
    }
    for tag, edit in manifest_cases.items():
        torch_case(f"torch-resume-manifest-{tag}", resume, setup=_tck("torch-ck", edit), needs=("torch", "torch-ck"),
                   kind="checkpoint", needles=["ck/step-2"] if tag != "manifest-missing" else [])  # the step folder or its manifest
    # fsdp's sharded checkpoint (2 ranks' pieces): pieces overlapping or missing, files doctored
    fsdp_resume = [*TORCH, "--strategy", "fsdp", "--steps", "3", "--resume", "{d}/ck", "--out", "{d}/r.json",
                   "--backend", "host"]

    def pieces(rank: int, value) -> Callable[[Path], None]:
        return _tmanifest(lambda m: m["ranks"][rank].update({"pieces": value}))

    fsdp_cases = {
        "pieces-overlap": (pieces(1, [[0, 36, 72, 0], [0, 0, 36, 0]]), "manifest.json"),
        "pieces-overlap-shifted": (pieces(1, [[0, 30, 66, 0]]), "manifest.json"),
        "pieces-missing": (pieces(1, []), "manifest.json"),
        "pieces-gap": (pieces(1, [[0, 38, 72, 0]]), "manifest.json"),
        "pieces-unit-beyond": (pieces(1, [[5, 36, 72, 0]]), "manifest.json"),
        "pieces-reversed": (pieces(1, [[0, 72, 36, 0]]), "manifest.json"),
        "layout-name": (_tmanifest(lambda m: m["layout"][0]["params"][0].__setitem__(0, "layers.0.other.weight")),
                        "manifest.json"),
        "layout-shape": (_tmanifest(lambda m: m["layout"][0]["params"][0].__setitem__(1, [4, 16])), "manifest.json"),
        "optimizer-steps-neg": (_tmanifest(lambda m: m.update({"optimizer_steps": -1})), "manifest.json"),
        "piece-truncated": (_raw("rank-1.param.npy", lambda b: b[:100]), "rank-1.param.npy"),
        "piece-empty": (_raw("rank-0.m.npy", lambda b: b""), "rank-0.m.npy"),
        "piece-missing": (lambda step: (step / "rank-1.v.npy").unlink(), "rank-1.v.npy"),
        "piece-fifo": (_replace("rank-0.param.npy", lambda p: os.mkfifo(p)), "rank-0.param.npy"),
    }
    for tag, (edit, needle) in fsdp_cases.items():
        for n in (1, 2) if tag in ("pieces-overlap", "pieces-missing", "piece-truncated") else (2,):
            torch_case(f"torch-resume-fsdp-{tag}-{n}", fsdp_resume, nprocs=n if n > 1 else None,
                       setup=_tck("torch-ck-fsdp", edit), needs=("torch", "torch-ck-fsdp"), kind="checkpoint",
                       needles=[needle])
    torch_case("torch-resume-good-2", [*resume, "--backend", "host"], nprocs=2, setup=_tck("torch-ck"),
               needs=("torch", "torch-ck"), kind="checkpoint", expect="ok", outputs=["r.json"])
    torch_case("torch-resume-fsdp-good-3", [*fsdp_resume], nprocs=3, setup=_tck("torch-ck-fsdp"),
               needs=("torch", "torch-ck-fsdp"), kind="checkpoint", expect="ok", outputs=["r.json"])

    # ---------- the library API misused from a user's script (tests/hostile/lib_cases.py)
    import sys

    sys.path.insert(0, str(HERE))
    import lib_cases

    # every case on 2 ranks; on 3 those where a third rank changes what is checked (which rank differs, how many
    # pieces, the world's size in a rank check): each costs torch's import on every rank (some 8 s of a core)
    on_three = {"agit-out-short-last", "allreduce-dtype-last", "a2a-splits-disagree", "rst-in-short-last",
                "shard-width-last", "shard-weights-last", "send-dst-world", "recv-src-world", "row-range-short",
                "steplogger-folder", "frozen-first-block-adamw", "ring-good"}
    for name in lib_cases.RAISES:
        for n in (2, 3) if name in on_three else (2,):
            add(f"lib-{name}-{n}", "library", "lib", [LIB, name], nprocs=n, program="python", expect="raises",
                needs=("torch",), timeout=LIB_TIMEOUT, batch="lib")
    for name in lib_cases.OK:
        for n in (2, 3) if name in on_three else (2,):
            add(f"lib-{name}-{n}", "library", "lib", [LIB, name], nprocs=n, program="python", expect="ok",
                needs=("torch",), timeout=LIB_TIMEOUT, batch="lib")

    # ---------- the OpenCL GEMM tuning cache (HETBENCH_CACHE_DIR): ignored with a note, the GEMM runs and verifies
    caches = {
        "fifo": (_cache(make=lambda p: os.mkfifo(p)), "ok"),
        "dir": (_cache(make=lambda p: p.mkdir()), "ok"),
        "link-devzero": (_cache(make=lambda p: os.symlink("/dev/zero", p)), "ok"),
        "link-devnull": (_cache(make=lambda p: os.symlink("/dev/null", p)), "ok"),
        "link-devurandom": (_cache(make=lambda p: os.symlink("/dev/urandom", p)), "ok"),
        "link-loop": (_cache(make=lambda p: os.symlink(p, p)), "ok"),
        "link-dangling": (_cache(make=lambda p: os.symlink(p.parent / "nowhere.json", p)), "ok"),
        "empty": (_cache(raw=b""), "ok"),
        "binary": (_cache(raw=bytes(range(256)) * 8), "ok"),
        "utf16": (_cache(raw='{"schema": "x"}'.encode("utf-16")), "ok"),
        "null": (_cache(raw="null"), "ok"),
        "list": (_cache(raw="[]"), "ok"),
        "deep": (_cache(raw="[" * 200000 + "]" * 200000), "ok"),
        "sparse-giant": (_cache(make=lambda p: _sparse(p.name, 3 * 2**30)(p.parent)), "ok"),
        "entries-list": (_cache(lambda doc: doc.update({"entries": []})), "ok"),
        "entries-null": (_cache(lambda doc: doc.update({"entries": None})), "ok"),
        "entry-text": (_cache(lambda doc: doc["entries"].update({"fp32/small": "fast"})), "ok"),
        "params-missing": (_cache(lambda doc: [e.pop("params") for e in doc["entries"].values()] and None), "ok"),
        "params-list": (_cache(_entry(params=[1, 2, 3])), "ok"),
        "version-9": (_cache(lambda doc: doc.update({"version": 9})), "ok"),
        "schema-other": (_cache(lambda doc: doc.update({"schema": "hetbench.other"})), "ok"),
        "device-other": (_cache(lambda doc: doc["device"].update({"name": "Another GPU 9000"})), "ok"),
        "driver-other": (_cache(lambda doc: doc["device"].update({"driver_version": "0.0-old"})), "ok"),
        "device-null": (_cache(lambda doc: doc.update({"device": None})), "ok"),
        "wg-over-limit": (_cache(_params(lx=256, ly=256, pack=0, nc=0)), "ok"),
        "wg-x-over": (_cache(_params(lx=256, ly=64, pack=0, nc=0)), "ok"),
        "local-mem-over": (_cache(_params(use_local=1, pack=0, nc=0, kb=256, wm=256, ly=256, lx=1)), "ok"),
        "local-mem-over-wide": (_cache(_params(use_local=1, pack=0, nc=0, kb=256, wm=64, ly=4, lx=4, vw=16, nv=16)),
                             "ok"),
        "tile-zero": (_cache(_params(wm=0)), "ok"),
        "tile-neg": (_cache(_params(nv=-4)), "ok"),
        "tile-huge": (_cache(_params(wm=10**9)), "ok"),
        "tile-float": (_cache(_params(wm=4.5)), "ok"),
        "tile-bool": (_cache(_params(use_local=True)), "ok"),
        "vw-3": (_cache(_params(vw=3)), "ok"),
        "nc-not-multiple": (_cache(_params(nc=100)), "ok"),
        "gflops-nan": (_cache(raw=None, change=_entry(tuned_gflops=float("nan"))), "ok"),
        "gflops-neg": (_cache(_entry(tuned_gflops=-1.0)), "ok"),
        "gflops-text": (_cache(_entry(tuned_gflops="fast")), "ok"),
        "other-entry-bad": (_cache(lambda doc: doc["entries"].update({"fp64/large": {"params": {}}})), "ok"),
    }
    # a truncated document: the template's text cut in half (made when the case runs)
    def truncated(d: Path) -> None:
        src = template("opencl-cache")
        (d / "cache").mkdir()
        text = src.read_bytes()
        (d / "cache" / src.name).write_bytes(text[: len(text) // 2])
    caches["truncated"] = (truncated, "ok")
    for tag, (setup, expect) in caches.items():
        add(f"cache-{tag}", "matmul", "cache", [*OCL_MM, "--out", "{d}/o.json"], setup=setup, expect=expect,
            env={CACHE_ENV: "{d}/cache"}, needs=("opencl",), outputs=["o.json"], timeout=60)
    for tag in ("fifo", "wg-over-limit", "local-mem-over", "truncated", "device-other", "tile-huge"):
        setup, expect = caches[tag]
        add(f"cache-{tag}-2", "matmul", "cache", [*OCL_MM, "--out", "{d}/o.json", *MPI_TIMEOUT], setup=setup,
            expect=expect, nprocs=2, env={CACHE_ENV: "{d}/cache"}, needs=("opencl",), timeout=60)
        add(f"cache-tune-{tag}", "tune", "cache", ["tune", "--backend", "opencl", "--shape-class", "small",
                                                   "--budget", "1", "--out", "{d}/o.json"],
            setup=setup, expect="ok_or_usage", env={CACHE_ENV: "{d}/cache"}, needs=("opencl",), timeout=90,
            may_change=["cache/opencl-gemm-*.json"])  # tune replaces a cache it cannot use with its winner
    # a cache folder that is not one: a file, a FIFO, a device, a folder no one may write
    for tag, value in {"is-file": "{d}/prev.txt", "fifo": "{d}/f", "devnull": "/dev/null", "proc": "/proc/self"}.items():
        add(f"cache-folder-{tag}", "matmul", "cache", [*OCL_MM, "--out", "{d}/o.json"],
            setup=_prev("prev.txt") if tag == "is-file" else (_fifo("f") if tag == "fifo" else None),
            expect="ok", env={CACHE_ENV: value}, needs=("opencl",), timeout=60)
    add("cache-auto-gemm-wg-over", "matmul", "cache", [*OCL_MM, "--out", "{d}/o.json"],
        setup=caches["wg-over-limit"][0], expect="ok", needs=("opencl",), timeout=60,
        env={CACHE_ENV: "{d}/cache", "HETBENCH_OPENCL_GEMM": "auto"})
    add("cache-split-local-mem-over", "split", "cache", ["split", "--size", "64", "--warmup", "0", "--repeat", "1",
                                                         "--backend", "opencl", "--out", "{d}/o.json"],
        setup=caches["local-mem-over"][0], expect="ok", needs=("opencl",), timeout=60,
        env={CACHE_ENV: "{d}/cache"})
    add("cache-good", "matmul", "cache", [*OCL_MM, "--out", "{d}/o.json"], expect="ok", needs=("opencl",),
        setup=_cache(), env={CACHE_ENV: "{d}/cache"}, outputs=["o.json"], timeout=60)

    # ---------- backend plugins (an entry point in a dist-info folder on PYTHONPATH) that break
    broken_backends = {
        "import-error": "raise ImportError('needs libhostile')\n",
        "syntax": "def (:\n",
        "exit-3": "import sys\nsys.exit(3)\n",
        "raises": "raise RuntimeError('hostile backend broke at import')\n",
        "keyboard-interrupt": "raise KeyboardInterrupt\n",
        "recursion": "def f():\n    return f()\nf()\n",
        "no-capabilities": GOOD_BACKEND.replace("CAPABILITIES = ", "_CAPS = "),
        "list-raises": GOOD_BACKEND.replace("    return [DeviceInfo(", "    raise RuntimeError('list_devices broke')\n"
                                            "    return [DeviceInfo("),
        "list-exits": GOOD_BACKEND.replace("    return [DeviceInfo(", "    raise SystemExit(3)\n    return [DeviceInfo("),
        "list-none": GOOD_BACKEND.replace("    return [DeviceInfo(", "    return None\n    return [DeviceInfo("),
        "list-junk": GOOD_BACKEND.replace("    return [DeviceInfo(", "    return [1, 'two']\n    return [DeviceInfo("),
        "reason-raises": GOOD_BACKEND.replace("    return None\ndef list", "    raise OSError('no driver')\ndef list"),
        "reason-not-text": GOOD_BACKEND.replace("    return None\ndef list", "    return 42\ndef list"),
    }
    for tag, src in broken_backends.items():
        name = "hb" + tag.replace("-", "")
        setup = _dist_plugin(name, src.replace("{name}", name))
        env = {"PYTHONPATH": "{d}/site"}
        add(f"plugin-backend-{tag}-devices", "plugins", "plugin", ["devices"], setup=setup, env=env, expect="ok",
            out_needles=[name])
        add(f"plugin-backend-{tag}-matmul", "plugins", "plugin", [*MM, "--json"], setup=setup, env=env, expect="ok")
        add(f"plugin-backend-{tag}-named", "plugins", "plugin", ["matmul", "--size", "16", "--backend", name],
            setup=setup, env=env, needles=[name])
    for tag in ("exit-3", "list-raises", "import-error"):
        name = "hb" + tag.replace("-", "")
        setup = _dist_plugin(name, broken_backends[tag].replace("{name}", name))
        add(f"plugin-backend-{tag}-devices-2", "plugins", "plugin", ["devices", *MPI_TIMEOUT], nprocs=2, setup=setup,
            env={"PYTHONPATH": "{d}/site"}, expect="ok", out_needles=[name])
        add(f"plugin-backend-{tag}-devices-json", "plugins", "plugin", ["devices", "--json"], setup=setup,
            env={"PYTHONPATH": "{d}/site"}, expect="ok", out_needles=[name])
    name = "hbopenbroke"
    add("plugin-backend-open-raises", "plugins", "plugin", ["matmul", "--size", "16", "--backend", name],
        setup=_dist_plugin(name, GOOD_BACKEND.replace("{name}", name)), env={"PYTHONPATH": "{d}/site"},
        expect="ok_or_usage", needles=[name])
    add("plugin-backend-takes-host-name", "plugins", "plugin", [*MM, "--json"],
        setup=_dist_plugin("host", GOOD_BACKEND.replace("{name}", "host")), env={"PYTHONPATH": "{d}/site"},
        expect="ok")
    # benchmark plugins (HETBENCH_BENCHMARKS, and an entry point): the rest of hetbench works, or a refusal in
    # one line naming the module (tests/plugins: a broken benchmark package refuses `--help` with exit 2)
    bench_src = {"raises": "raise RuntimeError('bench broke')\n", "exit-3": "import sys\nsys.exit(3)\n",
                 "import-error": "import nosuch_dependency_xyz\n", "syntax": "def (:\n",
                 "keyboard-interrupt": "raise KeyboardInterrupt\n"}
    for tag, src in bench_src.items():
        mod = f"hb_bench_{tag.replace('-', '_')}"
        env = {"HETBENCH_BENCHMARKS": mod, "PYTHONPATH": "{d}"}
        add(f"plugin-bench-{tag}-matmul", "plugins", "plugin", [*MM, "--json"], setup=_write(f"{mod}.py", src),
            env=env, expect="ok_or_usage", needles=[mod])
        add(f"plugin-bench-{tag}-entry-point", "plugins", "plugin", [*MM, "--json"],
            setup=_dist_plugin("hbbench" + tag.replace("-", ""), src, group="hetbench.benchmarks"),
            env={"PYTHONPATH": "{d}/site"}, expect="ok_or_usage", needles=["hbbench" + tag.replace("-", "")])
    add("plugin-bench-raises-matmul-2", "plugins", "plugin", [*MM, "--json", *MPI_TIMEOUT], nprocs=2,
        setup=_write("hb_bench_r2.py", "raise RuntimeError('bench broke')\n"),
        env={"HETBENCH_BENCHMARKS": "hb_bench_r2", "PYTHONPATH": "{d}"}, expect="ok_or_usage", needles=["hb_bench_r2"])

    # ---------- split --zero-copy
    zc = [*SPLIT, "--out", "{d}/o.json"]
    for n in (2, 3):
        add(f"split-zero-copy-good-{n}", "split", "zerocopy", [*zc, "--zero-copy", "--save", "{d}/c.npy",
                                                               *MPI_TIMEOUT], nprocs=n, expect="ok",
            outputs=["o.json", "c.npy"])
        add(f"split-no-zero-copy-good-{n}", "split", "zerocopy", [*zc, "--no-zero-copy", *MPI_TIMEOUT], nprocs=n,
            expect="ok", outputs=["o.json"])
        add(f"split-zero-copy-value-{n}", "split", "zerocopy", [*zc, "--zero-copy=yes", *MPI_TIMEOUT], nprocs=n)
        add(f"split-zero-copy-extra-arg-{n}", "split", "zerocopy", [*zc, "--zero-copy", "1", *MPI_TIMEOUT], nprocs=n)
        add(f"split-zero-copy-no-overlap-{n}", "split", "zerocopy", [*zc, "--zero-copy", "--no-overlap",
                                                                     *MPI_TIMEOUT], nprocs=n, expect="ok_or_usage")
        add(f"split-zero-copy-sim-{n}", "split", "zerocopy",
            [*SPLIT[:-1], "0=host,1=sim:h100" + (",2=host" if n == 3 else ""), "--zero-copy", "--out", "{d}/o.json",
             *MPI_TIMEOUT], nprocs=n, expect="ok_or_usage")
        add(f"split-zero-copy-chunks-1-{n}", "split", "zerocopy", [*zc, "--zero-copy", "--chunks", "1",
                                                                   *MPI_TIMEOUT], nprocs=n, expect="ok")
        add(f"split-zero-copy-chunks-bad-{n}", "split", "zerocopy", [*zc, "--zero-copy", "--chunks", "0",
                                                                     *MPI_TIMEOUT], nprocs=n)
        add(f"split-zero-copy-weights-zero-{n}", "split", "zerocopy",
            [*zc, "--zero-copy", "--weights", ",".join(["1"] * (n - 1) + ["0"]), *MPI_TIMEOUT], nprocs=n,
            expect="ok_or_usage")
        add(f"split-zero-copy-opencl-{n}", "split", "zerocopy",
            ["split", "--size", "64", "--warmup", "0", "--repeat", "1", "--backend", "0=host,1=opencl",
             "--zero-copy", "--out", "{d}/o.json", *MPI_TIMEOUT], nprocs=n, expect="ok", needs=("opencl",),
            env={CACHE_ENV: "{d}/cache"})
        add(f"split-zero-copy-save-devfull-{n}", "split", "zerocopy", [*zc, "--zero-copy", "--save", "/dev/full",
                                                                       *MPI_TIMEOUT], nprocs=n)
    add("split-zero-copy-plan", "split", "zerocopy", ["split", "--plan", "--backend", "sim:h100", "--size", "64",
                                                      "--zero-copy"], expect="ok_or_usage")
    add("split-zero-copy-one-rank", "split", "zerocopy", [*zc, "--zero-copy"], expect="ok", outputs=["o.json"])
    add("split-zero-copy-a-b-2", "split", "zerocopy",
        ["split", "--a", "{d}/a.npy", "--b", "{d}/a.npy", "--backend", "host", "--warmup", "0", "--repeat", "1",
         "--zero-copy", "--out", "{d}/o.json", *MPI_TIMEOUT], nprocs=2, expect="ok",
        setup=lambda d: __import__("numpy").save(d / "a.npy", __import__("numpy").ones((48, 48), "float32")))

    # ---------- --timeout far too small (or 0: documented as "wait for ever") on every MPI command
    timeout_cmds = {
        "matmul": MM, "collectives": COLL, "calibrate": CAL, "split": SPLIT, "train": TRAIN,
        "devices": ["devices"], "plan": ["split", "--plan", "--backend", "sim:h100", "--size", "64"],
    }
    tiny = {"milli": "0.001", "nano": "1e-9", "tiny": "1e-300", "denormal": "5e-324", "micro": "0.000001"}
    for command, base in timeout_cmds.items():
        name = "split" if command == "plan" else command
        for tag, value in tiny.items():
            add(f"timeout-{command}-{tag}", name, "value", [*base, "--timeout", value])
        for tag in ("milli", "nano"):
            add(f"timeout-{command}-{tag}-2", name, "value", [*base, "--timeout", tiny[tag]], nprocs=2)
        add(f"timeout-{command}-tiny-3", name, "value", [*base, "--timeout", tiny["tiny"]], nprocs=3)
    for tag in ("milli", "nano", "tiny"):
        torch_case(f"timeout-torch-{tag}", [*TORCH, "--timeout", tiny[tag]])
        torch_case(f"timeout-torch-{tag}-2", [*TORCH, "--backend", "host", "--timeout", tiny[tag]], nprocs=2)
        add(f"timeout-tune-{tag}", "tune", "value", ["tune", "--backend", "opencl", "--shape-class", "small",
                                                     "--budget", "1", "--timeout", tiny[tag]], needs=("opencl",),
            env={CACHE_ENV: "{d}/cache"})
    add("timeout-tune-milli-2", "tune", "value", ["tune", "--backend", "opencl", "--shape-class", "small",
                                                  "--budget", "1", "--timeout", "0.001"], nprocs=2, needs=("opencl",),
        env={CACHE_ENV: "{d}/cache"})
    # 0 is documented ("0: wait for ever"): a run, or a refusal in one line
    for command in ("matmul", "collectives", "split", "train"):
        add(f"timeout-{command}-zero-2", command, "value", [*timeout_cmds[command], "--timeout", "0"], nprocs=2,
            expect="ok_or_usage")

    # ---------- signals while a short run shuts down: SIGINT/SIGTERM to one rank this long after the job's last
    # line ("results written to") reached stdout
    short = {
        "matmul": [*MM, "--out", "{d}/r.json"],
        "collectives": [*COLL, "--out", "{d}/r.json"],
        "split": [*SPLIT, "--out", "{d}/r.json"],
        "train": [*TRAIN, "--backend", "host", "--out", "{d}/r.json"],
    }
    plan = [("matmul", 2, 1, signal.SIGTERM, 0.0), ("matmul", 2, 0, signal.SIGINT, 0.02),
            ("matmul", 3, 2, signal.SIGINT, 0.05), ("collectives", 2, 0, signal.SIGTERM, 0.0),
            ("collectives", 3, 1, signal.SIGINT, 0.03), ("split", 2, 1, signal.SIGINT, 0.0),
            ("split", 3, 0, signal.SIGTERM, 0.02), ("train", 2, 0, signal.SIGINT, 0.0),
            ("train", 2, 1, signal.SIGTERM, 0.05), ("train", 3, 2, signal.SIGTERM, 0.01),
            ("matmul", 2, 0, signal.SIGTERM, 0.04), ("split", 2, 0, signal.SIGINT, 0.03)]
    for i, (command, ranks, rank, signum, delay) in enumerate(plan):
        sig = signal.Signals(signum).name.lower()
        add(f"signal-shutdown-{command}-{ranks}r-rank{rank}-{sig}-{int(delay * 1000)}ms-{i}", command, "signal",
            [*short[command], *SIGNAL_TIMEOUT], nprocs=ranks, special="signal",
            signal=(rank, signum, f"end:{delay}"), expect="signal", timeout=30)
    for i, (command, signum, delay) in enumerate([("matmul", signal.SIGINT, 0.0), ("train", signal.SIGTERM, 0.02)]):
        sig = signal.Signals(signum).name.lower()
        add(f"signal-shutdown-{command}-1p-{sig}-{int(delay * 1000)}ms-{i}", command, "signal", short[command],
            special="signal", signal=(0, signum, f"end:{delay}"), expect="signal", timeout=25)
    return cs
