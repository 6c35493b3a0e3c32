"""The collective communication library (星脉's TCCL, in the testbed's terms).

- `plan`: the algorithms (ring, double binary tree, hierarchical) of each collective
  (all-reduce, reduce-scatter, all-gather, all-to-all, send/recv) as dataflow plans;
- `job`: one host's rank of a communicator over K channels (one per NIC rail), as a
  clock-free job both engines run, with the static and the adaptive channel schedule, and
  concurrent jobs on one fabric;
- `metrics`: nccl-tests' algbw, busbw and efficiency from the ranks' results.
"""
