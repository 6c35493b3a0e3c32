"""Compile generated C with the system compiler and load it through cffi (ABI mode).

The shared object is cached per user, never in the repository: `$XDG_CACHE_HOME/xingmai/native`
(default `~/.cache/xingmai/native`), named by the SHA-256 of the generator's version and the
C source (which the JSON determines). A build writes to a temporary name and renames, so two
switches starting at once never load a half-written file. The compiler is `$CC` or `cc`,
with `-O2 -Wall -Wextra -Werror`: a warning is a build failure, and the reference runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-std=gnu11")


class BuildError(Exception):
    """The native pipeline cannot be built here; the message says why in one line."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xingmai" / "native"


def compiler() -> str:
    cc = os.environ.get("CC", "cc")
    path = shutil.which(cc)
    if path is None:
        raise BuildError(f"no C compiler: {cc!r} is not on PATH (install gcc or set CC)")
    return path


def build(source: str, digest: str) -> Path:
    """The shared object of `source`, compiled now or found in the cache."""
    out_dir = cache_dir()
    so = out_dir / f"pipeline-{digest[:32]}.so"
    if so.exists():
        return so
    cc = compiler()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create the cache directory {out_dir}: {exc}") from exc
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        c_file = Path(tmp) / f"pipeline-{digest[:32]}.c"
        c_file.write_text(source)
        tmp_so = Path(tmp) / "pipeline.so"
        try:
            res = subprocess.run(
                [cc, *CFLAGS, "-o", str(tmp_so), str(c_file)],
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"the C compiler failed to run: {exc}") from exc
        if res.returncode != 0:
            first = next((ln for ln in res.stderr.splitlines() if "error" in ln), res.stderr[:200])
            raise BuildError(f"the generated C did not compile ({cc}): {first.strip()}")
        # keep the C beside the object, for reading and debugging
        shutil.copyfile(c_file, so.with_suffix(".c"))
        os.replace(tmp_so, so)
    return so


def load(cdef: str, so: Path) -> tuple[Any, Any]:
    """(ffi, lib) of a built pipeline."""
    try:
        import cffi
    except ImportError as exc:
        raise BuildError("cffi is not installed (pip install cffi)") from exc
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    try:
        lib = ffi.dlopen(str(so))
    except OSError as exc:
        raise BuildError(f"cannot load {so}: {exc}") from exc
    return ffi, lib
