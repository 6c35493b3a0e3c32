"""Errors the command line reports as one line (exit status 1) instead of a traceback: a
component that did not come up, a testbed that cannot start, an optional part of the package
that is not installed."""

from __future__ import annotations

import importlib
from types import ModuleType


class UserError(RuntimeError):
    """What the user can act on; its message says what and how."""


class MissingExtra(UserError):
    pass


# the optional dependencies, by the extra (pyproject.toml) that installs them
EXTRAS = {
    "mininet": "emu",
    "pyroute2": "emu",
    "matplotlib": "plots",
    "dask": "sweep",
    "distributed": "sweep",
    "scapy": "packets",
}


def require(module: str, what: str) -> ModuleType:
    """Import an optional dependency, or fail naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        extra = EXTRAS.get(top)
        how = f"pip install 'xingmai[{extra}]'" if extra else f"pip install {top}"
        raise MissingExtra(f"{what} needs {top}, which is not installed: {how}") from exc
