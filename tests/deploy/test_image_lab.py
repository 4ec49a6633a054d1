"""The container image, built here with podman, runs as the agent of one lab node.

``tools/image.sh`` builds deploy/daemonset/Dockerfile on a Debian 12 base made with
mmdebstrap (cached; podman's layer cache reuses every layer of an unchanged tree). The
container then runs the way the kubelet would run the DaemonSet's pod on that node:
the options come from deploy/daemonset/agent/daemonset.yaml itself (:func:`podman_argv`),
so a change there changes what is tested:

* ``hostNetwork`` -> the lab node's network namespace (``--network ns:/run/netns/...``);
* ``securityContext`` -> ``--cap-drop=ALL`` plus exactly the added capabilities, no
  privileged mode, ``no-new-privileges``, read-only root, uid 0, seccomp RuntimeDefault
  (see :func:`runtime_default_seccomp`), AppArmor unconfined;
* ``env`` -> the downward API's ``spec.nodeName`` (the node), ``metadata.name`` (the
  podman container name) and ``metadata.namespace`` (``zonemeter``), and the literals;
* ``volumeMounts`` -> the host paths (``/sys/fs/bpf`` is a private bpffs for the test,
  standing for the node's; ``HostToContainer`` is ``rslave``), ``emptyDir`` -> tmpfs with
  the size limit; ``resources.limits`` -> ``--memory`` and ``--cpus``;
* ``args`` -> the DaemonSet's arguments, then the lab's: the snapshot file (mounted
  read-only) instead of an API server, the uplink excluded, a 2 s interval and a linger.

The agent of node a1, where the only endpoint of shop/web lives, must count every
Service byte exactly as the nftables ground truth has it (as the host-run agent does in
tests/kernel/test_agent_lab.py), stop on SIGTERM with exit code 0 well within
``terminationGracePeriodSeconds`` (its final export carries the last traffic), and leave
pins and filters that the cleanup DaemonSet's container (deploy/daemonset/cleanup)
removes. The same run with no kernel headers on the node (empty ``/lib/modules`` and
``/usr/src``) shows BCC compiling from the image's UAPI tree.

Needs root, podman and mmdebstrap; a cold build reaches deb.debian.org and PyPI. Fails
(never skips) without them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.hooks import zonemeter_hooks

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "daemonset"
#: podman's default seccomp profile (containers/common), the base of RuntimeDefault here
PODMAN_SECCOMP = Path("/usr/share/containers/seccomp.json")

#: the agent lab topology with web only on a1, so one node's agent sees every Service byte
TOPOLOGY = """\
options: {mode: flat, ipv6: false}
zones:
  - {name: zone-a, region: region-1}
  - {name: zone-b, region: region-1}
nodes:
  - {name: a1, zone: zone-a, cpu: 4}
  - {name: a2, zone: zone-a, cpu: 4}
  - {name: b1, zone: zone-b, cpu: 4}
pods:
  - {name: client-a1, namespace: shop, node: a1, app: client}
  - {name: client-a2, namespace: shop, node: a2, app: client}
  - {name: client-b1, namespace: shop, node: b1, app: client}
  - name: web-a1
    namespace: shop
    node: a1
    app: web
    ports: [{port: 8080, name: http}, {port: 5353, protocol: UDP, name: dns}]
services:
  - name: web
    namespace: shop
    selector: {app: web}
    ports:
      - {name: http, port: 80, targetPort: http}
      - {name: dns, port: 53, targetPort: dns, protocol: UDP}
"""
NODE = "a1"
INTERVAL = 2.0
LINGER = 4.0
SNAPSHOT_IN_CONTAINER = "/etc/zonemeter/lab.json"

Key = tuple[str, str, str, str]  # client_zone, server_zone, crossing, direction


# ------------------------------------------------------------------ the manifests


def _doc(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def agent_pod() -> dict[str, Any]:
    """The agent DaemonSet's pod spec."""
    return _doc(DEPLOY / "agent" / "daemonset.yaml")["spec"]["template"]["spec"]


def cleanup_pod() -> dict[str, Any]:
    """The cleanup DaemonSet's pod spec."""
    return _doc(DEPLOY / "cleanup" / "daemonset.yaml")["spec"]["template"]["spec"]


def runtime_default_seccomp(dest: Path) -> Path:
    """Write the seccomp profile that stands for the kubelet's ``RuntimeDefault``.

    podman's own default (containers/common ``seccomp.json``) allows ``bpf(2)`` and
    ``perf_event_open(2)`` only with CAP_SYS_ADMIN, as CRI-O's does (the case the deploy
    README sends to components/legacy-kernel). The runtimes the default manifests are
    for allow them with CAP_BPF and CAP_PERFMON: moby's default profile
    (profiles/seccomp/default.json, the ``bpf``/``CAP_BPF`` and
    ``perf_event_open``/``CAP_PERFMON`` rules), which recent containerd releases follow.
    This is podman's profile with those two rules added and its EPERM rule for the two
    syscalls lifted by the same capabilities, nothing else changed.
    """
    profile = json.loads(PODMAN_SECCOMP.read_text())
    # podman's profile also has an explicit EPERM rule for these two unless CAP_SYS_ADMIN
    # is held; narrow it so that CAP_BPF (CAP_PERFMON) lifts it too, or it would win.
    for rule in profile["syscalls"]:
        if rule.get("action") == "SCMP_ACT_ERRNO" and "bpf" in rule["names"]:
            assert rule.get("excludes", {}).get("caps") == ["CAP_SYS_ADMIN"], rule
            rule["names"] = [n for n in rule["names"] if n not in ("bpf", "perf_event_open")]
            profile["syscalls"] += [
                {**rule, "names": ["bpf"], "excludes": {"caps": ["CAP_SYS_ADMIN", "CAP_BPF"]}},
                {**rule, "names": ["perf_event_open"],
                 "excludes": {"caps": ["CAP_SYS_ADMIN", "CAP_PERFMON"]}},
            ]
            break
    else:
        raise AssertionError(f"{PODMAN_SECCOMP}: no EPERM rule for bpf (a new layout?)")
    profile["syscalls"] += [
        {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_BPF"]}},
        {"names": ["perf_event_open"], "action": "SCMP_ACT_ALLOW",
         "includes": {"caps": ["CAP_PERFMON"]}},
    ]
    dest.write_text(json.dumps(profile))
    return dest


def _size(quantity: str) -> str:
    """A Kubernetes memory quantity (Mi, Gi) as podman's size (m, g)."""
    for suffix, unit in (("Mi", "m"), ("Gi", "g"), ("Ki", "k")):
        if quantity.endswith(suffix):
            return quantity[: -len(suffix)] + unit
    raise AssertionError(f"unexpected quantity {quantity!r}")


def podman_argv(pod: dict[str, Any], container: dict[str, Any], *, name: str, image: str,
                netns: str, node: str, host_paths: dict[str, str], seccomp: Path,
                extra_mounts: list[str], extra_args: list[str],
                machine: list[str] | None = None) -> list[str]:
    """Return ``podman run`` for one container of a pod spec, as the kubelet runs it.

    Args:
        pod, container: the pod spec and one of its (init) containers.
        name: the podman container name.
        image: the image (the manifest's own name resolves to the local build).
        netns: the node's network namespace name (``hostNetwork: true``).
        node: the node name (``spec.nodeName`` for the downward API; ``metadata.name`` is
            ``name``, ``metadata.namespace`` is ``zonemeter``, the manifest's namespace).
        host_paths: hostPath -> the directory standing for it on this "node".
        seccomp: the RuntimeDefault profile (:func:`runtime_default_seccomp`).
        extra_mounts, extra_args: ``-v`` specs and arguments the lab adds.
        machine: podman options this machine needs (``tools/image.sh --run-options``:
            the OCI runtime, ulimits), nothing the manifest says.

    Raises:
        AssertionError: the spec uses something this translation does not know, so a
            manifest change cannot slip through untranslated.
    """
    assert pod["hostNetwork"] is True
    sc = container["securityContext"]
    assert sc["privileged"] is False, "the DaemonSet is not privileged: neither is the test"
    machine = machine or []
    argv = ["podman", *[o for o in machine if o.startswith("--runtime")], "run",
            *[o for o in machine if not o.startswith("--runtime")],
            "--detach", "--name", name, "--network", f"ns:/run/netns/{netns}",
            "--pull=never", "--cap-drop=ALL"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    argv += [f"--cap-add=CAP_{c}" for c in sc["capabilities"].get("add", [])]
    if sc["allowPrivilegeEscalation"] is False:
        argv += ["--security-opt", "no-new-privileges"]
    if sc.get("readOnlyRootFilesystem"):
        argv += ["--read-only", "--read-only-tmpfs=false"]
    argv += ["--user", f"{sc['runAsUser']}:{sc['runAsGroup']}"]
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    argv += ["--security-opt", f"seccomp={seccomp}"]
    if "appArmorProfile" in sc:
        assert sc["appArmorProfile"] == {"type": "Unconfined"}
        argv += ["--security-opt", "apparmor=unconfined"]
    limits = container.get("resources", {}).get("limits", {})
    if "memory" in limits:
        argv += ["--memory", _size(limits["memory"])]
    if "cpu" in limits:
        cpu = str(limits["cpu"])
        argv += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
    # the downward API's fields the manifest may use, as the kubelet fills them
    downward = {"spec.nodeName": node, "metadata.name": name, "metadata.namespace": "zonemeter"}
    for env in container.get("env", []):
        if "value" in env:
            argv += ["--env", f"{env['name']}={env['value']}"]
        else:
            field = env["valueFrom"]["fieldRef"]["fieldPath"]
            assert env["valueFrom"] == {"fieldRef": {"fieldPath": field}} and field in downward, env
            argv += ["--env", f"{env['name']}={downward[field]}"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        vol = volumes[m["name"]]
        if "hostPath" in vol:
            src = host_paths[vol["hostPath"]["path"]]
            opts = ["ro" if m.get("readOnly") else "rw"]
            if m.get("mountPropagation") == "HostToContainer":
                opts.append("rslave")
            else:
                assert "mountPropagation" not in m, m
            argv += ["-v", f"{src}:{m['mountPath']}:{','.join(opts)}"]
        else:
            assert "emptyDir" in vol, vol
            size = vol["emptyDir"].get("sizeLimit")
            argv += ["--tmpfs", f"{m['mountPath']}:rw,mode=1777" + (f",size={_size(size)}" if size else "")]
    for spec in extra_mounts:
        argv += ["-v", spec]
    if "command" in container:
        argv += ["--entrypoint", json.dumps(container["command"])]
    argv.append(image)
    argv += [*container.get("args", []), *extra_args]
    return argv


# ------------------------------------------------------------------ fixtures


def _require() -> None:
    if os.geteuid() != 0:
        pytest.fail("tests/deploy image tests need root (rootful podman, the lab)", pytrace=False)
    for tool in ("podman", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.fail(f"tests/deploy image tests need {tool}: apt-get install podman mmdebstrap",
                        pytrace=False)


@pytest.fixture(scope="module")
def image() -> str:
    """Build (or reuse from cache) the image; return the DaemonSet's image reference."""
    _require()
    proc = subprocess.run(["bash", str(ROOT / "tools" / "image.sh")], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, f"tools/image.sh failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    built = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("image: localhost/")]
    assert built == ["localhost/zonemeter:0.1.0"], proc.stdout
    (container,) = agent_pod()["containers"]
    # The manifest's short name resolves to the local build, as on a node that loaded it.
    assert container["image"] == "zonemeter:0.1.0"
    return str(container["image"])


def machine_options() -> list[str]:
    """``tools/image.sh --run-options``: what podman needs on this machine."""
    proc = subprocess.run(["bash", str(ROOT / "tools" / "image.sh"), "--run-options"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.fixture(scope="module")
def lab() -> Iterator[Any]:
    _require()
    from tools.lab import Lab, Topology

    with Lab(Topology.from_yaml(TOPOLOGY)) as the_lab:
        yield the_lab


@pytest.fixture()
def bpffs(tmp_path: Path) -> Iterator[Path]:
    """A private BPF filesystem standing for the node's /sys/fs/bpf."""
    mnt = tmp_path / "bpffs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# ------------------------------------------------------------------ running the pod


class Container:
    """One podman container run from a manifest (removed by :meth:`remove`)."""

    def __init__(self, argv: list[str]) -> None:
        self.name = argv[argv.index("--name") + 1]
        subprocess.run(["podman", "rm", "-f", "-i", self.name], capture_output=True, check=False)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"podman run failed: {proc.stderr}"

    def logs(self) -> str:
        proc = subprocess.run(["podman", "logs", self.name], capture_output=True, text=True, timeout=60)
        return proc.stdout + proc.stderr

    def running(self) -> bool:
        out = subprocess.run(["podman", "inspect", "--format", "{{.State.Running}}", self.name],
                             capture_output=True, text=True, timeout=60).stdout.strip()
        return out == "true"

    def exit_code(self) -> int:
        out = subprocess.run(["podman", "inspect", "--format", "{{.State.ExitCode}}", self.name],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return int(out.strip())

    def signal(self, sig: signal.Signals) -> None:
        subprocess.run(["podman", "kill", "--signal", sig.name, self.name], check=True,
                       capture_output=True, timeout=60)

    def wait(self, timeout: float) -> int:
        """Wait for the container to exit; return its exit code."""
        proc = subprocess.run(["podman", "wait", self.name], capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.strip())

    def remove(self) -> None:
        subprocess.run(["podman", "rm", "-f", "-i", "-t", "0", self.name], capture_output=True,
                       check=False, timeout=120)


def _get(netns: str, path: str) -> tuple[int, str]:
    """HTTP GET on the agent's port inside the node's namespace (where it listens)."""
    code = ("import sys, urllib.request, urllib.error\n"
            "try:\n"
            f"    r = urllib.request.urlopen('http://127.0.0.1:11808{path}', timeout=3)\n"
            "    print(r.status); sys.stdout.write(r.read().decode())\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code)\n"
            "except OSError:\n"
            "    print(0)\n")
    proc = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=30)
    status, _, body = proc.stdout.partition("\n")
    return int(status or 0), body


def _wait_ready(c: Container, netns: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not c.running():
            raise AssertionError(f"the agent container exited:\n{c.logs()[-4000:]}")
        if _get(netns, "/readyz")[0] == 200:
            return
        time.sleep(1.0)
    raise AssertionError(f"the agent container not ready after {timeout:.0f}s:\n{c.logs()[-4000:]}")


def run_agent(lab: Any, image: str, tmp_path: Path, bpffs: Path, seccomp: Path, *,
              headers: bool) -> Container:
    """Start the agent DaemonSet's container as node a1's agent."""
    pod = agent_pod()
    (container,) = pod["containers"]
    snapshot = lab.write_snapshot(tmp_path / "lab.json")
    if headers:
        host_paths = {"/lib/modules": "/lib/modules", "/usr/src": "/usr/src"}
    else:
        # a node without kernel headers: nothing under /lib/modules/R, no /usr/src
        (tmp_path / "no-modules").mkdir()
        (tmp_path / "no-src").mkdir()
        host_paths = {"/lib/modules": str(tmp_path / "no-modules"), "/usr/src": str(tmp_path / "no-src")}
    host_paths["/sys/fs/bpf"] = str(bpffs)
    host_paths["/var/lib/zonemeter"] = str(state_dir(bpffs))
    argv = podman_argv(
        pod, container, name=f"zm-image-test-{lab.prefix}", image=image,
        netns=lab.node_netns(NODE), node=NODE, host_paths=host_paths, seccomp=seccomp,
        extra_mounts=[f"{snapshot}:{SNAPSHOT_IN_CONTAINER}:ro"],
        extra_args=[f"--snapshot={SNAPSHOT_IN_CONTAINER}", f"--exclude-interfaces={lab.prefix}u*",
                    f"--interval={INTERVAL:g}", f"--final-linger-seconds={LINGER:g}"],
        machine=machine_options())
    return Container(argv)


def state_dir(bpffs: Path) -> Path:
    """The directory standing for the node's ``/var/lib/zonemeter`` (the checkpoint's
    hostPath), beside the test's bpffs."""
    path = bpffs.parent / "var-lib-zonemeter"
    path.mkdir(exist_ok=True)
    return path


def run_cleanup(lab: Any, image: str, bpffs: Path, seccomp: Path) -> tuple[int, str]:
    """Run the cleanup DaemonSet's init container on node a1; return (exit code, log)."""
    pod = cleanup_pod()
    (init,) = pod["initContainers"]
    argv = podman_argv(pod, init, name=f"zm-image-cleanup-{lab.prefix}", image=image,
                       netns=lab.node_netns(NODE), node=NODE,
                       host_paths={"/sys/fs/bpf": str(bpffs),
                                   "/var/lib/zonemeter": str(state_dir(bpffs))},
                       seccomp=seccomp,
                       extra_mounts=[], extra_args=[], machine=machine_options())
    c = Container(argv)
    try:
        code = c.wait(timeout=180)
        return code, c.logs()
    finally:
        c.remove()


# ------------------------------------------------------------------ what is counted


def service_bytes(text: str) -> tuple[dict[Key, int], dict[str, int]]:
    """shop/web's Service bytes per Key (ports summed), and the other byte families."""
    per: dict[Key, int] = defaultdict(int)
    other: dict[str, int] = defaultdict(int)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "zonemeter_service_bytes_total":
                assert (s.labels["namespace"], s.labels["service"]) == ("shop", "web"), s
                per[(s.labels["client_zone"], s.labels["server_zone"], s.labels["crossing"],
                     s.labels["direction"])] += int(s.value)
            elif s.name in ("zonemeter_workload_bytes_total", "zonemeter_unattributed_bytes_total",
                            "zonemeter_skipped_bytes_total", "zonemeter_unknown_crossing_bytes_total"):
                other[s.name + ("/" + s.labels["reason"] if "reason" in s.labels else "")] += int(s.value)
    return dict(per), dict(other)


def expected(lab: Any) -> dict[Key, int]:
    """The lab's nftables ground truth in the same keys (web-a1 is the only server)."""
    topo = lab.topology
    out: dict[Key, int] = defaultdict(int)
    for (client, server, direction), nbytes in lab.ground_truth().items():
        if not nbytes:
            continue
        c, s = topo.pod(client), topo.pod(server)
        cz, sz = topo.zone_of(c.node), topo.zone_of(s.node)
        crossing = "same_node" if c.node == s.node else "same_zone" if cz == sz else "cross_zone"
        out[(cz, sz, crossing, direction)] += nbytes
    return dict(out)


def traffic(lab: Any) -> None:
    cip = lab.cluster_ip("shop/web")
    for client in ("client-a1", "client-a2", "client-b1"):
        lab.run_flow(client, cip, 80, "tcp", 1200, 9000, count=5)
        lab.run_flow(client, cip, 53, "udp", 200, 700, count=3)
    lab.run_flow("client-b1", lab.pod_ip("web-a1"), 8080, "tcp", 500, 3000, count=2)


def our_filters(lab: Any) -> list[str]:
    """``dev/hook`` of every zonemeter hook (tc filter or TCX program) in node a1's namespace."""
    return zonemeter_hooks(lab.node_netns(NODE))


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("headers", [True, False], ids=["node-headers", "no-node-headers"])
def test_image_counts_a_lab_node_like_the_host_agent(lab: Any, image: str, tmp_path: Path,
                                                     bpffs: Path, headers: bool) -> None:
    seccomp = runtime_default_seccomp(tmp_path / "seccomp.json")
    grace = float(agent_pod()["terminationGracePeriodSeconds"])
    assert LINGER < grace
    c = run_agent(lab, image, tmp_path, bpffs, seccomp, headers=headers)
    try:
        _wait_ready(c, lab.node_netns(NODE))
        log = c.logs()
        if headers:
            assert "BCC compiles against the node's kernel headers in /usr/src/" in log, log[-3000:]
        else:
            assert ("BCC compiles against the image's UAPI headers in /opt/zonemeter/kernel-uapi "
                    "(linux-libc-dev ") in log, log[-3000:]
        lab.reset_ground_truth()
        traffic(lab)
        time.sleep(INTERVAL * 1.5)  # one interval tick exports everything drained
        got, other = service_bytes(_get(lab.node_netns(NODE), "/metrics")[1])
        want = expected(lab)
        assert got == want
        assert {k[2] for k in want} == {"same_node", "same_zone", "cross_zone"}
        assert {k[3] for k in want} == {"request", "response"}
        # nothing double counted: only client-a1's copies of its ClusterIP traffic are skipped
        assert {k: v for k, v in other.items() if v and "skipped" not in k} == {}
        assert other.get("zonemeter_skipped_bytes_total/clusterip_client_copy", 0) > 0
        text = _get(lab.node_netns(NODE), "/metrics")[1]
        assert "zonemeter_attached_interfaces 2.0" in text  # client-a1 and web-a1

        # more traffic, SIGTERM at once: the final export carries it, exit 0 within the grace
        traffic(lab)
        t0 = time.monotonic()
        c.signal(signal.SIGTERM)
        time.sleep(LINGER / 2)
        got, _ = service_bytes(_get(lab.node_netns(NODE), "/metrics")[1])
        assert got == expected(lab)
        code = c.wait(timeout=grace + 10)
        elapsed = time.monotonic() - t0
        assert code == 0, c.logs()[-4000:]
        assert elapsed < grace, f"stopped after {elapsed:.1f}s, the grace period is {grace:g}s"

        # pins and filters stay for the next agent (on purpose) until the cleanup DaemonSet
        pins = bpffs / "zonemeter" / NODE
        assert pins.is_dir() and any(pins.iterdir())
        assert our_filters(lab) != []
        # the checkpoint on the node's /var/lib/zonemeter carries the totals across restarts
        assert (state_dir(bpffs) / "checkpoint").is_file()
        code, log = run_cleanup(lab, image, bpffs, seccomp)
        assert code == 0, log
        assert '"msg": "cleanup done"' in log, log
        assert our_filters(lab) == []
        assert not pins.exists() or not any(pins.iterdir())
        assert not (state_dir(bpffs) / "checkpoint").exists()
    finally:
        c.remove()


def test_a_seccomp_profile_that_wants_sys_admin_for_bpf_stops_the_agent(lab: Any, image: str,
                                                                         tmp_path: Path,
                                                                         bpffs: Path) -> None:
    """podman's own RuntimeDefault (containers/common, as CRI-O's) allows bpf(2) only with
    CAP_SYS_ADMIN: the agent then fails at start-up with "Operation not permitted", as the
    deploy README says (the case components/legacy-kernel is for)."""
    c = run_agent(lab, image, tmp_path, bpffs, PODMAN_SECCOMP, headers=True)
    try:
        code = c.wait(timeout=300)
        log = c.logs()
        assert code == 1, log[-3000:]
        assert "Operation not permitted" in log, log[-3000:]
        assert our_filters(lab) == []
    finally:
        c.remove()
