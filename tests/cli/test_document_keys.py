"""The results documents keep their schema through reshaping (issue 34): every command's document, run here at a
small size on one rank, has the key set recorded in tests/data/document_keys.json (made by this file's
`python tests/cli/test_document_keys.py --write` from the code before the reshaping). A key path is dotted, `[]` for
a list's elements (the union of theirs); what depends on the machine, not the code, is left out (environment
variables, a backend's own device details)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import REPO, run_cli  # noqa: E402

KEYS_FILE = REPO / "tests" / "data" / "document_keys.json"
MACHINE_DEPENDENT = ("metadata.ranks[].process.env.", "metadata.ranks[].device_info.details.")

TRAIN = ["train", "--layers", "2", "--hidden", "8", "--batch", "8", "--steps", "3"]
TORCH = [*TRAIN, "--frontend", "torch"]
CASES = {
    "matmul": ["matmul", "--size", "32", "--repeat", "2", "--backend", "host"],
    "collectives": ["collectives", "--op", "allreduce", "--min-bytes", "1K", "--max-bytes", "2K"],
    "calibrate": ["calibrate", "--size", "64", "--repeat", "2", "--min-seconds", "0.001"],
    "split": ["split", "--size", "64", "--repeat", "2"],
    "train-numpy-fsdp": [*TRAIN, "--strategy", "fsdp"],
    "train-numpy-ddp": [*TRAIN, "--strategy", "ddp"],
    "train-numpy-pipeline": [*TRAIN, "--strategy", "pipeline", "--micro-batches", "2"],
    "train-torch-ddp": [*TORCH, "--strategy", "ddp"],
    "train-torch-fsdp": [*TORCH, "--strategy", "fsdp"],
    "train-torch-fsdp2": [*TORCH, "--strategy", "fsdp2"],
}
TORCH_CASES = {name for name, args in CASES.items() if "torch" in args}


def key_paths(x: object, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(x, dict):
        for k, v in x.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            out.add(path)
            out |= key_paths(v, path)
    elif isinstance(x, list):
        for v in x:
            out |= key_paths(v, prefix + "[]")
    return {p for p in out if not p.startswith(MACHINE_DEPENDENT)}


def document_keys(name: str, folder: Path) -> list[str]:
    out = folder / f"{name}.json"
    run = run_cli([*CASES[name], "--out", str(out)], cwd=folder, timeout=300)
    assert run.returncode == 0, f"{name}: {run.stderr[-2000:]}"
    return sorted(key_paths(json.loads(out.read_text())))


def test_the_key_path_rule():
    doc = {"a": [{"b": 1}, {"c": {"d": 2}}], "metadata": {"ranks": [{"process": {"env": {"X": "1"}}}]}}
    assert key_paths(doc) == {"a", "a[].b", "a[].c", "a[].c.d", "metadata", "metadata.ranks",
                              "metadata.ranks[].process", "metadata.ranks[].process.env"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_command_keeps_its_document_keys(name, tmp_path):
    if name in TORCH_CASES:
        pytest.importorskip("torch")
    recorded = json.loads(KEYS_FILE.read_text())[name]
    got = document_keys(name, tmp_path)
    assert got == recorded, {"new": sorted(set(got) - set(recorded)), "gone": sorted(set(recorded) - set(got))}


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        keys = {name: document_keys(name, Path(tmp)) for name in sorted(CASES)}
    KEYS_FILE.write_text(json.dumps(keys, indent=1) + "\n")
    print(f"wrote {KEYS_FILE}: {', '.join(f'{n} {len(k)}' for n, k in keys.items())}")
