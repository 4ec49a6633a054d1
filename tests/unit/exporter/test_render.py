"""Exporter.render and the /metrics app: the text is prometheus_client's for the collector,
in both formats, written once per snapshot, and served with the library's content
negotiation (content type, gzip) or by the library's own app."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest, make_wsgi_app
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest

from agent.exporter import (
    AttributionTotals,
    Exporter,
    ExportSnapshot,
    Locality,
    ServiceBytesKey,
    ServiceRef,
    WorkloadBytesKey,
    make_app,
)
from tests.unit.exporter.test_exporter import full_snapshot

#: label values the escaping must get right: quotes, backslashes, newlines, UTF-8, "", None
ODD = ['we"ird', "back\\slash", "line\nbreak", "zone-ü", "", None, "a,b=c}", "trailing\\"]


def odd_snapshot() -> ExportSnapshot:
    svc = {ServiceBytesKey(ns, "s", "80", cz, "z", "cross_zone", "request"): 10 ** i + 0.5  # type: ignore[arg-type]
           for i, (ns, cz) in enumerate(zip(ODD, reversed(ODD), strict=True))}
    wl = {WorkloadBytesKey("ns", w, "Deployment", "a", "b", "pod", "cross_zone", "egress"): v  # type: ignore[arg-type]
          for w, v in zip(ODD, (0, 1, 1234567, 12345678, 2.5e21, float("inf"), float("nan"), -3),
                          strict=True)}
    return ExportSnapshot(
        totals=AttributionTotals(service_bytes=svc, workload_bytes=wl,
                                 unattributed_bytes={"flow_table_full": 123456789012}),
        locality={ServiceRef("shop", s): Locality("Auto", "none", {"a": True, "b": False}, 1.7e9,
                                                   {"a": 0.0, "b": 1 / 3}) for s in ODD[:3]},
        generated_at=1700000001.25, interval_seconds=10.0)


def test_one_snapshot_is_written_once_per_format_and_a_new_one_anew() -> None:
    exp = Exporter()
    first = full_snapshot()
    exp.update(first)
    text = exp.render()
    # one snapshot scraped twice (an HA pair of Prometheus servers) is written once
    assert exp.render() is text
    om = exp.render(openmetrics=True)
    assert om is exp.render(openmetrics=True) and om != text and exp.render() is text
    rec = next(iter(first.totals.service_bytes))
    exp.update(ExportSnapshot(totals=AttributionTotals(service_bytes={rec: 7})))
    again = exp.render()
    assert again != text and again == generate_latest(exp.registry())
    assert exp.render(openmetrics=True) == om_generate_latest(exp.registry())


def _get(app, accept: str | None, encoding: str | None = None,  # type: ignore[no-untyped-def]
         query: str = "") -> tuple[dict[str, str], bytes]:
    environ = {"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET", "QUERY_STRING": query}
    if accept is not None:
        environ["HTTP_ACCEPT"] = accept
    if encoding is not None:
        environ["HTTP_ACCEPT_ENCODING"] = encoding
    seen: list[dict[str, str]] = []
    body = b"".join(app(environ, lambda status, headers: seen.append(dict(headers))))
    return seen[0], body


ACCEPTS = [
    None,
    "text/plain",
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    # Prometheus 2.x and 3.x default scrape protocols
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;"
    "q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
    "text/plain;version=1.0.0;escaping=underscores",
    "application/openmetrics-text",
    # what only the library writes: answered by it
    "application/openmetrics-text;version=1.0.0;escaping=dots",
    "text/plain;version=1.0.0;escaping=dots",
]


@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_http_metrics_answers_as_the_library_would(accept: str | None, encoding: str | None) -> None:
    exp = Exporter(version="9.9.9")
    exp.update(odd_snapshot())
    ours = _get(make_app(exp, lambda: (True, "ready")), accept, encoding)
    lib = _get(make_wsgi_app(exp.registry()), accept, encoding)
    assert ours[0] == lib[0]  # Content-Type, Content-Encoding
    unzip: Iterator[bytes] = (gzip.decompress(b) if encoding else b for b in (ours[1], lib[1]))
    assert next(unzip) == next(unzip)


def test_http_metrics_name_filter_is_the_library_s() -> None:
    exp = Exporter()
    exp.update(full_snapshot())
    query = "name[]=zonemeter_build_info"
    ours = _get(make_app(exp, lambda: (True, "ready")), None, query=query)
    assert ours == _get(make_wsgi_app(exp.registry()), None, query=query)
    assert ours[1].count(b"# TYPE ") == 1 and b"zonemeter_build_info{" in ours[1]
