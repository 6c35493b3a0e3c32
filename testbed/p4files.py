"""The switch program both engines load: p4c's bmv2 JSON and P4Info for p4src/, committed under
p4src/build/ with their stamp (`make p4` refreshes them). An installed package carries a copy
written at build time (setup.py), found where the repository is not beside the code."""

from __future__ import annotations

from pathlib import Path

_REPO_BUILD = Path(__file__).resolve().parents[1] / "p4src" / "build"
_PACKAGED = Path(__file__).resolve().parent / "_program"


def program_dir() -> Path:
    """p4src/build/ in a checkout, else the package's copy."""
    if (_REPO_BUILD / "xingmai.json").exists():
        return _REPO_BUILD
    if (_PACKAGED / "xingmai.json").exists():
        return _PACKAGED
    raise FileNotFoundError(
        f"the switch program is in neither {_REPO_BUILD} nor {_PACKAGED}: reinstall the "
        "package, or in a checkout run `make p4` where p4c is installed"
    )


P4INFO = program_dir() / "xingmai.p4info.txtpb"
BMV2_JSON = program_dir() / "xingmai.json"
