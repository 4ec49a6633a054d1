#!/usr/bin/env bash
# Set up everything zonemeter needs on a Debian 12 machine, as root:
#   Debian packages (BCC, kernel headers, iptables, nftables, Prometheus),
#   the kernel-header links BCC compiles against, and the project venv in .venv
#   with the Debian `bcc` module linked in (and nothing else from dist-packages).
# Idempotent: running it again only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "tools/setup.sh: run as root (it installs Debian packages and loads eBPF)" >&2
  exit 1
fi

pkgs=(python3-bpfcc linux-headers-amd64 iproute2 iptables nftables ethtool prometheus python3-venv podman mmdebstrap runc)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's prometheus package starts a system service; the tests and the demo
# run their own instances on their own ports.
systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || true

# BCC compiles against /lib/modules/$(uname -r)/{build,source}. When the running
# kernel has no packaged headers (cloud and micro-VM kernels), link the Debian ones.
k="$(uname -r)"
if [ ! -e "/lib/modules/$k/build/include" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$hdr" ] || [ -z "$common" ]; then
    echo "setup: no kernel headers under /usr/src; install linux-headers-amd64" >&2
    exit 1
  fi
  mkdir -p "/lib/modules/$k"
  ln -sfn "$hdr" "/lib/modules/$k/build"
  ln -sfn "$common" "/lib/modules/$k/source"
fi

# The distribution's Python (the one python3-bpfcc is built for, readable by every user),
# not whichever python3 is first on PATH (pyenv and the like live under one user's home).
py="${PYTHON:-/usr/bin/python3}"
[ -x "$py" ] || py=python3
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Only the bcc package is linked from Debian's dist-packages, so no other Debian
# Python package leaks into the venv.
ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
# pip and the build backend are chatty (index warnings, editable-install notices): keep
# their output in a log and show it only when the install fails
log=.venv/setup-pip.log
if ! { .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip &&
       .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "setup: pip install failed (full log: $log)" >&2
  exit 1
fi
.venv/bin/python -c 'import bcc, pyroute2, kubernetes, prometheus_client, cachetools' \
  || { echo "setup: venv imports failed" >&2; exit 1; }
[ "${ZONEMETER_KUBE:-build}" = skip ] || { t0=$(date +%s); bash tools/kube/build.sh; echo "setup: Kubernetes components ready in $(( $(date +%s) - t0 )) s (tools/kube/BUILD.md; ZONEMETER_KUBE=skip skips)"; }
# the upstream oracle of the hint model at every minor the model covers from 1.31 (the
# differential and vector tests judge each; about 1-2 min per minor once the Kubernetes
# set above has filled the Go caches: tools/oracle/README.md)
[ "${ZONEMETER_KUBE:-build}" = skip ] || for v in 1.31 1.32 1.33 1.34 1.35 1.36 1.37; do bash tools/oracle/build.sh "$v"; done
echo "setup: ok (venv .venv, kernel $k)"
