"""Every shared reference vector (vectors/hints.json), at every version it claims, through ``zonemeter explain``.

Path under test: vector -> Kubernetes API-shaped objects in a kubectl dump (JSON List or
multi-document YAML) -> ``zonemeter explain --snapshot FILE -o json`` -> compare. Fields the
explain JSON does not carry (minimums, ready count, kept slices, reachable set) are compared
on :func:`agent.hints.evaluate_cluster` run on the same objects.
"""

from __future__ import annotations

import json

import pytest

from agent import cli, hints
from tests.unit.hints import vectors_adapter as va

VECTORS = va.load_vectors()
PARAMS = [pytest.param(v, ver, gates, id=f"{v['name']}@{ver}{'+' + ','.join(gates) if gates else ''}")
          for v in VECTORS for ver, gates in va.versions_for(v)]


def test_vendored_copy_is_the_shared_file() -> None:
    shared = va.shared_vectors_path()
    if shared is None:  # a clone with no shared/ beside it reads the vendored copy itself
        assert va.VECTORS_PATH == va.VENDORED_PATH and va.VENDORED_PATH.is_file()
        return
    assert va.VENDORED_PATH.read_bytes() == shared.read_bytes(), (
        f"{va.VENDORED_PATH} differs from {shared}: copy the shared file over it")


def test_every_vector_is_parametrized() -> None:
    assert len(VECTORS) == 60
    assert {id(p.values[0]) for p in PARAMS} == {id(v) for v in VECTORS}


@pytest.mark.parametrize(("vector", "version", "gates"), PARAMS)
def test_vector(vector: dict, version: str, gates: dict, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    case = va.Case(vector)
    dump = case.write(tmp_path / "dump.yaml", yaml_format=VECTORS.index(vector) % 2 == 0)
    argv = ["explain", "--snapshot", str(dump), "--kubernetes-version", version, "-o", "json",
            "--hints-populated", ",".join(case.hints_populated)]
    if gates:
        argv += ["--feature-gates", ",".join(f"{k}={str(v).lower()}" for k, v in gates.items())]
    if case.node:
        argv += ["--node", case.node]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kubernetes_version"] == version
    assert len(doc["services"]) == 1
    svc_json = doc["services"][0]
    diag = hints.evaluate_cluster(case.nodes, [case.service], case.slices, version=version,
                                  feature_gates=gates, hints_populated=case.hints_populated,
                                  strict=True)[0]
    if vector["kind"] == "proxy-selection":
        va.check_proxy(case, svc_json, diag)
    else:
        va.check_controller(case, svc_json, diag)
