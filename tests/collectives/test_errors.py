"""Bad input to the collectives layer names the argument and the rule."""

import pytest

import collectives as c


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"op": "allreduce", "algorithm": "pairwise"}, "algorithm", "does not implement allreduce"),
        ({"op": "allreduce", "algorithm": "nope"}, "algorithm", "unknown algorithm"),
        ({"op": "allsum", "algorithm": "ring"}, "op", "unknown op"),
        ({"op": "allreduce", "algorithm": "ring", "num_ranks": 0}, "num_ranks", ">= 1"),
        ({"op": "allreduce", "algorithm": "ring", "count": -1}, "count", ">= 0"),
        ({"op": "allreduce", "algorithm": "ring", "dtype": "complex64"}, "dtype", "unsupported dtype"),
        ({"op": "allreduce", "algorithm": "ring", "reduction": "prod"}, "reduction", "unknown reduction"),
        ({"op": "allreduce", "algorithm": "ring", "dtype": "int32", "reduction": "avg"}, "reduction", "floating"),
        ({"op": "alltoall", "algorithm": "pairwise", "num_ranks": 3, "count": 10}, "count", "not a multiple"),
        ({"op": "allgather", "algorithm": "recursive_doubling", "num_ranks": 6}, "num_ranks", "power-of-two"),
        (
            {"op": "allreduce", "algorithm": "hierarchical", "num_ranks": 6, "local_size": 4},
            "num_ranks",
            "local_size 4 must divide",
        ),
        ({"op": "broadcast", "algorithm": "ring", "root": 9}, "root", "not a rank"),
        ({"op": "sendrecv", "algorithm": "direct", "num_ranks": 3}, "num_ranks", "between 2 ranks"),
    ],
)
def test_bad_input_is_named(kwargs, field, words):
    args = {"num_ranks": 4, "count": 16, "dtype": "float32"} | kwargs
    with pytest.raises(c.CollectiveError) as caught:
        c.verify(**args)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_catalogue_lists_every_op_with_formulas():
    rows = c.catalogue()
    ops = {r["op"] for r in rows}
    assert ops == {o.value for o in c.Op}
    assert all(r["formula"] and r["source"] for r in rows)
    assert {
        "ring",
        "recursive_doubling",
        "halving_doubling",
        "binomial_tree",
        "double_binary_tree",
        "bruck",
        "pairwise",
        "direct",
        "hierarchical",
        "in_network",
        "swing",
    } == {r["algorithm"] for r in rows}
