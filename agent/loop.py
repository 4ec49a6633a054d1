"""AgentLoop: one node's interval work (endpoints, hints, drain, attribute, export).

Per interval (docs/agent.md)::

    metadata changed?  -> Service ports, local endpoints -> Datapath.set_service_ports,
                          Datapath.set_local_endpoints
    dirty Services     -> HintModel.refresh (evaluate_cluster on those only; all on node changes)
    Datapath.drain()   -> Attributor.attribute(deltas, at) -> close_interval(at)
                       -> HookCoverage.add(counted bytes, Datapath.interface_bytes())
    Checkpointer.save(Attributor.state(), Datapath.handover())        (with a checkpoint)
    AttributionTotals + HintModel.localities() + datapath stats + synced state -> ExportSnapshot
    Exporter.update(snapshot)                                  (served on /metrics, /flows)
    Datapath.commit()  (the drained kernel table is emptied only now; with a checkpoint)

No threads and no signals here (testable); ``zonemeter agent`` (:mod:`agent.cli.agent`)
drives it. This loop is the one place that catches every exception: a failing stage is
logged once per error type and the interval goes on with what it has.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent.attribution import Attributor
from agent.checkpoint import Checkpoint, Checkpointer, crash_point
from agent.datapath import HandOver, TableStats
from agent.datapath.cgroup import PodCgroupOrder
from agent.datapath.coverage import (
    ONE_WAY_RATIO,
    STARVED_RATIO,
    WINDOW_SECONDS,
    HookCoverage,
    InterfaceCounters,
    off_node_bytes,
    tcp_packets,
)
from agent.errors import InputError
from agent.exporter import Exporter, ExportSnapshot
from agent.exporter.shard import DEFAULT_REPLICAS, LocalityShard
from agent.hints import HintModel
from agent.k8s import MetadataAdapter
from agent.k8s.cache import ClusterMetadata
from agent.logs import LogOnce
from agent.records import AttributionTotals, CoverageState, FlowDelta, IPAddress, Locality, ServiceRef

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_INTERVAL", "AgentLoop", "DatapathLike", "HeapFreezer", "TickResult",
           "build_snapshot", "datapath_info", "restore_attributor"]

DEFAULT_INTERVAL = 10.0
#: seconds between two Service port syncs of :meth:`AgentLoop.poll_metadata` (a full
#: recount takes about 5 ms at 10,000 Services after any Service or EndpointSlice change)
PORTS_POLL_SECONDS = 1.0


class DatapathLike(Protocol):
    """What the loop needs from :class:`agent.datapath.Datapath` (a fake in unit tests)."""

    def set_local_endpoints(self, endpoints: Iterable[tuple[IPAddress | str, int, int]]) -> None:
        """Replace the kernel's local endpoint set."""
        ...

    def set_service_ports(self, ports: Iterable[int]) -> None:
        """Replace the set of ports some Service in the cluster uses."""
        ...

    def drain(self) -> list[FlowDelta]:
        """Flow deltas counted since the previous drain."""
        ...

    def stats(self) -> Any:
        """``DatapathStats``: ``attached`` names, ``table`` (TableStats), ``endpoints``."""
        ...

    def interface_bytes(self) -> Mapping[int, InterfaceCounters]:
        """What each hooked interface carried between the two latest drains."""
        ...


class HeapFreezer:
    """Keeps the cyclic garbage collector off the agent's long-lived heap (CPython ``gc``).

    The metadata cache of a large cluster is over a million tracked objects (150,000 pods:
    bench/bench_agent.py), and a full collection traverses all of them: 1..3 s of CPU every
    few intervals, more than the intervals' own work. After each interval the objects made
    since the last freeze are collected (``gc.collect()``, which skips the permanent
    generation, so it traverses one interval's new objects only) and the survivors go to
    the permanent generation (``gc.freeze()``: collections skip them; reference counting
    still frees them). Collecting first matters: ``gc.freeze()`` moves *every* tracked
    object, garbage cycles not collected yet included (the watch threads' HTTP responses,
    exceptions with their tracebacks), and a frozen cycle is never reclaimed until the next
    full collection: frozen each interval, such garbage grew the agent by hundreds of MiB
    per hour (bench/chaos.py). Every ``full_every`` seconds everything is unfrozen and
    collected once, so that cycles formed among frozen objects later are reclaimed too (the
    agent's records hold none: they are freed by reference counting).

    Args:
        full_every: seconds between full collections.
        clock: monotonic seconds.
    """

    def __init__(self, full_every: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.full_every = full_every
        self._clock = clock
        self._last_full = clock()
        #: full collections run so far
        self.full_collections = 0

    def after_interval(self) -> None:
        """Collect the interval's new objects (everything, when a full collection is due),
        then freeze what survived."""
        now = self._clock()
        if now - self._last_full >= self.full_every:
            gc.unfreeze()
            gc.collect()
            self._last_full = now
            self.full_collections += 1
        else:
            gc.collect()
        gc.freeze()


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one interval did (for logs and tests).

    Attributes:
        at: Unix seconds the drain was attributed at.
        deltas: flow deltas drained.
        bytes: L3 bytes in them.
        services_evaluated: Services the hint model re-evaluated.
        endpoints_changed: the local endpoint set was rewritten.
        duration_seconds: wall time of the interval's work.
    """

    at: float
    deltas: int
    bytes: int
    services_evaluated: int
    endpoints_changed: bool
    duration_seconds: float


class AgentLoop:
    """One node's interval work, without threads or signals (testable).

    Args:
        node: this node's name.
        datapath: the loaded datapath (or a fake with the same three methods).
        cache: the metadata cache.
        hints: the hint model over ``cache``.
        exporter: where snapshots go.
        interval: the configured interval, seconds (exported in ``/flows``).
        clock: Unix seconds (``at`` of each drain); perf: a monotonic clock for durations.
        top_n: pair rows published per interval for ``/flows``.
        hold_unresolved_seconds: see ``Attributor``.
        series_retention: seconds; see ``Attributor`` (0: series never expire).
        monotonic: the clock ``series_retention`` is measured on (monotonic seconds).
        checkpoint: where the totals are made durable after each drain (None: nowhere).
            With a datapath that has ``resume``/``handover``/``commit``
            (:class:`agent.datapath.Datapath`), a drained kernel table is emptied only
            after the checkpoint that includes it was written (docs/datapath.md).
        restore: the checkpoint ``checkpoint.load()`` returned: counters continue from it
            (a malformed one is discarded, counted and logged; the loop starts from zero).
        locality_replicas: ring owners per Service of the locality series
            (:class:`agent.exporter.shard.LocalityShard`; 0: every Service).
        heap: what to do with the garbage collector after each interval (the agent
            passes a :class:`HeapFreezer`); None: nothing.
        agent_pod: this agent's own pod ``(namespace, name)`` (the DaemonSet's
            ``POD_NAMESPACE``/``POD_NAME``): the ring holds the nodes where a pod of its
            workload runs (:meth:`ClusterMetadata.workload_nodes`), so no Service is owned
            only by nodes without an agent (Windows or virtual nodes, nodes the DaemonSet's
            pod cannot start on). None, or while the pod is not cached: every Node.
    """

    def __init__(self, node: str, datapath: DatapathLike, cache: ClusterMetadata, hints: HintModel,
                 exporter: Exporter, *, interval: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.time,
                 perf: Callable[[], float] = time.perf_counter, top_n: int = 50,
                 hold_unresolved_seconds: float = 0.0, series_retention: float = 0.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 checkpoint: Checkpointer | None = None, restore: Checkpoint | None = None,
                 locality_replicas: int = DEFAULT_REPLICAS,
                 agent_pod: tuple[str, str] | None = None,
                 heap: HeapFreezer | None = None) -> None:
        self.node = node
        self.heap = heap
        self.shard = LocalityShard(node, locality_replicas)
        self.agent_pod = agent_pod
        self.datapath = datapath
        self.cache = cache
        self.hints = hints
        self.exporter = exporter
        self.interval = interval
        self._clock = clock
        self._perf = perf
        self.hold_unresolved_seconds = hold_unresolved_seconds
        #: the datapath counts at the node's sockets (cgroup hook): host-network endpoints
        #: go into its endpoint map and are counted here as server (docs/attribution.md)
        self.sockets_seen = getattr(datapath, "hook", "veth") == "cgroup"
        root = getattr(datapath, "cgroup_root", None) if self.sockets_seen else None
        #: the cgroup hook's pod ids ordered by their containers (docs/datapath.md)
        self.pod_cgroup_order = PodCgroupOrder(root) if isinstance(root, str) else None
        self.attributor = Attributor(node, MetadataAdapter(cache, self.pod_cgroup_order), hints,
                                     top_n=top_n,
                                     hold_unresolved_seconds=hold_unresolved_seconds,
                                     series_retention=series_retention, clock=monotonic,
                                     sockets_seen=self.sockets_seen)
        self._endpoints: frozenset[tuple[IPAddress, int, int]] | None = None
        self._entries: frozenset[tuple[IPAddress, int, int]] | None = None
        self._scope_gen = (-1, -1)  # pods and nodes generations of the last pod-scope check
        self._service_ports: frozenset[int] | None = None
        self._monotonic = monotonic
        self._listed = False  # the metadata was fully listed once (_waiting_for_metadata)
        self._unlisted_since: float | None = None
        self._ports_polled_at = -PORTS_POLL_SECONDS  # poll_metadata's last Service port sync
        self._first = True
        self._once = LogOnce(log)
        self.coverage = HookCoverage()
        self.ticks = 0
        self.checkpoint = checkpoint
        self._unsaved = False  # a checkpoint failed: the drained table is still pending
        self._uncommitted = False  # saved, but emptying the drained table failed
        if checkpoint is not None:
            discarded = sum(checkpoint.discarded.values())
            handover = restore_attributor(self.attributor, checkpoint, restore)
            if restore is not None and restore.coverage and \
                    sum(checkpoint.discarded.values()) == discarded:  # not discarded just now
                self.coverage.restore(*restore.coverage)
            resume = getattr(datapath, "resume", None)
            if resume is not None:
                resume(handover)

    def log_once(self, key: str, msg: str, *args: object, exc: BaseException | None = None) -> None:
        """Log an error of the loop once per ``key`` (e.g. ``"drain:" + error type``)."""
        self._once(key, logging.ERROR, msg, *args, exc=exc)

    def sync_endpoints(self) -> bool:
        """Write this node's local endpoints, and the ports the cluster's Services use
        (``Datapath.set_service_ports``), to the datapath when they changed; nothing is
        written before the EndpointSlices were listed once (the kernel keeps its set).

        Returns:
            True when the set was rewritten.
        """
        if self._endpoints is None and not self.cache.synced().get("endpointslices"):
            # EndpointSlices never listed (API down at start, a list that failed half way):
            # the cache's set is empty or partial. The kernel's set is better: with pinned
            # maps it is the previous agent's, which keeps classifying Service traffic;
            # overwriting it would count this node's Service bytes as workload bytes for
            # the whole outage.
            return False
        self._sync_entries()
        self.sync_service_ports()
        # memoized per slice/node generation
        eps = self.cache.local_endpoints(self.node, host_network=self.sockets_seen)
        if eps == self._endpoints:
            return False
        try:
            self.datapath.set_local_endpoints(eps)
        except InputError as err:  # e.g. more endpoints than endpoint_capacity
            self.log_once("endpoints", "cannot write local endpoints: %s", err)
            return False
        self._endpoints = eps
        log.info("local endpoints updated", extra={"fields": {"endpoints": len(eps)}})
        return True

    def _sync_entries(self) -> None:
        """Write this node's entry points (the first hop of node ports, docs/datapath.md)
        to a datapath that counts them (``set_entry_points``) when they changed; not before
        Services and Nodes were listed once (the kernel keeps the previous agent's set)."""
        put = getattr(self.datapath, "set_entry_points", None)
        if put is None:
            return
        synced = self.cache.synced()
        if self._entries is None and not (synced.get("services") and synced.get("nodes")):
            return
        entries = self.cache.entry_points(self.node)  # memoized per Service/Node generation
        if entries == self._entries:
            return
        try:
            put(entries)
        except InputError as err:
            self.log_once("entries", "cannot write entry points: %s", err)
            return
        self._entries = entries
        log.info("entry points updated", extra={"fields": {"entries": len(entries)}})

    def check_pod_scope(self) -> list[str]:
        """``--pod-scope node``: log each problem of
        :meth:`agent.k8s.cache.ClusterMetadata.pod_scope_problems` once (a pod of this node
        outside its podCIDRs: other nodes' pods may resolve to the wrong node and zone);
        checked when this node's pods or the Nodes changed since the last call.

        Returns:
            the problems found by this call (empty when nothing changed).
        """
        gen = (self.cache.generation("pods"), self.cache.generation("nodes"))
        if gen == self._scope_gen or not self.cache.synced().get("pods"):
            return []
        self._scope_gen = gen
        problems = self.cache.pod_scope_problems()
        for p in problems:
            self._once("pod-scope:" + p, logging.WARNING, "--pod-scope node: %s (docs/metadata.md, "
                       "Pod scope)", p)
        return problems

    def sync_service_ports(self) -> bool:
        """Write the ports the cluster's Services use (``ClusterMetadata.service_ports``)
        to the datapath when they changed, once the EndpointSlices were listed: where the
        kernel keeps a port that may be a late UDP or SCTP endpoint's (docs/datapath.md,
        "Late endpoints"). Cheap when nothing changed (memoized per generation).

        Returns:
            True when the set was rewritten.
        """
        if self._service_ports is None and not self.cache.synced().get("endpointslices"):
            return False  # a partial list would clear the previous agent's pinned ports
        ports = self.cache.service_ports()
        if ports == self._service_ports:
            return False
        try:
            self.datapath.set_service_ports(ports)
        except InputError as err:
            self.log_once("service-ports", "cannot write Service ports: %s", err)
            return False
        self._service_ports = ports
        return True

    def refresh_hints(self, at: float | None = None) -> int:
        """Re-evaluate the hint model for Services that changed (all on the first call).

        Args:
            at: Unix seconds the hint model stamps on locality changes (``last_change``);
                None: the model's own clock.

        Returns:
            Services evaluated.
        """
        dirty = self.cache.take_dirty()
        if self._first:
            self._first = False
            return self.hints.refresh(None, at=at)
        if dirty.all or dirty.services:
            return self.hints.refresh(dirty, at=at)
        return 0

    def tick(self) -> TickResult:
        """Run one interval: endpoints, hints, drain, attribute, export.

        Never raises for a failing stage: a drain error is logged (once per error type) and
        the interval exports what it has; the bytes stay in the kernel table for the next
        drain when the failure happened before the table swap.
        """
        t0 = self._perf()
        changed = False
        evaluated = 0
        try:
            changed = self.sync_endpoints()
        except Exception as err:  # noqa: BLE001 - the agent never dies on one bad object
            self.log_once("sync:" + type(err).__name__, "endpoint sync failed", exc=err)
        self.check_pod_scope()
        at = self._clock()
        try:
            evaluated = self.refresh_hints(at)
        except Exception as err:  # noqa: BLE001
            self.log_once("hints:" + type(err).__name__, "hint model failed", exc=err)
        deltas: list[FlowDelta] = []
        if self._waiting_for_metadata():
            # a restarted agent whose metadata was never listed (an API outage): what the
            # kernel counts stays in the pinned tables (overflow entries when full: still
            # exact) rather than being attributed with an empty cache, where every Service
            # byte would be endpoint_without_service and every peer unknown
            duration = self._perf() - t0
            self.exporter.update(self.snapshot(self.attributor.totals(), at, duration))
            self.ticks += 1
            return TickResult(at, 0, 0, evaluated, changed, duration)
        if self._unsaved:  # the previous checkpoint failed: its table waits in the kernel
            self._persist()
        elif self._uncommitted:  # saved, not emptied: the datapath drains nothing before
            self._commit()
        try:
            deltas = self.datapath.drain()
        except Exception as err:  # noqa: BLE001
            self.log_once("drain:" + type(err).__name__, "drain failed", exc=err)
        else:
            self._measure_coverage(at, deltas)
        crash_point("after_read")
        try:
            self.attributor.attribute(deltas, at)
            self.attributor.close_interval(at)
        except Exception as err:  # noqa: BLE001 - a bug, not bad input: the next interval goes on
            self.log_once("attribute:" + type(err).__name__, "attribution failed", exc=err)
        totals = self.attributor.totals()
        saved = self._save() if self.checkpoint is not None else False
        duration = self._perf() - t0
        self.exporter.update(self.snapshot(totals, at, duration))
        if saved:
            crash_point("after_checkpoint")
            self._commit()
        self.ticks += 1
        nbytes = sum(d.bytes for d in deltas)
        n = len(deltas)
        del deltas
        if self.heap is not None:
            self.heap.after_interval()
        return TickResult(at, n, nbytes, evaluated, changed, duration)

    def _waiting_for_metadata(self) -> bool:
        """True while the drain waits for this agent's first full metadata list: only with
        a checkpoint (the kernel keeps what it counts for this agent), and for at most
        ``hold_unresolved_seconds`` after the first tick that waited (then the agent
        attributes with what it has, as without a checkpoint)."""
        if self._listed or self.checkpoint is None:
            return False
        if all(self.cache.synced().values()):
            self._listed = True
            return False
        now = self._monotonic()
        if self._unlisted_since is None:
            self._unlisted_since = now
            log.warning("metadata never listed yet: the drain waits for it (at most %.0f s); "
                        "the kernel keeps counting", self.hold_unresolved_seconds)
        if now - self._unlisted_since < self.hold_unresolved_seconds:
            return True
        self._listed = True  # waited long enough: as without a checkpoint from now on
        return False

    def _save(self) -> bool:
        """Write the checkpoint of the current totals; False (logged once) when it failed:
        then the drained kernel table stays until a later checkpoint succeeds."""
        assert self.checkpoint is not None
        handover = getattr(self.datapath, "handover", None)
        try:
            ho = handover() if handover is not None else None
            cov = self.coverage.state()
            self.checkpoint.save(self.attributor.state(), None if ho is None else
                                 {"pins_id": ho.pins_id, "folded": list(ho.folded)},
                                 (cov.counted_bytes, cov.carried_bytes, cov.unseen_bytes))
        except Exception as err:  # noqa: BLE001 - disk full or read-only: keep counting
            self._unsaved = True
            self.log_once("checkpoint:" + type(err).__name__, "checkpoint failed: %s; drained "
                          "tables stay in the kernel until one succeeds", err)
            return False
        self._unsaved = False
        return True

    def _commit(self) -> None:
        """Let the datapath empty the table the saved checkpoint includes."""
        commit = getattr(self.datapath, "commit", None)
        if commit is None:
            return
        try:
            commit()
        except Exception as err:  # noqa: BLE001 - the side stays pending: retried next tick
            self._uncommitted = True
            self.log_once("commit:" + type(err).__name__, "emptying the drained table failed",
                          exc=err)
        else:
            self._uncommitted = False

    def _persist(self) -> None:
        """Retry a failed checkpoint, then the commit it allows."""
        if self._save():
            self._commit()

    def _measure_coverage(self, at: float, deltas: list[FlowDelta]) -> None:
        """Fold the drain into the hook coverage; log when the hook starts and stops being
        starved (docs/datapath.md, "Interface counters"). On the cgroup hook only the
        bytes of peers off the node are compared (with the uplinks' counters)."""
        was = self.coverage.state().starved
        try:
            if self.sockets_seen:
                counted = off_node_bytes(deltas, self.node, self.cache.node_of)
            else:  # the uplinks' first hops of node ports crossed no hooked veth
                counted = sum(d.bytes for d in deltas if not d.is_entry)
            st = self.coverage.add(at, counted, self.datapath.interface_bytes(), tcp_packets(deltas))
        except Exception as err:  # noqa: BLE001 - coverage is health, never worth an interval
            self.log_once("coverage:" + type(err).__name__, "interface counters failed", exc=err)
            return
        if st.starved and not was:
            hook = "cgroup" if self.sockets_seen else "veth"
            if st.tcp_direction_ratio < ONE_WAY_RATIO:
                log.warning("hook coverage low: our programs counted TCP packets in one direction "
                            "only in the last %.0f s (%.4f of the other); a data plane is moving "
                            "the other direction past the hook and past the interfaces' counters "
                            "(bpf_redirect_peer into pods: run --hook cgroup; docs/datapath.md, "
                            "Interface counters)", WINDOW_SECONDS, st.tcp_direction_ratio,
                            extra={"fields": {"tcp_direction_ratio": round(st.tcp_direction_ratio, 6),
                                              "threshold": ONE_WAY_RATIO, "hook": hook}})
            else:
                if self.sockets_seen:
                    what = ("the node's uplinks carried in the last %.0f s for peers off the "
                            "node; sockets are not all under the hook's cgroup (check "
                            "--cgroup-root: the host's cgroup2 root, not the container's), or "
                            "the node forwards much traffic (a NodePort hop; docs/datapath.md, "
                            "Interface counters)")
                else:
                    what = ("the hooked interfaces carried in the last %.0f s; a data plane is "
                            "moving packets past the hook (try --attach tcx, or --hook cgroup; "
                            "docs/datapath.md, Hooks)")
                log.warning("hook coverage low: our programs counted %.0f%% of the L3 bytes " + what,
                            100 * st.ratio, WINDOW_SECONDS,
                            extra={"fields": {"ratio": round(st.ratio, 4), "threshold": STARVED_RATIO,
                                              "hook": hook}})
        elif was and not st.starved and (st.ratio == st.ratio  # recovered (not NaN: idle)
                                         or st.tcp_direction_ratio == st.tcp_direction_ratio):
            log.info("hook coverage recovered", extra={"fields": {
                "ratio": round(st.ratio, 4), "tcp_direction_ratio": round(st.tcp_direction_ratio, 6)}})

    def flush_held(self) -> int:
        """Count every held delta now, as it resolves now (``unknown`` with its reason if
        still unresolved), and export. Called once at shutdown after the final tick: held
        bytes must not die with the process.

        The Attributor releases a held delta when ``hold_unresolved_seconds`` have passed
        since its drain; this passes it a time that far past the newest drain, so every
        held delta is final. Each is still resolved as of its own drain time.

        Returns:
            bytes that were held.
        """
        held = self.attributor.totals().held_bytes
        if not held or self.checkpoint is not None:  # a checkpoint keeps held deltas
            return 0
        at = self._clock()
        self.attributor.attribute((), at + self.hold_unresolved_seconds + 1.0)
        self.attributor.close_interval(at)
        self.exporter.update(self.snapshot(self.attributor.totals(), at, 0.0))
        return held

    def poll_metadata(self, poll: Callable[[Callable[[], object]], bool]) -> bool:
        """Apply a metadata change that arrives as a whole (a rewritten ``--snapshot``).

        ``poll(before_apply)`` (``MetadataSource.poll_snapshot``) calls ``before_apply``
        just before it changes the cache; that is a full :meth:`tick`, so every byte the
        kernel counted before the change is drained and attributed with the metadata of
        its time (a deleted pod's last bytes to that pod, not to a pod that reuses its
        address). After the change the local endpoints are rewritten to the kernel map
        and the dirty Services re-evaluated at once, not at the next interval.

        Between changes, the cluster's Service ports are written when the watch changed
        them (:meth:`sync_service_ports`, at most every :data:`PORTS_POLL_SECONDS`): within
        a second, not an interval.

        Returns:
            True when the metadata changed.
        """
        if not poll(self.tick):
            now = self._monotonic()
            if now - self._ports_polled_at >= PORTS_POLL_SECONDS:
                self._ports_polled_at = now
                try:
                    self.sync_service_ports()
                except Exception as err:  # noqa: BLE001 - the next tick retries
                    self.log_once("ports:" + type(err).__name__, "Service port sync failed",
                                  exc=err)
            return False
        try:
            self.sync_endpoints()
            self.refresh_hints()
        except Exception as err:  # noqa: BLE001 - the next tick retries both
            self.log_once("reload:" + type(err).__name__, "applying a metadata change failed",
                       exc=err)
        return True

    def ring_nodes(self) -> frozenset[str]:
        """The nodes the locality ring is made of: those running an agent of this agent's
        workload when its pod is known and cached (see ``agent_pod``), else every Node (so
        always with ``--pod-scope node``, whose cache holds one node's pods)."""
        if self.agent_pod is not None and self.shard.replicas and not self.cache.settings.pod_node:
            nodes = self.cache.workload_nodes(*self.agent_pod)
            if nodes:
                return nodes
            if self.cache.synced().get("pods"):
                self._once("ring", logging.WARNING, "locality ring: pod %s/%s (POD_NAMESPACE, "
                           "POD_NAME) is not among the cluster's running pods: the ring holds "
                           "every Node", *self.agent_pod)
        return self.cache.node_names()

    def snapshot(self, totals: AttributionTotals, at: float, duration: float) -> ExportSnapshot:
        """The :class:`ExportSnapshot` of ``totals``, the hint model's locality and self-health."""
        try:
            st = self.datapath.stats()
            table: TableStats | None = st.table
            attached = len(st.attached)
        except Exception as err:  # noqa: BLE001
            self.log_once("stats", "datapath stats failed", exc=err)
            table, attached = None, 0
        locality = self.shard.select(self.hints.localities(), self.ring_nodes(),
                                     active_services(totals))
        return build_snapshot(totals, locality=locality, table=table, attached=attached,
                              synced=self.cache.synced(), duration=duration, at=at,
                              interval=self.interval, coverage=self.coverage.state(),
                              hint_model=self.hints.model_info(self.node),
                              datapath=datapath_info(self.datapath),
                              checkpoint_discarded=(self.checkpoint.discarded
                                                    if self.checkpoint is not None else None))


def datapath_info(datapath: object) -> tuple[str, str, str]:
    """``(hook, attach, requested)`` of a datapath for ``zonemeter_datapath_info``: the hook
    it counts on (``veth``/``cgroup``), how it attached (``tcx``/``clsact``/``cgroup``) and
    the ``--hook`` it was given (``veth``/``cgroup``/``auto``); ``unknown`` for what a
    datapath without these attributes (a test fake) does not say."""
    config = getattr(datapath, "config", None)
    return (str(getattr(datapath, "hook", "unknown")), str(getattr(datapath, "attach_mode", "unknown")),
            str(getattr(config, "hook", "unknown")))


def active_services(totals: AttributionTotals) -> set[ServiceRef]:
    """The Services ``totals`` holds bytes of (service, entry, hint-ignored and client-path
    series)."""
    out: set[ServiceRef] = set()
    for series in (totals.service_bytes, totals.service_entry_bytes, totals.hint_ignored_bytes,
                   totals.client_path_bytes):
        out.update(ServiceRef(k.namespace, k.service) for k in series)
    return out


def build_snapshot(totals: AttributionTotals, *, locality: Mapping[ServiceRef, Locality] | None = None,
                   table: TableStats | None, attached: int, synced: Mapping[str, bool],
                   duration: float, at: float, interval: float,
                   coverage: CoverageState | None = None,
                   hint_model: tuple[str, str, str, str] | None = None,
                   datapath: tuple[str, str, str] | None = None,
                   checkpoint_discarded: Mapping[str, int] | None = None) -> ExportSnapshot:
    """The :class:`ExportSnapshot` of one interval: the totals and locality as their stages
    produced them, plus self-health (docs/metrics.md says where each byte goes).

    Args:
        totals: the Attributor's totals (cumulative bytes).
        locality: the hint model's ``{ServiceRef: Locality}`` (``HintModel.localities()``).
        table: flow table health, or None when unavailable.
        attached: interfaces with the datapath attached.
        synced: ``{resource: synced}``.
        duration: seconds the interval's work took.
        at: Unix seconds of the drain.
        interval: configured interval, seconds.
        coverage: hook coverage (:class:`agent.datapath.coverage.HookCoverage`).
        hint_model: ``HintModel.model_info(node)``: (kubernetes_version,
            kube_proxy_version, source, kube_proxy_source), or None.
        datapath: :func:`datapath_info` of the node's datapath, or None.
        checkpoint_discarded: ``Checkpointer.discarded`` (``{reason: count}``), or None
            without a checkpoint.
    """
    return ExportSnapshot(
        totals=totals,
        locality=locality or {},
        flow_table_entries=table.entries if table else 0,
        flow_table_capacity=table.capacity if table else 0,
        attached_interfaces=attached,
        collector_duration_seconds=duration,
        metadata_synced=synced,
        generated_at=at,
        interval_seconds=interval,
        coverage=coverage or CoverageState(),
        hint_model=hint_model,
        datapath=datapath,
        checkpoint_discarded=checkpoint_discarded or {},
    )


def restore_attributor(attributor: Attributor, checkpoint: Checkpointer,
                       restore: Checkpoint | None) -> HandOver | None:
    """Load ``restore`` (a checkpoint read by ``checkpoint.load()``) into ``attributor``.

    Returns:
        its kernel hand-over marker, or None (no checkpoint, or one without a marker, or
        one whose attribution state is malformed: then discarded as ``corrupt``, logged
        once and counted, and the attributor is left at zero).
    """
    if restore is None:
        return None
    try:
        attributor.restore(restore.attribution)
    except ValueError as err:
        checkpoint.discard("corrupt", str(err))
        return None
    ho = restore.handover
    if ho is None:
        return None
    return HandOver(int(ho["pins_id"]), (int(ho["folded"][0]), int(ho["folded"][1])))
