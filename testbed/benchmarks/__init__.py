"""Benchmarks run by `make bench` (see testbed/bench.py)."""
