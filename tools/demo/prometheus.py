"""A real Prometheus (Debian's ``/usr/bin/prometheus``) scraping the demo's agents.

:func:`running_prometheus` starts it on a free 127.0.0.1 port with its TSDB in a
directory the caller owns; :func:`scrape_config` writes the scrape job. The tests of
``zonemeter report`` (``tests/prom``) use the same two functions.

:func:`service_increase` asks Prometheus for ``sum by (service) (increase(...))`` over a
window. ``increase()`` extrapolates to the edges of its range (Prometheus
``extrapolatedRate``): by up to one scrape interval of the *average* rate at each edge. To
compare with the lab exactly, :func:`service_increase_aligned` puts each target's range
edges on that target's own first and last scrape in the window (``@`` modifier and a
millisecond range, one ``increase`` per target joined with ``or``), from its last
successful scrape before the window to its last one in it, so nothing is extrapolated and
the result is ``last - first`` per series, reset-corrected.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.errors import RuntimeFailure
from tools.demo.agents import free_port

PROMETHEUS = "/usr/bin/prometheus"


def find_prometheus() -> str | None:
    """Return the path of the ``prometheus`` binary, or None when it is not installed."""
    return shutil.which("prometheus") or (PROMETHEUS if os.path.exists(PROMETHEUS) else None)


def scrape_config(targets: list[str], interval_seconds: float = 1) -> str:
    """``prometheus.yml`` that scrapes zonemeter agents at ``targets`` (``host:port``, which
    must be loopback or inside the lab's own namespaces); ``interval_seconds`` may be a
    fraction (it is written in milliseconds)."""
    listed = ", ".join(f"'{t}'" for t in targets)
    ms = int(round(interval_seconds * 1000))
    return (f"global:\n  scrape_interval: {ms}ms\n"
            f"  scrape_timeout: {ms}ms\n"
            "scrape_configs:\n  - job_name: zonemeter\n"
            f"    static_configs:\n      - targets: [{listed}]\n")


@contextlib.contextmanager
def running_prometheus(root: Path, config_text: str = "global:\n  scrape_interval: 1h\n"
                       "scrape_configs: []\n", *, openmetrics: str | None = None,
                       binary: str | None = None) -> Iterator[str]:
    """Run Prometheus on 127.0.0.1 (a free port) with its TSDB under ``root``.

    Args:
        root: an empty directory for the TSDB, config and log.
        config_text: ``prometheus.yml``.
        openmetrics: when given, the TSDB is first built from this text with promtool.
        binary: the prometheus binary (default: :func:`find_prometheus`).

    Yields:
        The base URL once ``/-/ready`` answers 200; the process is stopped on exit.

    Raises:
        RuntimeFailure: prometheus (or promtool) missing, or it did not become ready.
    """
    prometheus = binary or find_prometheus()
    if prometheus is None:
        raise RuntimeFailure("prometheus is not installed (Debian package prometheus; "
                             "tools/setup.sh installs it)")
    data = root / "data"
    if openmetrics is not None:
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        (root / "input.om").write_text(openmetrics)
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet",
                        str(root / "input.om"), str(data)], check=True, capture_output=True,
                       timeout=120)
    config = root / "prometheus.yml"
    config.write_text(config_text)
    port = free_port()
    with open(root / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=36500d"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise RuntimeFailure("prometheus exited: "
                                         + (root / "prometheus.log").read_text()[-800:])
                try:
                    with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:  # noqa: S310
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeFailure("prometheus not ready after 60 s")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def query(url: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """Run an instant query; returns the ``result`` list of the API answer.

    Raises:
        RuntimeFailure: the API answered an error.
    """
    params = {"query": promql}
    if at is not None:
        params["time"] = f"{at:.3f}"
    full = f"{url}/api/v1/query?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(full, timeout=30) as r:  # noqa: S310 (loopback)
            doc = json.loads(r.read())
    except OSError as err:
        raise RuntimeFailure(f"prometheus query failed: {err}: {promql}") from None
    if doc.get("status") != "success":
        raise RuntimeFailure(f"prometheus query failed: {doc.get('error')}: {promql}")
    return list(doc["data"]["result"])


def scrape_times(url: str, instance: str, start: float, end: float, *,
                 succeeded: bool = False) -> list[float]:
    """Return the timestamps (Unix seconds, ms precision) of ``instance``'s scrapes in
    ``[start, end]`` (from its ``up`` series); with ``succeeded``, only those whose ``up``
    is 1 (a failed scrape, e.g. a timeout under load, stores no sample of the target's
    metrics)."""
    window_ms = int((end - start) * 1000) + 1
    res = query(url, f'up{{instance="{instance}"}}[{window_ms}ms]', at=end)
    return sorted(float(t) for r in res for t, v in r.get("values", [])
                  if float(t) >= start and (not succeeded or float(v) == 1))


def _by_service(result: list[dict[str, Any]]) -> dict[str, float]:
    return {f"{r['metric'].get('namespace', '')}/{r['metric'].get('service', '')}":
            float(r["value"][1]) for r in result}


def service_increase(url: str, selector: str, start: float, end: float) -> dict[str, float]:
    """``sum by (namespace, service) (increase(SELECTOR[end-start]))`` at ``end``.

    Returns:
        ``namespace/name`` -> bytes (float: extrapolated, see the module docstring).
    """
    window_ms = int(round((end - start) * 1000))
    return _by_service(query(url, f"sum by (namespace, service) "
                                  f"(increase({selector}[{window_ms}ms]))", at=end))


def service_increase_aligned(url: str, metric: str, matchers: str, instances: list[str],
                             start: float, end: float, *, lookback: float = 60
                             ) -> tuple[dict[str, float], str, float]:
    """Like :func:`service_increase`, with each target's range on two of its own successful
    scrapes, so ``increase`` does not extrapolate: from the last one at or before ``start``
    to the last one at or before ``end``.

    The range starts before ``start``, not at the first scrape after it: the caller settles
    every agent's export before ``start`` and counts from there, and bytes exported between
    ``start`` and a target's first scrape after it (or a failed first scrape) would
    otherwise fall outside the range.

    Args:
        metric: metric name (``zonemeter_service_bytes_total``).
        matchers: extra label matchers without braces (``crossing="cross_zone"``).
        instances: the scrape targets (``host:port``).
        lookback: seconds before ``start`` to look for its last successful scrape.

    Returns:
        (``namespace/name`` -> bytes, the PromQL that was run, the earliest range start
        over the targets in Unix seconds).

    Raises:
        RuntimeFailure: a target has no successful scrape in ``[start - lookback, start]``
            or none after it up to ``end``.
    """
    parts = []
    earliest = start
    for inst in instances:
        times = scrape_times(url, inst, start - lookback, end, succeeded=True)
        before = [t for t in times if t <= start]
        if not before or times[-1] <= before[-1]:
            raise RuntimeFailure(f"prometheus has no successful scrape of {inst} before "
                                 "and after the window's start")
        first, last = before[-1], times[-1]
        earliest = min(earliest, first)
        rng = int(round((last - first) * 1000))
        sel = f'{metric}{{instance="{inst}"' + (f",{matchers}" if matchers else "") + "}"
        parts.append(f"increase({sel}[{rng}ms] @ {last:.3f})")
    promql = f"sum by (namespace, service) ({' or '.join(parts)})"
    return _by_service(query(url, promql, at=end)), promql, earliest


def locality(url: str, at: float) -> dict[str, dict[str, bool]]:
    """``max by (namespace, service, client_zone) (zonemeter_service_locality_in_effect)``.

    Returns:
        ``namespace/name`` -> {client_zone: in effect}.
    """
    out: dict[str, dict[str, bool]] = {}
    for r in query(url, "max by (namespace, service, client_zone) "
                        "(zonemeter_service_locality_in_effect)", at=at):
        m = r["metric"]
        out.setdefault(f"{m.get('namespace', '')}/{m.get('service', '')}", {})[
            m.get("client_zone", "unknown")] = float(r["value"][1]) >= 1
    return out
