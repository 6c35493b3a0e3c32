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

`runtime.load_native(prog, ...)` is the one entry point: a `Compiled`, or `Unsupported` /
`BuildError` naming why the reference must run instead.

This file imports nothing: the twin's NIC and the transports build their own C with `build.py`
and read the pipelines' names here, without loading the switch's generator.
"""

# The per-packet code of a part (the switch's pipeline, the twin's NICs, event loop and
# transports): the Python reference, or native code proven identical to it.
PIPELINES = ("reference", "native")
# what runs when none is named (the switch, both engines, the STF runner): the native code,
# which falls back to the reference wherever it cannot run, saying why
DEFAULT_PIPELINE = "native"
