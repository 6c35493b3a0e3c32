/*
 * Architecture shim for Tofino: TNA (Tofino 1, --arch tna) and T2NA (Tofino 2, --arch t2na),
 * compiled by p4c's Tofino backend (bf-p4c). It gives the names include/arch/v1model.p4
 * gives, with Tofino's externs: Counter / DirectCounter, Register + RegisterAction, an
 * ActionSelector over an ActionProfile with a CRC-16 Hash, the parser's Checksum unit, Random.
 *
 * Tofino's stage ALUs have no multiplier and shift only by constant amounts, so the helpers
 * that v1model computes exactly with a run-time multiplication or shift are computed here with
 * small constant tables (one action per shift amount): MulShr8 keeps the multiplier's two
 * leading bits, RandomRamp draws over the next power of two (p4src/README.md lists what this
 * changes).
 */
#ifndef XINGMAI_ARCH_TNA_P4
#define XINGMAI_ARCH_TNA_P4

#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>
#else
#include <tna.p4>
#endif

typedef PortId_t port_t;

// The PCIe CPU port: 192 on a 2-pipe Tofino 1 (Wedge100BF-32X; 320 on 4-pipe parts), 0 on
// Tofino 2. Build with -DCPU_PORT=<port> for another device.
#ifndef CPU_PORT
#if __TARGET_TOFINO__ == 2
#define CPU_PORT 0
#else
#define CPU_PORT 192
#endif
#endif

// Bridged and mirrored metadata are explicit headers on TNA (tna/xingmai.p4).
#define PRESERVE

// Counters: indexed packets+bytes, and direct (per table entry).
#define COUNTER(name, size) \
    Counter<bit<64>, bit<32>>((bit<32>)(size), CounterType_t.PACKETS_AND_BYTES) name
#define COUNT(name, index) name.count((bit<32>)(index))
#define DIRECT_COUNTER(name) DirectCounter<bit<64>>(CounterType_t.PACKETS_AND_BYTES) name
#define DIRECT_COUNT(name) name.count()

// Registers: REG_ACTION is a RegisterAction (the stateful ALU program), REG_EXEC executes it
// (REG_RUN when the packet needs nothing back).
#define REGISTER(type, name, size) Register<type, bit<32>>((bit<32>)(size)) name
#define REG_ACTION(reg, T, R, name, ...)                                       \
    RegisterAction<T, bit<32>, R>(reg) name = {                                \
        void apply(inout T value, out R rv) {                                  \
            __VA_ARGS__                                                        \
        }                                                                      \
    };
#define REG_EXEC(name, index, dst) dst = name.execute((bit<32>)(index))
#define REG_RUN(name, index) name.execute((bit<32>)(index))

// ECMP: an ActionSelector over an ActionProfile (ECMP_GROUPS groups of at most
// ECMP_MAX_GROUP_SIZE members), CRC-16 over the table's selector keys.
// (The ActionProfile carries the name: it is what P4Info lists, as v1model's action_selector.)
#define ECMP_SELECTOR(name, size)                                               \
    Hash<bit<16>>(HashAlgorithm_t.CRC16) name##_hash;                           \
    ActionProfile((bit<32>)(size)) name;                                        \
    ActionSelector(name, name##_hash, SelectorMode_t.FAIR,                      \
                   ECMP_MAX_GROUP_SIZE, ECMP_GROUPS) name##_groups
#define ECMP_IMPLEMENTATION(name) name##_groups

// Tofino's parser looks at most 160 bytes into a packet. The egress parser of a sink must
// reach the end of the INT stack to remove it: after the intrinsic and bridged metadata,
// Ethernet, IPv4, UDP, the shim and the MD header, 48 bytes are left: INT_STACK_MAX_WORDS 12
// (e.g. 3 hops of node id + hop latency + queue + tx utilization). A longer stack is counted
// (INT_SINK_STACK_TOO_LONG) and left in the packet; IPv4 options are not parsed (the packet is
// dropped, DROP_IPV4_OPTIONS).
#define INT_STACK_MAX_WORDS 12
#define IPV4_OPTIONS_PARSED 0
// The stack is skipped, not extracted: a varbit extraction takes PHV (or CLOTs, whose varbit
// support bf-p4c's assembler fails on for Tofino 2: "No length for clot") for bytes the sink
// only removes, and the bytes a parser skips are not emitted. One state per stack length
// (at most INT_STACK_MAX_WORDS = 12), each advancing a constant amount (a parser counter loop
// would take the counter Tofino 1's egress parser needs for its minimum parse depth).
#define INT_STACK_SKIP_STATE(n, next)                                          \
    state skip_int_stack_##n { pkt.advance(n * 32); transition next; }
#define INT_STACK_PARSER_STATES(next)                                          \
    state parse_int_stack {                                                    \
        transition select(hdr.int_shim.len) {                                  \
            4: skip_int_stack_1; 5: skip_int_stack_2; 6: skip_int_stack_3;     \
            7: skip_int_stack_4; 8: skip_int_stack_5; 9: skip_int_stack_6;     \
            10: skip_int_stack_7; 11: skip_int_stack_8; 12: skip_int_stack_9;  \
            13: skip_int_stack_10; 14: skip_int_stack_11;                      \
            15: skip_int_stack_12;                                             \
            default: next;  /* 3: no stack */                                  \
        }                                                                      \
    }                                                                          \
    INT_STACK_SKIP_STATE(1, next) INT_STACK_SKIP_STATE(2, next)                \
    INT_STACK_SKIP_STATE(3, next) INT_STACK_SKIP_STATE(4, next)                \
    INT_STACK_SKIP_STATE(5, next) INT_STACK_SKIP_STATE(6, next)                \
    INT_STACK_SKIP_STATE(7, next) INT_STACK_SKIP_STATE(8, next)                \
    INT_STACK_SKIP_STATE(9, next) INT_STACK_SKIP_STATE(10, next)               \
    INT_STACK_SKIP_STATE(11, next) INT_STACK_SKIP_STATE(12, next)

// IPv4 header checksum, verified by the parser's checksum unit.
#define IPV4_CHECKSUM_DECL Checksum() ipv4_checksum;
#define IPV4_CHECKSUM_ADD(h) ipv4_checksum.add(h);
#define IPV4_CHECKSUM_VERIFY(dst) dst = ipv4_checksum.verify();  // true: the sum is wrong

// No egress truncation: a report carries all of its inner packet unless its mirror session
// (P4Runtime clone session packet_length_bytes) cuts it.
#define ARCH_TRUNCATES 0

// y = x * m >> 8 with m rounded down to its two leading set bits (at most 25 % low, 12.5 %
// on average over m): each bit k of m adds x shifted by k - 8, one action per shift amount.
// m < 2^27 (y is 0 otherwise): the controller's multipliers stay below 2^27 (a window holds
// 8 frames of at least 100 bytes: p4src/README.md, tx_util_mult), and with more actions the
// stages that hold these tables hit a bf-p4c 9.13.4 bug on Tofino 2 ("Unreachable section of
// the instruction memory allocation").
#define MUL_HI_ACTION(term, k, op, s)                                           \
    @hidden action term##_##k() { term = x op s; rest = m & ~(32w1 << k); }
#define MUL_LO_ACTION(term, k, op, s) @hidden action term##_##k() { term = x op s; }
#define MUL_TERM_ACTION_REF(term, k, op, s) term##_##k;
#define MUL_TERM_ENTRY(term, k) (32w1 << k) &&& ~((32w1 << k) - 1): term##_##k();
#define MUL_TERM_ALL(X, term)                                                   \
    X(term, 0, >>, 8) X(term, 1, >>, 7) X(term, 2, >>, 6) X(term, 3, >>, 5)        \
    X(term, 4, >>, 4) X(term, 5, >>, 3) X(term, 6, >>, 2) X(term, 7, >>, 1)        \
    X(term, 8, <<, 0) X(term, 9, <<, 1) X(term, 10, <<, 2) X(term, 11, <<, 3)      \
    X(term, 12, <<, 4) X(term, 13, <<, 5) X(term, 14, <<, 6) X(term, 15, <<, 7)    \
    X(term, 16, <<, 8) X(term, 17, <<, 9) X(term, 18, <<, 10) X(term, 19, <<, 11)  \
    X(term, 20, <<, 12) X(term, 21, <<, 13) X(term, 22, <<, 14) X(term, 23, <<, 15) \
    X(term, 24, <<, 16) X(term, 25, <<, 17) X(term, 26, <<, 18)
#define MUL_TERM_ENTRIES(term)                                                  \
    MUL_TERM_ENTRY(term, 0) MUL_TERM_ENTRY(term, 1) MUL_TERM_ENTRY(term, 2)     \
    MUL_TERM_ENTRY(term, 3) MUL_TERM_ENTRY(term, 4) MUL_TERM_ENTRY(term, 5)     \
    MUL_TERM_ENTRY(term, 6) MUL_TERM_ENTRY(term, 7) MUL_TERM_ENTRY(term, 8)     \
    MUL_TERM_ENTRY(term, 9) MUL_TERM_ENTRY(term, 10) MUL_TERM_ENTRY(term, 11)   \
    MUL_TERM_ENTRY(term, 12) MUL_TERM_ENTRY(term, 13) MUL_TERM_ENTRY(term, 14)  \
    MUL_TERM_ENTRY(term, 15) MUL_TERM_ENTRY(term, 16) MUL_TERM_ENTRY(term, 17)  \
    MUL_TERM_ENTRY(term, 18) MUL_TERM_ENTRY(term, 19) MUL_TERM_ENTRY(term, 20)  \
    MUL_TERM_ENTRY(term, 21) MUL_TERM_ENTRY(term, 22) MUL_TERM_ENTRY(term, 23)  \
    MUL_TERM_ENTRY(term, 24) MUL_TERM_ENTRY(term, 25) MUL_TERM_ENTRY(term, 26)

control MulShr8(in bit<32> x, in bit<32> m, out bit<32> y) {
    bit<32> lo = 0;
    bit<32> rest = 0;

    MUL_TERM_ALL(MUL_HI_ACTION, y)
    MUL_TERM_ALL(MUL_LO_ACTION, lo)
    @hidden action none() { y = 0; }
    @hidden action sum() { y = y + lo; }

    @hidden table leading_bit {
        key = { m: ternary; }
        actions = { MUL_TERM_ALL(MUL_TERM_ACTION_REF, y) none; }
        const default_action = none();
        const entries = { MUL_TERM_ENTRIES(y) }
    }

    @hidden table second_bit {
        key = { rest: ternary; }
        actions = { MUL_TERM_ALL(MUL_TERM_ACTION_REF, lo) NoAction; }
        const default_action = NoAction();
        const entries = { MUL_TERM_ENTRIES(lo) }
    }

    apply {
        leading_bit.apply();
        second_bit.apply();
        sum();
    }
}

// Bytes a queue depth stands for: Tofino counts queues in cells of 80 bytes (Tofino 2: 176);
// qdepth_unit is not needed.
control QueueBytes(in bit<32> depth, in bit<32> unit, out bit<32> bytes) {
    bit<32> part = 0;
#if __TARGET_TOFINO__ == 2
    // 176 = 128 + 16 + 32
    @hidden action shifts() { bytes = depth << 7; part = depth << 4; }
    @hidden action add_16() { bytes = bytes + part; part = part << 1; }
    @hidden action add_32() { bytes = bytes + part; }
    apply {
        shifts();
        add_16();
        add_32();
    }
#else
    // 80 = 64 + 16
    @hidden action shifts() { bytes = depth << 6; part = depth << 4; }
    @hidden action add_16() { bytes = bytes + part; }
    apply {
        shifts();
        add_16();
    }
#endif
}

// The number of the 2^shift ns window a timestamp falls in, from its bits 41..10 (ts_10), for
// shifts 10..40 (1.02 us .. 18 min windows; another shift counts as TX_UTIL_WINDOW_SHIFT):
// ts_10 shifted by a constant, one action per shift.
#define WINDOW_ACTION(k, s) @hidden action shift_##k() { window = ts_10 >> s; }
#define WINDOW_ACTION_REF(k, s) shift_##k;
#define WINDOW_ENTRY(k, s) k: shift_##k();
#define WINDOW_ALL(X)                                                           \
    X(10, 0) X(11, 1) X(12, 2) X(13, 3) X(14, 4) X(15, 5) X(16, 6) X(17, 7)     \
    X(18, 8) X(19, 9) X(20, 10) X(21, 11) X(22, 12) X(23, 13) X(24, 14)         \
    X(25, 15) X(26, 16) X(27, 17) X(28, 18) X(29, 19) X(30, 20) X(31, 21)       \
    X(32, 22) X(33, 23) X(34, 24) X(35, 25) X(36, 26) X(37, 27) X(38, 28)       \
    X(39, 29) X(40, 30)

control TimeWindow(in bit<32> ts_10, in bit<8> shift, out bit<32> window) {
    WINDOW_ALL(WINDOW_ACTION)

    @hidden table window_shift {
        key = { shift: exact; }
        actions = { WINDOW_ALL(WINDOW_ACTION_REF) }
        const default_action = shift_20();
        const entries = { WINDOW_ALL(WINDOW_ENTRY) }
    }

    apply {
        window_shift.apply();
    }
}

// Bernoulli draw for a linear ramp, true with probability p * d / 2^n (p in units of 2^-16),
// where 2^n - 1 is span rounded up to all-ones: exactly v1model's p * d / (span + 1) when
// span + 1 is a power of two, up to 2x lower otherwise. The comparisons are saturating
// subtractions (a > b when a |-| b != 0), which a Tofino ALU does in one step.
#define RAMP_ENTRY(k) (32w1 << k) &&& ~((32w1 << k) - 1): set_mask((32w2 << k) - 1);
#define RAMP_ENTRIES                                                            \
    RAMP_ENTRY(0) RAMP_ENTRY(1) RAMP_ENTRY(2) RAMP_ENTRY(3) RAMP_ENTRY(4)        \
    RAMP_ENTRY(5) RAMP_ENTRY(6) RAMP_ENTRY(7) RAMP_ENTRY(8) RAMP_ENTRY(9)        \
    RAMP_ENTRY(10) RAMP_ENTRY(11) RAMP_ENTRY(12) RAMP_ENTRY(13) RAMP_ENTRY(14)   \
    RAMP_ENTRY(15) RAMP_ENTRY(16) RAMP_ENTRY(17) RAMP_ENTRY(18) RAMP_ENTRY(19)   \
    RAMP_ENTRY(20) RAMP_ENTRY(21) RAMP_ENTRY(22) RAMP_ENTRY(23) RAMP_ENTRY(24)   \
    RAMP_ENTRY(25) RAMP_ENTRY(26) RAMP_ENTRY(27) RAMP_ENTRY(28) RAMP_ENTRY(29)   \
    RAMP_ENTRY(30)

control RandomRamp(in bit<32> d, in bit<32> span, in bit<16> p, out bool hit) {
    Random<bit<32>>() draw_position;
    Random<bit<16>>() draw_probability;
    bit<32> mask = 0x7FFFFFFF;

    @hidden action set_mask(bit<32> m) { mask = m; }

    @hidden table span_mask {
        key = { span: ternary; }
        actions = { set_mask; }
        const default_action = set_mask(0x7FFFFFFF);
        const entries = { RAMP_ENTRIES }
    }

    // One step per action: a Tofino gateway tests a field, not an expression.
    bit<32> r = 0;
    bit<16> q = 0;
    bit<32> d_over = 0;
    bit<16> p_over = 0;
    // (each draw in its own action: a table passes at most 32 bits of RNG or hash output)
    @hidden action draw_r() { r = draw_position.get(); }
    @hidden action draw_q() { q = draw_probability.get(); }
    @hidden action mask_position() { r = r & mask; }
    @hidden action compare() {
        d_over = d |-| r;
        p_over = p |-| q;
    }

    apply {
        span_mask.apply();
        draw_r();
        draw_q();
        mask_position();
        compare();
        hit = false;
        if (d_over != 0) {
            if (p_over != 0) {
                hit = true;
            }
        }
    }
}

// Copies made by the hash unit (identity hash), for values whose PHV allocation must not be
// tied to their source's: an action's copy puts both fields in one allocation group (same
// container size, slices cut alike), a copy through the hash unit does not. Used for a bitmap
// whose single bits are tested (bf-p4c allocates such a field in 1-bit slices) and for 8-bit
// header fields taken from 16-bit arithmetic results.
control UnlinkedCopy32(in bit<32> x, out bit<32> y) {
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) identity;

    @hidden action copy() { y = identity.get({ x }); }  // a table of its own

    apply {
        copy();
    }
}

control UnlinkedCopy16(in bit<16> x, out bit<16> y) {
    Hash<bit<16>>(HashAlgorithm_t.IDENTITY) identity;

    @hidden action copy() { y = identity.get({ x }); }  // a table of its own

    apply {
        copy();
    }
}

// y = x[7:0] (the identity hash truncated to its output width).
control UnlinkedLow8(in bit<16> x, out bit<8> y) {
    Hash<bit<8>>(HashAlgorithm_t.IDENTITY) identity;

    @hidden action copy() { y = identity.get({ x }); }  // a table of its own

    apply {
        copy();
    }
}

#endif
