"""Traffic: the RoCEv2-like transport, AI-training workloads, per-run metrics, and the runner
that drives one transport process per host (network namespace)."""
