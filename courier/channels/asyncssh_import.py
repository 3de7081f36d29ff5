"""Import asyncssh the one way wb does: without the compiler runs of its library probe
(docs/benchmarks.md#the-asyncssh-import), and without cryptography's DSA deprecation notices.

At import, `asyncssh.crypto.pq` asks `ctypes.util.find_library` for liboqs, as "oqs" and as
"liboqs". On Linux a name that the dynamic linker's cache does not hold sends find_library on
to gcc and then ld: ten processes (ldconfig, gcc, collect2, ld, twice over) and about 25 ms on a
quiet machine, more on a busy one, paid by every cold remote call and every courier start. On
most machines liboqs is not installed at all, and then no probe can find it. So while asyncssh
is imported, a name is handed to the real find_library only where a file of it could be: the
linker's cache names it, or a directory the probes search holds a `lib<name>.so*`. Where it
could be, the answer is find_library's own; where it cannot, it is None, as find_library's.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
import sysconfig
import warnings

_LINKER_CACHE = "/etc/ld.so.cache"
DSA_DEPRECATED = "DSA is deprecated"  # the start of cryptography's warning (cryptography >= 51)
# The directories gcc's and ld's default search covers on Linux (the multiarch ones added below).
_DEFAULT_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/local/lib64")


def _search_dirs() -> list[str]:
    dirs = [path for key in ("LD_LIBRARY_PATH", "LIBRARY_PATH") for path in os.environ.get(key, "").split(":") if path]
    dirs.extend(_DEFAULT_DIRS)
    dirs.extend(os.path.join(prefix, "lib") for prefix in {sys.prefix, sys.base_prefix})  # a conda-like Python's own
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if isinstance(multiarch, str) and multiarch:
        dirs.extend(f"{root}/{multiarch}" for root in ("/lib", "/usr/lib", "/usr/local/lib"))
        dirs.append(f"/usr/{multiarch}/lib")
    return dirs


def could_be_installed(name: str) -> bool:
    """Whether any of find_library's probes could find `lib<name>.so` here."""
    stem = f"lib{name}.so"
    with contextlib.suppress(OSError), open(_LINKER_CACHE, "rb") as cache:
        if stem.encode() in cache.read():
            return True
    for directory in _search_dirs():
        with contextlib.suppress(OSError):
            if any(entry.startswith(stem) for entry in os.listdir(directory)):
                return True
    return False


def preload_asyncssh() -> None:
    """Import asyncssh once with find_library asking only where the library could be; a later
    `import asyncssh` finds it loaded."""
    if "asyncssh" in sys.modules:
        return
    real = ctypes.util.find_library

    def find_library(name: str) -> str | None:
        return real(name) if could_be_installed(name) else None

    if sys.platform.startswith("linux"):  # elsewhere find_library asks the loader, which is quick
        ctypes.util.find_library = find_library
    try:
        with warnings.catch_warnings():
            # cryptography 51 deprecates DSA, and asyncssh names its DSA key types at import: one
            # warning per name on a user's stderr at every SSH call, about keys wb never offers.
            warnings.filterwarnings("ignore", message=DSA_DEPRECATED)
            import asyncssh  # noqa: F401
    finally:
        ctypes.util.find_library = real
