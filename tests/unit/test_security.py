"""Security properties of the agent (docs/security.md), checked on the code itself.

* exposition: label values from the cluster (quotes, backslashes, newlines, unicode) are
  escaped, so a namespace or Service name cannot forge a series or break the format;
* per-Service series never carry an IP address or a pod name, for any traffic mix;
* the agent reads only pods, nodes, services and endpointslices, with list/watch;
* the BPF programs are compiled from the installed ``bpf/`` files only, with ``-D``
  options built from integers, never from names the cluster or a flag supplies;
* nothing in ``agent/`` starts a process.
"""

from __future__ import annotations

import ast
import ipaddress
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent import datapath
from agent.attribution import Attributor
from agent.errors import InputError
from agent.exporter import (
    AttributionTotals,
    Exporter,
    ExportSnapshot,
    HintIgnoredKey,
    Locality,
    ServiceBytesKey,
    ServiceRef,
    WorkloadBytesKey,
)
from agent.loop import build_snapshot
from tests.unit.attribution.cluster import Model, build, objects
from tests.unit.attribution.test_join_properties import conns

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent"
T0 = 1_764_470_000.0

# --------------------------------------------------------------------------- exposition escaping

HOSTILE = st.text(alphabet=st.sampled_from(list('ab"\\\n\r\t{}=,# é日\u2028\x00')), min_size=0, max_size=12)


@settings(max_examples=300, deadline=None)
@given(HOSTILE, HOSTILE, HOSTILE, HOSTILE)
def test_label_values_from_the_cluster_are_escaped(ns: str, svc: str, zone: str, reason: str) -> None:
    snap = ExportSnapshot(
        totals=AttributionTotals(
            service_bytes={ServiceBytesKey(ns, svc, "80", zone, "b", "cross_zone", "request"): 7},
            hint_ignored_bytes={HintIgnoredKey(ns, svc, zone, "b"): 3},
            workload_bytes={WorkloadBytesKey(ns, svc, "Deployment", zone, "b", "pod", "cross_zone", "egress"): 5},
            unattributed_bytes={reason: 11}),
        locality={ServiceRef(ns, svc): Locality("topology-mode", reason, {zone: True}, 0.0)})
    exp = Exporter()
    exp.update(snap)
    text = generate_latest(exp.registry()).decode()
    # every non-comment line is one sample: a newline in a value cannot start a new series
    samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    expected = {"zonemeter_service_bytes_total": 7, "zonemeter_service_hint_ignored_bytes_total": 3,
                "zonemeter_service_locality_in_effect": 1, "zonemeter_service_locality_info": 1,
                "zonemeter_workload_bytes_total": 5, "zonemeter_unattributed_bytes_total": 11}
    # the known unattributed reasons are exported at 0 beside the one counted: take that one
    parsed = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples
              if not (s.name == "zonemeter_unattributed_bytes_total" and s.value == 0)}
    for name, value in expected.items():
        assert parsed[name].value == value

    def want(v: str) -> str:
        return v or "unknown"

    assert parsed["zonemeter_service_bytes_total"].labels["namespace"] == want(ns)
    assert parsed["zonemeter_service_bytes_total"].labels["service"] == want(svc)
    assert parsed["zonemeter_service_bytes_total"].labels["client_zone"] == want(zone)
    assert parsed["zonemeter_service_locality_info"].labels["reason"] == want(reason)
    assert parsed["zonemeter_unattributed_bytes_total"].labels["reason"] == want(reason)
    assert sum(1 for ln in samples if ln.startswith("zonemeter_service_bytes_total{")) == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_hostile_labels() -> None:
    ns, svc = 'x"} evil{a="1', "a\\b\nzonemeter_fake 1"
    exp = Exporter()
    exp.update(ExportSnapshot(totals=AttributionTotals(
        service_bytes={ServiceBytesKey(ns, svc, "80", "a", "b", "cross_zone", "request"): 1})))
    text = generate_latest(exp.registry()).decode()
    assert "\nzonemeter_fake 1" not in text
    # promtool reads the exposition itself; only lint findings (not parse errors) may remain
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert "error while linting" not in proc.stderr and "text format parsing error" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- no IPs, no pod names

def _identities(o: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(every address literal in the cluster objects, every pod name)."""
    addrs: set[str] = set()
    for n in o["nodes"]:
        addrs |= {a["address"] for a in n["status"].get("addresses", []) if a["type"] != "Hostname"}
    for p in o["pods"]:
        addrs |= {i["ip"] for i in p["status"].get("podIPs", [])}
    for s in o["services"]:
        addrs |= set(s["spec"].get("clusterIPs") or [])
    for sl in o["slices"]:
        for e in sl.get("endpoints") or []:
            addrs |= set(e.get("addresses") or [])
    return addrs, {p["metadata"]["name"] for p in o["pods"]}


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value.split("%")[0])
    except ValueError:
        return False
    return True


@settings(max_examples=100, deadline=None)
@given(st.lists(conns(), min_size=1, max_size=25))
def test_service_series_never_carry_ips_or_pod_names(cs: list[Any]) -> None:
    o = objects()
    meta, hints = build(o)
    model = Model(meta, o)
    for c in cs:
        model.send(c)
    addrs, pod_names = _identities(o)
    checked = 0
    for node in ("n1", "n2", "n3"):
        a = Attributor(node, meta, hints)
        a.attribute(model.deltas.get(node, []), T0)
        t = a.totals()
        # the attribution keys feed the exporter's label values one to one
        snap = build_snapshot(t, table=None, attached=0, synced={}, duration=0.0, at=T0, interval=1.0)
        exp = Exporter()
        exp.update(snap)
        for family in text_string_to_metric_families(generate_latest(exp.registry()).decode()):
            for sample in family.samples:
                for name, value in sample.labels.items():
                    assert value not in addrs and not _is_ip(value), (sample.name, name, value)
                    if sample.name.startswith("zonemeter_service_"):
                        assert value not in pod_names, (sample.name, name, value)
                    checked += 1
    assert checked or not any(model.deltas.values())


# --------------------------------------------------------------------------- Kubernetes API calls

ALLOWED_CALLS = {"list_node", "list_pod_for_all_namespaces", "list_service_for_all_namespaces",
                 "list_endpoint_slice_for_all_namespaces"}
K8S_VERBS = re.compile(r"\.((?:list|read|create|patch|delete|replace|connect|watch)_"
                       r"(?:namespaced_)?[a-z_]*(?:node|pod|service|endpoint|secret|config_map|"
                       r"namespace|deployment|replica_set|token|lease|event|custom_object)\w*)")


def _py_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_agent_calls_only_list_of_the_four_kinds() -> None:
    used: set[str] = set()
    for path in _py_files(AGENT):
        text = path.read_text()
        used |= set(K8S_VERBS.findall(text))
        assert "call_api(" not in text, f"{path}: raw API call"
        for api in re.findall(r"client\.(\w+Api)\(", text):
            # VersionApi reads /version, which kube-apiserver's bootstrap policy
            # (system:public-info-viewer) grants every identity: it needs no RBAC rule
            assert api in ("CoreV1Api", "DiscoveryV1Api", "VersionApi"), f"{path}: {api}"
            if api == "VersionApi":
                assert set(re.findall(r"VersionApi\(\w*\)\.(\w+)\(", text)) == {"get_code"}, path
    assert used, "the pattern found no API call at all: it is broken"
    assert used <= ALLOWED_CALLS, used - ALLOWED_CALLS


def test_clusterrole_grants_exactly_what_the_code_uses() -> None:
    doc = yaml.safe_load((ROOT / "deploy/daemonset/agent/clusterrole.yaml").read_text())
    granted = {(res, verb) for rule in doc["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    assert {r for r, _ in granted} == {"pods", "nodes", "services", "endpointslices"}
    assert {v for _, v in granted} == {"get", "list", "watch"}
    groups = {g for rule in doc["rules"] for g in rule.get("apiGroups", [])}
    assert groups <= {"", "discovery.k8s.io"}


# --------------------------------------------------------------------------- BPF compile inputs

DEFINE = re.compile(r"^-DZM_[A-Z_]+=[0-9]+$")
META = st.text(alphabet=st.sampled_from(list("a1-_;|&$`'\"\\ \n*()#{}<>")), min_size=1, max_size=16)


@settings(max_examples=300, deadline=None)
@given(st.integers(-10, 2**25), st.integers(-10, 2**21), st.tuples(st.integers(-5, 70000), st.integers(-5, 70000)),
       st.none() | META, st.lists(META, max_size=3), st.lists(META, max_size=3))
def test_cflags_come_only_from_validated_integers(flows: int, eps: int, eph: tuple[int, int],
                                                   netns: str | None, pats: list[str], excl: list[str]) -> None:
    cfg = datapath.DatapathConfig(netns=netns, interface_patterns=tuple(pats), exclude_patterns=tuple(excl),
                                  flow_capacity=flows, endpoint_capacity=eps, ephemeral_ports=eph)
    try:
        cfg.validate()
    except Exception:  # noqa: BLE001 - rejected configs never reach the compiler
        return
    flags = datapath.flags_for(cfg, eph)
    assert flags[0] == f"-I{datapath.BPF_DIR}"
    assert all(DEFINE.match(f) for f in flags[1:]), flags
    for text in [t for t in (netns, *pats, *excl) if t and not t.isdigit()]:
        assert all(text not in f.split("=", 1)[-1] for f in flags[1:])


@pytest.mark.parametrize("kw, field", [({"flow_capacity": 100.5}, "flow_capacity"),
                                       ({"endpoint_capacity": True}, "endpoint_capacity"),
                                       ({"ephemeral_ports": (1.5, 2)}, "ephemeral_ports_low")])
def test_validate_refuses_non_integer_numbers(kw: dict[str, Any], field: str) -> None:
    # each of these numbers would become a -D flag of the BPF compile
    with pytest.raises(InputError) as info:
        datapath.DatapathConfig(**kw).validate()
    assert info.value.field == field and "\n" not in str(info.value)


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_bpf_source_is_only_the_installed_file() -> None:
    found = []
    for path in _py_files(AGENT):
        for call in _calls(ast.parse(path.read_text())):
            if isinstance(call.func, ast.Name) and call.func.id == "BPF":
                kws = {k.arg: k.value for k in call.keywords}
                assert "text" not in kws and not call.args, f"{path}: BPF() from text"
                assert ast.unparse(kws["src_file"]) == "str(source).encode()", ast.unparse(kws["src_file"])
                assert ast.unparse(kws["cflags"]) == "self.cflags()"
                found.append(path)
    assert found == [AGENT / "datapath" / "attach.py"]
    # ``source`` is one of the two installed program files, nothing else
    tree = ast.parse((AGENT / "datapath" / "attach.py").read_text())
    sources = [ast.unparse(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and [ast.unparse(t) for t in n.targets] == ["source"]]
    assert sources == ["CGROUP_SOURCE if self.hook == 'cgroup' else TC_SOURCE"], sources
    assert datapath.TC_SOURCE == datapath.BPF_DIR / "tc.c" and datapath.TC_SOURCE.is_file()
    assert datapath.CGROUP_SOURCE == datapath.BPF_DIR / "cgroup.c" and datapath.CGROUP_SOURCE.is_file()
    assert datapath.BPF_DIR == AGENT.parent / "bpf"


# --------------------------------------------------------------------------- no processes

FORBIDDEN_MODULES = {"subprocess", "pty", "pexpect", "sh", "plumbum"}
FORBIDDEN_CALLS = {"os.system", "os.popen", "os.spawnl", "os.spawnlp", "os.spawnv", "os.spawnvp",
                   "os.execv", "os.execvp", "os.execl", "os.execlp", "os.posix_spawn", "os.posix_spawnp",
                   "os.fork", "os.forkpty", "eval", "exec"}
#: justified exceptions, path relative to agent/ -> reason (none today)
JUSTIFIED: dict[str, str] = {}


def test_agent_starts_no_process() -> None:
    offences = []
    for path in _py_files(AGENT):
        rel = str(path.relative_to(AGENT))
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                offences += [(rel, a.name) for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                offences.append((rel, node.module or ""))
            elif isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name in FORBIDDEN_CALLS:
                    offences.append((rel, name))
    assert [o for o in offences if o[0] not in JUSTIFIED] == []


def test_the_process_scan_would_see_an_offence() -> None:
    tree = ast.parse("import subprocess\nos.system('x')\n")
    names = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.Call))]
    assert any(isinstance(n, ast.Import) and n.names[0].name == "subprocess" for n in names)
    assert any(isinstance(n, ast.Call) and ast.unparse(n.func) == "os.system" for n in names)


def test_documented_listener_is_the_default() -> None:
    # docs/security.md tells operators where /flows (pod names, peer IPs) is reachable
    import inspect

    from agent.exporter import start_server

    default = inspect.signature(start_server).parameters["address"].default
    doc = (ROOT / "docs/security.md").read_text()
    ds = (ROOT / "deploy/daemonset/agent/daemonset.yaml").read_text()
    assert default == "0.0.0.0:11808"
    assert f"`{default}`" in doc and f"--metrics-address={default}" in ds
