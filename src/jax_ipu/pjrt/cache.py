"""The executable cache (Poplar's --executable_cache_path): compiled IPU
programs saved in a directory, one file per program, so that a process
running a program another process compiled loads it instead.

    JAX_IPU_EXECUTABLE_CACHE=DIR, or TF_POPLAR_FLAGS=--executable_cache_path=DIR

The key is a sha256 of everything that changes what compiling makes: the
StableHLO bytes, jax-ipu's compile options (available_memory_proportion,
allow_out_of_memory, the f64 policy), the device assignment, the target's
every figure (its name and tile count among them), the versions of jax,
jaxlib and jax-ipu (with a digest of its sources) and the program format.
An entry is the executable's serialized bytes (graph.serialize: checksum,
format and plugin versions), written to a temporary file and renamed into
place, so that processes filling the cache at once leave whole entries. An
entry that cannot be loaded (corrupt, truncated, another version) is
reported with a warning and compiled again, never run. Programs that call
host callbacks are not stored: their callbacks are Python functions of the
process that compiled them.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import threading
import warnings

SUFFIX = ".ipu_exec"


class ExecutableCache:
    def __init__(self, directory: str):
        self.directory = directory
        self.stats = {"hits": 0, "misses": 0, "stored": 0, "rejected": 0}
        self._lock = threading.Lock()

    def key(self, code: bytes, settings, assignment, target) -> str:
        """`settings`: the compiler options and policies, in a stable repr."""
        import jax
        import jaxlib

        from jax_ipu.graph import serialize

        digest = hashlib.sha256()
        for part in (b"jax-ipu executable cache 1", serialize.plugin_version(), serialize.FORMAT_VERSION,
                     jax.__version__, jaxlib.__version__, repr(settings), repr(assignment),
                     repr(target)):
            digest.update(str(part).encode() + b"\0")
        digest.update(code)
        return digest.hexdigest()

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key + SUFFIX)

    def load(self, client, key: str):
        """The cached Executable, or None (a miss, or an entry refused)."""
        from jax_ipu.errors import IpuInvalidArgument
        from jax_ipu.pjrt.executable import from_bytes

        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self._count("misses")
            return None
        except OSError as exc:
            self._reject(path, f"unreadable: {exc}")
            return None
        try:
            executable = from_bytes(client, data, None)
        except IpuInvalidArgument as exc:
            self._reject(path, str(exc))
            return None
        self._count("hits")
        return executable

    def store(self, key: str, executable) -> None:
        """Saves the executable (atomically); a failure only warns."""
        if executable.host_callback_ids:     # their callbacks are this process's functions
            return
        try:
            data = executable.serialize()
            os.makedirs(self.directory, exist_ok=True)
            # A name of our own (and the umask's mode, as any file the user
            # writes: a cache directory may be shared), then renamed into place.
            temporary = os.path.join(self.directory, f".{key[:16]}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(temporary, self.path(key))
            except BaseException:
                os.unlink(temporary)
                raise
        except Exception as exc:
            warnings.warn(f"jax-ipu could not save {executable.name} in the executable cache {self.directory}: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            return
        self._count("stored")

    def _count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1

    def _reject(self, path: str, reason: str) -> None:
        self._count("rejected")
        warnings.warn(f"jax-ipu's executable cache entry {path} cannot be used ({reason}); compiling the "
                      "program again", RuntimeWarning, stacklevel=2)
