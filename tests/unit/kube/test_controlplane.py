"""tools/kube/controlplane.py without starting anything: the kubernetes Service address,
the pinned release, locating the built binaries, and the errors for bad input."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from tools.kube.controlplane import (
    Binaries,
    ControlPlane,
    ControlPlaneError,
    kubernetes_service_ip,
    pinned_kube_version,
)


@pytest.mark.parametrize(("cidr", "want"), [
    ("10.96.0.0/16", "10.96.0.1"),
    ("10.96.0.0/12,fd00:96::/108", "10.96.0.1"),
    ("fd00:96::/108, 10.96.0.0/12", "fd00:96::1"),
])
def test_kubernetes_service_ip_is_first_address_of_primary_range(cidr: str, want: str) -> None:
    assert kubernetes_service_ip(cidr) == ipaddress.ip_address(want)


@pytest.mark.parametrize("cidr", ["10.96.0.1/16", "nonsense", ""])
def test_kubernetes_service_ip_rejects_a_malformed_range(cidr: str) -> None:
    with pytest.raises(ControlPlaneError, match="service_cidr"):
        kubernetes_service_ip(cidr)


def test_pinned_kube_version_reads_go_mod_and_honours_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZONEMETER_KUBE_VERSION", raising=False)
    gomod = (Path(__file__).parents[3] / "tools" / "kube" / "go.mod").read_text()
    v = pinned_kube_version()
    assert f"\tk8s.io/kubernetes {v} " in gomod or f"require k8s.io/kubernetes {v}\n" in gomod
    assert v.startswith("v1.")
    monkeypatch.setenv("ZONEMETER_KUBE_VERSION", "v1.35.4")
    assert pinned_kube_version() == "v1.35.4"


def _fake_release(cache: Path, kv: str = "v1.99.0", ev: str = "v3.9.0", skip: str = "") -> None:
    kdir = cache / "kube" / kv
    kdir.mkdir(parents=True)
    (kdir / ".stamp").write_text(f"kubernetes {kv}\netcd {ev}\ngo go1.26.8\n")
    (cache / "etcd" / ev).mkdir(parents=True)
    for p in [kdir / n for n in ("kube-apiserver", "kube-controller-manager", "kube-proxy", "kubectl")] + [
            cache / "etcd" / ev / "etcd"]:
        if p.name != skip:
            p.write_text("#!/bin/sh\n")
            p.chmod(0o755)


def test_binaries_find_locates_a_built_release(tmp_path: Path) -> None:
    _fake_release(tmp_path)
    b = Binaries.find("v1.99.0", cache=tmp_path)
    assert (b.kube_version, b.etcd_version) == ("v1.99.0", "v3.9.0")
    assert b.etcd == tmp_path / "etcd" / "v3.9.0" / "etcd"
    assert b.kube_apiserver == tmp_path / "kube" / "v1.99.0" / "kube-apiserver"


def test_binaries_find_names_the_build_command_when_not_built(tmp_path: Path) -> None:
    want = r"Kubernetes v1\.99\.0 is not built .*KUBE_VERSION=v1\.99\.0 bash tools/kube/build\.sh"
    with pytest.raises(ControlPlaneError, match=want):
        Binaries.find("v1.99.0", cache=tmp_path)


def test_binaries_find_names_a_missing_binary(tmp_path: Path) -> None:
    _fake_release(tmp_path, skip="etcd")
    with pytest.raises(ControlPlaneError, match=r"etcd/v3\.9\.0/etcd is missing"):
        Binaries.find("v1.99.0", cache=tmp_path)


def test_control_plane_rejects_a_bad_address(tmp_path: Path) -> None:
    _fake_release(tmp_path)
    b = Binaries.find("v1.99.0", cache=tmp_path)
    with pytest.raises(ControlPlaneError, match="address 'cp-host'"):
        ControlPlane("zm-cp", "cp-host", "10.96.0.0/16", tmp_path / "cp", binaries=b)


def test_control_plane_start_needs_an_existing_netns(tmp_path: Path) -> None:
    _fake_release(tmp_path)
    cp = ControlPlane("zmtest-no-such-ns", "10.250.0.10", "10.96.0.0/16", tmp_path / "cp",
                      binaries=Binaries.find("v1.99.0", cache=tmp_path))
    assert cp.server == "https://10.250.0.10:6443"
    with pytest.raises(ControlPlaneError, match="network namespace 'zmtest-no-such-ns' does not exist"):
        cp.start()
    with pytest.raises(ControlPlaneError, match="not started"):
        cp.restart("kube-apiserver")
