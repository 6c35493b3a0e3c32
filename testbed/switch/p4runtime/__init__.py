"""P4Runtime v1 server of the built-in switch (what PI gives `simple_switch_grpc`), one module
per part: `service` (the RPCs and the dispatch of entities), `stream` (arbitration, packet I/O,
digests), `pipeline` (forwarding pipeline configs), and one handler per entity kind —
`table_entries` (with direct counters and meters), `profiles`, `indexed` (counters, meters and
registers through one handler), `replication`, `value_sets`. `codec` has the error type and
the byte conventions they share."""

from testbed.switch.p4runtime.codec import RpcError
from testbed.switch.p4runtime.service import P4RuntimeService, parse_p4info_text, serve

__all__ = ["P4RuntimeService", "RpcError", "parse_p4info_text", "serve"]
