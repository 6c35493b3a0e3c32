"""Other simulators run beside the twin on the same experiment (`xingmai-testbed peer`).

`ns3_hpcc`: HPCC's ns-3 simulator (alibaba-edu/High-Precision-Congestion-Control), which the
user builds outside this repository; this package writes its input files, runs it, reads its
outputs and prints them beside the twin's.
"""
