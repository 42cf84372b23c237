"""A seccomp filter for the sandbox: a classic-BPF program, built here with ``struct``, that bubblewrap
loads (``--seccomp FD``) just before it starts the worker.

It refuses, with ``EPERM``, the system calls graded code has no use for and that reach the kernel's
least-contained parts: new namespaces (``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*``
flag), mounts (``mount``, ``umount2``, ``pivot_root`` and the new mount API), ``ptrace`` and
``process_vm_readv``/``writev``, the keyrings (``keyctl``, ``add_key``, ``request_key``), ``bpf``,
``perf_event_open``, ``userfaultfd``, ``kexec_*`` and kernel modules. ``clone3`` gets ``ENOSYS``
(its flags live in memory, which a filter cannot read), so the C library falls back to ``clone``,
whose flags the filter checks. A system call of another ABI than the interpreter's (32-bit
``int 0x80`` or x32 on x86-64) is refused whole: the numbers would mean other calls there.

Only x86-64 and aarch64 are known; elsewhere ``program()`` returns ``None`` and the sandbox runs
without the filter (``sandbox.py`` says so in its reason).
"""

from __future__ import annotations

import errno
import os
import platform
import struct
import sys

# <linux/audit.h>
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# <linux/seccomp.h>
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

# offsets in struct seccomp_data {int nr; u32 arch; u64 instruction_pointer; u64 args[6];}
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

# <linux/sched.h>: every namespace flag of clone/unshare
CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEW_ANY = CLONE_NEWTIME | CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS
CLONE_NEW_ANY |= CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET

REFUSED = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
)

SYSCALLS = {
    "x86_64": {
        "clone": 56,
        "clone3": 435,
        "unshare": 272,
        "setns": 308,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
    },
    "aarch64": {  # the generic table (asm-generic/unistd.h)
        "clone": 220,
        "clone3": 435,
        "unshare": 97,
        "setns": 268,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
    },
}

# classic BPF opcodes (<linux/filter.h>)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_INSN = struct.Struct("=HBBI")  # struct sock_filter {u16 code; u8 jt; u8 jf; u32 k;}


def machine() -> str:
    return platform.machine().lower()


def supported(arch: str | None = None) -> bool:
    return (arch or machine()) in SYSCALLS


def instructions(arch: str | None = None) -> list[tuple[int, int, int, int]] | None:
    """The filter as ``(code, jt, jf, k)`` tuples for ``arch`` (default: this machine), None if unknown."""
    arch = arch or machine()
    if arch not in SYSCALLS:
        return None
    numbers = SYSCALLS[arch]
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    refused = sorted({numbers[name] for name in REFUSED})
    prog: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, AUDIT_ARCH[arch]),  # the interpreter's ABI: go on; any other: refused
        (_RET_K, 0, 0, eperm),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if arch == "x86_64":  # x32 calls carry the same audit arch, with bit 30 set in the number
        prog += [(_JGE_K, 0, 1, X32_SYSCALL_BIT), (_RET_K, 0, 0, eperm)]
    prog += [(_JEQ_K, 0, 1, numbers["clone3"]), (_RET_K, 0, 0, enosys)]
    for number in refused:
        prog += [(_JEQ_K, 0, 1, number), (_RET_K, 0, 0, eperm)]
    # clone: refused when its flags (the first argument's low word) ask for any new namespace
    prog += [
        (_JEQ_K, 0, 3, numbers["clone"]),
        (_LD_W_ABS, 0, 0, _ARG0_LOW),
        (_JSET_K, 0, 1, CLONE_NEW_ANY),
        (_RET_K, 0, 0, eperm),
        (_RET_K, 0, 0, RET_ALLOW),
    ]
    return prog


def program(arch: str | None = None) -> bytes | None:
    """The filter as the bytes of a ``struct sock_filter`` array (what ``bwrap --seccomp`` reads)."""
    prog = instructions(arch)
    if prog is None:
        return None
    if sys.byteorder != "little":  # the argument's low word is at offset 16 only on little-endian
        return None
    return b"".join(_INSN.pack(*insn) for insn in prog)


def program_fd(arch: str | None = None) -> int | None:
    """A file descriptor positioned at the start of ``program()`` (a memfd; the caller closes it)."""
    data = program(arch)
    if data is None:
        return None
    fd = os.memfd_create("spec-seccomp", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
