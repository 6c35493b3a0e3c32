"""Fuzzing that stays (issue 18): each surface that takes input from a peer or an API —
P4Runtime, SwitchAdmin, the report decoder and collector, the agent API, the switch's packet
path, the transport's packet handler — driven by Hypothesis with structure-aware strategies
(valid messages, then mutated) and plain random bytes.

`python -m tests.fuzz --cases N --out results/fuzz.json` (make fuzz) runs N cases per
surface; tests/test_fuzz.py runs a short pass of every surface in make test. Each case is
checked for a crash (an exception, or an answer the API must never give: INTERNAL, UNKNOWN, a
decoder exception), a hang (a case over HANG_S), and after the run for unbounded growth (each
surface's own bounds, and the process's memory)."""
