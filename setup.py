"""Build steps pyproject.toml cannot declare (its metadata is all there):

- the gRPC stubs are generated from controller/proto/*.proto while the package is built
  (grpcio-tools is a build requirement), never committed;
- the switch program the twin and the emulation load (p4c's outputs for p4src/, committed
  under p4src/build/ with their stamp) is copied into the package as testbed/_program/, so an
  installed package runs without the repository beside it (testbed/p4files.py finds it);
- the NIC's C (ebpf/: its programs and headers) is copied into the package as
  controller/nic/_ebpf/, so an installed twin runs the NIC's own programs compiled, as a clone
  does (controller/nic/bpf/header.py finds it).

An editable install (`pip install -e .`, what `make install` does) writes the stubs into the
source tree, where `make proto` also writes them, and reads the program from p4src/build/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROGRAM_FILES = ("xingmai.json", "xingmai.p4info.txtpb", "stamp.json")


def generate_stubs(out: Path) -> None:
    """controller/proto/*_pb2.py, *_pb2_grpc.py and *.pyi under `out` (a package root)."""
    from grpc_tools import protoc  # a build requirement (pyproject.toml [build-system])

    for proto in sorted((ROOT / "controller" / "proto").glob("*.proto")):
        rel = proto.relative_to(ROOT).as_posix()
        args = ["protoc", f"-I{ROOT}", f"--python_out={out}", f"--grpc_python_out={out}"]
        if protoc.main([*args, f"--pyi_out={out}", rel]) != 0:
            raise RuntimeError(f"protoc failed on {rel}")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            generate_stubs(ROOT)
            return
        out = Path(self.build_lib)
        generate_stubs(out)
        program = out / "testbed" / "_program"
        program.mkdir(parents=True, exist_ok=True)
        for name in PROGRAM_FILES:
            shutil.copy2(ROOT / "p4src" / "build" / name, program / name)
        ebpf = out / "controller" / "nic" / "_ebpf"
        for src in sorted((ROOT / "ebpf").rglob("*")):
            if src.suffix in (".c", ".h"):
                dst = ebpf / src.relative_to(ROOT / "ebpf")
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)


setup(cmdclass={"build_py": BuildPy})
