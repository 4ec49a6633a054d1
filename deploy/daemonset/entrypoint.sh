#!/bin/bash
# zonemeter container entrypoint: make the node's kernel headers visible where BCC
# looks for them, then exec `zonemeter agent "$@"`.
#
# BCC compiles the datapath at start-up against /lib/modules/$(uname -r)/build (and
# .../source when present). In the pod the node's /lib/modules is mounted read-only at
# $ZONEMETER_HOST_ROOT/lib/modules and the node's /usr/src at /usr/src (the same path as
# on the node, so absolute symlinks inside header trees resolve). This script reads the
# node's build/source links, translates each target into a path that exists in the
# container, and recreates the links in the container's own writable /lib/modules.
# Running it again replaces the links with the same ones (idempotent).
#
# Order of preference for the headers of kernel release R:
#   1. the node's /lib/modules/R/build and /lib/modules/R/source (links or directories);
#   2. /usr/src/linux-headers-R (Debian, Ubuntu) with /usr/src/linux-headers-R%-*-common
#      as source (Debian's split packages), or /usr/src/kernels/R (RHEL, Fedora, Amazon Linux);
#   3. the kernel's own /sys/kernel/kheaders.tar.xz (CONFIG_IKHEADERS), which BCC
#      extracts by itself: nothing to link;
#   4. only with ZONEMETER_HEADERS_FALLBACK=newest: the newest Debian headers under
#      /usr/src even though their version differs from R, as tools/setup.sh does for
#      kernels without packaged headers. Structures that changed between the two
#      versions would be compiled wrongly, hence opt-in.
#   5. the kernel UAPI headers the image carries ($ZONEMETER_UAPI_TREE, laid out by
#      deploy/daemonset/kernel-uapi.sh from Debian's linux-libc-dev), through
#      BCC_KERNEL_SOURCE: the datapath reads only UAPI structures, whose layout does not
#      change between kernels, so a node without any headers still runs the agent.
# A BCC_KERNEL_SOURCE set on the container wins over all of these. Whichever is used is
# logged. Only when none exists (an image without the UAPI tree) it exits 1 with a
# message naming the node's missing paths.
#
# `--cleanup` (remove pins and filters) and `--help` need no headers and skip all this.
#
# Settings (environment; the defaults are the DaemonSet's layout, tests override them):
#   ZONEMETER_HOST_ROOT        where the node's / paths are mounted      (/host)
#   ZONEMETER_MODULES_DIR      the container's writable modules dir      (/lib/modules)
#   ZONEMETER_USR_SRC          the node's /usr/src inside the container  (/usr/src)
#   ZONEMETER_SYS_KERNEL       sysfs kernel dir, for kheaders.tar.xz     (/sys/kernel)
#   ZONEMETER_KERNEL_RELEASE   kernel release                            ($(uname -r))
#   ZONEMETER_HEADERS_FALLBACK none | newest                             (none)
#   ZONEMETER_UAPI_TREE        the image's UAPI header tree              (/opt/zonemeter/kernel-uapi)
#   ZONEMETER_AGENT            the zonemeter executable                  (/opt/zonemeter/venv/bin/zonemeter)
set -euo pipefail

host_root=${ZONEMETER_HOST_ROOT:-/host}
modules_dir=${ZONEMETER_MODULES_DIR:-/lib/modules}
usr_src=${ZONEMETER_USR_SRC:-/usr/src}
sys_kernel=${ZONEMETER_SYS_KERNEL:-/sys/kernel}
release=${ZONEMETER_KERNEL_RELEASE:-$(uname -r)}
fallback=${ZONEMETER_HEADERS_FALLBACK:-none}
uapi_tree=${ZONEMETER_UAPI_TREE:-/opt/zonemeter/kernel-uapi}
agent=${ZONEMETER_AGENT:-/opt/zonemeter/venv/bin/zonemeter}

# One JSON object per line on stderr, like the agent's own log.
log() {
  local level=$1 msg=$2
  msg=${msg//\\/\\\\}
  msg=${msg//\"/\\\"}
  printf '{"level":"%s","logger":"zonemeter.entrypoint","msg":"%s"}\n' "$level" "$msg" >&2
}

# to_container HOST_PATH: the path under which the container sees a node path.
to_container() {
  case $1 in
    /usr/src | /usr/src/*) printf '%s\n' "$usr_src${1#/usr/src}" ;;
    *) printf '%s\n' "$host_root$1" ;;
  esac
}

# resolve_host HOST_PATH: follow symlinks the way the node would (targets are node
# paths), printing the final container path, or nothing after 16 hops (a loop).
resolve_host() {
  local hp=$1 cp target hops=0
  while [ "$hops" -lt 16 ]; do
    cp=$(to_container "$hp")
    if [ ! -L "$cp" ]; then
      printf '%s\n' "$cp"
      return 0
    fi
    target=$(readlink "$cp")
    case $target in
      /*) hp=$target ;;
      *) hp=$(dirname "$hp")/$target ;;
    esac
    # Lexically, without touching the container's file system: ".." in a node path
    # means the node's parent directory, not the mount point's.
    hp=$(realpath -m -s -- "$hp")
    hops=$((hops + 1))
  done
  return 1
}

# link NAME TARGET: $modules_dir/$release/NAME -> TARGET, replacing an earlier link.
link() {
  local dest=$modules_dir/$release/$1
  if [ -e "$dest" ] && [ ! -L "$dest" ]; then
    # A real directory (an image with headers baked in, or /lib/modules mounted
    # directly): keep it, and never write a link inside it.
    log info "$dest exists and is not a link; leaving it"
    return 0
  fi
  mkdir -p "$modules_dir/$release"
  ln -sfn "$2" "$dest"
  log info "linked $dest -> $2"
}

prepare_headers() {
  local build="" source="" cp
  if [ -n "${BCC_KERNEL_SOURCE:-}" ]; then
    log info "BCC_KERNEL_SOURCE is set: BCC compiles against $BCC_KERNEL_SOURCE"
    return 0
  fi
  cp=$(resolve_host "/lib/modules/$release/build" || true)
  if [ -n "$cp" ] && [ -d "$cp/include" ]; then build=$cp; fi
  cp=$(resolve_host "/lib/modules/$release/source" || true)
  if [ -n "$cp" ] && [ -d "$cp" ]; then source=$cp; fi

  if [ -z "$build" ]; then
    if [ -d "$usr_src/linux-headers-$release/include" ]; then
      build=$usr_src/linux-headers-$release
    elif [ -d "$usr_src/kernels/$release/include" ]; then
      build=$usr_src/kernels/$release
    fi
  fi

  if [ -z "$build" ] && [ -e "$sys_kernel/kheaders.tar.xz" ]; then
    log info "no kernel headers for $release on the node; BCC uses $sys_kernel/kheaders.tar.xz"
    return 0
  fi

  if [ -z "$build" ] && [ "$fallback" = newest ]; then
    local arch
    case $(uname -m) in
      x86_64) arch=amd64 ;;
      aarch64) arch=arm64 ;;
      *) arch=$(uname -m) ;;
    esac
    build=$(find "$usr_src" -mindepth 1 -maxdepth 1 -name "linux-headers-*-$arch" 2>/dev/null | sort -V | tail -n 1)
    source=$(find "$usr_src" -mindepth 1 -maxdepth 1 -name 'linux-headers-*-common' 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$build" ]; then
      log warning "no headers for kernel $release; using $build (ZONEMETER_HEADERS_FALLBACK=newest): structures that differ between versions are compiled wrongly"
    fi
  fi

  if [ -z "$build" ] && [ -f "$uapi_tree/include/linux/kconfig.h" ]; then
    local origin
    origin=$(head -n 1 "$uapi_tree/ORIGIN" 2>/dev/null || echo "unknown origin")
    export BCC_KERNEL_SOURCE=$uapi_tree
    log info "no kernel headers for $release on the node; BCC compiles against the image's UAPI headers in $uapi_tree ($origin)"
    return 0
  fi

  if [ -z "$build" ]; then
    log error "no kernel headers for $release: the node has no /lib/modules/$release/build with an include/ directory, no /usr/src/linux-headers-$release or /usr/src/kernels/$release, and no $sys_kernel/kheaders.tar.xz, and the image has no UAPI header tree at $uapi_tree (see deploy/daemonset/README.md)"
    return 1
  fi
  # Debian splits headers into linux-headers-R (flavour: amd64, cloud-amd64, ...) and
  # linux-headers-R%-*-common; BCC wants the latter as source/.
  if [ -z "$source" ]; then
    local abi
    abi=$(basename "$build" | sed -nE 's/^(linux-headers-[0-9][0-9.]*-[0-9]+)-.*/\1/p')
    if [ -n "$abi" ] && [ -d "$(dirname "$build")/$abi-common" ]; then
      source=$(dirname "$build")/$abi-common
    fi
  fi
  link build "$build"
  if [ -n "$source" ]; then
    link source "$source"
  fi
  log info "BCC compiles against the node's kernel headers in $build"
}

needs_headers=1
for arg in "$@"; do
  case $arg in
    --cleanup | -h | --help) needs_headers=0 ;;
  esac
done
if [ "$needs_headers" = 1 ]; then
  prepare_headers || exit 1
fi

exec "$agent" agent "$@"
