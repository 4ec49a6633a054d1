"""List+watch Pods, Nodes, Services and EndpointSlices into :class:`ClusterMetadata`.

The loop per resource follows kopf (``kopf/_cogs/clients/watching.py``) and client-go's
reflector (``k8s.io/client-go/tools/cache/reflector.go`` ``ListAndWatch``):

1. list (in pages of ``list_limit``), replace the cache's objects of that kind, remember
   the list's ``resourceVersion``; the resource is now *synced*;
2. watch from that resourceVersion (with bookmarks and a server-side timeout); every
   ADDED/MODIFIED/DELETED event updates the cache and advances the resourceVersion;
   unknown event types are logged once and skipped;
3. when the watch ends normally (server timeout, quiet connection) watch again from the
   last resourceVersion: never re-list on a timer;
4. on 410 Gone (HTTP status or an ERROR event with code 410) list again;
5. a request answered ``429 Too Many Requests`` (API Priority and Fairness) is sent again,
   the same request (a list page keeps its ``continue`` token), after the answer's
   ``Retry-After`` with jitter, up to :data:`THROTTLE_RETRIES` times, as client-go's rest
   client does (``k8s.io/client-go/rest/request.go``: ``maxRetries`` 10, ``checkWait``);
6. on any other error back off exponentially (bounded) and retry the watch from the last
   resourceVersion; after ``unsynced_after`` seconds of continuous failure the resource is
   marked unsynced (``zonemeter_metadata_synced`` 0, ``/readyz`` 503) and, once the API
   answers again, listed again (its watch history may be gone).

Each resource runs in its own daemon thread; :meth:`MetadataWatcher.stop` ends them
promptly by setting an event and shutting down the sockets of open watches.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from agent.k8s.cache import RESOURCES, ClusterMetadata

log = logging.getLogger(__name__)

#: how often one request answered 429 (API Priority and Fairness) is sent again before the
#: answer counts as an error (client-go's rest client: ``maxRetries`` 10)
THROTTLE_RETRIES = 10
#: bound on one wait for a 429's ``Retry-After`` (seconds)
MAX_RETRY_AFTER_SECONDS = 60.0


def retry_after(err: ApiException) -> float | None:
    """Seconds to wait before sending a request the API server throttled again, or None when
    ``err`` is no throttling (status 429).

    The server's ``Retry-After`` header (seconds; API Priority and Fairness sends it with
    each 429), at least 1 and at most :data:`MAX_RETRY_AFTER_SECONDS`; 1 when absent or not
    a number.
    """
    if err.status != 429:
        return None
    headers = getattr(err, "headers", None) or {}
    try:
        wait = float(headers.get("Retry-After", 1))
    except (TypeError, ValueError):
        wait = 1.0
    return min(max(wait, 1.0), MAX_RETRY_AFTER_SECONDS)


@dataclass
class WatchSettings:
    """Settings of the list+watch loop.

    Attributes:
        timeout_seconds: server-side watch timeout (``timeoutSeconds``); the API server
            ends the watch after it and the loop watches again from the last version.
        read_margin_seconds: the client gives up on a silent connection after
            ``timeout_seconds`` plus this, so a half-open TCP connection is noticed.
        connect_timeout_seconds: TCP/TLS connect timeout per request.
        list_limit: page size of list requests (``limit``/``continue``); 0 lists at once.
        backoff_initial_seconds: first retry delay after an error.
        backoff_max_seconds: cap of the exponential backoff.
        unsynced_after_seconds: continuous failure after which a resource counts as
            unsynced and is listed again on recovery.
    """

    timeout_seconds: int = 300
    read_margin_seconds: float = 30.0
    connect_timeout_seconds: float = 10.0
    list_limit: int = 500
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    unsynced_after_seconds: float = 30.0


@dataclass
class WatchStats:
    """Counters of one resource's loop (for logs, tests and self-metrics).

    Attributes:
        lists: successful lists; relists: lists after the first; watches: watch
        requests opened; events: events applied; errors: failed requests;
        unknown_events: events of unknown type skipped; throttled: requests answered 429
        and sent again after their ``Retry-After``.
    """

    lists: int = 0
    relists: int = 0
    watches: int = 0
    events: int = 0
    errors: int = 0
    unknown_events: int = 0
    throttled: int = 0
    last_error: str = ""
    unknown_types: set[str] = field(default_factory=set)


class _Gone(Exception):
    """The resourceVersion is too old (410): list again."""


class _Stopped(Exception):
    """The stop event was set in the middle of a paged list: abandon it (the cache keeps
    what it had; a half list must not delete the objects of the pages never read)."""


def _list_functions(api_client: client.ApiClient) -> dict[str, Callable[..., Any]]:
    core = client.CoreV1Api(api_client)
    discovery = client.DiscoveryV1Api(api_client)
    return {
        "pods": core.list_pod_for_all_namespaces,
        "nodes": core.list_node,
        "services": core.list_service_for_all_namespaces,
        "endpointslices": discovery.list_endpoint_slice_for_all_namespaces,
    }


class ResourceWatcher:
    """The list+watch loop of one resource (see the module docstring).

    Args:
        list_fn: the official client's list function (``CoreV1Api.list_node`` ...).
        resource: one of :data:`agent.k8s.cache.RESOURCES`.
        cache: where events go.
        settings: see :class:`WatchSettings`.
        stop_event: set it to end :meth:`run`.
    """

    def __init__(self, list_fn: Callable[..., Any], resource: str, cache: ClusterMetadata,
                 settings: WatchSettings, stop_event: threading.Event,
                 field_selector: str | None = None) -> None:
        self.list_fn = list_fn
        #: ``fieldSelector`` of every list and watch request (``spec.nodeName=NODE`` for
        #: pods with ``--pod-scope node``), or None
        self.field_selector = field_selector
        self.resource = resource
        self.cache = cache
        self.settings = settings
        self.stop_event = stop_event
        self.stats = WatchStats()
        self._resp: Any = None
        self._resp_lock = threading.Lock()
        self._failing_since: float | None = None
        #: the newest resourceVersion seen (list, event or bookmark); a watch that fails
        #: mid-stream resumes from here, not from where it started
        self.resource_version: str | None = None
        self._backoff = settings.backoff_initial_seconds

    def _answered(self) -> None:
        """The API answered a request: the failure streak (and its backoff) is over."""
        self._failing_since = None
        self._backoff = self.settings.backoff_initial_seconds

    # ---------------------------------------------------------------- requests

    def _request(self, kwargs: dict[str, Any]) -> Any:
        """``list_fn(**kwargs)``, sent again after a 429's ``Retry-After`` (times 1 to 1.5,
        so agents throttled together come back apart) up to :data:`THROTTLE_RETRIES` times.

        Raises:
            _Gone: 410. _Stopped: the stop event was set while waiting.
            ApiException, urllib3 errors: any other failure, or the last 429.
        """
        for attempt in range(THROTTLE_RETRIES + 1):
            try:
                return self.list_fn(**kwargs)
            except ApiException as err:
                if err.status == 410:
                    raise _Gone() from None
                wait = retry_after(err)
                if wait is None or attempt == THROTTLE_RETRIES:
                    raise
                self.stats.throttled += 1
                if self.stop_event.wait(wait * (1.0 + 0.5 * random.random())):
                    raise _Stopped() from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _timeout(self, read: float) -> tuple[float, float]:
        return (self.settings.connect_timeout_seconds, read)

    def _pages(self, first: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Yield the items of a list, fetching further pages lazily (``continue``)."""
        page = first
        while True:
            yield from page.get("items") or ()
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            if self.stop_event.is_set():
                raise _Stopped()
            page = self._get_page(token)

    def _get_page(self, token: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"_preload_content": False,
                                  "_request_timeout": self._timeout(60.0 + self.settings.read_margin_seconds)}
        if self.settings.list_limit:
            kwargs["limit"] = self.settings.list_limit
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        if token:
            kwargs["_continue"] = token
        resp = self._request(kwargs)
        with self._resp_lock:
            self._resp = resp
        try:
            data = json.loads(resp.data)
        finally:
            with self._resp_lock:
                self._resp = None
            resp.release_conn()
        self._answered()
        if not isinstance(data, dict):
            raise ValueError("list response is not an object")
        # a list is replaced as a whole: a body that is no list (a Status, "{}" from a
        # misbehaving proxy) must fail, not read as "no objects" and delete them all
        kind = data.get("kind")
        items = data.get("items")
        if kind == "Status" or not isinstance(items, (list, type(None))) or (
                items is None and not (isinstance(kind, str) and kind.endswith("List"))):
            raise ValueError(f"list response is not a list (kind {kind!r}, items "
                             f"{type(items).__name__})")
        return data

    def list_once(self) -> str:
        """List the resource into the cache; return the list's resourceVersion.

        Raises:
            ApiException, urllib3 errors, ValueError: the list failed (cache untouched
            before the first page arrives).
        """
        first = self._get_page(None)
        rv = str((first.get("metadata") or {}).get("resourceVersion") or "")
        kinds = {"pods": "Pod", "nodes": "Node", "services": "Service",
                 "endpointslices": "EndpointSlice"}
        self.cache.replace(self.resource, ({**o, "kind": kinds[self.resource]}
                                           if isinstance(o, dict) and "kind" not in o else o
                                           for o in self._pages(first)))
        self.stats.lists += 1
        if self.stats.lists > 1:
            self.stats.relists += 1
        self.cache.set_synced(self.resource, True)
        log.info("listed %s at resourceVersion %s", self.resource, rv)
        return rv

    def watch_once(self, rv: str) -> str:
        """Watch from ``rv`` until the stream ends; return the last resourceVersion seen.

        Raises:
            _Gone: the server answered 410 (status or ERROR event).
            ApiException, urllib3 errors: the watch failed.
        """
        kwargs: dict[str, Any] = {
            "watch": True, "allow_watch_bookmarks": True,
            "timeout_seconds": self.settings.timeout_seconds,
            "_preload_content": False,
            "_request_timeout": self._timeout(self.settings.timeout_seconds
                                              + self.settings.read_margin_seconds),
        }
        if rv:
            kwargs["resource_version"] = rv
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        resp = self._request(kwargs)
        self.stats.watches += 1
        # not yet "answered": an API server that accepts every watch and then streams only
        # an ERROR event (etcd down, "too large resource version" after an etcd restore)
        # is failing; the streak (and its backoff) ends with the first good event or a
        # stream that ends normally, so such a resource goes unsynced and is listed again
        with self._resp_lock:
            self._resp = resp
        try:
            if self.stop_event.is_set():
                return rv
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if not line:
                    continue
                rv = self._handle_line(line, rv)
                self.resource_version = rv
                if self._failing_since is not None:
                    self._answered()
                if self.stop_event.is_set():
                    break
            else:
                self._answered()  # the server ended the watch normally (its timeout)
        except urllib3.exceptions.ReadTimeoutError:
            log.debug("watch of %s quiet for too long, watching again", self.resource)
        except (urllib3.exceptions.ProtocolError, OSError):
            if not self.stop_event.is_set():
                raise
        finally:
            with self._resp_lock:
                self._resp = None
            # close, never hand a half-read stream back to the pool: the next request on
            # that connection would read the rest of this watch, and the server would keep
            # a handler streaming into a connection nobody reads
            resp.close()
            resp.release_conn()
        return rv

    def _handle_line(self, line: str, rv: str) -> str:
        try:
            event = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            log.warning("watch of %s: skipping a line that is not JSON", self.resource)
            return rv
        if not isinstance(event, dict):
            return rv
        etype = event.get("type")
        obj = event.get("object")
        if etype == "ERROR":
            code = obj.get("code") if isinstance(obj, dict) else None
            if code == 410:
                raise _Gone()
            message = obj.get("message") if isinstance(obj, dict) else obj
            raise ApiException(status=code if isinstance(code, int) else 500,
                               reason=f"watch ERROR event: {message}")
        if not isinstance(obj, dict):
            return rv
        meta = obj.get("metadata")
        # an object whose metadata is not an object is counted as bad by the cache and
        # skipped; it must not end the watch (resumed from before it, it would come again)
        new_rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if isinstance(new_rv, bool) or not isinstance(new_rv, (str, int)):
            new_rv = None
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            self.cache.apply(self.resource, etype, obj)
            self.stats.events += 1
        elif etype == "BOOKMARK":
            pass
        else:
            self.stats.unknown_events += 1
            if str(etype) not in self.stats.unknown_types:
                self.stats.unknown_types.add(str(etype))
                log.warning("watch of %s: skipping unknown event type %r", self.resource, etype)
        return str(new_rv) if new_rv else rv

    # ---------------------------------------------------------------- loop

    def run(self) -> None:
        """Run the loop until the stop event is set. Never raises."""
        rv: str | None = None
        went_unsynced = False
        gone_backoff = 0.0  # 0 until a 410 follows a list without any event in between
        listed_events = -1  # stats.events right after the last list
        while not self.stop_event.is_set():
            try:
                if rv is None or went_unsynced:
                    rv = self.list_once()
                    self.resource_version = rv
                    went_unsynced = False
                    listed_events = self.stats.events
                started, events = time.monotonic(), self.stats.events
                rv = self.watch_once(rv)
                if time.monotonic() - started < 1.0 and self.stats.events == events:
                    # a server that closes watches at once must not make us spin
                    self.stop_event.wait(self.settings.backoff_initial_seconds)
            except _Gone:
                log.info("%s: resourceVersion %s expired (410 Gone), listing again", self.resource, rv)
                rv = None
                if self.stats.events == listed_events:
                    # the watch from a fresh list expired before a single event: relisting
                    # at once again would fetch the whole resource in a tight loop (from
                    # every node); back off as for errors
                    gone_backoff = min(max(gone_backoff * 2, self.settings.backoff_initial_seconds),
                                       self.settings.backoff_max_seconds)
                    self.stop_event.wait(gone_backoff)
                else:
                    gone_backoff = 0.0
                continue
            except Exception as err:  # noqa: BLE001 - the loop must survive any error
                if self.stop_event.is_set():
                    break
                if rv is not None and self.resource_version is not None:
                    rv = self.resource_version  # resume after the last event applied
                self.stats.errors += 1
                self.stats.last_error = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
                now = time.monotonic()
                if self._failing_since is None:
                    self._failing_since = now
                failing_for = now - self._failing_since
                if failing_for >= self.settings.unsynced_after_seconds and not went_unsynced:
                    went_unsynced = True
                    self.cache.set_synced(self.resource, False)
                    log.warning("%s: API failing for %.1f s, metadata marked unsynced",
                                self.resource, failing_for)
                log.warning("%s: %s; retrying in %.2f s", self.resource, self.stats.last_error,
                            self._backoff)
                self.stop_event.wait(self._backoff)
                self._backoff = min(self._backoff * 2, self.settings.backoff_max_seconds)

    def interrupt(self) -> None:
        """Shut down the socket of an open watch so :meth:`run` notices the stop event."""
        with self._resp_lock:
            resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # noqa: BLE001 - best effort on a socket another thread reads
                pass


class MetadataWatcher:
    """Runs one :class:`ResourceWatcher` thread per resource.

    Args:
        api_client: from :func:`agent.k8s.client.build_api_client`.
        cache: the cache to fill.
        settings: see :class:`WatchSettings`.
        resources: which resources to watch (default all four).
        pod_node: list and watch only the Pods of this node (``fieldSelector=
            spec.nodeName=NODE``, a field the API server indexes for pods:
            pkg/registry/core/pod ``NodeNameTriggerFunc``), for ``--pod-scope node``
            (docs/metadata.md, "Pod scope"); None: every Pod.
    """

    def __init__(self, api_client: client.ApiClient, cache: ClusterMetadata,
                 settings: WatchSettings | None = None,
                 resources: tuple[str, ...] = RESOURCES, pod_node: str | None = None) -> None:
        self.cache = cache
        self.settings = settings or WatchSettings()
        self.stop_event = threading.Event()
        fns = _list_functions(api_client)
        selectors = {"pods": f"spec.nodeName={pod_node}"} if pod_node else {}
        self.watchers = {r: ResourceWatcher(fns[r], r, cache, self.settings, self.stop_event,
                                            selectors.get(r))
                         for r in resources}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the threads (idempotent)."""
        if self._threads:
            return
        for name, w in self.watchers.items():
            t = threading.Thread(target=w.run, name=f"watch-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loops and join their threads (at most ``timeout`` seconds in total)."""
        self.stop_event.set()
        for w in self.watchers.values():
            w.interrupt()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def alive(self) -> bool:
        """True while every thread runs."""
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def wait_synced(self, timeout: float) -> bool:
        """Block until every watched resource is synced, or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.cache.synced()
            if all(state.get(r) for r in self.watchers):
                return True
            if self.stop_event.wait(0.05):
                return False
        return all(self.cache.synced().get(r) for r in self.watchers)
