"""Series expiry: drop the cumulative series of deleted Services and workloads.

A ``service_bytes`` or ``hint_ignored_bytes`` series whose Service no longer exists, or a
``workload_bytes`` series whose workload no pod belongs to any more, is dropped from the
totals once it has gained no bytes for ``series_retention`` seconds (:class:`ObjectView`
says what exists; docs/attribution.md, "Series expiry"). Its bytes are kept in
``expired_bytes``; bytes arriving later for the same labels start a new series from 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from agent.attribution.vocabulary import EXPIRY_FAMILIES, UNKNOWN
from agent.logs import LogOnce

_log = logging.getLogger(__name__)

__all__ = ["SWEEP_FRACTION", "ObjectView", "SeriesExpiry"]

#: a sweep runs at most every ``series_retention * SWEEP_FRACTION`` seconds, so a series
#: expires between ``series_retention`` and ``(1 + 2 * SWEEP_FRACTION) *
#: series_retention`` seconds after its last byte (gains are noticed at sweeps)
SWEEP_FRACTION = 0.1


class ObjectView(Protocol):
    """Which Kubernetes objects still exist: what series expiry asks before it drops a
    series. Asked only about series that have gained no bytes for the retention, at most
    once per sweep, in one batch per family.

    Implementations must answer "exists" when unsure (cache not synced, a lookup failed):
    a series is only ever dropped for an object that is known to be gone.
    """

    def live_services(self, services: Collection[tuple[str, str]]) -> Collection[tuple[str, str]]:
        """The Services of ``services`` (``(namespace, name)``) that still exist."""
        ...

    def live_workloads(self, workloads: Collection[tuple[str, str, str]]
                       ) -> Collection[tuple[str, str, str]]:
        """The workloads of ``workloads`` (``(namespace, workload, workload_kind)``, as in
        :class:`agent.records.WorkloadBytesKey`) that at least one pod in the metadata
        still belongs to."""
        ...


#: one family to sweep: (family name, series key tuple -> bytes, key tuple -> record
#: key, width of the object prefix of the key: 2 Service, 3 workload)
Family = tuple[str, dict[Any, int], dict[Any, Any], int]


class SeriesExpiry:
    """Remembers when each series last gained bytes and drops idle series of gone objects.

    Args:
        retention: seconds a series of a deleted object must stay unchanged (> 0).
        objects: what exists (see :class:`ObjectView`).
        clock: monotonic seconds (``time.monotonic``; injectable for tests).

    Attributes:
        expired: ``{family: series dropped}`` (cumulative), every family of
            :data:`agent.attribution.EXPIRY_FAMILIES` present.
        expired_bytes: ``{family: bytes those series held}`` (cumulative).
    """

    def __init__(self, retention: float, objects: ObjectView, clock: Callable[[], float]) -> None:
        self.retention = retention
        self.objects = objects
        self._clock = clock
        self._last_sweep: float | None = None
        # per family: series key -> (value when last seen to change, clock at that sweep)
        self._seen: dict[str, dict[tuple[str, ...], tuple[int, float]]] = {f: {} for f in EXPIRY_FAMILIES}
        self.expired: dict[str, int] = {f: 0 for f in EXPIRY_FAMILIES}
        self.expired_bytes: dict[str, int] = {f: 0 for f in EXPIRY_FAMILIES}
        self._once = LogOnce(_log)

    def sweep(self, families: Sequence[Family]) -> int:
        """Run a sweep now over ``families``, unless one ran less than ``retention *
        SWEEP_FRACTION`` seconds ago; dropped series are removed from the family's dicts.

        A series is dropped when, at this sweep, it has not changed since a sweep at least
        ``retention`` seconds ago and its object is gone. Never raises for a failing
        :class:`ObjectView`: nothing of that family is dropped this time (logged once per
        error type).

        Returns:
            number of series dropped (0 when the sweep was skipped).
        """
        now = self._clock()
        if self._last_sweep is not None and now - self._last_sweep < self.retention * SWEEP_FRACTION:
            return 0
        self._last_sweep = now
        dropped = 0
        for family, counts, keys, width in families:
            seen = self._seen[family]
            idle: list[tuple[str, ...]] = []
            for k, v in counts.items():
                s = seen.get(k)
                if s is None or s[0] != v:  # new, or gained bytes since the last sweep
                    seen[k] = (v, now)
                elif now - s[1] >= self.retention:
                    idle.append(k)
            if not idle:
                continue
            objs = {k[:width] for k in idle}
            if width == 3:  # pods not in the cache: a catch-all, not an object
                objs.discard((UNKNOWN, UNKNOWN, UNKNOWN))
            try:
                live: set[tuple[str, ...]] = set()
                if objs and width == 2:
                    live.update(self.objects.live_services(objs))  # type: ignore[arg-type]
                elif objs:
                    live.update(self.objects.live_workloads(objs))  # type: ignore[arg-type]
            except Exception as err:  # noqa: BLE001 - unsure: keep every series of this family
                name = type(err).__name__
                self._once("expiry:" + name, logging.WARNING,
                           "series expiry: object lookup failed (%s: %s); no series of %s dropped "
                           "this sweep, further %s errors not logged", name, err, family, name, exc=err)
                continue
            for k in idle:
                obj = k[:width]
                if obj in live or obj not in objs:
                    continue
                v = counts.pop(k)
                del seen[k]
                keys.pop(k, None)
                self.expired[family] += 1
                self.expired_bytes[family] += v
                dropped += 1
        if dropped:
            _log.info("expired %d series of deleted objects", dropped,
                      extra={"fields": {"series_expired": dict(self.expired)}})
        return dropped
