/*
 * Constants and types shared by every feature control and by both architectures.
 * Constants are UPPER_SNAKE, types end in _t. Architecture-specific types (port_t) and extern
 * macros come from include/arch/<arch>.p4, which the top file includes before this one.
 */
#ifndef XINGMAI_DEFINE_P4
#define XINGMAI_DEFINE_P4

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<16> next_id_t;

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8> IP_PROTO_TCP = 6;
const bit<8> IP_PROTO_UDP = 17;

// ECN codepoints (RFC 3168).
const bit<2> ECN_ECT1 = 0b01;
const bit<2> ECN_ECT0 = 0b10;
const bit<2> ECN_CE = 0b11;

// ---- INT-MD v2.1 over UDP (docs/wire-format.md) ----------------------------------------------
// INT presence is this DSCP value. The parser has to branch on it, and bmv2's P4Runtime server
// cannot write parser value sets, so it is a build-time constant of the INT domain:
// build with -DINT_DSCP=<value> to change it.
#ifndef INT_DSCP
#define INT_DSCP 0x17
#endif
const bit<4> INT_TYPE_MD = 1;
const bit<4> INT_VERSION = 2;
const bit<8> INT_MD_WORDS = 3;           // the MD header, counted by the shim length
const bit<16> INT_HEADERS_BYTES = 16;    // shim + MD header, what a source inserts

// md.int_status: what the parser and the ingress checks found. Only INT_OK packets get any INT
// processing; every other value is counted (int_events) and the packet forwarded untouched.
const bit<8> INT_NONE = 0;               // no INT DSCP, or not UDP
const bit<8> INT_OK = 1;
const bit<8> INT_TRUNCATED = 2;          // packet ends inside the shim or the MD header
const bit<8> INT_LEN_PAST_END = 3;       // shim length runs past the packet / the UDP length
const bit<8> INT_BAD_SHIM_LEN = 4;       // shim length shorter than the MD header
const bit<8> INT_BAD_VERSION = 5;        // MD header version is not 2
const bit<8> INT_BAD_HOP_ML = 6;         // Hop ML 0, or not the size the instruction bitmap needs
const bit<8> INT_UNSUPPORTED = 7;        // shim type not INT-MD, or NPT not 0

// int_status counter: indexed by md.int_status (ingress, every packet with the INT DSCP).
const bit<32> INT_STATUS_COUNT = 8;
// int_source_events counter indexes (egress).
const bit<32> INT_SOURCE_INSERTED = 0;   // shim + MD header inserted
const bit<32> INT_SOURCE_MTU = 1;        // not inserted: the packet would exceed the MTU
// int_transit_events counter indexes (egress).
const bit<32> INT_TRANSIT_PUSHED = 0;    // this hop's metadata pushed
const bit<32> INT_TRANSIT_E_BIT = 1;     // RemainingHopCnt was 0: E bit set, nothing pushed
const bit<32> INT_TRANSIT_M_BIT = 2;     // pushing would exceed the MTU: M bit set
// int_sink_events counter indexes (egress).
const bit<32> INT_SINK_STRIPPED = 0;     // INT removed, original DSCP restored
const bit<32> INT_SINK_REPORT = 1;       // telemetry report sent
const bit<32> INT_SINK_REPORT_TO_CPU = 2;  // no collector configured: packet-in instead
const bit<32> INT_SINK_STACK_TOO_LONG = 3;  // not stripped: longer than INT_STACK_MAX_WORDS
const bit<32> INT_EVENTS_SIZE = 4;

// ---- Telemetry Report v2.0 -------------------------------------------------------------------
const bit<4> REPORT_VERSION = 2;
const bit<4> REPORT_TYPE_INT = 1;
const bit<4> REPORT_IN_TYPE_IPV4 = 4;
const bit<16> REPORT_UDP_SPORT = 32766;
// Report metadata the sink provides (RepMdBits, bit 0 = MSB): L1 ports (1), hop latency (2),
// queue id + occupancy (3), ingress timestamp (4), egress timestamp (5), tx utilization (7).
const bit<16> REPORT_MD_SUPPORTED = 0x7D00;
// Inner packet bytes kept after the INT stack, so the collector sees the transport header.
const bit<16> REPORT_INNER_PAYLOAD_BYTES = 16;
// Report header bytes before the sink's metadata, from the outer IPv4 header (IPv4, UDP,
// group, individual) and from the UDP header; the Ethernet header in front of them.
const bit<16> REPORT_IP_HEADERS_BYTES = 20 + 8 + 8 + 12;
const bit<16> REPORT_UDP_HEADERS_BYTES = 8 + 8 + 12;
const bit<32> REPORT_ETHERNET_BYTES = 14;

// ---- drops counter indexes (ingress) ---------------------------------------------------------
const bit<8> DROP_NOT_IPV4 = 1;
const bit<8> DROP_IPV4_BAD_CHECKSUM = 2;
const bit<8> DROP_IPV4_BAD_IHL = 3;
const bit<8> DROP_NO_ROUTE = 4;
const bit<8> DROP_TTL_EXPIRED = 5;
const bit<8> DROP_NO_NEXT_HOP = 6;
const bit<8> DROP_ACL = 7;
const bit<8> DROP_PACKET_OUT_BAD_PORT = 8;
const bit<8> DROP_IPV4_OPTIONS = 9;      // TNA only: IPv4 options are not parsed
const bit<32> DROP_REASONS = 16;

// ---- packet-in reasons -----------------------------------------------------------------------
const bit<16> PUNT_ACL = 1;              // an acl entry sent it to the controller
const bit<16> PUNT_REPORT_UNSENT = 2;    // sink without a collector: the INT packet as received

// ---- clone sessions (P4Runtime clone_session_entry ids the controller configures) ------------
const bit<32> REPORT_CLONE_SESSION = 256;  // one replica: the port towards the collector
const bit<32> CPU_CLONE_SESSION = 257;     // one replica: CPU_PORT

// md.pkt_kind: what the architecture says this egress packet is.
const bit<2> PKT_NORMAL = 0;
const bit<2> PKT_INGRESS_CLONE = 1;
const bit<2> PKT_OTHER = 2;              // replicas, recirculated packets: not produced here

// Egress tx utilization (INT bit 7, ppm of the port speed) is computed over aligned windows of
// 2^shift ns: the utilization of the last complete window. The controller sets the shift per
// switch (switch_config) so that a window holds several frames at the ports' speed; without
// it, 2^TX_UTIL_WINDOW_SHIFT ns (~1.05 ms).
#define TX_UTIL_WINDOW_SHIFT 20
// Window lengths the programs take: 2^10 ns .. 2^40 ns; another shift counts as the default
// (TimeWindow in include/arch/*.p4).
// A port's load in a window is counted in ppm of its speed with this many fraction bits (each
// packet adds bytes * tx_util_mult >> 8): INT and reports carry it >> TX_LOAD_FRACTION_BITS.
#define TX_LOAD_FRACTION_BITS 8
const bit<16> NO_MTU = 0xFFFF;  // lengths saturate at it: never exceeded

#endif
