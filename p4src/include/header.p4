/*
 * Packet headers (wire formats: docs/wire-format.md) and the project metadata every feature
 * control works on. local_md_t is architecture-neutral: the top file fills its "from the
 * architecture" part from intrinsic metadata and carries out its "requests" part.
 */
#ifndef XINGMAI_HEADER_P4
#define XINGMAI_HEADER_P4

// ---- CPU port --------------------------------------------------------------------------------
@controller_header("packet_in")
header packet_in_t {
    bit<16> ingress_port;
    bit<16> reason;          // PUNT_*
}

@controller_header("packet_out")
header packet_out_t {
    bit<16> egress_port;
}

// ---- L2 / L3 / L4 ----------------------------------------------------------------------------
header ethernet_t {
    mac_addr_t dst_addr;
    mac_addr_t src_addr;
    bit<16> ether_type;
}

header ipv4_t {
    bit<4> version;
    bit<4> ihl;
    bit<6> dscp;
    bit<2> ecn;
    bit<16> total_len;
    bit<16> identification;
    bit<3> flags;
    bit<13> frag_offset;
    bit<8> ttl;
    bit<8> protocol;
    bit<16> hdr_checksum;
    ipv4_addr_t src_addr;
    ipv4_addr_t dst_addr;
}

// IPv4 options (IHL > 5): carried, covered by the checksum, never interpreted.
header ipv4_options_t {
    varbit<320> options;
}

header udp_t {
    bit<16> sport;
    bit<16> dport;
    bit<16> len;
    bit<16> checksum;
}

header tcp_t {
    bit<16> sport;
    bit<16> dport;
    bit<32> seq_no;
    bit<32> ack_no;
    bit<4> data_offset;
    bit<4> res;
    bit<8> flags;
    bit<16> window;
    bit<16> checksum;
    bit<16> urgent_ptr;
}

// ---- INT-MD v2.1 -----------------------------------------------------------------------------
header int_shim_t {
    bit<4> int_type;
    bit<2> npt;
    bit<2> rsvd;
    bit<8> len;              // MD header + stack, in 4-byte words (the shim not counted)
    bit<8> rsvd2;
    bit<6> dscp;             // the packet's original DSCP, restored by the sink
    bit<2> rsvd3;
}

header int_md_t {
    bit<4> ver;
    bit<1> d;
    bit<1> e;
    bit<1> m;
    bit<12> rsvd;
    bit<5> hop_ml;
    bit<8> remaining_hop_cnt;
    bit<16> instruction_bitmap;  // bit 0 (node id) is the MSB
    bit<16> domain_id;
    bit<16> ds_instruction;
    bit<16> ds_flags;
}

// The metadata stack the packet arrived with (newest hop first). Parsed as one opaque field so
// that the sink can remove it; transit pushes its own hop in front of it. Up to 252 words (the
// 8-bit shim length less the MD header) where the architecture can hold them
// (INT_STACK_MAX_WORDS).
header int_stack_t {
    varbit<(INT_STACK_MAX_WORDS * 32)> data;
}

// One 4- or 8-byte metadata unit per instruction bit (wire order = bit order).
header int_node_id_t {
    bit<32> node_id;
}

header int_l1_port_ids_t {
    bit<16> ingress_port_id;
    bit<16> egress_port_id;
}

header int_hop_latency_t {
    bit<32> hop_latency;     // ns
}

header int_q_occupancy_t {
    bit<8> q_id;
    bit<24> q_occupancy;     // bytes
}

header int_timestamp_t {
    bit<64> ns;
}

header int_l2_port_ids_t {
    bit<32> ingress_port_id;
    bit<32> egress_port_id;
}

header int_tx_util_t {
    bit<32> tx_util;         // ppm of the port speed over the last window
}

// A 4-byte unit this switch cannot provide: all-ones (buffer id + occupancy, reserved bits
// 9-14, checksum complement).
header int_word_t {
    bit<32> value;
}

// This hop's record, one header per instruction bit.
struct int_hop_t {
    int_node_id_t node_id;               // bit 0
    int_l1_port_ids_t l1_port_ids;       // bit 1
    int_hop_latency_t hop_latency;       // bit 2
    int_q_occupancy_t q_occupancy;       // bit 3
    int_timestamp_t ingress_tstamp;      // bit 4
    int_timestamp_t egress_tstamp;       // bit 5
    int_l2_port_ids_t l2_port_ids;       // bit 6
    int_tx_util_t tx_util;               // bit 7
    int_word_t buffer;                   // bit 8
    int_word_t rsvd9;
    int_word_t rsvd10;
    int_word_t rsvd11;
    int_word_t rsvd12;
    int_word_t rsvd13;
    int_word_t rsvd14;
    int_word_t checksum;                 // bit 15
}

// ---- Telemetry Report v2.0 -------------------------------------------------------------------
header report_group_t {
    bit<4> ver;
    bit<6> hw_id;
    bit<22> seq_no;
    bit<32> node_id;
}

header report_individual_t {
    bit<4> rep_type;
    bit<4> in_type;
    bit<8> report_len;       // words after this header's first word
    bit<8> md_len;           // words of the sink's own metadata
    bit<1> d;
    bit<1> q;
    bit<1> f;
    bit<1> i;
    bit<4> rsvd;
    bit<16> rep_md_bits;
    bit<16> domain_id;
    bit<16> ds_md_bits;
    bit<16> ds_md_status;
}

// The sink's own metadata in a report (RepMdBits), same encodings as the hop metadata.
struct report_md_t {
    int_l1_port_ids_t l1_port_ids;       // bit 1
    int_hop_latency_t hop_latency;       // bit 2
    int_q_occupancy_t q_occupancy;       // bit 3
    int_timestamp_t ingress_tstamp;      // bit 4
    int_timestamp_t egress_tstamp;       // bit 5
    int_tx_util_t tx_util;               // bit 7
}

struct headers_t {
    packet_in_t packet_in;
    packet_out_t packet_out;
    // report encapsulation, in front of the inner packet (from its IPv4 header on)
    ethernet_t report_ethernet;
    ipv4_t report_ipv4;
    udp_t report_udp;
    report_group_t report_group;
    report_individual_t report_individual;
    report_md_t report_md;
    // the packet
    ethernet_t ethernet;
    ipv4_t ipv4;
    ipv4_options_t ipv4_options;
    udp_t udp;
    tcp_t tcp;
    int_shim_t int_shim;
    int_md_t int_md;
    int_hop_t int_hop;
    int_stack_t int_stack;
}

// ---- project metadata ------------------------------------------------------------------------
// Values the feature controls compute in one step and use in a later one. A Tofino stage does
// one operation per field and bf-p4c puts consecutive statements into one action, so a chain
// of computations is a chain of action calls (one stage each), and what passes between them is
// metadata.
struct calc_md_t {
    bit<16> ingress_port_16;     // ports as INT and packet-in carry them
    bit<16> egress_port_16;
    bit<16> sink_port_16;
    bit<16> int_bytes_ip;        // bytes a record adds, once per length field (ingress: the
    bit<16> int_bytes_udp;       // UDP length the INT headers need)
    bit<16> len_after;           // IPv4 total length after transit's push (saturated)
    bit<16> udp_len_after;
    bit<16> src_len_after;       // IPv4 total length after the source's insertion (saturated)
    bit<16> hop_words;           // this hop's record size (Hop ML)
    bit<8> hop_ml;
    bit<8> shim_room;            // words the 8-bit shim length can still grow by
    bit<8> stack_over;           // shim length beyond the parser's INT stack limit
    bit<16> md_words;            // hop record size (IntHopWords)
    // transit's input (IntTransitPrepare): the record size for the packet's Hop ML (rx_) and
    // for the source's bitmap (src_), and the INT headers as transit will find them
    bit<8> rx_hop_ml;
    bit<16> rx_bytes;
    bit<8> src_hop_ml;
    bit<16> src_bytes;
    bit<1> transit;              // the packet gets this hop's record (or the E or M bit)
    bit<16> base_len;            // IPv4 total length before the push
    bit<16> base_udp_len;
    bit<8> shim_len;
    bit<8> shim_len_after;
    bit<8> remaining;            // RemainingHopCnt
    bit<16> bitmap;              // instruction bitmap
    bit<16> inner_len;
    bit<16> inner_words;
    bit<16> report_words;
    bit<16> report_sat;          // report_words |+| 0xFF00 (int_sink.p4)
    bit<8> report_len;           // the report's 8-bit Report Length
    bit<16> report_ip_len;       // the report's IPv4 and UDP lengths
    bit<16> report_udp_len;
    bit<16> rep_bits;            // RepMdBits
    bit<8> rep_md_words;         // the report metadata's words
    bit<16> report_len_md;       // report_len ++ rep_md_words
    bit<16> strip_bytes_ip;      // INT bytes a sink removes, once per length field
    bit<16> strip_bytes_udp;
    // "a > b" as a saturating difference a |-| b, nonzero when true: a Tofino gateway compares
    // a field with a constant only.
    bit<16> udp_short;           // INT length past the UDP length
    bit<16> mtu_over;            // IPv4 length past the MTU
    bit<16> src_mtu_over;        // the same for the source's insertion
    bit<8> room_over;            // hop record past the shim length's room
    bit<32> occupancy_sat;       // queue bytes + 0xFF000001, saturated (port_telemetry.p4)
}

struct local_md_t {
    // From the architecture (the top file fills these).
    PRESERVE port_t ingress_port;
    PRESERVE bit<64> ingress_ts;         // ns
    bool checksum_error;                 // the IPv4 header checksum does not verify
    port_t egress_port;                  // egress only
    bit<64> egress_ts;                   // ns, egress only
    bit<32> egress_ts_10;                // egress_ts[41:10]: units of 2^10 ns
    bit<32> enq_qdepth;                  // queue depth in the target's unit (see qdepth_unit)
    bit<32> deq_qdepth;
    bit<8> qid;
    bit<32> pkt_len;                     // bytes as enqueued
    bit<2> pkt_kind;                     // PKT_*

    // Requests to the architecture (the top file carries them out).
    port_t egress_spec;
    bit<1> drop;
    bit<8> drop_reason;                  // DROP_*
    bit<1> clone;                        // ingress-to-egress clone to clone_session
    bit<32> clone_session;
    bit<32> truncate_len;                // egress: transmit only this many bytes (0: all)

    // Parser results.
    bit<16> l4_sport;
    bit<16> l4_dport;
    bit<1> ipv4_bad_ihl;
    bit<1> ipv4_options_unparsed;        // IHL > 5 where the target does not parse options
    bit<8> int_status;                   // INT_*

    // Ingress decisions.
    bit<1> bypass;                       // packet-out: no lookup at all
    bit<1> punted;
    PRESERVE bit<16> punt_reason;        // PUNT_*, the packet-in reason
    next_id_t next_id;
    bit<1> int_source;                   // watchlist hit: insert INT at egress
    bit<16> int_source_bitmap;
    bit<8> int_source_hop_budget;
    bit<16> int_source_domain_id;
    bit<1> int_sink;                     // egress port is an INT sink port: strip at egress

    // Report clone parameters (set at ingress, used by the clone's egress).
    PRESERVE bit<1> report;
    PRESERVE port_t report_sink_port;    // where the original packet left
    PRESERVE mac_addr_t report_src_mac;
    PRESERVE mac_addr_t report_dst_mac;
    PRESERVE ipv4_addr_t report_src_addr;
    PRESERVE ipv4_addr_t report_dst_addr;
    PRESERVE bit<16> report_dport;

    // Egress config and measurements.
    bit<32> node_id;
    bit<6> hw_id;
    bit<32> qdepth_unit;                 // bytes per target queue-depth unit
    bit<8> tx_util_shift;                // tx utilization windows are 2^tx_util_shift ns
    bit<16> mtu;                         // IPv4 MTU of the egress port (0xFFFF: none)
    bit<32> tx_util_mult;                // from the port speed (p4src/README.md)
    bit<32> enq_qdepth_bytes;
    bit<32> deq_qdepth_bytes;
    bit<24> q_occupancy;                 // deq_qdepth_bytes in INT's 24 bits (saturated)
    bit<32> tx_load;                     // last complete window of the egress port (for a
                                         // report: of the sink port), in ppm with
                                         // TX_LOAD_FRACTION_BITS fraction bits
    // The port's latest measurements as its registers hold them after this packet: this
    // packet's own, or for a report the sink port's latest packet's (port_telemetry.p4).
    bit<32> last_hop_latency;
    bit<32> last_queue;                  // queue id (8 bits) + occupancy (24), as in INT
    bit<64> last_egress_ts;

    calc_md_t calc;
}

#endif
