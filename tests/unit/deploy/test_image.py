"""deploy/daemonset: the container image definition and its entrypoint.

No container engine runs here, so the Dockerfile is checked statically (parsed with
dockerfile-parse): pinned base and packages, multi-stage with nothing to build or
install left in the final stage, the entrypoint wired as the DaemonSet expects.
The entrypoint script runs for real against fake node trees in tmp_path (never the
real /lib/modules): it must link the headers BCC needs, be idempotent, and fail
with a clear message when there are none.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy" / "daemonset"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
BUILD_TOOLS = re.compile(
    r"^(build-essential|gcc.*|g\+\+.*|make|clang.*|llvm(-\d+)?-dev|.*-dev|python3-pip|python3-venv|"
    r"python3-setuptools|linux-headers.*|git|curl|wget)$"
)


# ---------------------------------------------------------------- Dockerfile


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    parser = DockerfileParser(path=str(DEPLOY / "Dockerfile"))
    return parser


def _stages(df: DockerfileParser) -> list[list[dict[str, str]]]:
    stages: list[list[dict[str, str]]] = []
    for ins in df.structure:
        if ins["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _apt_packages(run: str) -> list[str]:
    m = re.search(r"apt-get install\s+((?:\S+\s*)+?)(?:&&|$)", run)
    assert m, run
    return [w for w in m.group(1).split() if not w.startswith("-")]


def test_base_is_pinned_debian_12(dockerfile: DockerfileParser) -> None:
    args = {
        i["value"].split("=", 1)[0]: i["value"].split("=", 1)[1]
        for i in dockerfile.structure
        if i["instruction"] == "ARG" and "=" in i["value"]
    }
    base = args["DEBIAN_IMAGE"]
    assert re.fullmatch(r"debian:12\.\d+-slim(@sha256:[0-9a-f]{64})?", base), base
    froms = [i["value"] for i in dockerfile.structure if i["instruction"] == "FROM"]
    assert froms == ["${DEBIAN_IMAGE} AS build", "${DEBIAN_IMAGE}"]


def test_every_apt_package_is_pinned_and_final_stage_has_no_build_tools(
    dockerfile: DockerfileParser,
) -> None:
    build, final = _stages(dockerfile)
    for stage in (build, final):
        for ins in stage:
            if ins["instruction"] == "RUN" and "apt-get install" in ins["value"]:
                assert "--no-install-recommends" in ins["value"]
                assert "rm -rf /var/lib/apt/lists/*" in ins["value"]
                for pkg in _apt_packages(ins["value"]):
                    assert re.fullmatch(r"[a-z0-9.+-]+=[0-9][\w.+~:-]*", pkg), f"unpinned {pkg}"
    final_pkgs = [
        p.split("=")[0]
        for ins in final
        if ins["instruction"] == "RUN" and "apt-get install" in ins["value"]
        for p in _apt_packages(ins["value"])
    ]
    assert "python3-bpfcc" in final_pkgs
    assert not [p for p in final_pkgs if BUILD_TOOLS.match(p)], final_pkgs
    final_text = "\n".join(i["value"] for i in final)
    assert "pip install" not in final_text
    # The build stage removes the installers from the venv it hands over.
    build_text = "\n".join(i["value"] for i in build)
    assert "pip uninstall -y setuptools pip" in build_text
    assert "COPY --from=build /opt/zonemeter /opt/zonemeter" in "\n".join(
        f"{i['instruction']} {i['value']}" for i in final
    )


def test_bcc_is_linked_like_setup_sh(dockerfile: DockerfileParser) -> None:
    final = _stages(dockerfile)[1]
    text = "\n".join(i["value"] for i in final)
    assert 'ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"' in text
    setup = (ROOT / "tools" / "setup.sh").read_text()
    assert 'ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"' in setup
    assert "import bcc, agent" in text


def test_entrypoint_and_cmd_match_the_daemonset(dockerfile: DockerfileParser) -> None:
    final = _stages(dockerfile)[1]
    by = {i["instruction"]: i["value"] for i in final}
    assert json.loads(by["ENTRYPOINT"]) == ["/usr/local/bin/zonemeter-entrypoint"]
    assert "deploy/daemonset/entrypoint.sh /usr/local/bin/zonemeter-entrypoint" in by["COPY"] or any(
        i["instruction"] == "COPY"
        and i["value"].endswith("deploy/daemonset/entrypoint.sh /usr/local/bin/zonemeter-entrypoint")
        for i in final
    )
    ds = yaml.safe_load((DEPLOY / "agent" / "daemonset.yaml").read_text())
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert "command" not in container, "the DaemonSet must keep the image entrypoint"
    assert json.loads(by["CMD"]) == container["args"]
    assert by["EXPOSE"] == "11808"


def test_requirements_pin_every_dependency() -> None:
    pins: dict[str, str] = {}
    for line in (DEPLOY / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"requirements.txt: {line} is not pinned with =="
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        assert key in pins, f"{req.name} from pyproject.toml is not pinned"
        assert req.specifier.contains(pins[key]), f"{req.name}=={pins[key]} violates {req.specifier}"


def test_dockerignore_keeps_the_image_lean() -> None:
    ignored = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for entry in (".git", ".venv", "tests"):
        assert entry in ignored
    assert not any(e.startswith(("deploy", "agent", "bpf")) for e in ignored)


# ---------------------------------------------------------------- entrypoint

RELEASE = "6.1.0-57-amd64"


def _fake_node(tmp: Path, layout: str) -> dict[str, str]:
    """A node tree (host root, /usr/src) and an empty container /lib/modules.

    Returns the environment that points the entrypoint at them, with a fake
    `zonemeter` that records its arguments instead of starting the agent.
    """
    host, usr_src, modules, sys_kernel = tmp / "host", tmp / "usr-src", tmp / "modules", tmp / "sys-kernel"
    for d in (host / "lib" / "modules" / RELEASE, usr_src, modules, sys_kernel):
        d.mkdir(parents=True, exist_ok=True)
    hm = host / "lib" / "modules" / RELEASE
    if layout in {"debian", "debian-relative", "debian-no-links", "mismatch"}:
        rel = RELEASE if layout != "mismatch" else "6.1.0-99-amd64"
        (usr_src / f"linux-headers-{rel}" / "include").mkdir(parents=True)
        (usr_src / f"linux-headers-{rel.rsplit('-', 1)[0]}-common" / "include").mkdir(parents=True)
    if layout == "debian":
        # As Debian's linux-image package ships them: absolute node paths.
        (hm / "build").symlink_to(f"/usr/src/linux-headers-{RELEASE}")
        (hm / "source").symlink_to("/usr/src/linux-headers-6.1.0-57-common")
    elif layout == "debian-relative":
        (hm / "build").symlink_to(f"../../../usr/src/linux-headers-{RELEASE}")
    elif layout == "rhel-dir":
        # build is a real directory inside the node's /lib/modules.
        (hm / "build" / "include").mkdir(parents=True)
    elif layout == "kheaders":
        (sys_kernel / "kheaders.tar.xz").write_bytes(b"")
    fake = tmp / "zonemeter"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/agent-args"\n'
                    'printf "%s" "${BCC_KERNEL_SOURCE-unset}" > "$(dirname "$0")/agent-bcc-source"\n')
    fake.chmod(0o755)
    return {
        "PATH": os.environ["PATH"],
        "ZONEMETER_HOST_ROOT": str(host),
        "ZONEMETER_MODULES_DIR": str(modules),
        "ZONEMETER_USR_SRC": str(usr_src),
        "ZONEMETER_SYS_KERNEL": str(sys_kernel),
        "ZONEMETER_KERNEL_RELEASE": RELEASE,
        "ZONEMETER_AGENT": str(fake),
        # absent unless a test makes one (_uapi_tree)
        "ZONEMETER_UAPI_TREE": str(tmp / "uapi"),
    }


def _uapi_tree(tmp: Path) -> Path:
    """A stand-in for the image's UAPI tree: what the entrypoint checks for."""
    tree = tmp / "uapi"
    (tree / "include" / "linux").mkdir(parents=True)
    (tree / "include" / "linux" / "kconfig.h").write_text("#define CONFIG_BPF_SYSCALL 1\n")
    (tree / "ORIGIN").write_text("linux-libc-dev 6.1.176-1 (/usr/include)\n")
    return tree


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=30
    )


def _links(modules: Path) -> dict[str, str]:
    return {p.name: os.readlink(p) for p in sorted((modules / RELEASE).iterdir())}


def test_entrypoint_links_debian_headers_and_execs_the_agent(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "debian")
    result = _run(env, "--metrics-address=0.0.0.0:11808", "--interval=10")
    assert result.returncode == 0, result.stderr
    usr_src = tmp_path / "usr-src"
    assert _links(tmp_path / "modules") == {
        "build": str(usr_src / f"linux-headers-{RELEASE}"),
        "source": str(usr_src / "linux-headers-6.1.0-57-common"),
    }
    assert (tmp_path / "modules" / RELEASE / "build" / "include").is_dir()
    assert (tmp_path / "agent-args").read_text().split() == [
        "agent",
        "--metrics-address=0.0.0.0:11808",
        "--interval=10",
    ]
    for line in result.stderr.splitlines():
        assert json.loads(line)["logger"] == "zonemeter.entrypoint"


def test_entrypoint_is_idempotent(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "debian")
    assert _run(env).returncode == 0
    first = _links(tmp_path / "modules")
    second_run = _run(env)
    assert second_run.returncode == 0, second_run.stderr
    assert _links(tmp_path / "modules") == first
    # `ln -s` into an existing directory link would nest a link inside the headers.
    assert not (tmp_path / "usr-src" / f"linux-headers-{RELEASE}" / f"linux-headers-{RELEASE}").exists()
    assert sorted(p.name for p in (tmp_path / "usr-src" / f"linux-headers-{RELEASE}").iterdir()) == ["include"]


def test_entrypoint_resolves_relative_node_links(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "debian-relative")
    result = _run(env)
    assert result.returncode == 0, result.stderr
    links = _links(tmp_path / "modules")
    assert links["build"] == str(tmp_path / "usr-src" / f"linux-headers-{RELEASE}")
    # No source link on the node: the Debian -common tree is found by name.
    assert links["source"] == str(tmp_path / "usr-src" / "linux-headers-6.1.0-57-common")


def test_entrypoint_finds_headers_without_node_links(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "debian-no-links")
    result = _run(env)
    assert result.returncode == 0, result.stderr
    assert _links(tmp_path / "modules")["build"] == str(tmp_path / "usr-src" / f"linux-headers-{RELEASE}")


def test_entrypoint_links_a_real_build_directory(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "rhel-dir")
    result = _run(env)
    assert result.returncode == 0, result.stderr
    assert _links(tmp_path / "modules") == {
        "build": str(tmp_path / "host" / "lib" / "modules" / RELEASE / "build")
    }


def test_entrypoint_leaves_kheaders_to_bcc(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "kheaders")
    result = _run(env)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "modules" / RELEASE).exists()
    assert "kheaders.tar.xz" in result.stderr
    assert (tmp_path / "agent-args").exists()


def test_entrypoint_fails_clearly_without_headers(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "none")
    result = _run(env)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "error"
    assert f"no kernel headers for {RELEASE}" in record["msg"]
    assert not (tmp_path / "agent-args").exists(), "the agent must not start without headers"


def test_entrypoint_mismatched_headers_only_when_asked(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "mismatch")
    assert _run(env).returncode == 1
    env["ZONEMETER_HEADERS_FALLBACK"] = "newest"
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine)
    if arch != "amd64":
        pytest.skip("the fake tree holds amd64 header names")
    result = _run(env)
    assert result.returncode == 0, result.stderr
    assert _links(tmp_path / "modules") == {
        "build": str(tmp_path / "usr-src" / "linux-headers-6.1.0-99-amd64"),
        "source": str(tmp_path / "usr-src" / "linux-headers-6.1.0-99-common"),
    }
    assert '"level":"warning"' in result.stderr


def test_entrypoint_cleanup_needs_no_headers(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "none")
    result = _run(env, "--cleanup")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "agent-args").read_text().split() == ["agent", "--cleanup"]


def test_entrypoint_keeps_a_real_directory_in_place(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "debian")
    real = tmp_path / "modules" / RELEASE / "build"
    (real / "include").mkdir(parents=True)
    result = _run(env)
    assert result.returncode == 0, result.stderr
    assert real.is_dir() and not real.is_symlink()
    assert sorted(p.name for p in real.iterdir()) == ["include"]


def test_entrypoint_pairs_a_debian_cloud_flavour_with_its_common_tree(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "none")
    release = "6.1.0-57-cloud-amd64"
    env["ZONEMETER_KERNEL_RELEASE"] = release
    usr_src = tmp_path / "usr-src"
    (usr_src / f"linux-headers-{release}" / "include").mkdir(parents=True)
    (usr_src / "linux-headers-6.1.0-57-common").mkdir()
    result = _run(env)
    assert result.returncode == 0, result.stderr
    made = {p.name: os.readlink(p) for p in (tmp_path / "modules" / release).iterdir()}
    assert made == {
        "build": str(usr_src / f"linux-headers-{release}"),
        "source": str(usr_src / "linux-headers-6.1.0-57-common"),
    }


# ---------------------------------------------------------------- headerless nodes


def test_entrypoint_uses_the_image_uapi_tree_without_node_headers(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "none")
    tree = _uapi_tree(tmp_path)
    result = _run(env, "--interval=10")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "agent-bcc-source").read_text() == str(tree)
    assert (tmp_path / "agent-args").read_text().split() == ["agent", "--interval=10"]
    assert not (tmp_path / "modules" / RELEASE).exists(), "no links into an empty tree"
    (line,) = result.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "info"
    assert f"no kernel headers for {RELEASE} on the node" in record["msg"]
    assert f"UAPI headers in {tree} (linux-libc-dev 6.1.176-1" in record["msg"]


def test_entrypoint_prefers_node_headers_over_the_uapi_tree(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "debian")
    _uapi_tree(tmp_path)
    result = _run(env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "agent-bcc-source").read_text() == "unset"
    assert _links(tmp_path / "modules")["build"] == str(tmp_path / "usr-src" / f"linux-headers-{RELEASE}")
    assert "BCC compiles against the node's kernel headers in" in result.stderr


def test_entrypoint_prefers_kheaders_over_the_uapi_tree(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "kheaders")
    _uapi_tree(tmp_path)
    result = _run(env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "agent-bcc-source").read_text() == "unset"
    assert "kheaders.tar.xz" in result.stderr


def test_entrypoint_keeps_a_bcc_kernel_source_set_on_the_container(tmp_path: Path) -> None:
    env = _fake_node(tmp_path, "debian")
    _uapi_tree(tmp_path)
    env["BCC_KERNEL_SOURCE"] = str(tmp_path / "mine")
    result = _run(env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "agent-bcc-source").read_text() == str(tmp_path / "mine")
    assert not (tmp_path / "modules" / RELEASE).exists()
    assert f"BCC_KERNEL_SOURCE is set: BCC compiles against {tmp_path / 'mine'}" in result.stderr


def test_kernel_uapi_script_lays_out_a_tree_bcc_accepts(tmp_path: Path) -> None:
    """kernel-uapi.sh on a fake UAPI include dir: the layout BCC's KBuildHelper reads."""
    inc = tmp_path / "include"
    arch = {"x86_64": ("x86", "x86_64-linux-gnu"), "aarch64": ("arm64", "aarch64-linux-gnu")}
    karch, multiarch = arch[os.uname().machine]
    (inc / "linux").mkdir(parents=True)
    (inc / "asm-generic").mkdir()
    (inc / multiarch / "asm").mkdir(parents=True)
    (inc / "linux" / "pkt_cls.h").write_text("/* tc */\n")
    (inc / "linux" / "bpf.h").write_text(
        "#ifndef __LINUX_BPF_H__\n#define __LINUX_BPF_H__\nenum { BPF_REG_0 };\n"
        "#endif /* __LINUX_BPF_H__ */\n")
    (inc / multiarch / "asm" / "types.h").write_text("/* asm */\n")
    dest = tmp_path / "tree"
    script = DEPLOY / "kernel-uapi.sh"
    result = subprocess.run(["bash", str(script), str(dest), str(inc)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert (dest / "include" / "linux" / "kconfig.h").read_text().count("#define CONFIG_BPF_SYSCALL 1") == 1
    assert (dest / "include" / "uapi" / "linux" / "pkt_cls.h").is_file()
    assert (dest / "arch" / karch / "include" / "uapi" / "asm" / "types.h").is_file()
    assert (dest / "arch" / karch / "include" / "asm" / "page.h").is_file()
    assert (dest / "include" / "linux" / "log2.h").is_file()
    # the kernel's own include guard, as BCC's bundled bpf.h has it
    assert (dest / "include" / "uapi" / "linux" / "bpf.h").read_text().splitlines()[:2] == [
        "#ifndef _UAPI__LINUX_BPF_H__", "#define _UAPI__LINUX_BPF_H__"]
    # idempotent: a second run replaces the tree
    (dest / "stale").write_text("x")
    assert subprocess.run(["bash", str(script), str(dest), str(inc)], capture_output=True,
                          timeout=60).returncode == 0
    assert not (dest / "stale").exists()


def test_kernel_uapi_script_fails_clearly_without_uapi_headers(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(DEPLOY / "kernel-uapi.sh"), str(tmp_path / "t"), str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "no UAPI headers in" in result.stderr and "linux-libc-dev" in result.stderr


def test_dockerfile_builds_the_uapi_tree_and_keeps_the_package_out(dockerfile: DockerfileParser) -> None:
    build, final = _stages(dockerfile)
    build_pkgs = [p.split("=")[0] for ins in build if ins["instruction"] == "RUN"
                  and "apt-get install" in ins["value"] for p in _apt_packages(ins["value"])]
    assert "linux-libc-dev" in build_pkgs
    assert any(ins["instruction"] == "RUN" and "zonemeter-kernel-uapi /opt/zonemeter/kernel-uapi" in ins["value"]
               for ins in build)
    # the entrypoint's default tree is what the build stage makes and the final stage copies
    assert "uapi_tree=${ZONEMETER_UAPI_TREE:-/opt/zonemeter/kernel-uapi}" in ENTRYPOINT.read_text()
