"""hb.local_batch and LocalBatch in one process (the rank given): each rank's rows of tensors and of dicts, lists
and tuples of them, the placeholder row of a rank without rows, its loss an exact 0 with exact zero gradients (NaN
losses too), the ranks' gradients summing to the whole batch's, and bad input refused in one ValueError line."""

from __future__ import annotations

from collections import UserDict, namedtuple

import pytest

torch = pytest.importorskip("torch")
try:
    import hetbench.pytorch  # noqa: F401 - refuses a torch outside the supported versions, in one line
except ImportError as e:
    pytest.skip(f"hetbench's torch front end is unavailable: {e}", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

from hetbench.pytorch.uneven import LocalBatch, local_batch  # noqa: E402

ROWS = [4, 2, 0]


def hf_batch(rows=6, seq=5):
    ids = torch.arange(rows * seq).view(rows, seq)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def test_a_tensor_splits_into_each_ranks_rows():
    x = torch.arange(12.0).view(6, 2)
    first, second = local_batch(x, ROWS, 0), local_batch(x, ROWS, 1)
    assert torch.equal(first.data, x[:4]) and (first.rows, first.start, first.stop) == (4, 0, 4)
    assert torch.equal(second.data, x[4:]) and (second.rows, second.start, second.stop) == (2, 4, 6)
    assert not first.placeholder and not second.placeholder


def test_a_rank_without_rows_gets_row_0_as_a_placeholder():
    x = torch.arange(12.0).view(6, 2)
    mine = local_batch(x, ROWS, 2)
    assert mine.placeholder and (mine.rows, mine.start, mine.stop) == (0, 6, 6)
    assert torch.equal(mine.data, x[:1])
    assert local_batch(x, [0, 6], 0).placeholder and torch.equal(local_batch(x, [0, 6], 0).data, x[:1])


def test_dicts_lists_and_tuples_keep_their_shape_and_pass_other_values():
    Pair = namedtuple("Pair", "x y")
    batch = {"inputs": hf_batch(), "pair": Pair(torch.zeros(6, 3), torch.ones(6)), "list": [torch.arange(6), None],
             "flag": True, "name": "sonnets", "scale": 0.5}
    mine = local_batch(batch, ROWS, 1).data
    assert set(mine) == set(batch) and set(mine["inputs"]) == {"input_ids", "attention_mask", "labels"}
    assert torch.equal(mine["inputs"]["labels"], batch["inputs"]["labels"][4:6])
    assert isinstance(mine["pair"], Pair) and mine["pair"].x.shape == (2, 3) and mine["pair"].y.shape == (2,)
    assert isinstance(mine["list"], list) and torch.equal(mine["list"][0], torch.tensor([4, 5]))
    assert mine["list"][1] is None and mine["flag"] is True and mine["name"] == "sonnets" and mine["scale"] == 0.5
    placeholder = local_batch((torch.zeros(6, 2), torch.ones(6)), ROWS, 2).data
    assert isinstance(placeholder, tuple) and [t.shape[0] for t in placeholder] == [1, 1]


def test_a_mapping_such_as_batch_encoding_comes_back_a_dict():
    class Encoding(UserDict):  # transformers' BatchEncoding is a UserDict
        pass

    mine = local_batch(Encoding(hf_batch()), ROWS, 0)
    assert type(mine.data) is dict and mine.data["input_ids"].shape == (4, 5)


def test_part_of_mean_sums_the_rows_over_the_global_count():
    losses = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert float(local_batch(torch.zeros(6), ROWS, 0).part_of_mean(losses, 6)) == pytest.approx(10 / 6)
    tokens = torch.ones(2, 5)  # per-token losses (rows, tokens): the sum over the global token count
    assert float(local_batch(torch.zeros(6), ROWS, 1).part_of_mean(tokens, 20)) == pytest.approx(0.5)


@pytest.mark.parametrize("how", ["part_of_mean", "counted"])
def test_a_placeholder_loss_is_exactly_0_with_exact_zero_gradients_even_when_nan(how):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 7)
    batch = {"x": torch.randn(6, 5), "labels": torch.randint(0, 7, (6,))}
    batch["labels"][0] = -100  # row 0 counts no token: a mean over it is 0/0
    mine = local_batch(batch, ROWS, 2)
    logits = model(mine.data["x"])
    if how == "counted":  # a model's own mean loss over the placeholder: NaN
        loss = F.cross_entropy(logits, mine.data["labels"], ignore_index=-100)
        assert loss.isnan()
        loss = mine.counted(loss)
    else:
        loss = mine.part_of_mean(torch.full((1,), float("nan")) + logits.sum(1), 6)
    loss.backward()
    assert loss.item() == 0.0 and not loss.isnan()
    assert all(p.grad is not None and torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())


def test_counted_keeps_a_ranks_own_loss():
    loss = torch.tensor(2.5)
    assert local_batch(torch.zeros(6), ROWS, 0).counted(loss) is loss


def test_the_ranks_gradients_sum_to_the_whole_batchs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    x, y = torch.randn(6, 3), torch.randn(6, 1)
    ((model(x) - y).square().sum(1).mean()).backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for rank in range(3):  # the gradients accumulate: the sum exact_ddp and exact_fully_shard make
        mine = local_batch((x, y), ROWS, rank)
        xs, ys = mine.data
        mine.part_of_mean((model(xs) - ys).square().sum(1), 6).backward()
    assert all(torch.allclose(p.grad, w, rtol=1e-6, atol=1e-7) for p, w in zip(model.parameters(), whole))


@pytest.mark.parametrize("batch,rows,rank,message", [
    (torch.zeros(5, 2), ROWS, 0, "local_batch: batch has 5 rows (its first dimension) but the rows [4, 2, 0] sum "
                                 "to 6: give the global batch and one count per rank summing to its rows"),
    ({"ids": torch.zeros(6, 2), "labels": torch.zeros(5)}, ROWS, 0,
     "local_batch: batch['labels'] has 5 rows (its first dimension) but the rows [4, 2, 0] sum to 6: give the "
     "global batch and one count per rank summing to its rows"),
    ({"ids": torch.zeros(6), "n": torch.tensor(3)}, ROWS, 0,
     "local_batch: batch['n'] is a 0-dimensional tensor: every tensor's first dimension is the batch's rows"),
    ({"mask": None}, ROWS, 0, "local_batch: the batch holds no tensor: give a tensor, or dicts, lists and tuples of "
                              "tensors whose first dimension is the batch's rows"),
    (torch.zeros(0, 3), [0, 0], 0, "local_batch: the batch has no rows (rows [0, 0]): a step needs at least one row "
                                   "to run the model on"),
    (torch.zeros(6), [4, 3, -1], 0, "local_batch: rows must be counts >= 0 (one per rank), got [4, 3, -1]"),
    (torch.zeros(6), ROWS, 3, "local_batch: rank 3 has no count in [4, 2, 0] (ranks 0-2)"),
    (torch.zeros(6), ROWS, None, "local_batch: 3 row counts given for a world of 1 ranks: give one per rank "
                                 "(batch_rows makes them)"),
])
def test_bad_input_is_one_value_error_line(batch, rows, rank, message):
    with pytest.raises(ValueError) as e:
        local_batch(batch, rows, rank)
    assert str(e.value) == message and "\n" not in str(e.value)


def test_a_value_of_another_kind_is_refused_naming_it():
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match=r"^local_batch: batch\['x'\] is a numpy.ndarray; a batch holds tensors"):
        local_batch({"x": np.zeros(6)}, ROWS, 0)


def test_part_of_mean_refuses_losses_not_one_per_row():
    mine = local_batch(torch.zeros(6), ROWS, 2)
    with pytest.raises(ValueError, match=r"^LocalBatch.part_of_mean: losses of shape \(6,\) given for 1 row: give"):
        mine.part_of_mean(torch.zeros(6), 6)
    with pytest.raises(ValueError, match=r"losses of shape \(\) given for 4 rows"):
        local_batch(torch.zeros(6), ROWS, 0).part_of_mean(torch.tensor(1.0), 6)
    assert isinstance(mine, LocalBatch)
