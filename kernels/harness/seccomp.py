"""A seccomp filter for the sandboxed child: it cannot create a socket.

Network namespaces (`unshare -n`) and Landlock's TCP rights leave two ways out: a pathname Unix
socket (PostgreSQL's /var/run/postgresql/.s.PGSQL.5432, a Redis socket, a container runtime's
socket) is reachable from any network namespace, and Landlock has no right for UDP. Neither
torch nor triton needs a socket to compile and run a kernel, so the child refuses socket(2) for
every address family but netlink (which only talks to the local kernel, used by interface
enumeration) with EACCES. socketpair(2) stays: it connects nothing outside.

The CUDA driver does create a socket while it initialises (on the H200 host, cuInit failed with
"OS call failed" (304) under this filter), so the child installs the filter only once its CUDA
context exists and before any candidate code loads, for every thread at once (TSYNC): the
driver's own threads, started during initialisation, are covered too.

The filter is ten classic-BPF instructions, built here with ctypes rather than through
libseccomp so that a GPU host needs no extra system library; it allows only the native
architecture (a 32-bit compat syscall kills the process) and refuses x32 syscall numbers.
"""

from __future__ import annotations

import ctypes
import platform

_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_EACCES = 13
_AF_NETLINK = 16
_X32_BIT = 0x40000000

# seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low 32 bits on little-endian hosts).
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16

# machine -> (AUDIT_ARCH_*, __NR_socket, __NR_seccomp)
_ARCHES = {
    "x86_64": (0xC000003E, 41, 317),
    "aarch64": (0xC00000B7, 198, 277),
}


class _Insn(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Insn))]


def supported() -> bool:
    return platform.system() == "Linux" and platform.machine() in _ARCHES


def program() -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k); jumps count instructions skipped after the jump."""
    arch, nr_socket, _ = _ARCHES[platform.machine()]
    return [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),  # 0
        (_JEQ_K, 0, 7, arch),  # 1: foreign arch -> 9 (kill)
        (_LD_W_ABS, 0, 0, _OFF_NR),  # 2
        (_JGE_K, 4, 0, _X32_BIT),  # 3: x32 number -> 8 (refuse)
        (_JEQ_K, 0, 2, nr_socket),  # 4: not socket(2) -> 7 (allow)
        (_LD_W_ABS, 0, 0, _OFF_ARG0),  # 5: the address family
        (_JEQ_K, 0, 1, _AF_NETLINK),  # 6: netlink -> 7 (allow), else -> 8 (refuse)
        (_RET_K, 0, 0, _RET_ALLOW),  # 7
        (_RET_K, 0, 0, _RET_ERRNO | _EACCES),  # 8
        (_RET_K, 0, 0, _RET_KILL_PROCESS),  # 9
    ]


def deny_sockets() -> bool:
    """Install the filter on every thread of this process and on everything they create later
    (seccomp(2) with TSYNC). Returns False where unsupported; raises OSError on failure,
    including when some thread could not take the filter."""
    if not supported():
        return False
    insns = program()
    arr = (_Insn * len(insns))(*[_Insn(*i) for i in insns])
    prog = _Prog(len(insns), arr)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, *map(ctypes.c_ulong, (1, 0, 0, 0))):
        e = ctypes.get_errno()
        raise OSError(e, "seccomp: no_new_privs failed")
    nr_seccomp = _ARCHES[platform.machine()][2]
    r = libc.syscall(
        ctypes.c_long(nr_seccomp),
        ctypes.c_ulong(_SECCOMP_SET_MODE_FILTER),
        ctypes.c_ulong(_SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(prog),
    )
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "seccomp: installing the filter failed")
    if r > 0:  # TSYNC: the id of a thread that could not be synchronised
        raise OSError(0, f"seccomp: thread {r} could not take the filter")
    return True
