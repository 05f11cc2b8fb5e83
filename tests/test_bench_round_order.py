"""The benches' round order (``bench.figures.round_order``): pure, no broker."""

from __future__ import annotations

import itertools

import pytest

from bench.figures import round_order


@pytest.mark.parametrize("count", [2, 3, 4, 10])
def test_every_two_items_run_in_each_order_equally_often_over_pairs_of_rounds(count: int) -> None:
    items = list(range(count))
    orders = [round_order(items, index) for index in range(2 * count)]
    assert all(sorted(order) == items for order in orders)
    for first, second in itertools.combinations(items, 2):
        before = sum(order.index(first) < order.index(second) for order in orders)
        assert before == len(orders) / 2, (first, second)


def test_each_item_runs_at_every_place_of_a_round() -> None:
    items = ["raw", "broker-jobs", "celery", "dramatiq"]
    places = {round_order(items, index).index("broker-jobs") for index in range(8)}
    assert places == {0, 1, 2, 3}
