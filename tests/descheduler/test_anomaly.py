"""The anomaly detector, as upstream's ``pkg/descheduler/utils/anomaly/basic_detector_test.go``
drives it (conditions ``consecutiveAbnormalities >= 2`` and ``consecutiveNormalities >= 1``,
a 3 s timeout), on a clock the test moves."""

from __future__ import annotations

from descheduler.anomaly import ANOMALY, OK, Counter, Detector, DetectorCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_basic_detector_follows_upstreams_sequence() -> None:
    clock = Clock()
    # upstream's ">= 2" and ">= 1" are our "> 1" and "> 0"
    d = Detector("test", abnormal_after=1, normal_after=0, timeout_s=3, clock=clock)
    assert d.current() == OK
    assert d.mark(True) == OK
    assert d.mark(False) == OK
    assert d.counter == Counter(
        total=2,
        normalities=1,
        abnormalities=1,
        consecutive_normalities=0,
        consecutive_abnormalities=1,
    )
    assert d.mark(False) == ANOMALY
    assert d.mark(True) == OK
    d.mark(False)
    d.mark(False)
    assert d.current() == ANOMALY
    clock.now += 3.001  # past the timeout
    assert d.current() == OK
    assert d.mark(False) == OK


def test_anomaly_needs_more_than_the_configured_consecutive_rounds() -> None:
    clock = Clock()
    d = Detector("n", abnormal_after=5, normal_after=3, timeout_s=60, clock=clock)
    states = [d.mark(False) for _ in range(6)]
    assert states == [OK] * 5 + [ANOMALY]


def test_reset_clears_an_anomaly_but_not_an_ok_counter() -> None:
    clock = Clock()
    d = Detector("n", abnormal_after=5, normal_after=3, timeout_s=60, clock=clock)
    for _ in range(3):
        d.mark(False)
    d.reset()  # OK already: upstream's setState returns early, the count stays
    assert d.counter.consecutive_abnormalities == 3
    for _ in range(3):
        d.mark(False)
    assert d.current() == ANOMALY
    d.reset()
    assert d.current() == OK
    assert d.counter == Counter()


def test_an_anomalous_detector_returns_to_ok_after_more_than_n_normal_marks() -> None:
    clock = Clock()
    d = Detector("n", abnormal_after=1, normal_after=3, timeout_s=60, clock=clock)
    d.mark(False)
    assert d.mark(False) == ANOMALY
    assert [d.mark(True) for _ in range(4)] == [ANOMALY, ANOMALY, ANOMALY, OK]


def test_the_cache_forgets_a_detector_unused_for_its_ttl() -> None:
    clock = Clock()
    cache = DetectorCache(300, clock)
    d = Detector("n", abnormal_after=5, normal_after=3, timeout_s=60, clock=clock)
    cache.set("n", d)
    clock.now += 299
    assert cache.get("n") is d
    clock.now += 2
    assert cache.get("n") is None
