"""Landlock confinement for the sandboxed child: no writes outside its own directory, no TCP,
no signals or abstract Unix sockets aimed outside its own process tree.

Landlock (Linux >= 5.13) lets an unprivileged process restrict itself and every process it
later starts; the restriction survives execve and cannot be lifted. The child calls
`confine()` at boot, while it is still single-threaded (the restriction applies to the calling
thread and to threads and processes created after it), before torch, triton or the candidate
load. Each right is used only when the running kernel's Landlock ABI has it; `confine()` says
what it applied, and the report carries that, so a verdict never claims more isolation than the
host gave.

Reads and execution stay allowed everywhere (the child needs Python, torch, the CUDA driver and
ptxas). Writes are allowed beneath the sandbox directory, to a few named files (/dev/null,
the NVIDIA device nodes the driver opens read-write, the GPU timing lock) and to the process's
own /proc/<pid> files. Not covered: a connect() to a pathname Unix socket (Landlock has no
right for it on the kernels this targets); see docs/harness.md for what the other layers do
about that.

The syscalls are made through ctypes: Python has no binding, and the interface is three
syscalls and two structs from <linux/landlock.h>.
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform

# <asm/unistd.h>: the Landlock syscalls have the same numbers on every architecture.
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# <linux/landlock.h> filesystem rights, with the ABI that introduced each.
_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_REMOVE_DIR = 1 << 4
_FS_REMOVE_FILE = 1 << 5
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_DIR = 1 << 7
_FS_MAKE_REG = 1 << 8
_FS_MAKE_SOCK = 1 << 9
_FS_MAKE_FIFO = 1 << 10
_FS_MAKE_BLOCK = 1 << 11
_FS_MAKE_SYM = 1 << 12
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1  # ABI 6

_WRITE_V1 = (
    _FS_WRITE_FILE
    | _FS_REMOVE_DIR
    | _FS_REMOVE_FILE
    | _FS_MAKE_CHAR
    | _FS_MAKE_DIR
    | _FS_MAKE_REG
    | _FS_MAKE_SOCK
    | _FS_MAKE_FIFO
    | _FS_MAKE_BLOCK
    | _FS_MAKE_SYM
)
# Rights that make sense on a single file (the kernel refuses directory-only rights there).
_FILE_RIGHTS = _FS_WRITE_FILE | _FS_TRUNCATE

# Device files any Python process may write to; the NVIDIA nodes are globbed at confine time.
_DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")
_NVIDIA_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int:
    """The running kernel's Landlock ABI, or 0 when Landlock is absent or disabled."""
    if platform.system() != "Linux":
        return 0
    try:
        libc = _libc()
    except OSError:
        return 0
    v = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return int(v) if v > 0 else 0


def _err(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"landlock: {what}: {os.strerror(e)}")


def confine(writable_dirs: list[str], writable_files: list[str] = ()) -> dict:
    """Restrict this process (and everything it starts) for good. Returns what was applied:
    {"abi": n, "filesystem": bool, "tcp": bool, "signals": bool, "abstract_unix": bool}.

    Raises OSError when Landlock is present but a step fails: the caller must not go on
    believing it is confined. With no Landlock at all it applies nothing and says so."""
    applied = {
        "abi": abi_version(),
        "filesystem": False,
        "tcp": False,
        "signals": False,
        "abstract_unix": False,
    }
    abi = applied["abi"]
    if abi < 1:
        return applied
    libc = _libc()
    fs = _WRITE_V1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = _RulesetAttr(fs, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise _err("create_ruleset")
    try:
        rules = [(d, fs) for d in writable_dirs]
        files = [*_DEVICE_FILES, *writable_files]
        for pattern in _NVIDIA_GLOBS:
            files.extend(sorted(glob.glob(pattern)))
        rules += [(f, fs & _FILE_RIGHTS) for f in files]
        # The process's own /proc/<pid> (resolved now: its children get none): the CUDA driver
        # writes there while it initialises (cuInit failed with "OS call failed" without it on
        # the H200 host). Files there only act on this process; a magic link beneath
        # (/proc/<pid>/root, cwd, fd/N) resolves to the real path, which Landlock checks.
        rules.append(("/proc/self", fs & _FILE_RIGHTS))
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # an optional node this host lacks (no /dev/tty, no GPU)
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_RIGHTS
                rule = _PathBeneathAttr(rights, fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                    raise _err(f"add_rule {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, *map(ctypes.c_ulong, (1, 0, 0, 0))):
            raise _err("no_new_privs")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0):
            raise _err("restrict_self")
    finally:
        os.close(ruleset)
    applied.update(filesystem=True, tcp=bool(net), signals=bool(scoped), abstract_unix=bool(scoped))
    return applied
