"""Namespaces inside the sandbox: at import, a new user namespace (where the submission would be
root with every capability), then a mount namespace and a tmpfs mount over /tmp, a ptrace attach
to its own parent, and a keyring; all refused by the sandbox's seccomp filter (EPERM)."""

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
ESCAPES = {
    "unshare_user": _libc.unshare(0x10000000),
    "unshare_mount": _libc.unshare(0x00020000),
    "mount": _libc.mount(b"none", b"/tmp", b"tmpfs", 0, None),
    "ptrace": _libc.ptrace(16, os.getppid(), None, None),
}
