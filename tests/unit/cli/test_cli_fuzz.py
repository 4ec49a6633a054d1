"""Fuzz (hypothesis) the CLI verbs' arguments and the lab topology loader.

Property: ``agent.cli.main`` returns 0, or 2 with exactly one stderr line, and never
prints a traceback, for any ``what-if`` flags, any ``report`` times/prices/windows (with a
fake Prometheus that answers with arbitrary, also malformed, bodies), and any lab topology.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agent.cli.report as report_cli
from agent.cli import main
from agent.errors import InputError
from agent.report.prom import PromClient
from tools.lab.topology import Topology

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def run_cli(capsys: Any, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if code != 0:
        assert code == 2, (code, err)
        assert len(err.splitlines()) == 1, err
        assert err.startswith("zonemeter: error: ") or err.startswith("zonemeter "), err
    return code, out, err


# --------------------------------------------------------------------------- what-if

QUANTITIES = st.sampled_from(["4", "0", "-1", "abc", "NaN", "Infinity", "1e3", "500m", "1e-9", "1Ki",
                              "", " ", "4.5", "99999999999999999999", "1e1000", "²", "４"])
ZONE_NAMES = st.sampled_from(["a", "b", "c", "", " ", "a b", "=", "a,b", "é", "x" * 70])
COUNTS = st.sampled_from(["3", "1-12", "0", "12-3", "6", "99999999999999999999", "1-100001", "３",
                          "-3", "3-", "a", "", "10000-10010", "1--3"])


@SETTINGS
@given(st.lists(st.tuples(ZONE_NAMES, QUANTITIES).map(lambda t: f"{t[0]}={t[1]}") | st.text(max_size=8),
                min_size=1, max_size=4),
       COUNTS, st.none() | st.sampled_from(["a=1,b=1", "a=0,b=0", "a=2", "z=1", "a=²", "a=-1",
                                             "a=99999999999", "a=1,a=2", "a"]),
       st.sampled_from([[], ["-o", "json"]]))
def test_what_if_any_flags(capsys: Any, zones: list[str], replicas: str, spread: str | None,
                           out_flag: list[str]) -> None:
    argv = ["what-if", *[f"--zone={z}" for z in zones], f"--replicas={replicas}", *out_flag]
    if spread is not None:
        argv.append(f"--spread={spread}")
    code, out, _ = run_cli(capsys, argv)
    if code == 0 and out_flag:
        rows = json.loads(out)["rows"]
        assert rows and all(r["hints_enabled"] == (r["reason"] is None) for r in rows)


def test_what_if_huge_counts_are_refused_quickly(capsys: Any) -> None:
    for argv in (["--replicas", "99999999999999999999"], ["--replicas", "90000-99999"],
                 ["--replicas", "3", "--spread", "a=99999999999"]):
        code, _, err = run_cli(capsys, ["what-if", "--zone", "a=4", "--zone", "b=4", *argv])
        assert code == 2 and ("--replicas" in err or "--spread" in err)


# --------------------------------------------------------------------------- report

class FakeResponse:
    def __init__(self, body: Any, status: int = 200) -> None:
        self.body, self.status_code = body, status

    def json(self) -> Any:
        if isinstance(self.body, str):
            return json.loads(self.body)
        return self.body


class FakeSession:
    """Answers every query with one body (a Prometheus API document, or garbage)."""

    def __init__(self, body: Any) -> None:
        self.body = body

    def get(self, url: str, params: dict[str, str], timeout: float) -> FakeResponse:
        return FakeResponse(self.body)


NOW = 1_760_000_000.0
TIMES = st.one_of(
    st.sampled_from(["now", "-7d", "-14d", "-1h", "+1h", "-0s", "-2h30m", "2025-01-06T10:00:00Z",
                     "2025-01-06", "2025-13-45T10:00:00Z", "0000-01-01T00:00:00Z",
                     "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "1736121600",
                     "99999999999", "-99999999999999999999w", "-1e5d", "-" + "9" * 400 + "s",
                     "", " ", "-", "..", "nan", "inf", "-inf", "-1.5d", "１７３６１２１６００"]),
    st.text(max_size=12))
DURATIONS = st.sampled_from(["1d", "0s", "90s", "1.5h", "9" * 400 + "w", "99999999999999999999d",
                             "-1d", "", "1", "1y", "１d"])
PRICES = st.sampled_from(["aws", "gcp", "azure", "AWS", "0.02", "$0.02", "-1", "nan", "inf", "1e308",
                          "1e309", "0", "", "free", "0x10", "1_000", "２"])
BODIES = st.sampled_from([
    {"status": "success", "data": {"resultType": "vector", "result": []}},
    {"status": "success", "data": {"resultType": "matrix", "result": []}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "x"]}]}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "1"]}]}},
    {"status": "success", "data": {"resultType": "vector",
                                   "result": [{"metric": {"namespace": "shop", "service": "web"},
                                               "value": [1, "1759990000"]}]}},
    {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": "x"}]}},
    {"status": "success", "data": {"resultType": "scalar", "result": [1, "NaN"]}},
    {"status": "success", "data": None},
    {"status": "success"},
    {"status": "error", "error": "bad\nquery"},
    [], "null", "not json",
])


def _patch_prom(monkeypatch: Any, body: Any) -> None:
    monkeypatch.setattr(report_cli, "PromClient",
                        lambda url: PromClient(url, session=FakeSession(body)))  # type: ignore[arg-type]


@SETTINGS
@given(st.sampled_from(["windows", "change", "per-service"]), TIMES, TIMES, TIMES, TIMES,
       st.none() | DURATIONS, PRICES, st.none() | st.sampled_from(["shop/web", "Shop/Web", "shop", "a/b/c"]),
       BODIES)
def test_report_any_times_prices_windows(monkeypatch: Any, capsys: Any, mode: str, t1: str, t2: str,
                                         t3: str, t4: str, window: str | None, price: str,
                                         service: str | None, body: Any) -> None:
    _patch_prom(monkeypatch, body)
    argv = ["report", "--prometheus", "http://prometheus.invalid:9090", "--now", str(NOW),
            f"--price={price}"]
    if mode == "windows":
        argv += [f"--before={t1}..{t2}", f"--after={t3}..{t4}"]
    elif mode == "change":
        argv += [f"--change-time={t1}"]
    if window is not None:
        argv += [f"--window={window}"]
    if service is not None:
        argv += ["--service", service]
    run_cli(capsys, argv)


@pytest.mark.parametrize("argv", [
    ["--before=-" + "9" * 400 + "s..-7d", "--after=-7d..now"],
    ["--before=-99999999999999999999w..-7d", "--after=-7d..now"],
    ["--change-time=0001-01-01T00:00:00+23:59", "--window=1d"],
    ["--change-time=-99999999999999999999w"],
    ["--window=" + "9" * 400 + "w"],
])
def test_report_absurd_times_are_one_line_errors(monkeypatch: Any, capsys: Any, argv: list[str]) -> None:
    _patch_prom(monkeypatch, {"status": "success", "data": {"resultType": "vector", "result": []}})
    code, _, err = run_cli(capsys, ["report", "--prometheus", "http://p.invalid", "--now", str(NOW), *argv])
    assert code == 2


# --------------------------------------------------------------------------- lab topology

TOPO_KEYS = ["options", "zones", "nodes", "pods", "services", "name", "zone", "cpu", "node", "ports",
             "port", "targetPort", "protocol", "labels", "selector", "mode", "ipv6", "mtu", "vni",
             "node_cidr", "pod_cidr", "service_cidr", "ip", "ip6", "clusterIP", "region", "ignoreHints",
             "trafficDistribution", "internalTrafficPolicy", "annotations", "hostNetwork", "replicas"]
TOPO_LEAVES = (st.none() | st.booleans() | st.integers(-2, 70000) | st.floats()
               | st.sampled_from(["a", "b", "n1", "web", "TCP", "UDP", "auto", "10.0.0.0/8", "10.1.0.0/30",
                                  "fd00::/48", "vxlan", "flat", "Local", "PreferClose", "10.0.0.5", "x" * 70,
                                  "0.0.0.0/0", "::/0"]))
TOPO = st.recursive(TOPO_LEAVES, lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.sampled_from(TOPO_KEYS), kids, max_size=5), max_leaves=30)
BASE_TOPO = {"zones": [{"name": "a"}, {"name": "b"}],
             "nodes": [{"name": "n1", "zone": "a"}, {"name": "n2", "zone": "b"}],
             "pods": [{"name": "web-1", "node": "n1", "labels": {"app": "web"}, "ports": [{"port": 8080}]}],
             "services": [{"name": "web", "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}]}


@SETTINGS
@given(st.one_of(TOPO, st.builds(lambda sec, val: {**BASE_TOPO, sec: val},
                                 st.sampled_from(["options", "zones", "nodes", "pods", "services"]), TOPO)))
def test_lab_topology_any_document(doc: Any) -> None:
    try:
        topo = Topology.from_yaml(yaml.safe_dump(doc) + "\n")
    except InputError as err:
        assert "\n" not in str(err) and str(err).startswith("<yaml>")
        return
    assert topo.zones and topo.nodes
    for n in topo.nodes:
        assert math.isfinite(n.cpu) and n.cpu > 0


@pytest.mark.parametrize("options", [{"node_cidr": "10.0.0.0/8"}, {"node_cidr": "0.0.0.0/0"},
                                     {"overlay_cidr": "0.0.0.0/1"}])
def test_lab_topology_huge_cidrs_are_cheap(options: dict[str, Any]) -> None:
    topo = Topology.from_dict({**BASE_TOPO, "options": options})
    assert [str(n.ip).count(".") for n in topo.nodes] == [3, 3]


@pytest.mark.parametrize("cpu", [float("nan"), float("inf"), ".nan", 0, -1])
def test_lab_topology_node_cpu_must_be_finite_and_positive(cpu: Any) -> None:
    doc = {**BASE_TOPO, "nodes": [{"name": "n1", "zone": "a", "cpu": cpu}]}
    with pytest.raises(InputError) as info:
        Topology.from_dict(doc, source="t.yaml")
    assert info.value.field == "cpu" and info.value.obj == "Node n1"


@pytest.mark.parametrize("options", [{"ipv6": True, "node_cidr_v6": "fd00::/128"},
                                     {"ipv6": True, "mode": "vxlan", "overlay_cidr_v6": "fd01::/127"}])
def test_lab_topology_tiny_v6_cidrs_are_input_errors(options: dict[str, Any]) -> None:
    with pytest.raises(InputError) as info:
        Topology.from_dict({**BASE_TOPO, "options": options})
    assert "too many nodes" in str(info.value) and info.value.obj in ("Node n1", "Node n2")
