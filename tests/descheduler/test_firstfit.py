"""``FirstFit`` finds the node upstream's in-order walk finds (``podFitsAnyNodeWithThreshold``)."""

from __future__ import annotations

import random

import pytest

from descheduler.loadaware.firstfit import FirstFit


def _walk(
    usages: list[dict[str, int]],
    limits: list[dict[str, int]],
    need: dict[str, int],
    refuse: set[int],
) -> int | None:
    for i, (u, lim) in enumerate(zip(usages, limits, strict=True)):
        if i in refuse:
            continue
        if any(r in u and u[r] + need.get(r, 0) > v for r, v in lim.items()):
            continue
        return i
    return None


@pytest.mark.parametrize("resources", [["cpu"], ["cpu", "memory"], ["cpu", "memory", "pods"]])
@pytest.mark.parametrize("seed", range(5))
def test_first_fit_matches_the_in_order_walk(resources: list[str], seed: int) -> None:
    rng = random.Random(seed)
    count = rng.randint(1, 40)
    usages = [{r: rng.randint(0, 80) for r in resources} for _ in range(count)]
    limits = [{r: rng.randint(40, 100) for r in resources} for _ in range(count)]
    want_usages = [dict(u) for u in usages]
    placer = FirstFit(usages, limits, resources)
    refuse = {i for i in range(count) if rng.random() < 0.2}  # the scheduler's filters say no
    for _ in range(200):
        need = {r: rng.randint(0, 15) for r in resources}
        want = _walk(want_usages, limits, need, refuse)
        got = placer.first(need, lambda i: i not in refuse)
        assert got == want
        if got is not None:
            placer.take(got, need)
            for r in limits[got]:
                want_usages[got][r] += need.get(r, 0)
    assert usages == want_usages


def test_no_targets_fit_nothing() -> None:
    assert FirstFit([], [], ["cpu"]).first({"cpu": 1}, lambda _i: True) is None


def test_a_resource_without_usage_does_not_bound() -> None:
    placer = FirstFit(
        [{"cpu": 90}, {"cpu": 10}], [{"cpu": 100, "memory": 5}, {"cpu": 100}], ["cpu", "memory"]
    )
    assert placer.first({"cpu": 5, "memory": 50}, lambda _i: True) == 0
    assert placer.first({"cpu": 20, "memory": 50}, lambda _i: True) == 1
