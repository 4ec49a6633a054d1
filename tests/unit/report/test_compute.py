"""Arithmetic of ``zonemeter report``: shares, savings, normalisation, totals."""

from __future__ import annotations

import pytest

from agent.errors import InputError
from agent.report.compute import (
    CROSS_ZONE,
    PairRate,
    Scope,
    ServiceKey,
    WindowStats,
    change_of,
    in_effect_shares,
    label_matchers,
    total_of,
    windows_around,
)
from agent.report.pricing import Price
from agent.report.prom import Series, format_ms, prometheus_ms
from agent.report.timespec import Window

B, A = Window(0, 3600), Window(3600, 7200)
AWS = Price("aws", 0.02)
CART = ServiceKey("shop", "cart")


def stats(w: Window, total: float, cross: float, share: float | None = 1.0,
          withdrawn: tuple[float, ...] = ()) -> WindowStats:
    return WindowStats(w, total, cross, 0.0, share,
                       (PairRate("request", "a", "b", cross),) if cross else (), withdrawn)


def test_fraction() -> None:
    assert stats(B, 4000, 1000).cross_zone_fraction == 0.25
    assert stats(B, 0, 0).cross_zone_fraction is None


def test_in_effect_share_and_withdrawal() -> None:
    # 4 instants at step 900 s: on, on, off, on -> share 3/4, withdrawn at 1800
    s = Series({"namespace": "shop", "service": "cart"},
               [(0, 1.0), (900, 1.0), (1800, 0.0), (2700, 1.0)])
    assert in_effect_shares([s], B, 900) == {CART: (0.75, (1800.0,))}


def test_in_effect_share_ignores_unknown_instants_and_points_outside() -> None:
    # a gap (no value at 900) is neither on nor off; 3600 is outside [0, 3600)
    s = Series({"namespace": "shop", "service": "cart"},
               [(0, 1.0), (1800, 0.0), (2700, 0.0), (3600, 1.0)])
    share, withdrawn = in_effect_shares([s], B, 900)[CART]
    assert share == pytest.approx(1 / 3)
    assert withdrawn == ()  # 0 -> 1800 skips an instant: not a proven withdrawal instant
    assert in_effect_shares([Series({"namespace": "shop", "service": "cart"}, [])], B, 900) == {
        CART: (None, ())}


def test_change_observed_normalised_and_dollars() -> None:
    # before 4 MB/s with 3 MB/s cross (75 %); after 1.3 MB/s with 0.3 MB/s cross
    c = change_of(CART, stats(B, 4e6, 3e6, 0.0), stats(A, 1.3e6, 3e5), AWS)
    assert c.saved == pytest.approx(2.7e6)
    assert c.normalized_saved == pytest.approx(0.75 * 1.3e6 - 3e5)
    # 675,000 B/s x 2,592,000 s / 1e9 x $0.02
    assert c.usd_per_month_saved == pytest.approx(35.501571)
    assert c.warnings == ()


def test_normalisation_can_turn_an_observed_increase_into_a_saving() -> None:
    c = change_of(CART, stats(B, 1e6, 5e5), stats(A, 2e6, 8e5), AWS)
    assert c.saved == pytest.approx(-3e5)
    assert c.normalized_saved == pytest.approx(2e5)


def test_change_warnings() -> None:
    c = change_of(CART, stats(B, 0, 0), stats(A, 1e6, 1e5, 0.5, withdrawn=(5400.0,)), AWS)
    assert c.normalized_saved is None and c.usd_per_month_saved is None
    assert c.warnings == (
        "no traffic in the before window: the normalised saving is undefined",
        "locality withdrawn inside the after window at 1970-01-01T01:30:00Z")
    c = change_of(CART, stats(B, 1e6, 1e5), stats(A, 0, 0, None), AWS)
    assert c.normalized_saved == 0  # no traffic after: nothing to normalise
    assert c.warnings == ("no traffic in the after window",
                          "locality state unknown in the after window "
                          "(no zonemeter_service_locality_in_effect series)")
    c = change_of(CART, stats(B, 1e6, 1e5), stats(A, 1e6, 1e5, 0.0), AWS)
    assert c.warnings == ("locality not in effect at any time in the after window",)


def test_total_sums_services_and_weights_the_share_by_bytes() -> None:
    cart = change_of(CART, stats(B, 4e6, 3e6, 0.0), stats(A, 1.3e6, 3e5, 1.0), AWS)
    pay = change_of(ServiceKey("shop", "pay"), stats(B, 2e6, 1e6, 0.0),
                    stats(A, 1.55e6, 5.5e5, 0.5), AWS)
    new = change_of(ServiceKey("shop", "new"), stats(B, 0, 0, None), stats(A, 1e6, 1e6, None),
                    AWS)
    t = total_of([cart, pay, new], AWS, B, A)
    assert t.key is None
    assert t.before.bytes_per_second == pytest.approx(6e6)
    assert t.after.cross_zone_bytes_per_second == pytest.approx(3e5 + 5.5e5 + 1e6)
    assert t.saved == pytest.approx(4e6 - 1.85e6)
    # normalised: sum of the Services that have one (new has no before traffic)
    assert t.normalized_saved == pytest.approx(675_000 + (0.5 * 1.55e6 - 5.5e5))
    assert t.usd_per_month_saved == pytest.approx(AWS.usd_per_month(900_000))
    assert t.warnings == ("normalised total leaves out Services without a before figure: "
                          "shop/new",)
    # new has no locality state: left out of the weighting
    assert t.after.locality_in_effect_share == pytest.approx((1.3e6 + 0.5 * 1.55e6) / 2.85e6)
    assert t.after.cross_zone_pairs == (PairRate("request", "a", "b", 1.85e6),)


def test_total_share_unknown_without_any_state() -> None:
    c = change_of(CART, stats(B, 1e6, 1e5, None), stats(A, 1e6, 1e5, None), AWS)
    assert total_of([c], AWS, B, A).after.locality_in_effect_share is None


def test_label_matchers_escape() -> None:
    assert label_matchers(None) == ""
    assert label_matchers(None, 'crossing="cross_zone"') == '{crossing="cross_zone"}'
    assert label_matchers(ServiceKey('a"b', "c\\d")) == '{namespace="a\\"b",service="c\\\\d"}'


def test_windows_around() -> None:
    now = 100_000.0
    assert windows_around(90_000, now, None) == (Window(80_000, 90_000), Window(90_000, 100_000))
    assert windows_around(10_000, now, 3600) == (Window(6400, 10_000), Window(10_000, 13_600))
    # default: at most a day
    b, a = windows_around(0.0, 200_000.0, None)
    assert (b.seconds, a.seconds) == (86400, 86400)
    with pytest.raises(InputError, match="in the future") as info:
        windows_around(99_000, now, 3600)
    # says how short: the change was 1,000 s ago
    assert "use a --window of at most 1000 s" in str(info.value)
    with pytest.raises(InputError, match="under 60 s"):
        windows_around(99_990, now, None)


@pytest.mark.parametrize("t, ms", [
    (1736125200.0, 1736125200000), (1736125200.123, 1736125200123),
    (1736125200.1235, 1736125200124), (1736125200.9996, 1736125201000), (0.0005, 1),
    (1736125200.0004, 1736125200000)])
def test_prometheus_ms_rounds_like_prometheus(t: float, ms: int) -> None:
    """Prometheus's parseTime rounds the fraction to milliseconds, half away from zero."""
    assert prometheus_ms(t) == ms
    assert prometheus_ms(float(format_ms(ms))) == ms


def test_scope_matchers_select_a_superset_and_admit_exactly() -> None:
    one = Scope(None, frozenset({CART}))
    assert one.matchers() == '{namespace="shop",service="cart"}'
    two = Scope(None, frozenset({CART, ServiceKey("web", "a.b")}))
    assert two.matchers(CROSS_ZONE) == ('{crossing="cross_zone",namespace=~"shop|web",'
                                        'service=~"a\\\\.b|cart"}')
    assert two.admits(CART) and not two.admits(ServiceKey("web", "cart"))
    assert Scope(CART).matchers() == label_matchers(CART) and Scope(CART).admits(
        ServiceKey("x", "y"))
