#!/usr/bin/env bash
# Build the zonemeter image here, from Debian's packages only, with podman: no registry.
#
#   tools/image.sh [--refresh-base] [--tag NAME]      (as root; NAME: localhost/zonemeter:0.1.0)
#   tools/image.sh --run-options    print the podman options this machine needs, one a
#                                   line, for `podman run` of the image (tests/deploy)
#
# 1. The Debian 12 base: mmdebstrap bookworm (minbase, merged /usr, no docs, man pages
#    or locales: what the registry's debian:12-slim is) into a tarball cached in
#    $ZONEMETER_IMAGE_CACHE (/var/cache/zonemeter/image), outside the clone, and
#    imported as localhost/debian:<point release>-slim. Reused until --refresh-base or
#    until the mmdebstrap options below change (their hash names the tarball).
# 2. deploy/daemonset/Dockerfile built on it (DEBIAN_IMAGE=that base) with podman's
#    layer cache: an unchanged tree rebuilds from cache in seconds. apt and pip inside
#    the build reach deb.debian.org and PyPI over the host network.
# 3. Prints the image's name, id and size (one line per fact, "image: ...").
#
# Needs: podman and mmdebstrap (apt-get install podman mmdebstrap), and runc on hosts
# with hybrid cgroups (below).
set -euo pipefail
cd "$(dirname "$0")/.."

# podman options for the machine, not for the image (build and run alike):
# - crun, podman's default runtime, refuses hybrid cgroup hierarchies (cgroup v1 with
#   controllers also enabled in the v2 tree at /sys/fs/cgroup/unified); runc runs them.
# - without CAP_SYS_RESOURCE (a root that may not raise rlimits, as in some VMs and CI
#   sandboxes) the runtime cannot apply podman's default ulimits: keep the open-files
#   limit we have, and a process limit within conmon's (uid 0 is exempt from
#   RLIMIT_NPROC anyway: kernel/fork.c, copy_process).
podman_options() {
  local controllers=/sys/fs/cgroup/unified/cgroup.controllers
  if [ -r "$controllers" ] && [ -n "$(tr -d ' \n' <"$controllers")" ]; then
    command -v runc >/dev/null || {
      echo "tools/image.sh: hybrid cgroups here need runc (apt-get install runc)" >&2
      return 1
    }
    echo "--runtime=runc"
  fi
  local bnd
  bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  if [ $(((16#$bnd >> 24) & 1)) = 0 ]; then
    local nofile nproc
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
    echo "--ulimit=nofile=$nofile:$nofile"
    echo "--ulimit=nproc=$nproc:$nproc"
  fi
}

# pip inside the build verifies PyPI's certificate against its own bundle. Where the
# host's pip trusts another CA (PIP_CERT, or cert= in /etc/pip.conf: a TLS-inspecting
# egress proxy), hand that bundle and a pip.conf naming it to the build's RUN steps as
# bind mounts: their content is never committed to a layer (the empty mount points
# /etc/pip.conf and /etc/ssl/certs/zonemeter-build-ca.crt are, in both stages).
build_options() {
  local cert=${PIP_CERT:-}
  if [ -z "$cert" ] && [ -r /etc/pip.conf ]; then
    cert=$(sed -nE 's/^[[:space:]]*cert[[:space:]]*=[[:space:]]*(.*[^[:space:]])[[:space:]]*$/\1/p' /etc/pip.conf | head -n 1)
  fi
  if [ -n "$cert" ] && [ -r "$cert" ]; then
    printf '[global]\ncert = /etc/ssl/certs/zonemeter-build-ca.crt\n' >"$cache/pip.conf"
    echo "--volume=$cert:/etc/ssl/certs/zonemeter-build-ca.crt:ro"
    echo "--volume=$cache/pip.conf:/etc/pip.conf:ro"
  fi
}

refresh=0
tag=localhost/zonemeter:0.1.0
while [ $# -gt 0 ]; do
  case $1 in
    --refresh-base) refresh=1 ;;
    --tag) tag=$2; shift ;;
    --run-options) podman_options; exit 0 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "tools/image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$(id -u)" != 0 ]; then
  echo "tools/image.sh: run as root (rootful podman; mmdebstrap --mode=root)" >&2
  exit 1
fi
for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || {
    echo "tools/image.sh: $tool is missing: apt-get install podman mmdebstrap" >&2
    exit 1
  }
done

cache=${ZONEMETER_IMAGE_CACHE:-/var/cache/zonemeter/image}
mirror=${ZONEMETER_DEBIAN_MIRROR:-http://deb.debian.org}
mkdir -p "$cache"

# The registry's slim images drop these paths (debuerreotype's --slimify list).
mmdebstrap_args=(
  --variant=minbase --mode=root --format=tar
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/lintian/*'
  --aptopt='APT::Install-Recommends "false"'
)
sources=(
  "deb $mirror/debian bookworm main"
  "deb $mirror/debian bookworm-updates main"
  "deb $mirror/debian-security bookworm-security main"
)
key=$(printf '%s\n' "${mmdebstrap_args[@]}" "${sources[@]}" | sha256sum | cut -c1-12)
tarball=$cache/debian-bookworm-slim-$key.tar

t0=$(date +%s)
if [ "$refresh" = 1 ] || [ ! -s "$tarball" ]; then
  echo "image: bootstrapping Debian bookworm into $tarball (a few minutes)" >&2
  nice -n 10 mmdebstrap "${mmdebstrap_args[@]}" bookworm "$tarball.tmp" "${sources[@]}" \
    >"$cache/mmdebstrap.log" 2>&1 || {
    tail -n 20 "$cache/mmdebstrap.log" >&2
    echo "tools/image.sh: mmdebstrap failed (log: $cache/mmdebstrap.log)" >&2
    rm -f "$tarball.tmp"
    exit 1
  }
  mv "$tarball.tmp" "$tarball"
fi
release=$(tar -xOf "$tarball" ./etc/debian_version)
base=localhost/debian:$release-slim
base_sum=$(sha256sum "$tarball" | cut -c1-64)
# Import only when this tarball is not the image already (its digest is recorded as a
# label): podman import of the same tarball would otherwise make a new image each time.
if [ "$(podman image inspect --format '{{index .Labels "org.zonemeter.base-tarball"}}' "$base" 2>/dev/null)" != "$base_sum" ]; then
  podman import --quiet \
    --change 'CMD ["bash"]' \
    --change "LABEL org.zonemeter.base-tarball=$base_sum" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$tarball" "$base" >/dev/null
fi
t1=$(date +%s)

# podman build's cache keys COPY layers by the content of what they copy, so an
# unchanged tree reuses every layer.
mapfile -t machine < <(podman_options)
mapfile -t network < <(build_options)
nice -n 10 podman build "${machine[@]}" "${network[@]}" \
  --pull=never --network=host --layers \
  --ignorefile deploy/daemonset/Dockerfile.dockerignore \
  --build-arg "DEBIAN_IMAGE=$base" \
  -f deploy/daemonset/Dockerfile -t "$tag" . >"$cache/build.log" 2>&1 || {
  tail -n 30 "$cache/build.log" >&2
  echo "tools/image.sh: podman build failed (log: $cache/build.log)" >&2
  exit 1
}
t2=$(date +%s)

size=$(podman image inspect --format '{{.Size}}' "$tag")
id=$(podman image inspect --format '{{.Id}}' "$tag")
echo "image: $tag"
echo "image: id $id"
echo "image: base $base ($tarball)"
echo "image: size $size bytes ($((size / 1000000)) MB)"
echo "image: base $((t1 - t0)) s, build $((t2 - t1)) s"
