#!/bin/bash
# Lay out the kernel's user-space API headers (Debian's linux-libc-dev, /usr/include)
# as the kernel build tree BCC expects, so that BCC compiles the datapath on a node
# that has no kernel headers at all: `BCC_KERNEL_SOURCE=DEST` points BCC at it.
#
#   deploy/daemonset/kernel-uapi.sh DEST [INCLUDE_DIR]      (INCLUDE_DIR: /usr/include)
#
# Why this is enough: the datapath (bpf/*.c, *.h) reads only UAPI structures
# (__sk_buff, ethhdr, iphdr, ipv6hdr, tcphdr, udphdr, the TC_ACT_* codes), whose layout
# the kernel never changes (Documentation/process/stable-api-nonsense.rst: the
# user-space interface is stable). BCC itself brings its own linux/bpf.h (the
# /virtual/include/bcc/bpf.h it force-includes).
#
# How BCC 0.26 reads a kernel tree (src/cc/frontends/clang/loader.cc, ClangLoader::parse,
# and kbuild_helper.cc, KBuildHelper::get_flags): with BCC_KERNEL_SOURCE set it runs
# clang inside that directory with -nostdinc, -Iinclude, -I./include/uapi,
# -I./arch/ARCH/include, -I./arch/ARCH/include/uapi (and the generated/ variants),
# -D__KERNEL__ and `-include ./include/linux/kconfig.h`; it takes the tree only if that
# kconfig.h exists. So DEST gets:
#   include/uapi/{linux,asm-generic,...}  the UAPI headers as installed in INCLUDE_DIR;
#   arch/ARCH/include/uapi/asm            the architecture's asm/ UAPI headers;
#   include/linux/kconfig.h, include/linux/types.h, include/linux/log2.h,
#   arch/ARCH/include/asm/page.h          small stand-ins for the four kernel-internal
#                                         headers BCC's helpers.h and the UAPI headers
#                                         reach (see each file's comment).
# With these the programs compile to the same instructions as against a Debian kernel
# tree (tests/deploy/test_kernel_uapi.py compares them).
#
# Idempotent: DEST is replaced.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 DEST [INCLUDE_DIR]" >&2
  exit 2
fi
dest=$1
inc=${2:-/usr/include}

case ${ARCH:-$(uname -m)} in
  x86_64 | x86) arch=x86 multiarch=x86_64-linux-gnu ;;
  aarch64 | arm64) arch=arm64 multiarch=aarch64-linux-gnu ;;
  *) echo "$0: unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac
if [ ! -f "$inc/linux/pkt_cls.h" ] || [ ! -d "$inc/$multiarch/asm" ]; then
  echo "$0: no UAPI headers in $inc (install linux-libc-dev)" >&2
  exit 1
fi

rm -rf "$dest"
mkdir -p "$dest/include/uapi" "$dest/include/linux" "$dest/arch/$arch/include/uapi" \
  "$dest/arch/$arch/include/asm"
for d in linux asm-generic; do
  cp -a "$inc/$d" "$dest/include/uapi/$d"
done
cp -a "$inc/$multiarch/asm" "$dest/arch/$arch/include/uapi/asm"

# headers_install (scripts/headers_install.sh in the kernel) strips the _UAPI prefix
# from include guards. BCC's own copy of linux/bpf.h keeps the kernel's guard
# _UAPI__LINUX_BPF_H__, so put it back: otherwise the installed bpf.h is read a second
# time and every enumerator is redefined.
sed -i -E \
  -e 's@^#(ifndef|define) __LINUX_BPF_H__$@#\1 _UAPI__LINUX_BPF_H__@' \
  -e 's@^#endif /\* __LINUX_BPF_H__ \*/$@#endif /* _UAPI__LINUX_BPF_H__ */@' \
  "$dest/include/uapi/linux/bpf.h"
grep -q '^#define _UAPI__LINUX_BPF_H__$' "$dest/include/uapi/linux/bpf.h" || {
  echo "$0: $inc/linux/bpf.h has an unexpected include guard" >&2
  exit 1
}

cat >"$dest/include/linux/kconfig.h" <<'EOF'
/* Stand-in for the kernel's include/linux/kconfig.h, which BCC force-includes.
 *
 * BCC's helpers.h refuses to compile without CONFIG_BPF_SYSCALL; a kernel that loads
 * the programs has it. No other CONFIG_ symbol is defined: nothing the datapath
 * compiles depends on one.
 *
 * The errno codes: in a kernel tree the datapath gets them through the kernel-internal
 * include/linux/socket.h (from uapi/linux/in.h), linux/uio.h, linux/kernel.h,
 * linux/err.h, linux/errno.h; the UAPI tree's linux/socket.h has no such chain. */
#define CONFIG_BPF_SYSCALL 1
#include <uapi/linux/errno.h>
EOF

cat >"$dest/include/linux/types.h" <<'EOF'
/* Stand-in for the kernel's include/linux/types.h: the UAPI types plus the
 * kernel-internal names BCC's helpers.h and the datapath use, defined as the kernel
 * defines them:
 *   u8..u64, s8..s64      include/asm-generic/int-ll64.h
 *   size_t, ssize_t,
 *   uintptr_t, bool       include/linux/types.h (__kernel_size_t is unsigned long)
 *   NULL, false, true     include/linux/stddef.h
 *   __always_inline       include/linux/compiler_attributes.h (the UAPI
 *                         linux/stddef.h would otherwise define it as plain
 *                         __inline__, which changes the generated code) */
#ifndef _ZONEMETER_UAPI_TREE_LINUX_TYPES_H
#define _ZONEMETER_UAPI_TREE_LINUX_TYPES_H
#define __always_inline inline __attribute__((__always_inline__))
#include <uapi/linux/types.h>
typedef __s8 s8;
typedef __u8 u8;
typedef __s16 s16;
typedef __u16 u16;
typedef __s32 s32;
typedef __u32 u32;
typedef __s64 s64;
typedef __u64 u64;
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ssize_t;
typedef __UINTPTR_TYPE__ uintptr_t;
typedef _Bool bool;
enum { false = 0, true = 1 };
#undef NULL
#define NULL ((void *)0)
#endif
EOF

cat >"$dest/include/linux/log2.h" <<'EOF'
/* Stand-in for the kernel's include/linux/log2.h, which BCC's helpers.h includes for
 * roundup_pow_of_two() in its BPF_STACK_TRACE macros. The datapath has no stack-trace
 * table, so this defines nothing: a program that used one would fail to compile here
 * instead of being sized wrongly. */
EOF

cat >"$dest/arch/$arch/include/asm/page.h" <<'EOF'
/* Stand-in for the kernel's arch/ARCH/include/asm/page.h, which BCC's helpers.h
 * includes for PAGE_SIZE in its BPF_RINGBUF_OUTPUT macro. The datapath has no ring
 * buffer, and the page size differs between kernels (arm64: 4, 16 or 64 KiB), so this
 * defines nothing: a program that used it would fail to compile instead of guessing. */
EOF

# What the tree was made from, for the entrypoint's log line.
version=$(dpkg-query -W -f='${Version}' linux-libc-dev 2>/dev/null || true)
printf 'linux-libc-dev %s (%s)\n' "${version:-unknown}" "$inc" >"$dest/ORIGIN"
