"""Mixing datasets by ratio: exact counts, whole passes then a seeded sample, determinism."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from oxrl.data.mix import mix, mixture_counts


def test_no_weights_no_total_takes_every_row_once_in_order():
    mixture, counts = mix({"a": [1, 2], "b": [3, 4, 5]}, {"a": None, "b": None}, total=None, seed=0)
    assert mixture == [1, 2, 3, 4, 5] and counts == {"a": 2, "b": 3}


def test_no_weights_with_total_is_proportional_to_sizes():
    assert mixture_counts({"a": 10, "b": 30}, {"a": None, "b": None}, total=8) == {"a": 2, "b": 6}


def test_weights_are_normalised_and_counts_add_up_by_largest_remainder():
    assert mixture_counts({"a": 10, "b": 10}, {"a": 3.0, "b": 1.0}, total=8) == {"a": 6, "b": 2}
    # 10/3 each: one leftover item, which goes to the first listed dataset on a tie.
    assert mixture_counts({"a": 5, "b": 5, "c": 5}, {"a": 1.0, "b": 1.0, "c": 1.0}, total=10) == {"a": 4, "b": 3, "c": 3}
    # Without num_examples the total is the sum of the sizes.
    assert mixture_counts({"a": 4, "b": 12}, {"a": 1.0, "b": 1.0}, total=None) == {"a": 8, "b": 8}


def test_a_small_dataset_is_repeated_in_whole_passes_then_sampled():
    mixture, counts = mix({"small": ["x", "y", "z"]}, {"small": 1.0}, total=7, seed=0)
    assert counts == {"small": 7}
    assert mixture[:6] == ["x", "y", "z"] * 2
    assert sorted(Counter(mixture).values()) == [2, 2, 3]


def test_deterministic_by_seed_and_independent_of_other_datasets():
    data = {"a": list(range(100)), "b": list(range(100, 200))}
    weights = {"a": 1.0, "b": 1.0}
    first, _ = mix(data, weights, total=50, seed=1)
    assert mix(data, weights, total=50, seed=1)[0] == first
    assert mix(data, weights, total=50, seed=2)[0] != first
    # Adding a dataset changes how many rows `a` gives, not which: its sample is seeded by its name.
    alone, _ = mix({"a": data["a"]}, {"a": None}, total=25, seed=1)
    assert alone == [x for x in first if x < 100]


def test_weights_on_some_datasets_only_is_an_error():
    with pytest.raises(ValueError, match=r"datasets \['b'\] have no `weight`"):
        mixture_counts({"a": 1, "b": 1}, {"a": 1.0, "b": None}, total=None)


def test_an_empty_dataset_asked_for_rows_is_an_error():
    with pytest.raises(ValueError, match="dataset 'b' has no usable rows"):
        mix({"a": [1], "b": []}, {"a": 1.0, "b": 1.0}, total=4, seed=0)


def test_counts_are_logged(caplog):
    with caplog.at_level(logging.INFO, logger="oxrl.data.mix"):
        mix({"a": [1, 2], "b": [3]}, {"a": 1.0, "b": 1.0}, total=4, seed=0)
    assert "a contributes 2 of 2 rows" in caplog.text and "b contributes 2 of 1 rows (2.00 passes)" in caplog.text
