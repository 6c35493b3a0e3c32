/*
 * Architecture shim for v1model (bmv2 simple_switch / simple_switch_grpc and the built-in
 * switch). Feature controls never name a v1model extern or standard_metadata: they use the
 * types, macros and helper controls below, and include/arch/tna.p4 gives the same names
 * Tofino's externs. The top file maps standard_metadata to/from local_md_t.
 *
 * The helpers are arithmetic and state primitives the two architectures express differently
 * (run-time multiplication, random values over a range, shifts by a run-time amount, register
 * read-modify-writes); what the features compute with them stays in control/.
 */
#ifndef XINGMAI_ARCH_V1MODEL_P4
#define XINGMAI_ARCH_V1MODEL_P4

#include <core.p4>
#include <v1model.p4>

typedef bit<9> port_t;

// simple_switch_grpc --cpu-port / xingmai-switch --cpu-port.
#ifndef CPU_PORT
#define CPU_PORT 255
#endif

// Metadata fields carried into ingress-to-egress clones (v1model field list 1).
#define CLONE_FIELD_LIST 1
#define PRESERVE @field_list(CLONE_FIELD_LIST)

// Counters: indexed packets+bytes, and direct (per table entry).
#define COUNTER(name, size) counter((bit<32>)(size), CounterType.packets_and_bytes) name
#define COUNT(name, index) name.count((bit<32>)(index))
#define DIRECT_COUNTER(name) direct_counter(CounterType.packets_and_bytes) name
#define DIRECT_COUNT(name) name.count()

// Registers. A register cell is changed by a named read-modify-write, the shape Tofino's
// RegisterAction imposes (one per register per packet): REG_ACTION declares it at control
// scope with a body that reads and updates `value` (the cell) and sets `rv` (what the packet
// gets back); REG_EXEC runs it on one cell, REG_RUN too when the packet needs nothing back (a
// 32-bit rv). Bodies only assign (v1model predicates them).
#define REGISTER(type, name, size) register<type>((bit<32>)(size)) name
#define REG_ACTION(reg, T, R, name, ...)                                       \
    @hidden action name(in bit<32> index, out R rv) {                          \
        T value;                                                               \
        reg.read(value, index);                                                \
        __VA_ARGS__                                                            \
        reg.write(index, value);                                               \
    }
#define REG_EXEC(name, index, dst) name((bit<32>)(index), dst)
#define REG_RUN(name, index) { bit<32> rv_unused; name((bit<32>)(index), rv_unused); }

// ECMP: an action selector hashing the table's selector keys with CRC-16. The table names
// ECMP_IMPLEMENTATION(name) as its implementation.
#define ECMP_SELECTOR(name, size) action_selector(HashAlgorithm.crc16, (bit<32>)(size), 32w16) name
#define ECMP_IMPLEMENTATION(name) name

// IPv4 options are parsed (and covered by the checksum).
#define IPV4_OPTIONS_PARSED 1

// INT stack words the parser can hold: all of them (the 8-bit shim length less the MD header).
#define INT_STACK_MAX_WORDS 252
// The stack is extracted into hdr.int_stack (one varbit field).
#define INT_STACK_PARSER_STATES(next)                                          \
    state parse_int_stack {                                                    \
        pkt.extract(hdr.int_stack, ((bit<32>)hdr.int_shim.len - 3) << 5);      \
        transition next;                                                       \
    }

// IPv4 header checksum: v1model verifies it in its verify-checksum control (the top file), not
// in the parser.
#define IPV4_CHECKSUM_DECL
#define IPV4_CHECKSUM_ADD(h)
#define IPV4_CHECKSUM_VERIFY(dst)

// v1model truncates any packet at egress (truncate()): a report is cut to what it carries.
#define ARCH_TRUNCATES 1

// y = x * m >> 8, exactly (the low 32 bits).
control MulShr8(in bit<32> x, in bit<32> m, out bit<32> y) {
    apply {
        y = (bit<32>)(((bit<64>)x * (bit<64>)m) >> 8);
    }
}

// Bytes a queue depth stands for: depth in the target's unit times the bytes per unit.
control QueueBytes(in bit<32> depth, in bit<32> unit, out bit<32> bytes) {
    apply {
        bytes = depth * unit;
    }
}

// The number of the 2^shift ns window a timestamp falls in, from its bits 41..10 (ts_10),
// for shifts 10..40 (1.02 us .. 18 min windows: a window of about one base RTT at 400G); another
// shift counts as 20, TX_UTIL_WINDOW_SHIFT (define.p4; include/arch/tna.p4 takes the same range).
control TimeWindow(in bit<32> ts_10, in bit<8> shift, out bit<32> window) {
    apply {
        bit<8> s = shift;
        if (s < 10 || s > 40) {
            s = 20;
        }
        window = ts_10 >> (s - 10);
    }
}

// Bernoulli draw for a linear ramp: true with probability p * d / span, p in units of 2^-16,
// for 0 < d <= span: draw r in [0, span] and compare d * p with r * 2^16.
control RandomRamp(in bit<32> d, in bit<32> span, in bit<16> p, out bool hit) {
    apply {
        bit<32> r;
        random(r, 32w0, span);
        hit = (bit<48>)d * (bit<48>)p > (bit<48>)r << 16;
    }
}

// Plain copies (include/arch/tna.p4 makes them with the hash unit, for PHV allocation).
control UnlinkedCopy16(in bit<16> x, out bit<16> y) {
    apply {
        y = x;
    }
}

control UnlinkedLow8(in bit<16> x, out bit<8> y) {
    apply {
        y = x[7:0];
    }
}

#endif
