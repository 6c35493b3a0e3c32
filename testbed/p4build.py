"""`make p4`: compile the project's P4 with the compilers installed here and keep the committed
outputs honest.

Two folders of P4 sources have committed builds: `p4src/` (the switch program) and `tests/p4/`
(small programs the built-in switch's tests and benchmarks run). Each has a `build/` with the
compiler outputs (the project runs without a P4 compiler) and `stamp.json`, which records, per
target, the sha256 of every P4 source the target's top file includes (transitively), the
compiler and its version, the flags, and the sha256 of each output. `check()` recomputes the
source and output hashes: a test fails when they differ from the stamp, so the committed
artifacts can never silently drift from the code.

    python -m testbed.p4build            # rebuild every target whose compiler is installed
    python -m testbed.p4build --check    # only verify the stamp (exit 1 on a mismatch)

A compiler is found on PATH, or through the environment variable the target names (e.g.
P4C_BM2_SS=/path/to/p4c-bm2-ss). Targets whose compiler is missing keep their committed
outputs; the command says so, and fails if those outputs are stale.

The Tofino targets of p4src (Tofino 1 / TNA and Tofino 2 / T2NA) are compiled by p4c's
Tofino backend: `bf-p4c` on PATH, `$BF_P4C`, or a `p4c` driver with `p4c-barefoot` beside it.
It keeps the P4Info, `bfrt.json` and a short resource summary (stages, SRAM, TCAM, PHV, from
bf-p4c's resource log), not the binary or context.json (large, for a device only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


@dataclass(frozen=True)
class Target:
    """One compiled program: its top file, compiler, flags and the outputs it writes."""

    name: str
    top: str  # relative to p4src/
    compiler: str  # executable name
    compiler_env: str  # environment variable that may point at the compiler
    flags: tuple[str, ...]
    outputs: dict[str, str] = field(default_factory=dict)  # role -> file name in build/
    kind: str = "bmv2"  # "bmv2" (p4c-bm2-ss) or "tofino" (p4c's Tofino backend)

    def command(self, exe: str, outdir: Path) -> list[str]:
        if self.kind == "tofino":
            # bf-p4c writes a folder (bfrt.json, the pipe's binary, logs); the P4Info beside it
            return [
                exe,
                *self.flags,
                "--p4runtime-files",
                str(outdir / self.outputs["p4info"]),
                "-o",
                str(outdir / TOFINO_OUTDIR),
                self.top,
            ]
        return [
            exe,
            *self.flags,
            "--p4runtime-files",
            str(outdir / self.outputs["p4info"]),
            "-o",
            str(outdir / self.outputs["json"]),
            self.top,
        ]


def bmv2_target(name: str, top: str) -> Target:
    return Target(
        name=name,
        top=top,
        compiler="p4c-bm2-ss",
        compiler_env="P4C_BM2_SS",
        flags=("--arch", "v1model", "--std", "p4-16"),
        outputs={"json": f"{Path(top).stem}.json", "p4info": f"{Path(top).stem}.p4info.txtpb"},
    )


TOFINO_OUTDIR = "bf-p4c-out"


def tofino_target(name: str, top: str, device: str, arch: str) -> Target:
    """`device` is bf-p4c's --target (tofino, tofino2), `arch` its --arch (tna, t2na).
    Metadata starts zeroed as on v1model (--auto-init-metadata); the P4Info uses P4Runtime's
    standard externs (counters, registers, action profiles), as for v1model, so that one
    controller drives both; -g makes bf-p4c write the logs the resource summary is read from."""
    stem = f"{Path(top).stem}.{device}"
    return Target(
        name=name,
        top=top,
        compiler="bf-p4c",
        compiler_env="BF_P4C",
        flags=(
            "--target",
            device,
            "--arch",
            arch,
            "--std",
            "p4-16",
            "--auto-init-metadata",
            "--p4runtime-force-std-externs",
            "-g",
        ),
        outputs={
            "p4info": f"{stem}.p4info.txtpb",
            "bfrt": f"{stem}.bfrt.json",
            "resources": f"{stem}.resources.json",
        },
        kind="tofino",
    )


@dataclass(frozen=True)
class Project:
    """A folder of P4 sources with its own build/ and stamp."""

    root: Path
    targets: tuple[Target, ...]

    @property
    def build(self) -> Path:
        return self.root / "build"

    @property
    def stamp(self) -> Path:
        return self.build / "stamp.json"

    def rel(self, path: Path) -> str:
        try:
            return path.relative_to(REPO).as_posix()
        except ValueError:
            return str(path)


P4SRC = Project(
    REPO / "p4src",
    (
        bmv2_target("bmv2", "xingmai.p4"),
        tofino_target("tofino", "tna/xingmai.p4", "tofino", "tna"),
        tofino_target("tofino2", "tna/xingmai.p4", "tofino2", "t2na"),
    ),
)
TESTS = Project(
    REPO / "tests" / "p4",
    tuple(
        bmv2_target(name, f"{name}.p4")
        for name in (
            "switch_features",
            "primitives",
            "queue_probe",
            "bench_l3",
            "bench_two_tables",
            "parser_default_case",
        )
    ),
)
PROJECTS: tuple[Project, ...] = (P4SRC, TESTS)


class StampError(Exception):
    """The committed outputs do not match the sources (or the stamp is missing/invalid)."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sources_of(project: Project, top: str) -> list[str]:
    """Every P4 file `top` includes with #include "..." (transitively), itself first; paths
    relative to the project's folder. System includes (<core.p4>) belong to the compiler's
    version."""
    seen: list[str] = []
    todo = [project.root / top]
    while todo:
        path = todo.pop(0).resolve()
        rel = path.relative_to(project.root.resolve()).as_posix()
        if rel in seen:
            continue
        if not path.is_file():
            raise StampError(f"{rel} is included but does not exist")
        seen.append(rel)
        for inc in _INCLUDE.findall(path.read_text()):
            todo.append(path.parent / inc)
    return seen


def source_hashes(project: Project, target: Target) -> dict[str, str]:
    return {rel: sha256(project.root / rel) for rel in sorted(sources_of(project, target.top))}


def all_p4_files(project: Project) -> list[str]:
    """The P4 sources under the project's folder (compiled outputs excluded)."""
    return sorted(
        p.relative_to(project.root).as_posix()
        for p in project.root.rglob("*.p4")
        if project.build not in p.parents
    )


def load_stamp(project: Project) -> dict:
    name = project.rel(project.stamp)
    if not project.stamp.is_file():
        raise StampError(f"{name} is missing: run `make p4` where p4c exists")
    try:
        doc = json.loads(project.stamp.read_text())
    except ValueError as exc:
        raise StampError(f"{name} is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("targets"), dict):
        raise StampError(f"{name} has no 'targets' mapping")
    return doc


def check(project: Project = P4SRC) -> list[str]:
    """Problems with the committed build (empty: the stamp matches sources and outputs)."""
    try:
        stamp = load_stamp(project)
    except StampError as exc:
        return [str(exc)]
    problems = []
    covered: set[str] = set()
    for t in project.targets:
        entry = stamp["targets"].get(t.name)
        if entry is None:
            problems.append(f"{t.name}: not in the stamp")
            continue
        try:
            now = source_hashes(project, t)
        except StampError as exc:
            problems.append(f"{t.name}: {exc}")
            continue
        covered |= set(now)
        then = entry.get("sources", {})
        for rel in sorted(set(now) | set(then)):
            if rel not in then:
                problems.append(f"{t.name}: {rel} is a new source since the build")
            elif rel not in now:
                problems.append(f"{t.name}: {rel} was a source of the build, now is not")
            elif now[rel] != then[rel]:
                problems.append(f"{t.name}: {rel} changed since the build")
        if list(entry.get("flags", [])) != list(t.flags):
            problems.append(f"{t.name}: built with flags {entry.get('flags')}, now {list(t.flags)}")
        for role, name in t.outputs.items():
            out = project.build / name
            want = entry.get("outputs", {}).get(name)
            if not out.is_file():
                problems.append(f"{t.name}: output {name} ({role}) is missing")
            elif want != sha256(out):
                problems.append(f"{t.name}: output {name} differs from what the build wrote")
    for rel in all_p4_files(project):
        if rel not in covered:
            problems.append(
                f"{rel} is under {project.rel(project.root)}/ but no target includes it"
            )
    return problems


def find_compiler(t: Target) -> str | None:
    env = os.environ.get(t.compiler_env)
    if env:
        return env if os.access(env, os.X_OK) else None
    found = shutil.which(t.compiler)
    if found is None and t.kind == "tofino":
        # p4c's driver compiles for Tofino when the Tofino backend is installed beside it
        driver = shutil.which("p4c")
        if driver is not None and (Path(driver).parent / "p4c-barefoot").is_file():
            found = driver
    return found


def compiler_version(exe: str) -> str:
    res = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    lines = [ln.strip() for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    # p4c prints its own path (argv[0]) first: keep the stamp free of install locations
    return " ".join(ln for ln in lines if not ln.endswith(Path(exe).name))


def tofino_backend_version(exe: str) -> str:
    """The Tofino backend's own version (p4c-barefoot, beside the driver), which decides the
    resource use; empty when it cannot be found."""
    backend = Path(exe).resolve().parent / "p4c-barefoot"
    if not backend.is_file():
        found = shutil.which("p4c-barefoot")
        if found is None:
            return ""
        backend = Path(found)
    return compiler_version(str(backend))


def _normalise_json(path: Path) -> None:
    """Make the bmv2 JSON independent of where it was built: p4c records each source file's
    path as it opened it, which for its own includes (<v1model.p4>) is the install folder.
    Those become `p4include/<name>` (source_info is for debugging only)."""
    doc = json.loads(path.read_text())

    def walk(node: object) -> None:
        if isinstance(node, dict):
            fn = node.get("filename")
            if isinstance(fn, str) and fn.startswith("/"):
                node["filename"] = "p4include/" + Path(fn).name
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def tofino_resource_summary(out: Path) -> dict:
    """A short resource summary of a bf-p4c output folder: MAU stages used per gress (the
    pipeline depth, of the stages the device has, and which stages hold tables), SRAM / TCAM /
    map RAM blocks and logical tables, PHV containers and bits per container width, parser
    TCAM rows. From bf-p4c's logs (metrics.json, mau.json, resources.json under pipe/logs)."""
    found = next(out.rglob("logs/metrics.json"), None)
    if found is None:
        # bf-p4c writes metrics.json and mau.json with its p4c-build-logs tool (-g), which a
        # p4c build without pyinstaller does not package
        raise RuntimeError(
            f"bf-p4c wrote no logs/metrics.json under {out}: its summary logs did not run "
            "(p4c-build-logs must be beside bf-p4c)"
        )
    logs = found.parent
    metrics = json.loads((logs / "metrics.json").read_text())
    mau = json.loads((logs / "mau.json").read_text())
    resources = json.loads((logs / "resources.json").read_text())["resources"]
    stages: dict[str, set[int]] = {}
    for table in mau.get("tables", []):
        for alloc in table.get("stage_allocation", []):
            if int(alloc["stage_number"]) >= 0:  # (-1: the parser's port metadata table)
                stages.setdefault(table["gress"], set()).add(int(alloc["stage_number"]))
    phv: dict[str, dict[str, int]] = {}
    for kind in ("normal", "tagalong", "mocha", "dark"):
        for use in metrics["phv"].get(kind, []):
            row = phv.setdefault(f"{use['bit_width']}b", {"containers": 0, "bits": 0})
            row["containers"] += use["containers_occupied"]
            row["bits"] += use["bits_occupied"]
    m = metrics["mau"]
    return {
        "target": metrics.get("target"),
        "mau_stages_available": resources["mau"]["nStages"],
        "mau_stages_used": {gress: max(used) + 1 for gress, used in sorted(stages.items())},
        "mau_stage_numbers": {gress: sorted(used) for gress, used in sorted(stages.items())},
        "sram_blocks": m["srams"],
        "tcam_blocks": m["tcams"],
        "map_ram_blocks": m["map_rams"],
        "logical_tables": m["logical_tables"],
        "phv": dict(sorted(phv.items())),
        "parser_tcam_rows": {g: metrics["parser"][g]["tcam_rows"] for g in ("ingress", "egress")},
    }


def _collect_tofino_outputs(t: Target, tmp: Path) -> None:
    """bf-p4c's folder -> the committed outputs: bfrt.json as written, and the resource
    summary (the pipe's binary and context.json are for a device only)."""
    out = tmp / TOFINO_OUTDIR
    summary = tofino_resource_summary(out)
    # bf-p4c's backend can finish with more stages than the device has (the assembler then
    # fails, or nothing checks): such a build is refused here, not committed.
    over = {
        g: n for g, n in summary["mau_stages_used"].items() if n > summary["mau_stages_available"]
    }
    if over:
        raise RuntimeError(
            f"{t.name}: needs more MAU stages than the device's "
            f"{summary['mau_stages_available']}: {over}"
        )
    shutil.copyfile(next(out.rglob("bfrt.json")), tmp / t.outputs["bfrt"])
    (tmp / t.outputs["resources"]).write_text(json.dumps(summary, indent=2) + "\n")


def build(project: Project, t: Target, exe: str) -> dict:
    """Compile one target into build/ (via a temporary folder, so a failed compile leaves the
    committed outputs alone) and return its stamp entry."""
    project.build.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xingmai-p4build-") as tmp:
        cmd = t.command(exe, Path(tmp))
        res = subprocess.run(cmd, cwd=project.root, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"{t.name}: {' '.join(cmd)} failed:\n{res.stdout}{res.stderr}")
        if res.stderr.strip():
            print(res.stderr.strip(), file=sys.stderr)
        if "json" in t.outputs:
            _normalise_json(Path(tmp) / t.outputs["json"])
        if t.kind == "tofino":
            _collect_tofino_outputs(t, Path(tmp))
        for name in t.outputs.values():
            shutil.copyfile(Path(tmp) / name, project.build / name)
    version = compiler_version(exe)
    if t.kind == "tofino":
        version = f"{version}; backend: {tofino_backend_version(exe)}"
    return {
        "compiler": t.compiler,
        "compiler_version": version,
        "flags": list(t.flags),
        "top": t.top,
        "sources": source_hashes(project, t),
        "outputs": {name: sha256(project.build / name) for name in t.outputs.values()},
    }


def build_project(project: Project) -> bool:
    """Rebuild every target of `project` whose compiler is installed; False on a failure."""
    try:
        stamp = load_stamp(project)
    except StampError:
        stamp = {"targets": {}}
    for t in project.targets:
        exe = find_compiler(t)
        if exe is None:
            print(
                f"{t.name}: {t.compiler} not found (PATH or ${t.compiler_env}); "
                "keeping the committed outputs"
            )
            continue
        print(f"{project.rel(project.root)}: {t.name}: compiling {t.top} with {exe}")
        try:
            stamp["targets"][t.name] = build(project, t, exe)
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return False
    project.stamp.write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.p4build", description=__doc__)
    ap.add_argument("--check", action="store_true", help="only verify the stamps")
    args = ap.parse_args(argv)
    status = 0
    for project in PROJECTS:
        where = project.rel(project.root)
        if not args.check and not build_project(project):
            return 1
        problems = check(project)
        for p in problems:
            print(f"stale: {where}: {p}", file=sys.stderr)
        if problems:
            print(
                f"{where}/build does not match {where}: run `make p4` where the compilers "
                "are installed",
                file=sys.stderr,
            )
            status = 1
        else:
            print(f"{where}/build matches {where} (stamp.json)")
    return status


if __name__ == "__main__":
    sys.exit(main())
