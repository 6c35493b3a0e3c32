"""The flow-level engine: fleet-scale fabrics (1k to 131k GPUs and more) as arrays, flows
routed with the switches' ECMP hash, max-min fair rates (an all-to-all through FIFO
queues), collectives step by step, and
per-scheme efficiencies calibrated on the packet-level twin (docs/flow.md).

- `fabric`: deployed Clos shapes from a few parameters, or a packet engine's topology;
- `routing`: per-flow ECMP with the P4 program's hash, spraying, collisions, fail-over around
  switches and cables down (`fabric.fail`);
- `maxmin`: progressive filling, and flows run to completion on events;
- `collectives`: ring all-reduce per rail (and its reduce-scatter and all-gather halves), the
  library's hierarchical all-reduce, one flat ring, all-to-all within groups, as flows, and
  the library's adaptive schedule as work-stealing per hop;
- `calibration`: the per-scheme efficiencies (calibration.yaml), free and where the network
  holds the collective (congested), and how they are fitted;
- `lossfit`: the goodput a scheme's transport keeps through a lossy link, fitted on the twin
  (`fabric.lose` cuts the lossy directions to it);
- `workload`: SimAI/AICB workload files, one pass of SimAI's loop on the fabric;
- `suite`: `xingmai-testbed run --engine flow` (allreduce, alltoall; `--faults` down, kill,
  rate and loss at 0) and `sweep --engine flow`;
- `report`, `plots`: `flow-iteration`'s table, link utilisation and plot, and the cost plot of
  `make bench`'s `flow_scale`;
- `cli`: the commands `fabric`, `flow-iteration`, `flow-workload`, `calibrate-flow`.
"""
