"""Build the native pipeline ahead of its first use: `python -m testbed.switch.prebuild [JSON ...]`.

`make install` runs it on the project's program, so that the first switches of a run (or of
`make test`, several at once) load the shared objects from the cache instead of each compiling
them. Without arguments it builds the traffic manager, the switch process's lock and the
xingmai program (p4src/build/xingmai.json); a program the native pipeline cannot run is named
with the reason and the reference runs it, as a switch would. Exit status 0 either way (the
reference always runs); 2 when a JSON cannot be read.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from testbed.p4files import BMV2_JSON
from testbed.switch.native.build import BuildError
from testbed.switch.native.lock import NativeLock
from testbed.switch.native.tm import NativeTrafficManager
from testbed.switch.program import LoadError
from testbed.switch.v1model import V1Switch


def prebuild(path: Path) -> str:
    """Load `path` on a native switch (which builds or finds its C) and say which pipeline
    runs it."""
    t0 = time.monotonic()
    try:
        NativeLock()  # the switch process's lock (testbed/switch/dataplane.py)
    except BuildError:
        pass  # no compiler: the pipeline's line below says so
    sw = V1Switch(pipeline="native")
    sw.load(path.read_bytes())
    took = time.monotonic() - t0
    tm = "native" if isinstance(sw.tm, NativeTrafficManager) else "reference"
    if sw.pipeline_in_use == "native":
        return f"{path}: native pipeline and {tm} traffic manager ready ({took:.1f} s)"
    return f"{path}: the reference runs it ({sw.native_reason})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m testbed.switch.prebuild",
        description="compile the native switch pipeline of bmv2 JSON programs into the cache",
    )
    ap.add_argument("json", nargs="*", type=Path, help=f"programs (default: {BMV2_JSON})")
    args = ap.parse_args(argv)
    paths = args.json or [BMV2_JSON]
    status = 0
    for path in paths:
        try:
            print(prebuild(path))
        except (OSError, LoadError) as exc:
            print(f"{path}: cannot load: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
