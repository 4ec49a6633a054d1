"""Times, durations, windows and steps of ``zonemeter report``."""

from __future__ import annotations

import pytest

from agent.errors import InputError
from agent.report.timespec import (
    MAX_POINTS_PER_WINDOW,
    Window,
    choose_step,
    format_time,
    parse_duration,
    parse_time,
    parse_window,
    validate_windows,
)

NOW = 1_736_128_800.0  # 2025-01-06T02:00:00Z


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90), ("15m", 900), ("2h30m", 9000), ("7d", 604800), ("1w", 604800),
    ("1d12h", 129600), ("1.5h", 5400), ("2H", 7200)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "h", "5x", "-5m", "0s", "1h 30m", "5m1"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(InputError) as err:
        parse_duration(text, flag="--window")
    assert str(err.value).startswith("--window: ")


@pytest.mark.parametrize("text, expected", [
    ("now", NOW),
    ("-7d", NOW - 7 * 86400),
    ("-2h30m", NOW - 9000),
    ("+15m", NOW + 900),
    ("2025-01-06T00:00:00Z", 1_736_121_600),
    ("2025-01-06t00:00:00z", 1_736_121_600),
    ("2025-01-06 00:00:00Z", 1_736_121_600),
    ("2025-01-06T02:00:00+02:00", 1_736_121_600),
    ("2025-01-05T19:00:00-05:00", 1_736_121_600),
    ("2025-01-06T00:00:00.250Z", 1_736_121_600.25),
    ("2025-01-06", 1_736_121_600),
    ("1736121600", 1_736_121_600),
    ("1736121600.5", 1_736_121_600.5),
])
def test_times(text: str, expected: float) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", [
    "yesterday", "2025-01-06T00:00:00",  # no offset: ambiguous, refused
    "2025-13-01T00:00:00Z", "2025-01-06T25:00:00Z", "-7x", "12", "2025/01/06"])
def test_bad_times(text: str) -> None:
    with pytest.raises(InputError) as err:
        parse_time(text, NOW, flag="--after")
    assert str(err.value).startswith("--after: ")
    assert "\n" not in str(err.value)


def test_window() -> None:
    w = parse_window("-2h..-1h", NOW, flag="--before")
    assert w == Window(NOW - 7200, NOW - 3600)
    assert w.seconds == 3600
    assert parse_window("2025-01-06T00:00:00Z..now", NOW, flag="--after").as_list() == [
        1_736_121_600, NOW]


@pytest.mark.parametrize("text, problem", [
    ("-1h..-2h", "reversed or empty"), ("-1h..-1h", "reversed or empty"),
    ("-1h", "is not a window"), ("-3h..-2h..-1h", "is not a window"), ("x..now", "not a time")])
def test_bad_windows(text: str, problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        parse_window(text, NOW, flag="--before")


def test_windows_may_touch() -> None:
    validate_windows(Window(0, 100), Window(100, 200), NOW)
    validate_windows(Window(0, 100), Window(150, 200), NOW)


@pytest.mark.parametrize("before, after, problem", [
    (Window(0, 100), Window(50, 200), "overlap by 50 s"),
    (Window(0, 300), Window(100, 200), "overlap"),
    (Window(200, 300), Window(0, 100), "reversed windows"),
    (Window(0, 100), Window(100, NOW + 3600), "in the future"),
])
def test_bad_window_pairs(before: Window, after: Window, problem: str) -> None:
    with pytest.raises(InputError, match=problem):
        validate_windows(before, after, NOW)


@pytest.mark.parametrize("seconds, step", [
    (30, 1), (1000, 1), (1001, 2), (3600, 5), (10_000, 10), (15_000, 15), (15_001, 30), (86400, 120), (7 * 86400, 900),
    (30 * 86400, 3600), (365 * 86400, 43200)])
def test_choose_step(seconds: float, step: int) -> None:
    assert choose_step(seconds) == step
    assert seconds / step <= MAX_POINTS_PER_WINDOW


def test_choose_step_very_long_spans_stay_under_the_point_limit() -> None:
    seconds = 10 * 365 * 86400.0
    assert seconds / choose_step(seconds) <= MAX_POINTS_PER_WINDOW


def test_format_time() -> None:
    assert format_time(1_736_121_600) == "2025-01-06T00:00:00Z"
    assert format_time(1_736_121_600.5) == "2025-01-06T00:00:00.500Z"


@pytest.mark.parametrize("text, message", [
    ("5M", "--window: '5M' is ambiguous: use m for minutes"),
    ("10", "--window: '10' has no unit (use e.g. 10s, 10m, 10h or 10d)"),
    ("1.5", "--window: '1.5' has no unit"),
    (" ", "--window: empty duration"),
    ("", "--window: empty duration"),
    ("P1D", "--window: 'P1D' is not a duration"),
])
def test_bad_duration_messages_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_duration(text, flag="--window")
    assert str(err.value).startswith(message)
    with pytest.raises(InputError, match="^--change-time: "):
        parse_time(f"-{text}", NOW, flag="--change-time")
