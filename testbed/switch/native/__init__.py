"""The built-in switch's native pipeline: C generated from the same `Program` the reference
pipeline (testbed/switch/codegen.py, compiler.py) runs, compiled on the user's machine.

- `cgen.py` writes the C: one function per parser state, action, table application,
  conditional and action call, the deparser and the checksums, named after the P4 objects.
  A construct it does not implement raises `Unsupported("what, where")`; it never writes code
  that could give another result than the reference.
- `build.py` compiles that C with the system compiler (`-O2 -Wall -Wextra -Werror`) into a
  shared object cached by the hash of the C source (which covers the JSON and the
  generator's version) in the per-user cache directory, and loads it through cffi.
- `runtime.py` wraps the loaded object as a `Compiled` (the interface `V1Switch` drives), with
  the packet state in C memory and the tables, counters and registers mirrored natively.

`load_native(prog, ...)` is the one entry point: a `Compiled`, or `Unsupported` /
`BuildError` naming why the reference must run instead.
"""

from __future__ import annotations

from testbed.switch.native.build import BuildError
from testbed.switch.native.cgen import Unsupported
from testbed.switch.native.runtime import load_native

__all__ = ["BuildError", "Unsupported", "load_native"]
