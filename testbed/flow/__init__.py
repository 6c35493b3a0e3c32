"""The flow-level engine: fleet-scale fabrics (1k to 131k GPUs and more) as arrays, flows
routed with the switches' ECMP hash, max-min fair rates, collectives step by step, and
per-scheme efficiencies calibrated on the packet-level twin (docs/flow.md).

- `fabric`: deployed Clos shapes from a few parameters, or a packet engine's topology;
- `routing`: per-flow ECMP with the P4 program's hash, spraying, collisions;
- `maxmin`: progressive filling, and flows run to completion on events;
- `collectives`: ring all-reduce per rail and all-to-all within groups, as flows;
- `calibration`: the per-scheme efficiencies (calibration.yaml) and how they are fitted;
- `suite`: `xingmai-testbed run --engine flow` (allreduce, alltoall);
- `cli`: the commands `fabric`, `flow-iteration`, `calibrate-flow`.
"""
