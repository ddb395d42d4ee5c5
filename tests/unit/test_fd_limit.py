"""raise_fd_limit: the soft descriptor limit goes to the hard one (or to OPEN_MAX where an
unlimited hard limit is refused, as on macOS), and the figure is logged."""

from __future__ import annotations

import logging
import math
import resource

import pytest

from byok.fd_limit import MACOS_OPEN_MAX, raise_fd_limit

INF = resource.RLIM_INFINITY


class Limits:
    def __init__(self, soft: int, hard: int, *, max_soft: int | None = None) -> None:
        self.soft, self.hard, self.max_soft = soft, hard, max_soft

    def get(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def set(self, which: int, limits: tuple[int, int]) -> None:
        soft, hard = limits
        assert hard == self.hard
        if self.max_soft is not None and (soft == INF or soft > self.max_soft):
            raise ValueError("not allowed to raise maximum limit")
        self.soft = soft


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> Limits:
    fake = Limits(256, 256)
    monkeypatch.setattr(resource, "getrlimit", fake.get)
    monkeypatch.setattr(resource, "setrlimit", fake.set)
    return fake


def test_raised_to_the_hard_limit(limits: Limits, caplog: pytest.LogCaptureFixture) -> None:
    limits.soft, limits.hard = 256, 65536
    with caplog.at_level(logging.INFO, "byok"):
        assert raise_fd_limit() == 65536
    assert limits.soft == 65536
    assert "open file limit: 65536 (raised from 256)" in caplog.text


def test_already_at_the_hard_limit(limits: Limits, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "byok"):
        assert raise_fd_limit() == 256
    assert limits.soft == 256
    assert "open file limit: 256 (hard limit 256)" in caplog.text


def test_unlimited_hard_limit_refused_falls_back_to_open_max(limits: Limits) -> None:
    limits.soft, limits.hard, limits.max_soft = 256, INF, MACOS_OPEN_MAX
    assert raise_fd_limit() == MACOS_OPEN_MAX
    assert limits.soft == MACOS_OPEN_MAX


def test_unlimited_soft_limit_is_left_alone(limits: Limits) -> None:
    limits.soft = limits.hard = INF
    assert raise_fd_limit() == math.inf
