"""The Kubernetes version a cluster (or a dump of one) reports: ``/version`` and ``version.json``.

``/version`` is the API server's ``version.Info`` (``k8s.io/apimachinery/pkg/version``);
its ``gitVersion`` (``v1.33.5``, ``v1.33.5-eks-abc``) is what the hint model reads
(:func:`agent.hints.versions.covered_version`). Beside a ``kubectl get ... -o json`` dump, a
``version.json`` made with ``kubectl version -o json`` carries it as
``serverVersion.gitVersion`` (docs/hints.md, Snapshots).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.errors import InputError, RuntimeFailure

#: the file :func:`snapshot_version` reads beside a dump
VERSION_FILE = "version.json"


def server_version(api: Any, timeout: float = 10.0) -> str:
    """The API server's ``gitVersion`` (``GET /version``, ``VersionApi().get_code()``).

    The body is read as JSON here (``_preload_content=False``) rather than through the
    client's ``VersionInfo`` model, which refuses an answer lacking any of its nine fields
    (``buildDate``, ``goVersion``...): only ``gitVersion`` matters.

    Args:
        api: a :class:`kubernetes.client.ApiClient`.
        timeout: seconds for the request.

    Raises:
        RuntimeFailure: the request failed or the answer has no ``gitVersion``.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        # _preload_content=False: a urllib3 response, whatever the annotation says
        resp: Any = client.VersionApi(api).get_code(_preload_content=False, _request_timeout=timeout)
        status = getattr(resp, "status", 200)
        if status != 200:
            raise RuntimeFailure(f"reading the API server's version (/version) failed: HTTP {status}")
        info = json.loads(resp.data)
    except ApiException as err:  # its str() carries the headers and the whole body
        raise RuntimeFailure(f"reading the API server's version (/version) failed: HTTP "
                             f"{err.status} {err.reason}") from None
    except (HTTPError, OSError, ValueError) as err:
        raise RuntimeFailure(f"reading the API server's version (/version) failed: "
                             f"{' '.join(str(err).split())}") from None
    git = info.get("gitVersion") if isinstance(info, dict) else None
    if not isinstance(git, str) or not git.strip():
        raise RuntimeFailure("the API server's /version has no gitVersion")
    return git.strip()


def version_file_for(snapshot: str | Path) -> Path:
    """The ``version.json`` beside a dump (same directory)."""
    return Path(snapshot).with_name(VERSION_FILE)


def snapshot_version(snapshot: str | Path) -> str | None:
    """The server ``gitVersion`` in the ``version.json`` beside ``snapshot``, None without one.

    Reads ``kubectl version -o json`` output (``{"clientVersion": ..., "serverVersion":
    {"gitVersion": ...}}``) and also a bare ``/version`` object (``kubectl get --raw
    /version``: ``{"gitVersion": ...}``).

    Raises:
        InputError: the file exists but is not JSON, or has no server ``gitVersion``
            (names the file and the field).
    """
    path = version_file_for(snapshot)
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"cannot read: {' '.join(str(err).split())}", source=str(path)) from None
    if not isinstance(doc, dict):
        raise InputError("must be an object (kubectl version -o json)", source=str(path))
    server = doc.get("serverVersion", doc if "gitVersion" in doc else None)
    if not isinstance(server, dict):
        raise InputError("no server version (kubectl version -o json run without a reachable "
                         "cluster?)", source=str(path), field="serverVersion")
    git = server.get("gitVersion")
    if not isinstance(git, str) or not git.strip():
        raise InputError("must be a non-empty string", source=str(path),
                         field="serverVersion.gitVersion")
    return git.strip()
