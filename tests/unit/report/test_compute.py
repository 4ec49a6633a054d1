"""Arithmetic of ``zonemeter report``: shares, savings, normalisation, totals."""

from __future__ import annotations

import pytest

from agent.errors import InputError
from agent.report.compute import (
    CROSS_ZONE,
    NO_SIGNIFICANT_CHANGE,
    PairRate,
    Scope,
    ServiceKey,
    Spread,
    WindowStats,
    change_errors,
    change_of,
    in_effect_shares,
    label_matchers,
    significant,
    spread_of,
    sub_window_seconds,
    total_of,
    windows_around,
)
from agent.report.pricing import Price
from agent.report.prom import Series, format_ms, prometheus_ms
from agent.report.timespec import Window

B, A = Window(0, 3600), Window(3600, 7200)
AWS = Price("aws", 0.02)
CART = ServiceKey("shop", "cart")


#: steady traffic: 60 sub-windows with identical rates (no noise)
STEADY = Spread(60, 60.0, 0.0, 0.0, 0.0)


def stats(w: Window, total: float, cross: float, share: float | None = 1.0,
          withdrawn: tuple[float, ...] = (), spread: Spread | None = STEADY) -> WindowStats:
    return WindowStats(w, total, cross, 0.0, share,
                       (PairRate("request", "a", "b", cross),) if cross else (), withdrawn,
                       spread)


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
    # 675,000 B/s x 2,629,746 s (30.44 days) / 1e9 x $0.02
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


def classed(w: Window, total: float, pairs: dict[tuple[str, str], float]) -> WindowStats:
    """A window whose cross-zone bytes/s come from client classes ``(kind, lb_type)``."""
    prs = tuple(PairRate("request", "a", "b", v, kind, lb) for (kind, lb), v in pairs.items())
    return WindowStats(w, total, sum(pairs.values()), 0.0, 1.0, prs, (), STEADY)


def test_dollars_price_only_the_classes_the_cloud_bills() -> None:
    # before: 1 MB/s of 4 MB/s cross from pods, 2 MB/s from an ALB (free on AWS), 0.5 MB/s
    # from an NLB (billed); after: pods 0.2 MB/s at 4 MB/s total, the load balancers unchanged
    before = classed(B, 4e6, {("pod", "none"): 1e6, ("load-balancer", "aws-alb"): 2e6,
                              ("load-balancer", "aws-nlb"): 5e5})
    after = classed(A, 4e6, {("pod", "none"): 2e5, ("load-balancer", "aws-alb"): 2e6,
                             ("load-balancer", "aws-nlb"): 5e5})
    c = change_of(CART, before, after, AWS)
    # the bytes arithmetic is over every cross-zone byte, as before classes existed
    assert c.normalized_saved == pytest.approx(3.5e6 / 4e6 * 4e6 - 2.7e6)
    # the dollars over the billed ones only: pods and the NLB, not the ALB
    assert c.billed_normalized_saved == pytest.approx(1.5e6 / 4e6 * 4e6 - 7e5)
    assert c.usd_per_month_saved == pytest.approx(AWS.usd_per_month(8e5))
    # GCP bills both AWS types as ordinary transfer; Azure bills nothing
    gcp = change_of(CART, before, after, Price("gcp", 0.01))
    assert gcp.billed_normalized_saved == pytest.approx(gcp.normalized_saved)
    assert change_of(CART, before, after, Price("azure", 0.0)).usd_per_month_saved == 0.0
    # the total sums the billed figures of the Services it counts
    pay = change_of(ServiceKey("shop", "pay"), classed(B, 2e6, {("node", "none"): 1e6}),
                    classed(A, 2e6, {("node", "none"): 5e5}), AWS)
    t = total_of([c, pay], AWS, B, A)
    assert t.billed_normalized_saved == pytest.approx(8e5 + 5e5)
    assert t.usd_per_month_saved == pytest.approx(AWS.usd_per_month(1.3e6))
    # series of older agents (no client_kind): billed, so the figures are as before classes
    old = change_of(CART, classed(B, 4e6, {("", ""): 3e6}), classed(A, 1.3e6, {("", ""): 3e5}), AWS)
    assert old.usd_per_month_saved == pytest.approx(35.501571)


def test_class_costs_show_unbilled_classes_at_zero_with_the_reason() -> None:
    from agent.report.compute import class_costs
    before = classed(B, 4e6, {("pod", "none"): 1e6, ("load-balancer", "aws-alb"): 2e6})
    after = classed(A, 4e6, {("pod", "none"): 2e5, ("load-balancer", "aws-alb"): 3e6,
                             ("cidr", "none"): 1e5})
    rows = {(k.client_kind, k.lb_type): k for k in class_costs("services", before, after, AWS)}
    alb = rows[("load-balancer", "aws-alb")]
    assert (alb.before, alb.after, alb.billed) == (2e6, 3e6, False)
    assert alb.usd_per_month_before == alb.usd_per_month_after == 0.0
    assert "Application Load Balancer" in alb.reason and alb.source.startswith("https://")
    pod = rows[("pod", "")]  # lb_type "none" is no part of a non-load-balancer class
    assert pod.billed and pod.usd_per_month_after == pytest.approx(AWS.usd_per_month(2e5))
    assert rows[("cidr", "")].usd_per_month_before == 0.0  # no bytes before
    # largest after first
    assert [k for k in rows] == [("load-balancer", "aws-alb"), ("pod", ""), ("cidr", "")]


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


def test_spread_is_the_standard_error_of_the_mean_of_the_sub_window_rates() -> None:
    # 4 sub-windows of 10 s: all bytes 100, 300, 100, 300 -> rates 10, 30, 10, 30 B/s;
    # cross-zone 0, 100, 0, 100 -> 0, 10, 0, 10 B/s
    grid = [10.0, 20.0, 30.0, 40.0]
    points = {10.0: (100.0, 0.0), 20.0: (300.0, 100.0), 30.0: (100.0, 0.0),
              40.0: (300.0, 100.0)}
    sp = spread_of(points, grid, 10.0)
    assert sp is not None and sp.sub_windows == 4 and sp.seconds == 10.0
    # sample variance (n - 1): 4 x 10^2 / 3; of the mean: / 4
    assert sp.var_bytes == pytest.approx(400 / 3 / 4)
    assert sp.var_cross == pytest.approx(100 / 3 / 4)
    assert sp.cov == pytest.approx(200 / 3 / 4)  # 4 x (10 x 5) / 3 / 4
    # a sub-window without any result counts as 0 bytes, as the window average counts it
    gap = spread_of({10.0: (100.0, 0.0)}, [10.0, 20.0], 10.0)
    assert gap is not None and gap.var_bytes == pytest.approx(50 / 2)
    assert spread_of(points, [10.0], 10.0) is None  # one sub-window: no variance


def test_sub_windows_hold_four_scrapes_and_at_least_the_query_step() -> None:
    assert sub_window_seconds(3600, 15) == 60  # step 15 s, 4 x 15 s = 60 s
    assert sub_window_seconds(86400, 15) == 120  # the day's 2 min step is longer
    assert sub_window_seconds(20, 1) == 5  # 4 s rounded up to a query step


def test_change_errors_observed_and_normalised_by_error_propagation() -> None:
    b = WindowStats(B, 4e6, 3e6, spread=Spread(60, 60, 4e8, 1e8, 1.5e8))
    a = WindowStats(A, 2e6, 1e6, spread=Spread(60, 60, 9e8, 4e8, 5e8))
    observed, normalised = change_errors(b, a)
    assert observed == pytest.approx((1e8 + 4e8) ** 0.5)
    # N = Cb/Tb x Ta - Ca: gradients Ta/Tb = 0.5, -Cb Ta/Tb^2 = -0.375, Cb/Tb = 0.75, -1
    var = (0.25 * 1e8 + 0.375 ** 2 * 4e8 + 2 * 0.5 * -0.375 * 1.5e8
           + 0.75 ** 2 * 9e8 + 4e8 - 2 * 0.75 * 5e8)
    assert normalised == pytest.approx(var ** 0.5)
    assert change_errors(b, WindowStats(A, 2e6, 1e6)) == (None, None)
    assert change_errors(WindowStats(B, spread=STEADY), a)[1] is None  # no before traffic


def test_significance_rule_is_strict_at_two_standard_errors() -> None:
    assert significant(2.01, 1.0) is True
    assert significant(-2.01, 1.0) is True
    assert significant(2.0, 1.0) is False
    assert significant(0.0, 0.0) is False  # nothing changed: never a saving
    assert significant(1e-12, 0.0) is True  # exact data: any change is real
    assert significant(5.0, None) is None


def test_noise_reads_no_significant_change_and_is_not_priced_or_totalled() -> None:
    """The demo where nothing changed: a few B/s of difference with kB/s of variation."""
    noisy = Spread(60, 60.0, 1e6, 1e6, 1e6)  # standard errors of 1 kB/s
    cart = change_of(CART, stats(B, 4e6, 3e6, spread=noisy),
                     stats(A, 4e6, 3e6 - 50, spread=noisy), AWS)
    assert cart.saved == pytest.approx(50) and cart.saved_significant is False
    assert cart.significant is False and cart.verdict == NO_SIGNIFICANT_CHANGE
    assert cart.usd_per_month_saved == 0.0
    real = change_of(ServiceKey("shop", "pay"), stats(B, 2e6, 1e6), stats(A, 2e6, 5e5), AWS)
    assert real.significant is True and real.verdict == "saved"
    t = total_of([cart, real], AWS, B, A)
    # the total counts pay only: cart's 37.5 B/s of normalised "saving" is noise
    assert t.normalized_saved == pytest.approx(5e5)
    assert t.usd_per_month_saved == pytest.approx(AWS.usd_per_month(5e5))
    assert t.saved_stderr == pytest.approx((2 * 1e6) ** 0.5)
    only_noise = total_of([cart], AWS, B, A)
    assert only_noise.normalized_saved == 0 and only_noise.usd_per_month_saved == 0.0
    assert only_noise.verdict == NO_SIGNIFICANT_CHANGE


def test_a_significant_rise_reads_cost_rose_with_negative_dollars() -> None:
    c = change_of(CART, stats(B, 2e6, 5e5), stats(A, 2e6, 1e6), AWS)
    assert c.verdict == "cost rose"
    assert c.usd_per_month_saved == pytest.approx(-AWS.usd_per_month(5e5))


def test_unknown_noise_is_not_priced_and_is_left_out_of_the_total() -> None:
    c = change_of(CART, stats(B, 2e6, 1e6, spread=None), stats(A, 2e6, 5e5), AWS)
    assert c.significant is None and c.verdict == "noise unknown"
    assert c.usd_per_month_saved is None
    assert "too few sub-windows to measure the noise: the change is not priced" in c.warnings
    t = total_of([c], AWS, B, A)
    assert t.normalized_saved == 0 and t.saved_stderr is None
    assert t.warnings == ("normalised total leaves out Services whose noise is unknown: "
                          "shop/cart",)
