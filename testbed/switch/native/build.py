"""Compile generated C with the system compiler and load it through cffi (ABI mode).

The shared object is cached per user, never in the repository: `$XDG_CACHE_HOME/xingmai/native`
(default `~/.cache/xingmai/native`), named by the SHA-256 of the generator's version and the
C source (which the JSON determines). A build writes to a temporary name and renames, so two
switches starting at once never load a half-written file. The cache keeps the CACHE_KEEP
objects used last (a hit refreshes an object's time) and removes older ones after each build:
every program and every generator version has its own object, and nothing else would ever
remove them. The compiler is `$CC` or `cc`,
with `-O2 -Wall -Wextra -Werror`: a warning is a build failure, and the reference runs.

`XINGMAI_NATIVE_SANITIZE` (e.g. `address,undefined`) builds with those sanitizers, aborting at
the first report, into objects of their own; the process must have the sanitizer's runtime
loaded first (`LD_PRELOAD=$(cc -print-file-name=libasan.so)`, as `make fuzz` does).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-std=gnu11")
SANITIZE_ENV = "XINGMAI_NATIVE_SANITIZE"
CACHE_KEEP = 512  # objects kept, the ones used last: the test suite alone loads about 140 (~30 MB)


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


def sanitizers() -> str | None:
    """The sanitizers asked for (XINGMAI_NATIVE_SANITIZE), None for none."""
    value = os.environ.get(SANITIZE_ENV, "").strip()
    if value and not re.fullmatch(r"[a-z]+(,[a-z]+)*", value):
        raise BuildError(
            f"{SANITIZE_ENV}={value!r}: a comma-separated list such as address,undefined"
        )
    return value or None


def cflags() -> tuple[str, ...]:
    san = sanitizers()
    if san is None:
        return CFLAGS
    return (
        *CFLAGS,
        "-g",
        "-fno-omit-frame-pointer",
        f"-fsanitize={san}",
        "-fno-sanitize-recover=all",
    )


def build(source: str, digest: str, stem: str = "pipeline") -> Path:
    """The shared object of `source`, compiled now or found in the cache (`stem`: what it is,
    the start of its name: the switch's pipelines, the twin's NIC)."""
    out_dir = cache_dir()
    san = sanitizers()
    tag = f"-{san.replace(',', '-')}" if san else ""
    so = out_dir / f"{stem}-{digest[:32]}{tag}.so"
    if so.exists():
        try:
            os.utime(so)  # used now: the last to be pruned
        except OSError:
            pass  # a read-only cache is still a cache
        return so
    cc = compiler()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create the cache directory {out_dir}: {exc}") from exc
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        c_file = Path(tmp) / f"{stem}-{digest[:32]}.c"
        c_file.write_text(source)
        tmp_so = Path(tmp) / "pipeline.so"
        try:
            res = subprocess.run(
                [cc, *cflags(), "-o", str(tmp_so), str(c_file)],
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"the C compiler failed to run: {exc}") from exc
        if res.returncode != 0:
            first = next((ln for ln in res.stderr.splitlines() if "error" in ln), res.stderr[:200])
            raise BuildError(f"the {stem}'s C did not compile ({cc}): {first.strip()}")
        # keep the C beside the object, for reading and debugging
        shutil.copyfile(c_file, so.with_suffix(".c"))
        os.replace(tmp_so, so)
    prune(out_dir)
    return so


def prune(out_dir: Path, keep: int = CACHE_KEEP) -> None:
    """Remove all but the `keep` shared objects used last, with their C."""
    objs = []
    for so in out_dir.glob("*-*.so"):
        try:
            objs.append((so.stat().st_mtime, so))
        except OSError:
            continue  # removed meanwhile by another process's prune
    objs.sort(reverse=True)
    for _, so in objs[keep:]:
        for f in (so, so.with_suffix(".c")):
            try:
                f.unlink()
            except OSError:
                pass  # gone already, or not ours to remove: the next prune tries again


def inline_headers(source: Path, headers: Sequence[Path]) -> str:
    """`source`'s text with each header's `#include "<name>"` line replaced by the header (one
    self-contained text: the cache's .c beside the object is what ran)."""
    text = source.read_text()
    for header in headers:
        include = f'#include "{header.name}"\n'
        if include not in text:
            raise BuildError(f"{source.name} has no {include.strip()!r} to expand")
        text = text.replace(include, header.read_text())
    return text


def build_library(text: str, decls: str, stem: str) -> tuple[Any, Any]:
    """(ffi, lib) of the C `text` that cffi's `decls` declare, built into the cache (or found
    there) by the hash of both."""
    digest = hashlib.sha256((decls + text).encode()).hexdigest()
    return load(decls, build(text, digest, stem=stem))


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
        hint = ""
        if sanitizers():
            hint = f" ({SANITIZE_ENV} is set: preload the sanitizer's runtime, LD_PRELOAD)"
        raise BuildError(f"cannot load {so}: {exc}{hint}") from exc
    return ffi, lib
