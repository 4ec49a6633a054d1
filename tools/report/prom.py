"""A thin client of the Prometheus HTTP API (``/api/v1/query``, ``/api/v1/query_range``).

Works against anything that speaks that API (Prometheus, Thanos Query, Mimir, VictoriaMetrics).
Only ``requests`` is used; results come back as plain records, never ``requests`` objects.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import requests

from agent.errors import InputError

#: seconds to wait for one API call
DEFAULT_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant vector.

    Attributes:
        labels: the series labels (``__name__`` dropped by aggregations).
        value: the sample value (float; NaN and Inf are passed through).
    """

    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range query.

    Attributes:
        labels: the series labels.
        points: ``[(unix_seconds, value), ...]`` in time order; instants without a value
            are absent.
    """

    labels: dict[str, str]
    points: list[tuple[float, float]]


@contextlib.contextmanager
def _result_shape(kind: str) -> Iterator[None]:
    """Turn a malformed Prometheus result (missing keys, non-numeric values) into an
    InputError instead of a KeyError/TypeError/ValueError traceback."""
    try:
        yield
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"malformed {kind} result from Prometheus ({type(err).__name__}: {err})",
                         source="--prometheus") from None


class PromClient:
    """Query a Prometheus HTTP API at ``base_url``.

    Args:
        base_url: e.g. ``http://prometheus:9090`` (a path prefix such as ``/prom`` is kept).
        timeout: seconds per request.
        session: a ``requests.Session`` to reuse (tests, auth headers); a new one otherwise.
    """

    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 session: requests.Session | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InputError(f"{base_url!r} is not an http(s) URL", source="--prometheus")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.base_url}{path}"
        try:
            resp = self.session.get(url, params=params, timeout=self.timeout)
        except requests.RequestException as err:
            raise InputError(f"cannot reach {self.base_url} ({type(err).__name__})",
                             source="--prometheus") from None
        try:
            body = resp.json()
        except ValueError:
            raise InputError(f"{url} answered HTTP {resp.status_code} without Prometheus API JSON "
                             "(is this a Prometheus URL?)", source="--prometheus") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error", "no error text") if isinstance(body, dict) else "not an object"
            raise InputError(f"{url} refused the query: {why}", source="--prometheus")
        if not isinstance(body.get("data"), dict):
            raise InputError(f"{url} answered without a 'data' object", source="--prometheus")
        return body["data"]

    def query(self, promql: str, at: float) -> list[Sample]:
        """Evaluate ``promql`` as an instant vector at ``at`` (Unix seconds).

        Returns:
            One :class:`Sample` per series (a scalar result becomes one series without labels).

        Raises:
            InputError: unreachable URL, not a Prometheus API, or the query was refused.
        """
        data = self._get("/api/v1/query", {"query": promql, "time": repr(float(at))})
        kind = data.get("resultType")
        if kind not in ("scalar", "vector"):
            raise InputError(f"expected an instant vector, got {kind}", source="--prometheus")
        with _result_shape(kind):
            if kind == "scalar":
                return [Sample({}, float(data["result"][1]))]
            return [Sample(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]

    def raw_samples(self, selector: str, seconds: float, at: float) -> list[Series]:
        """The stored samples of ``selector`` in ``[at - seconds, at]`` (a range-vector
        instant query, no evaluation), used to measure the scrape interval.

        Raises:
            InputError: unreachable URL, not a Prometheus API, or the query was refused.
        """
        data = self._get("/api/v1/query", {"query": f"{selector}[{int(seconds * 1000)}ms]",
                                           "time": repr(float(at))})
        if data.get("resultType") != "matrix":
            raise InputError(f"expected a range vector, got {data.get('resultType')}",
                             source="--prometheus")
        with _result_shape("matrix"):
            return [Series(dict(r["metric"]), [(float(t), float(v)) for t, v in r["values"]])
                    for r in data["result"]]

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        """Evaluate ``promql`` at ``start, start+step, ...`` up to ``end`` (Unix seconds).

        Returns:
            One :class:`Series` per series.

        Raises:
            InputError: unreachable URL, not a Prometheus API, or the query was refused.
        """
        data = self._get("/api/v1/query_range", {
            "query": promql, "start": repr(float(start)), "end": repr(float(end)),
            "step": repr(float(step))})
        if data.get("resultType") != "matrix":
            raise InputError(f"expected a range vector, got {data.get('resultType')}",
                             source="--prometheus")
        with _result_shape("matrix"):
            return [Series(dict(r["metric"]), [(float(t), float(v)) for t, v in r["values"]])
                    for r in data["result"]]
