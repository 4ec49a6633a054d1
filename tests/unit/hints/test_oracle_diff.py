"""agent.hints against the upstream code (tools/oracle) on random clusters (Hypothesis).

Each example is a random cluster: 1-4 zones; Nodes with and without the zone label, with zero,
odd or missing allocatable CPU, Ready / NotReady / Unknown / no Ready condition, control-plane
or master labelled, or with no labels at all; one Service (annotation values under the
topology-mode key, the legacy key or both: ``Auto``, ``auto``, ``Disabled``, ``disabled``,
empty, misspellings; every trafficDistribution value and invalid ones; internalTrafficPolicy
Local; NodePort with externalTrafficPolicy Local); one to three controller slices whose
endpoints are ready, not ready, serving-terminating or not-serving-terminating, carrying no
hints, their own zone, a stale zone, partial hints or node hints (1.33+, the API field's first
release); addresses repeated across and inside slices (a pod address reused while the old pod
terminates); and sometimes a slice of another manager with readiness unset, no zone and no node
name. Feature gates: random values for the gates the version lets one set, and now and then a
removed or locked gate set against its value. One example in four is a cluster fit for Auto
(every Node Ready, zoned, with CPU, not control-plane, two or more zones, up to ten endpoints a
slice, an Auto annotation two times in three, else a valid trafficDistribution; mostly the
hints the controller keeps; sometimes one more NotReady Node without a zone, whose endpoints
then have none), so that the topology cache's allocation, donation and per-zone hint code runs
(``tools/oracle/coverage.sh`` measures how much of it does).

The same input goes to the oracle of each built minor the model covers and to
``agent.hints.evaluate_cluster`` at that version and gates. Compared:

* refusals: the model raises InputError exactly when the oracle answers with an error line
  (upstream's ``featuregate`` refusal), with the same ``unrecognized feature gate`` /
  ``cannot set feature gate`` wording;
* the controller's events (type, reason, message), in order;
* the hints the controller writes per endpoint (by Pod). Order-dependent upstream: which
  receiving zone gets an endpoint that Auto donates (``redistributeHints`` iterates a Go map of
  receiving zones). For a donated endpoint (a zone hint other than its own zone, in either
  answer) only the fact that it is donated is compared, plus the number of hints per zone;
* every node's cluster and local endpoint lists and ``hasAnyEndpoints`` (``CategorizeEndpoints``
  on the input slices). Order-dependent upstream: which copy of a duplicated ``ip:port``
  kube-proxy keeps when several copies in *different* slices can replace
  (``EndpointSliceCache`` visits slices in Go map order). The model is evaluated for every
  order of the slices; on a node where those orders give different lists the oracle's must be
  one of them, elsewhere they must be equal.

The topology cache's populated mark is set the same on both sides (``hints_populated`` /
``topology_cache.populated``).

Examples per minor: ``ZONEMETER_ORACLE_EXAMPLES`` (default 400, which keeps the test under a
minute on a 2-core machine), or ``--hypothesis-profile oracle-long`` (1000 per minor). Runs are
derandomized (the same examples each time) unless ``ZONEMETER_ORACLE_SEED`` is set. Oracle
binaries: ``bash tools/oracle/build.sh MINOR`` (tools/setup.sh builds 1.31 to 1.37); every
covered minor must be built, else its test fails naming the build command.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from agent import hints
from agent.errors import InputError
from agent.hints.versions import GATES, MAX_MINOR, _gate_default
from tools.oracle import client as oc

ZONE = "topology.kubernetes.io/zone"
CP, MASTER = "node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
MODE, LEGACY = "service.kubernetes.io/topology-mode", "service.kubernetes.io/topology-aware-hints"
NS, SVC = "default", "web"
#: every minor the model claims that the oracle builds (tools/setup.sh builds them all)
COVERED = [m for m in oc.MINORS if int(m.split(".")[1]) <= MAX_MINOR]
REQUIRED = tuple(COVERED)

settings.register_profile("oracle-long", max_examples=1000)
_EXAMPLES = int(os.environ.get("ZONEMETER_ORACLE_EXAMPLES", "0")) or None
_SEED = os.environ.get("ZONEMETER_ORACLE_SEED")


def _examples() -> int:
    if _EXAMPLES:
        return _EXAMPLES
    prof = settings.get_profile(settings._current_profile or "default")
    return 1000 if prof.max_examples == 1000 else 400


# ------------------------------------------------------------------------------ the generator

ANNOTATION_VALUES = ["Auto", "auto", "Disabled", "disabled", "", "Atuo", "AUTO", "true", "PreferClose"]
TD_VALUES = [None, None, "PreferClose", "PreferSameZone", "PreferSameNode", "preferclose", "Bogus", ""]


@st.composite
def clusters(draw: st.DrawFn, minor: int) -> dict[str, Any]:
    """A random cluster: ``nodes``, ``service``, ``slices`` (API JSON), ``gates``, ``populated``."""
    # One cluster in four is fit for Auto (topologycache SetNodes/getAllocations accept it):
    # every Node Ready, zoned, with CPU, not control-plane, at least two zones, more
    # endpoints, and an Auto annotation; otherwise AddHints would almost never get past
    # getAllocations and the allocation, donation (redistributeHints) and per-zone hint
    # paths of the upstream code would go unexercised.
    fit = draw(st.integers(0, 3)) == 0
    zones = [f"z{c}" for c in "abcd"[:draw(st.integers(2 if fit else 1, 4))]]
    nodes: list[dict[str, Any]] = []
    node_zone: dict[str, str | None] = {}
    for i in range(draw(st.integers(2 if fit else 1, 6 if fit else 5))):
        name = f"n{i}"
        # now and then no label at all (topologycache hasExcludedLabels' empty-map case)
        labels: dict[str, str] = {"kubernetes.io/hostname": name} if fit or draw(st.integers(0, 5)) else {}
        if fit:
            zone: str | None = zones[i] if i < 2 else draw(st.sampled_from(zones))
        else:
            zone = draw(st.sampled_from(zones)) if draw(st.integers(0, 9)) else None
        if zone is not None:
            labels[ZONE] = zone
        if not fit and draw(st.integers(0, 9)) == 0:
            labels[draw(st.sampled_from([CP, MASTER]))] = ""
        node_zone[name] = zone
        status: dict[str, Any] = {}
        cpu = draw(st.sampled_from(["4", "2", "1", "500m", "1500m"] + ([] if fit else ["0", None])))
        if cpu is not None:
            status["allocatable"] = {"cpu": cpu}
        ready = "True" if fit else draw(st.sampled_from(["True", "True", "True", "False", "Unknown", None]))
        if ready is not None:
            status["conditions"] = [{"type": "Ready", "status": ready}]
        nodes.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                      "status": status})
    if fit and draw(st.integers(0, 3)) == 0:
        # a NotReady Node without a zone: SetNodes skips it, so the allocation succeeds, and
        # its ready endpoints have no zone (AddHints' "no zone specified" after allocating)
        node_zone["nx"] = None
        not_ready = draw(st.sampled_from(["False", "Unknown"]))
        nodes.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": "nx", "labels": {"kubernetes.io/hostname": "nx"}},
                      "status": {"allocatable": {"cpu": "2"},
                                 "conditions": [{"type": "Ready", "status": not_ready}]}})
    ann: dict[str, str] = {}
    if fit and draw(st.integers(0, 2)):
        ann[draw(st.sampled_from([MODE, MODE, LEGACY]))] = draw(st.sampled_from(["Auto", "Auto", "auto"]))
    elif not fit:
        for key in draw(st.sampled_from([(), (), (MODE,), (MODE,), (LEGACY,), (MODE, LEGACY)])):
            ann[key] = draw(st.sampled_from(ANNOTATION_VALUES))
    spec: dict[str, Any] = {"selector": {"app": SVC}, "type": "ClusterIP", "clusterIP": "10.96.0.1",
                            "clusterIPs": ["10.96.0.1"], "ipFamilies": ["IPv4"],
                            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}
    # a fit cluster without Auto runs trafficdist on clean slices
    td = draw(st.sampled_from(TD_VALUES if ann or not fit else ["PreferClose", "PreferSameZone", "PreferSameNode"]))
    if td is not None:
        spec["trafficDistribution"] = td
    if draw(st.integers(0, 4)) == 0:
        spec["internalTrafficPolicy"] = "Local"
    if draw(st.integers(0, 6)) == 0:
        spec["type"] = "NodePort"
        spec["ports"][0]["nodePort"] = 30080
        spec["externalTrafficPolicy"] = draw(st.sampled_from(["Local", "Cluster"]))
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": SVC, "namespace": NS, "uid": "uid-web", "annotations": ann}, "spec": spec}
    # addresses 10.1.0.1..pool: small pools repeat addresses
    pool = draw(st.integers(8, 30)) if fit else draw(st.integers(2, 9))
    slices: list[dict[str, Any]] = []
    pod = 0
    for s in range(draw(st.integers(1, 3))):
        eps = []
        for _ in range(draw(st.integers(0, 10 if fit else 5))):
            node = draw(st.sampled_from(sorted(node_zone)))
            state = draw(st.sampled_from(["ready", "ready", "ready", "unready", "term-serving", "term"]
                                         + ["ready"] * (6 if fit else 0)))
            serving = state in ("ready", "term-serving")
            term = state.startswith("term")
            ep: dict[str, Any] = {"addresses": [f"10.1.0.{draw(st.integers(1, pool))}"],
                                  "conditions": {"ready": serving and not term, "serving": serving,
                                                 "terminating": term},
                                  "nodeName": node,
                                  "targetRef": {"kind": "Pod", "namespace": NS, "name": f"p{pod}"}}
            pod += 1
            if node_zone[node] is not None:
                ep["zone"] = node_zone[node]
            # forNodes is in the discovery/v1 API from 1.33 (k8s.io/api EndpointHints.ForNodes);
            # an older apiserver (and the oracle's decoder) drops it
            # fit clusters carry mostly the hints the controller would keep (unchanged slices)
            h = draw(st.sampled_from(["none", "none", "own", "other", "empty"] + ["own", "own"] * fit
                                     + (["node"] * (1 + 2 * fit) if minor >= 33 else [])))
            if h == "own" and node_zone[node] is not None:
                ep["hints"] = {"forZones": [{"name": node_zone[node]}]}
            elif h == "other":
                ep["hints"] = {"forZones": [{"name": draw(st.sampled_from(zones))}]}
            elif h == "node":
                ep["hints"] = {"forZones": [{"name": node_zone[node] or zones[0]}], "forNodes": [{"name": node}]}
            elif h == "empty":
                ep["hints"] = {}
            eps.append(ep)
        slices.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                       "metadata": {"name": f"{SVC}-{s}", "namespace": NS,
                                    "labels": {"kubernetes.io/service-name": SVC,
                                               MANAGED_BY: "endpointslice-controller.k8s.io"}},
                       "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": eps})
    if draw(st.integers(0, 3)) == 0:
        eps = []
        for _ in range(draw(st.integers(1, 3))):
            ep = {"addresses": [f"10.1.0.{draw(st.integers(1, pool))}"], "conditions": {}}
            for c in ("ready", "serving", "terminating"):
                v = draw(st.sampled_from([None, True, False]))
                if v is not None:
                    ep["conditions"][c] = v
            if draw(st.booleans()):
                ep["nodeName"] = draw(st.sampled_from(sorted(node_zone)))
            if draw(st.booleans()):
                ep["zone"] = draw(st.sampled_from(zones))
            if draw(st.booleans()):
                ep["hints"] = {"forZones": [{"name": draw(st.sampled_from(zones))}]}
            eps.append(ep)
        slices.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                       "metadata": {"name": f"{SVC}-mirror", "namespace": NS,
                                    "labels": {"kubernetes.io/service-name": SVC, MANAGED_BY: "mirror.example"}},
                       "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": eps})
    gates: dict[str, bool] = {}
    for g in GATES:
        d = _gate_default(g, minor)
        if d is not None and not d[1] and draw(st.booleans()):
            gates[g] = draw(st.booleans())
    if draw(st.integers(0, 19)) == 0:  # a gate upstream refuses at this version (or accepts)
        g = draw(st.sampled_from(GATES))
        gates[g] = draw(st.booleans())
    # the populated mark lives in the topology cache, which exists only with TopologyAwareHints
    cache = gates.get("TopologyAwareHints", minor >= 36 or (_gate_default("TopologyAwareHints", minor) or (False,))[0])
    return {"nodes": nodes, "service": service, "slices": slices, "gates": gates,
            "populated": cache and draw(st.booleans())}


# ------------------------------------------------------------------------------ comparison


def _names(h: Any, key: str) -> tuple[str, ...]:
    if h is None:
        return ()
    if isinstance(h, dict):
        return tuple(sorted(x["name"] for x in h.get(key) or []))
    return tuple(sorted(h.for_zones if key == "forZones" else h.for_nodes))


def _model(c: dict[str, Any], minor: int, slices: list[dict[str, Any]]) -> hints.ServiceDiagnosis:
    (d,) = hints.evaluate_cluster(c["nodes"], [c["service"]], slices, version=f"1.{minor}",
                                  feature_gates=c["gates"], hints_populated=[f"{NS}/{SVC}"] if c["populated"] else [],
                                  strict=True)
    return d


def _lists(d: hints.ProxyDecision) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    return tuple(d.cluster_endpoints or ()), tuple(d.local_endpoints or ()), d.has_any_endpoints


def compare(c: dict[str, Any], minor: int, ans: dict[str, Any]) -> None:
    """Assert the model agrees with one oracle answer (see the module docstring)."""
    try:
        d = _model(c, minor, c["slices"])
    except InputError as err:
        assert "error" in ans, f"model refused ({err}), upstream accepted"
        for words in ("unrecognized feature gate", "cannot set feature gate"):
            assert (words in str(err)) == (words in ans["error"]), (str(err), ans["error"])
        return
    assert "error" not in ans, f"upstream refused ({ans['error']}), model accepted"
    ctl = ans["controller"]
    assert ctl.get("error") is None and not ctl.get("skipped"), ctl
    assert [e.to_json() for e in d.controller.events] == (ctl.get("events") or [])
    # hints per Pod
    zone_of: dict[str, str | None] = {}
    mine: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for s in c["slices"]:
        if s["metadata"]["labels"][MANAGED_BY] != "endpointslice-controller.k8s.io":
            continue
        for e, h in zip(s["endpoints"], d.controller.slices[s["metadata"]["name"]], strict=True):
            pod = e["targetRef"]["name"]
            zone_of[pod] = e.get("zone")
            mine[pod] = (_names(h, "forZones"), _names(h, "forNodes"))
    theirs = {e["pod"]: (_names(e["hints"], "forZones"), _names(e["hints"], "forNodes"))
              for e in ctl["endpoints"] if e["slice"] in {s["metadata"]["name"] for s in c["slices"]}}
    assert sorted(theirs) == sorted(mine)

    def donated(h: tuple[tuple[str, ...], tuple[str, ...]], pod: str) -> bool:
        return bool(h[0]) and h[0] != (zone_of[pod],)

    for pod in mine:
        if donated(mine[pod], pod) or donated(theirs[pod], pod):
            assert donated(mine[pod], pod) and donated(theirs[pod], pod), (pod, mine[pod], theirs[pod])
        else:
            assert mine[pod] == theirs[pod], (pod, mine[pod], theirs[pod])
    assert Counter(z for h in mine.values() for z in h[0]) == Counter(z for h in theirs.values() for z in h[0])
    # kube-proxy per node, over every slice order the model can see
    proxy = ans.get("proxy") or {}
    if ans.get("proxy_skipped"):
        assert not proxy
        return
    options: dict[str, set[tuple[tuple[str, ...], tuple[str, ...], bool]]] = {n: set() for n in d.proxy}
    for perm in itertools.permutations(c["slices"]):
        dp = d if list(perm) == c["slices"] else _model(c, minor, list(perm))
        for n in options:
            options[n].add(_lists(dp.proxy[n]))
    for n, ports in proxy.items():
        got = ports.get("http/TCP")
        seen = ((tuple(got["cluster"] or ()), tuple(got["local"] or ()), got["has_any"]) if got
                else ((), (), False))
        assert seen in options[n], (n, seen, sorted(options[n]))


def request(c: dict[str, Any]) -> dict[str, Any]:
    req: dict[str, Any] = {"address_type": "IPv4", "feature_gates": c["gates"], "nodes": c["nodes"],
                           "service": c["service"], "endpoint_slices": c["slices"], "proxy_nodes": "all",
                           "proxy_slices": "input", "owner_refs": "add-missing"}
    if c["populated"]:
        req["topology_cache"] = {"IPv4": {"populated": True}}
    return req


# ------------------------------------------------------------------------------ the tests

_ORACLES: dict[str, oc.Oracle] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_oracles():  # type: ignore[no-untyped-def]
    yield
    for o in _ORACLES.values():
        o.close()
    _ORACLES.clear()


def test_every_covered_oracle_is_built() -> None:
    missing = [m for m in REQUIRED if not oc.binary(m).is_file()]
    assert not missing, "oracle not built for " + ", ".join(missing) + "; run: " + \
        " && ".join(f"bash tools/oracle/build.sh {m}" for m in missing)


@pytest.mark.parametrize("minor", COVERED)
def test_model_agrees_with_upstream(minor: str) -> None:
    if not oc.binary(minor).is_file():
        pytest.fail(f"oracle for {minor} not built; run: bash tools/oracle/build.sh {minor}")
    m = int(minor.split(".")[1])
    count = [0]

    @settings(max_examples=_examples(), deadline=None, database=None, derandomize=_SEED is None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @seed(int(_SEED or 0))
    @given(clusters(m))
    def check(c: dict[str, Any]) -> None:
        count[0] += 1
        note("request: " + json.dumps(request(c), sort_keys=True))
        o = _ORACLES.get(minor) or _ORACLES.setdefault(minor, oc.Oracle(minor))
        ans = o.ask_raw(request(c))
        if "error" in ans:
            # The oracle's gate reset replays refused gate names on the next request
            # (README: "gates set by an earlier request are put back to their default
            # first"), so every later request fails; a fresh process starts clean.
            _ORACLES.pop(minor).close()
        compare(c, m, ans)

    check()
    print(f"oracle diff {minor}: {count[0]} examples agree")  # shown with pytest -s
