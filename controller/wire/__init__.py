"""The wire formats, declared once: INT-MD v2.1 (`int_md`), Telemetry Report v2.0
(`telemetry_report`) and the RoCEv2 headers (`roce`), as field tables, sizes, codes and byte
codecs. Plain Python: no scapy, and nothing else of the project is imported here, so the
collector, the NIC and the testbed can all stand on it (docs/architecture.md).
"""
