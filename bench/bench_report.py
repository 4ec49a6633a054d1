"""Benchmark: ``zonemeter report`` wall time and Prometheus requests as Services grow.

Builds a TSDB with ``--services`` N Services (``tests/fixtures/promdata.py``'s
:func:`many_services_input`: each Service has its own locality change, 15 s apart, so
every Service has its own windows), starts Debian's Prometheus on 127.0.0.1 over it, and
runs the real CLI ``python -m agent report --prometheus URL --window 10m -o json`` (the
per-Service-windows mode: no --before/--after/--change-time) once per source tree given
with ``--tree``, as a subprocess with ``PYTHONPATH=TREE``. For each run it prints the wall
time (interpreter start to exit), the Services reported, and the API requests Prometheus
served (its own ``prometheus_http_requests_total`` for ``/api/v1/query`` and
``/api/v1/query_range``, read before and after). The JSON outputs of all trees are
compared: the numbers must be identical.

To compare with the code before batching (commit a0cb7f7)::

    git archive a0cb7f7 | (mkdir -p /tmp/zm-old && tar -x -C /tmp/zm-old)
    PYTHONPATH=. python -m bench.bench_report --services 500 --tree /tmp/zm-old --tree .

Usage:
    python -m bench.bench_report [--services 500] [--tree DIR ...] [--mode per-service|windows]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.fixtures.promdata import MANY_T0, MANY_WINDOW, SCRAPE, many_services_input
from tools.demo.prometheus import running_prometheus


def openmetrics(n: int, span: int) -> str:
    """The OpenMetrics text of ``n`` Services over ``span`` seconds from ``MANY_T0``."""
    fams = many_services_input(n, MANY_T0, "bench", span)
    lines: list[str] = []
    for family, kind in (("zonemeter_service_bytes", "counter"),
                         ("zonemeter_service_locality_in_effect", "gauge"),
                         ("zonemeter_service_locality_last_change_timestamp_seconds", "gauge")):
        lines += [f"# TYPE {family} {kind}", *fams[family]]
    return "\n".join(lines + ["# EOF"]) + "\n"


def api_requests(url: str) -> int:
    """Query API requests Prometheus has served so far (its own metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:  # noqa: S310  (loopback)
        text = r.read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and (
                'handler="/api/v1/query"' in line or 'handler="/api/v1/query_range"' in line):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=500)
    ap.add_argument("--tree", action="append", help="source tree to run (default: this one)")
    ap.add_argument("--mode", choices=("per-service", "windows"), default="per-service")
    args = ap.parse_args()
    trees = args.tree or [str(Path(__file__).resolve().parents[1])]
    span = 2 * MANY_WINDOW + SCRAPE * args.services
    now = MANY_T0 + span
    if args.mode == "per-service":
        flags = ["--window", f"{MANY_WINDOW // 60}m"]
    else:
        flags = ["--before", f"{MANY_T0}..{MANY_T0 + 600}", "--after", f"{now - 600}..{now}"]
    print(f"{args.services} Services, {span} s of 15 s scrapes, mode {args.mode}")
    outputs = []
    with tempfile.TemporaryDirectory(prefix="zm-bench-report-") as tmp:
        t = time.perf_counter()
        with running_prometheus(Path(tmp), openmetrics=openmetrics(args.services, span)) as url:
            print(f"TSDB built and Prometheus ready in {time.perf_counter() - t:.1f} s")
            for tree in trees:
                env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
                argv = [sys.executable, "-m", "agent", "report", "--prometheus", url,
                        "--now", str(now), "-o", "json", *flags]
                before = api_requests(url)
                t0, c0 = time.perf_counter(), os.times()
                proc = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True,
                                      timeout=3600)
                wall, c1 = time.perf_counter() - t0, os.times()
                served = api_requests(url) - before
                if proc.returncode != 0:
                    print(f"{tree}: exit {proc.returncode}: {proc.stderr.strip()}")
                    return 1
                doc = json.loads(proc.stdout)
                outputs.append(doc)
                cpu = (c1.children_user - c0.children_user) + (c1.children_system
                                                                - c0.children_system)
                print(f"{tree}: {wall:7.2f} s wall, {cpu:6.2f} s client CPU, "
                      f"{served:6d} API requests, {len(doc['services'])} Services")
    same = all(o == outputs[0] for o in outputs[1:])
    if len(outputs) > 1:
        print("outputs identical" if same else "OUTPUTS DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
