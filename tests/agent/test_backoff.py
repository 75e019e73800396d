"""Restart backoff with an injected jitter source."""

from __future__ import annotations

import pytest

from nodeagent.backoff import Backoff


def test_exponential_capped_without_jitter() -> None:
    b = Backoff(base_s=1, factor=2, cap_s=10, jitter=0.5, rand=lambda: 0.5)  # 0.5 -> no jitter
    assert [b.delay_for(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_jitter_bounds_and_cap() -> None:
    low = Backoff(base_s=4, jitter=0.25, cap_s=100, rand=lambda: 0.0)
    high = Backoff(base_s=4, jitter=0.25, cap_s=4.5, rand=lambda: 0.999999)
    assert low.delay_for(1) == 3.0
    assert high.delay_for(1) == 4.5  # jitter never exceeds the cap


def test_invalid_settings() -> None:
    with pytest.raises(ValueError):
        Backoff(factor=0.5)
    with pytest.raises(ValueError):
        Backoff(jitter=2)
