"""`tc` run in a network namespace, its output as text (the agent's qdiscs, classes, filters)."""

from __future__ import annotations

import subprocess


def tc(netns: str, *args: str) -> str:
    return subprocess.run(["tc", "-n", netns, *args], capture_output=True, text=True).stdout
