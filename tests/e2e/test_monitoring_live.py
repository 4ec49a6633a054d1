"""The dashboard and the rules against real data: every PromQL expression of
deploy/daemonset/monitoring, evaluated by Debian's Prometheus after it scraped the demo's six
real agents, returns data (or, for an alert, evaluates without error and every series it
reads has data).

``zonemeter demo --keep`` leaves the lab, its agents and their traffic counters running (a
short run: its warm-up already makes every series); this test's Prometheus loads the rule
groups of ``rules.yml`` with every group evaluated each second (the file's 30 s group interval
is the only text changed, so the recording rules run right after the traffic) and scrapes the
agents every second with the labels the PodMonitor gives (``job="zonemeter"``, ``node``). Once
it has scraped every agent, ``zonemeter lab traffic`` keeps a Service busy across a few
scrapes, then the test queries.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fixtures.monitoring import MON, dashboard_queries, metric_names, substitute
from tools.demo import prometheus as prom

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
#: series from outside zonemeter that an alert may read and the lab has no source of
#: (kube-state-metrics); the alerts stay silent without them (their comments say so)
FOREIGN = {"kube_daemonset_status_number_ready", "kube_daemonset_status_desired_number_scheduled"}
DASHBOARD_VARS = {"namespace": ".*", "service": ".*", "price_usd_per_gb": "0.02", "__rate_interval": "1m"}
#: the recording rules' group interval in rules.yml, and what this test's copy uses instead
RULES_INTERVAL, TEST_INTERVAL = "interval: 30s", "interval: 1s"


def _rules_every_second(dest: Path) -> Path:
    """Write ``rules.yml`` to ``dest`` with every group's ``interval`` set to 1 s, and return it."""
    text = (MON / "rules.yml").read_text()
    assert text.count(RULES_INTERVAL) == 1, "rules.yml: one group with a 30 s interval expected"
    dest.write_text(text.replace(RULES_INTERVAL, TEST_INTERVAL))
    return dest


def _wait_until_scraped(url: str, agents: int, timeout: float = 60.0) -> None:
    """Wait until Prometheus scraped every agent successfully (its first scrape comes up to a
    few seconds after start), so the traffic that follows moves counters it already has."""
    deadline = time.monotonic() + timeout
    while True:
        up = prom.query(url, 'count(up{job="zonemeter"} == 1)')
        if up and int(float(up[0]["value"][1])) == agents:
            return
        assert time.monotonic() < deadline, f"Prometheus did not scrape the {agents} agents"
        time.sleep(0.5)


def test_every_dashboard_and_rule_expression_returns_demo_data(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    demo = subprocess.run([sys.executable, "-m", "agent", "demo", "--keep", "--duration", "2",
                           "--interval", "1", "-o", "json", "--workdir", str(work)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert demo.returncode == 0, demo.stderr[-3000:]
    state = json.loads((work / "demo.json").read_text())
    try:
        targets = "".join(f"      - targets: ['{a['metrics']}']\n        labels: {{node: {a['node']}}}\n"
                          for a in state["agents"])
        config = ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                  f"rule_files: ['{_rules_every_second(tmp_path / 'rules.yml')}']\n"
                  "scrape_configs:\n  - job_name: zonemeter\n    static_configs:\n" + targets)
        root = tmp_path / "prom"
        root.mkdir()
        with prom.running_prometheus(root, config) as url:
            _wait_until_scraped(url, len(state["agents"]))
            # 3 s of requests: at least two agent exports (1 s) and scrapes (1 s) see them move
            traffic = [sys.executable, "-m", "agent", "lab", "traffic", "--prefix", state["prefix"],
                       "--state-dir", state["state_dir"], "--from", "frontend-a1", "--to", "shop/catalog",
                       "--port", "80", "--count", "12", "--rate", "4"]
            busy = subprocess.run(traffic, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert busy.returncode == 0, busy.stderr
            # and from c2, whose data plane ignores the hints, to the PreferSameZone checkout:
            # the hint-ignored cause rules join c2's ClusterIP path bytes with the endpoints'
            # hint-ignored bytes, and both must move (rate > 0); 12 random picks among six
            # endpoints that all stay in zone c: (1/3)^12
            ignored = [*traffic[:traffic.index("--from") + 1], "frontend-c2", "--to",
                       "shop/checkout", *traffic[traffic.index("--port"):]]
            busy = subprocess.run(ignored, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert busy.returncode == 0, busy.stderr
            # wait until the rules ran after the traffic's last export was scraped (export 1 s,
            # scrape 1 s)
            deadline = time.monotonic() + 90
            after = time.time() + 2
            while time.monotonic() < deadline:
                got = prom.query(url, "timestamp(zonemeter:cross_zone_price_usd_per_gigabyte)")
                if got and float(got[0]["value"][1]) > after:  # the sample's evaluation time
                    break
                time.sleep(0.5)
            else:
                raise AssertionError("the recording rules were not evaluated within 90 s")
            empty: list[str] = []
            rules = yaml.safe_load((MON / "rules.yml").read_text())["groups"]
            for group in rules:
                for rule in group["rules"]:
                    expr = str(rule["expr"])
                    if "record" in rule:
                        if not prom.query(url, rule["record"]):
                            empty.append(f"record {rule['record']}: {expr.strip()}")
                        continue
                    prom.query(url, expr)  # raises on an evaluation error
                    for name in metric_names(expr) - FOREIGN:
                        if not prom.query(url, name):
                            empty.append(f"alert {rule['alert']} reads {name}: no data")
            for where, expr in dashboard_queries():
                if not prom.query(url, substitute(where, expr, DASHBOARD_VARS)):
                    empty.append(f"{where}: {expr}")
            assert not empty, "expressions without data on the demo:\n" + "\n".join(empty)
    finally:
        down = subprocess.run([sys.executable, "-m", "agent", "demo", "--teardown", str(work)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
