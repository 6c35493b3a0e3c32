"""The flow-level engine: fleet-scale fabrics (1k to 131k GPUs and more) as arrays, flows
routed with the switches' ECMP hash, max-min fair rates, collectives step by step, and
per-scheme efficiencies calibrated on the packet-level twin (docs/flow.md).

- `fabric`: deployed Clos shapes from a few parameters, or a packet engine's topology;
- `routing`: per-flow ECMP with the P4 program's hash, spraying, collisions, fail-over around
  switches and cables down (`fabric.fail`);
- `maxmin`: progressive filling, and flows run to completion on events;
- `collectives`: ring all-reduce per rail, the library's hierarchical all-reduce, one flat
  ring, and all-to-all within groups, as flows;
- `calibration`: the per-scheme efficiencies (calibration.yaml) and how they are fitted;
- `suite`: `xingmai-testbed run --engine flow` (allreduce, alltoall; `--faults` down/kill at 0)
  and `sweep --engine flow`;
- `report`, `plots`: `flow-iteration`'s table, link utilisation and plot, and the cost plot of
  `make bench`'s `flow_scale`;
- `cli`: the commands `fabric`, `flow-iteration`, `calibrate-flow`.
"""
