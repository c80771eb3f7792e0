"""The training strategies are one registry (hetbench/train/strategies.py) for both front ends: the command's
--strategy choices and each front end's accepted list come from it, what a strategy does is the callable its
record names, and no code outside a strategy tests a strategy's name or reads what it does from flags."""

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
    got = {name: strategies.get("numpy", name).applier() for name in strategies.names("numpy")}
    assert got == {"fsdp": train_fsdp, "ddp": train_ddp, "pipeline": train_pipeline}
    assert [s for s in strategies.names("numpy") if strategies.get("numpy", s).shares_of == "layers"] == ["pipeline"]


def test_torch_strategies_name_their_parallel_models():
    pytest.importorskip("torch")
    from hetbench.train.torch_frontend import parallel

    got = {name: strategies.get("torch", name).applier() for name in strategies.names("torch")}
    assert got == {"ddp": parallel.Replicated, "fsdp": parallel.UnevenSharded, "fsdp2": parallel.FullyShard}
    assert all(issubclass(c, parallel.Parallel) for c in got.values())


def test_an_unknown_strategy_names_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown torch strategy 'pipeline'; accepted: ddp, fsdp, fsdp2"):
        strategies.get("torch", "pipeline")


def test_a_name_registers_once_per_front_end_and_a_record_is_checked(monkeypatch):
    monkeypatch.setattr(strategies, "REGISTRY", dict(strategies.REGISTRY))
    with pytest.raises(ValueError, match="registered already"):
        strategies.register(strategies.Strategy("ddp", "numpy", "again", "hetbench.train.data_parallel:train_ddp"))
    with pytest.raises(ValueError, match="options \\['overlap'\\] not among prefetch, micro_batches"):
        strategies.register(strategies.Strategy("x", "numpy", "x", "m:f", options=("overlap",)))
    with pytest.raises(ValueError, match="front end 'jax'"):
        strategies.register(strategies.Strategy("x", "jax", "x", "m:f"))
    strategies.register(strategies.Strategy("zero", "numpy", "a new one", "hetbench.train.pipeline:train_pipeline"))
    assert strategies.names("numpy")[-1] == "zero"
    assert strategies.get("numpy", "zero").applier() is train_pipeline


def test_the_command_takes_the_registry_s_strategies():
    from hetbench.benchmarks.train import Train

    (option,) = [o for o in Train().options() if o.name == "strategy"]
    assert tuple(option.type.choices) == ("fsdp", "ddp", "pipeline", "fsdp2")


STRATEGY_NAMES = {"fsdp", "ddp", "pipeline", "fsdp2"}
FLAGS = {"replicated", "shards_by_weights", "prefetch", "rebalances", "micro_batches", "train"}


def _offences(path) -> list[str]:
    return [f"{path.relative_to(REPO)}:{o}" for o in _offences_in(path)]


def _offences_in(path) -> list[str]:
    """A comparison of something named *strategy with a strategy's name (==, in a tuple/list/set), or a read of a
    behaviour flag off a strategy record."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(ast.unparse(s).rstrip("]'\"").endswith("strategy") for s in sides):
                literals = set()
                for s in sides:
                    elements = s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s]
                    literals |= {getattr(e, "value", None) for e in elements}
                if literals & STRATEGY_NAMES:
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
        if (isinstance(node, ast.Attribute) and node.attr in FLAGS and isinstance(node.value, ast.Name)
                and node.value.id in ("strategy", "record")):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_tests_a_strategy_name_or_flag():
    """`cfg.strategy == "fsdp"`, `params["strategy"] in ("fsdp", "ddp")`, `strategy.replicated`: the code asks the
    strategy's record (what its weights share, the options it takes) or calls what it names instead. The strategies'
    own modules (their loops and parallel models) are where a strategy is itself."""
    own = {REPO / "hetbench" / "train" / p for p in ("strategies.py", "data_parallel.py", "pipeline.py")}
    own.add(REPO / "hetbench" / "train" / "torch_frontend" / "parallel.py")
    bench = REPO / "hetbench" / "bench"  # make bench times torch's own DDP and FSDP2 by name, not hetbench's strategies
    found = [o for path in sorted((REPO / "hetbench").rglob("*.py")) if path not in own and bench not in path.parents
             for o in _offences(path)]
    assert not found, found


def test_the_check_finds_a_name_in_a_tuple_and_a_flag(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text('if params["strategy"] in ("fsdp", "ddp"):\n    pass\nif strategy.replicated:\n    pass\n'
                   'if cfg.strategy == "pipeline":\n    pass\n')
    found = sorted(o.split(": ", 1)[1] for o in _offences_in(bad))
    assert found == sorted(["params['strategy'] in ('fsdp', 'ddp')", "cfg.strategy == 'pipeline'", "strategy.replicated"])
