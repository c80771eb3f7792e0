"""The training strategies are one registry (hetbench/train/strategies.py) for both front ends: the command's
--strategy choices and each front end's accepted list come from it, the runs read what a strategy does from its
record, and no run tests a strategy's name."""

from __future__ import annotations

import ast

import pytest
from helpers import REPO

from hetbench.train import strategies
from hetbench.train.data_parallel import train_ddp, train_fsdp
from hetbench.train.pipeline import train_pipeline


def test_each_front_end_has_its_strategies_in_order():
    assert strategies.names("numpy") == ("fsdp", "ddp", "pipeline")
    assert strategies.names("torch") == ("ddp", "fsdp", "fsdp2")
    assert strategies.DEFAULT == {"numpy": "fsdp", "torch": "fsdp2"}


def test_numpy_strategies_name_their_training_loops():
    got = {name: strategies.get("numpy", name).train_function() for name in strategies.names("numpy")}
    assert got == {"fsdp": train_fsdp, "ddp": train_ddp, "pipeline": train_pipeline}
    assert [s for s in strategies.names("numpy") if strategies.get("numpy", s).shares_of == "layers"] == ["pipeline"]


def test_an_unknown_strategy_names_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown torch strategy 'pipeline'; accepted: ddp, fsdp, fsdp2"):
        strategies.get("torch", "pipeline")


def test_a_name_registers_once_per_front_end(monkeypatch):
    monkeypatch.setattr(strategies, "REGISTRY", dict(strategies.REGISTRY))
    with pytest.raises(ValueError, match="registered already"):
        strategies.register(strategies.Strategy("ddp", "numpy", "again"))
    strategies.register(strategies.Strategy("zero", "numpy", "a new one", train="hetbench.train.pipeline:train_pipeline"))
    assert strategies.names("numpy")[-1] == "zero"


def test_the_command_takes_the_registry_s_strategies():
    from hetbench.benchmarks.train import Train

    (option,) = [o for o in Train().options() if o.name == "strategy"]
    assert tuple(option.type.choices) == ("fsdp", "ddp", "pipeline", "fsdp2")


def test_no_run_tests_a_strategy_name():
    """`cfg.strategy == "fsdp"` and the like: the runs ask the strategy's record instead."""
    found = []
    for path in [*(REPO / "hetbench" / "benchmarks" / "train").glob("*.py"), REPO / "hetbench" / "pytorch" / "trainer.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(ast.unparse(s).endswith("strategy") for s in [node.left, *node.comparators]):
                literals = {getattr(s, "value", None) for s in [node.left, *node.comparators]}
                if literals & {"fsdp", "ddp", "pipeline", "fsdp2"}:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found
