"""agent.k8s.client: the one ApiClient builder (host, kubeconfig, in-cluster)."""

from __future__ import annotations

import pytest

from agent.errors import InputError, RuntimeFailure
from agent.k8s.client import build_api_client

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: me
  user: {token: abc}
contexts:
- name: lab
  context: {cluster: lab, user: me}
- name: other
  context: {cluster: lab, user: me, namespace: x}
current-context: lab
"""


def test_explicit_host() -> None:
    api = build_api_client(host="http://127.0.0.1:8001")
    assert api.configuration.host == "http://127.0.0.1:8001"
    assert api.configuration.retries is False  # the watch loop does its own backoff


def test_kubeconfig_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "config"
    path.write_text(KUBECONFIG)
    api = build_api_client(path)
    assert api.configuration.host == "https://10.0.0.1:6443"
    assert api.configuration.api_key["BearerToken"] == "Bearer abc"


def test_missing_and_bad_kubeconfig(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="cannot read"):
        build_api_client(tmp_path / "nope")
    bad = tmp_path / "bad"
    bad.write_text(KUBECONFIG.replace("current-context: lab", "current-context: missing"))
    with pytest.raises(InputError) as info:
        build_api_client(bad)
    assert str(info.value).startswith(f"{bad}: invalid kubeconfig")
    assert "\n" not in str(info.value)


def test_in_cluster_outside_a_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(RuntimeFailure, match="not running in a cluster") as info:
        build_api_client()
    # says what to do instead, on one line
    assert "--kubeconfig FILE" in str(info.value) and "--snapshot FILE" in str(info.value)
    assert "KUBECONFIG unset, no ~/.kube/config" in str(info.value)
    assert "\n" not in str(info.value)


OTHER = """\
apiVersion: v1
kind: Config
clusters:
- name: far
  cluster: {server: "https://10.0.0.9:6443", insecure-skip-tls-verify: true}
users:
- name: you
  user: {token: xyz}
contexts:
- name: far
  context: {cluster: far, user: you}
current-context: far
"""


def test_kubeconfig_found_as_kubectl_finds_it(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--kubeconfig, then $KUBECONFIG (a merged list), then ~/.kube/config (client-go
    clientcmd loading rules); --context picks a context of the merged files."""
    from agent.k8s.client import kubeconfig_source

    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text(KUBECONFIG)
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(OTHER)
    b.write_text(KUBECONFIG)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert kubeconfig_source() == (str(home / ".kube" / "config"), "~/.kube/config")
    assert build_api_client().configuration.host == "https://10.0.0.1:6443"
    monkeypatch.setenv("KUBECONFIG", f"{a}:{b}")
    assert build_api_client().configuration.host == "https://10.0.0.9:6443"  # the first file's context
    assert build_api_client(context="lab").configuration.host == "https://10.0.0.1:6443"  # from b
    assert build_api_client(b).configuration.host == "https://10.0.0.1:6443"  # the flag wins
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "gone.yaml"))
    with pytest.raises(InputError) as info:
        build_api_client()
    assert str(info.value) == f"KUBECONFIG={tmp_path / 'gone.yaml'}: cannot read: no such file"
