"""A thin client of the Prometheus HTTP API (``/api/v1/query``, ``/api/v1/query_range``).

Works against anything that speaks that API (Prometheus, Thanos Query, Mimir, VictoriaMetrics).
Only ``requests`` is used; results come back as plain records, never ``requests`` objects.

Every message that shows a URL shows it through :func:`redact_url`: credentials in the URL
(``http://user:pass@host``) and secret-looking query parameters (``?token=...``) never reach
the terminal or a log.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import requests

from agent.errors import InputError

#: seconds to wait for one API call
DEFAULT_TIMEOUT_SECONDS = 60.0
#: longest URL-encoded query string sent with GET; longer ones are sent as a POST form
#: (the API accepts both; common proxies refuse request lines over 8 KiB)
MAX_GET_QUERY_BYTES = 4096
#: query parameter names whose values are redacted in messages (case-insensitive, substring)
_SECRET_PARAM_RE = re.compile(
    r"token|passw|pwd|secret|key|auth|signature|sig$|credential|session", re.IGNORECASE)
REDACTED = "REDACTED"


def redact_url(url: str) -> str:
    """``url`` with its credentials replaced by ``REDACTED``, for messages.

    The userinfo (``user:password@`` or ``token@``) becomes ``REDACTED@``; the value of every
    query parameter whose name looks secret (``token``, ``access_token``, ``password``,
    ``api_key``, ``auth``, ``X-Amz-Signature``, ...) becomes ``REDACTED``; a fragment is
    dropped. Text that does not parse as a URL is returned with anything up to an ``@``
    before the first ``/`` after ``://`` redacted the same way.

    Args:
        url: any URL text.

    Returns:
        The URL, safe to print.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc
    except ValueError:  # e.g. an invalid IPv6 literal: redact by hand
        return re.sub(r"^([^:/]*://)[^/@]*@", rf"\1{REDACTED}@", url)
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = urllib.parse.urlencode(
            [(k, REDACTED if _SECRET_PARAM_RE.search(k) else v) for k, v in pairs], safe="")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def prometheus_ms(t: float) -> int:
    """The millisecond timestamp Prometheus evaluates at for a ``time``/``start``/``end``
    parameter sent as ``repr(float(t))``.

    Mirrors Prometheus's ``web/api/v1`` ``parseTime``: split into whole seconds and a
    fraction (``math.Modf``), round the fraction to milliseconds (``math.Round``, half away
    from zero), convert to nanoseconds truncating (``int64``), then integer-divide to
    milliseconds (``timestamp.FromTime``). Used to line up batched evaluations exactly with
    the instants separate queries would have used.

    Args:
        t: Unix seconds, finite.

    Returns:
        Unix milliseconds (int).
    """
    whole = math.trunc(t)
    frac = t - whole  # exact for IEEE doubles, as math.Modf
    scaled = frac * 1000
    rounded = math.floor(scaled) if scaled >= 0 else math.ceil(scaled)
    if abs(scaled - rounded) >= 0.5:
        rounded += 1 if scaled >= 0 else -1
    nanos = int((rounded / 1000) * 1e9)  # Go int64(): truncation toward zero
    total = whole * 1_000_000_000 + nanos
    return int(total / 1_000_000) if total < 0 else total // 1_000_000


def format_ms(ms: int) -> str:
    """Unix milliseconds as PromQL seconds text (``1736125200.123``), for ``@``."""
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    return f"{sign}{ms // 1000}.{ms % 1000:03d}"


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
        base_url: e.g. ``http://prometheus:9090`` (a path prefix such as ``/prom`` is kept;
            ``http://user:pass@host`` sends basic auth; query parameters such as
            ``?tenant=a`` are sent with every request).
        timeout: seconds per request.
        session: a ``requests.Session`` to reuse (tests, auth headers); a new one otherwise.

    Attributes:
        requests_made: HTTP requests sent so far (one per query; thread-safe: the report
            sends a few concurrently).

    Raises:
        InputError: ``base_url`` is not an http(s) URL (the message shows it redacted).
    """

    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 session: requests.Session | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InputError(f"{redact_url(base_url)!r} is not an http(s) URL",
                             source="--prometheus")
        try:
            parts = urllib.parse.urlsplit(base_url)
            extra = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
            parts.port  # noqa: B018  (raises ValueError on a bad port)
        except ValueError as err:
            raise InputError(f"{redact_url(base_url)!r} is not a valid URL ({err})",
                             source="--prometheus") from None
        if not parts.hostname:
            raise InputError(f"{redact_url(base_url)!r} has no host", source="--prometheus")
        self.base_url = urllib.parse.urlunsplit(
            (parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.extra_params = dict(extra)
        self.timeout = timeout
        self.session = session or requests.Session()
        self.requests_made = 0
        self._count_lock = threading.Lock()

    @property
    def shown_url(self) -> str:
        """The base URL as messages show it (credentials redacted)."""
        return redact_url(self.base_url + ("?" + urllib.parse.urlencode(self.extra_params)
                                           if self.extra_params else ""))

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.base_url}{path}"
        shown = redact_url(url)
        params = {**self.extra_params, **params}
        with self._count_lock:
            self.requests_made += 1
        try:
            if len(urllib.parse.urlencode(params)) > MAX_GET_QUERY_BYTES:
                resp = self.session.post(url, data=params, timeout=self.timeout)
            else:
                resp = self.session.get(url, params=params, timeout=self.timeout)
        except requests.Timeout:
            raise InputError(f"{self.shown_url} did not answer within {self.timeout:g} s",
                             source="--prometheus") from None
        except requests.RequestException as err:
            raise InputError(f"cannot reach {self.shown_url} ({type(err).__name__})",
                             source="--prometheus") from None
        if resp.status_code in (401, 403):
            raise InputError(f"{shown} answered HTTP {resp.status_code}: not authorised (give "
                             "credentials as http://USER:PASSWORD@HOST)", source="--prometheus")
        try:
            body = resp.json()
        except ValueError:
            raise InputError(f"{shown} answered HTTP {resp.status_code} without Prometheus API "
                             "JSON (is this a Prometheus URL?)", source="--prometheus") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error", "no error text") if isinstance(body, dict) else "not an object"
            if isinstance(why, str) and "is disabled" in why and (
                    "@ modifier" in why or "offset" in why):
                why += (" (the report needs the @ modifier and negative offsets: Prometheus "
                        ">= 2.33 has both on by default)")
            raise InputError(f"{shown} refused the query: {why}", source="--prometheus")
        if not isinstance(body.get("data"), dict):
            raise InputError(f"{shown} answered without a 'data' object", source="--prometheus")
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
