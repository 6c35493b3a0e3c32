"""Every `xingmai-testbed` command's --help renders: argparse formats help strings with %, so
a value written into one as `1%` breaks that command's help, and only its help."""

from __future__ import annotations

import argparse

from testbed.main import build_parser


def _parsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return [p, *(q for s in subs for c in s.choices.values() for q in _parsers(c))]


def test_every_commands_help_renders() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) >= 20  # the commands, found
    for p in parsers:
        assert p.format_help().startswith("usage:"), p.prog
