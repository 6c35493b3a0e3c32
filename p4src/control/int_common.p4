/*
 * What INT source, transit and the ingress check agree on: the size of one hop's record.
 */
#ifndef XINGMAI_INT_COMMON_P4
#define XINGMAI_INT_COMMON_P4

// The 256 entries of a table that maps an 8-bit slice of the instruction bitmap (bits s+7..s)
// to the words its instructions take; w7..w0 are the words of the slice's bits, most
// significant first. The key is the whole bitmap, masked to the slice: with the slice itself as
// key, bf-p4c splits the bitmap, and every field it is copied to, into single bits for PHV
// allocation. An entry's action is set(v, w): v the slice's value in place, w its words.
// INT_WORDS_ROW gives the 16 entries whose high nibble is h (worth hw words).
#define INT_WORDS_ENTRY(set, s, h, l, w) \
    ((h << 4) | l) << s &&& 0xFF << s: set(((h << 4) | l) << s, w);
#define INT_WORDS_ROW(set, s, h, hw, w3, w2, w1, w0)                                     \
    INT_WORDS_ENTRY(set, s, h, 0x0, hw) INT_WORDS_ENTRY(set, s, h, 0x1, hw + w0)          \
    INT_WORDS_ENTRY(set, s, h, 0x2, hw + w1) INT_WORDS_ENTRY(set, s, h, 0x3, hw + w1 + w0) \
    INT_WORDS_ENTRY(set, s, h, 0x4, hw + w2) INT_WORDS_ENTRY(set, s, h, 0x5, hw + w2 + w0) \
    INT_WORDS_ENTRY(set, s, h, 0x6, hw + w2 + w1)                                         \
    INT_WORDS_ENTRY(set, s, h, 0x7, hw + w2 + w1 + w0)                                    \
    INT_WORDS_ENTRY(set, s, h, 0x8, hw + w3) INT_WORDS_ENTRY(set, s, h, 0x9, hw + w3 + w0) \
    INT_WORDS_ENTRY(set, s, h, 0xA, hw + w3 + w1)                                         \
    INT_WORDS_ENTRY(set, s, h, 0xB, hw + w3 + w1 + w0)                                    \
    INT_WORDS_ENTRY(set, s, h, 0xC, hw + w3 + w2)                                         \
    INT_WORDS_ENTRY(set, s, h, 0xD, hw + w3 + w2 + w0)                                    \
    INT_WORDS_ENTRY(set, s, h, 0xE, hw + w3 + w2 + w1)                                    \
    INT_WORDS_ENTRY(set, s, h, 0xF, hw + w3 + w2 + w1 + w0)
#define INT_WORDS_BYTE(set, s, w7, w6, w5, w4, w3, w2, w1, w0)                            \
    INT_WORDS_ROW(set, s, 0x0, 0, w3, w2, w1, w0)                                         \
    INT_WORDS_ROW(set, s, 0x1, w4, w3, w2, w1, w0)                                        \
    INT_WORDS_ROW(set, s, 0x2, w5, w3, w2, w1, w0)                                        \
    INT_WORDS_ROW(set, s, 0x3, w5 + w4, w3, w2, w1, w0)                                   \
    INT_WORDS_ROW(set, s, 0x4, w6, w3, w2, w1, w0)                                        \
    INT_WORDS_ROW(set, s, 0x5, w6 + w4, w3, w2, w1, w0)                                   \
    INT_WORDS_ROW(set, s, 0x6, w6 + w5, w3, w2, w1, w0)                                   \
    INT_WORDS_ROW(set, s, 0x7, w6 + w5 + w4, w3, w2, w1, w0)                              \
    INT_WORDS_ROW(set, s, 0x8, w7, w3, w2, w1, w0)                                        \
    INT_WORDS_ROW(set, s, 0x9, w7 + w4, w3, w2, w1, w0)                                   \
    INT_WORDS_ROW(set, s, 0xA, w7 + w5, w3, w2, w1, w0)                                   \
    INT_WORDS_ROW(set, s, 0xB, w7 + w5 + w4, w3, w2, w1, w0)                              \
    INT_WORDS_ROW(set, s, 0xC, w7 + w6, w3, w2, w1, w0)                                   \
    INT_WORDS_ROW(set, s, 0xD, w7 + w6 + w4, w3, w2, w1, w0)                              \
    INT_WORDS_ROW(set, s, 0xE, w7 + w6 + w5, w3, w2, w1, w0)                              \
    INT_WORDS_ROW(set, s, 0xF, w7 + w6 + w5 + w4, w3, w2, w1, w0)

// The 256 entries of a constant table keyed on the 8-bit INT shim length, entry n running
// set(n) (a function-like macro naming the action and its data): lengths derived from the shim
// length in one lookup, not a chain of Tofino stages. INT_SHIM_ROW gives the 16 entries whose
// high nibble is h.
#define INT_SHIM_ROW(set, h)                                                              \
    (h << 4) | 0x0: set((h << 4) | 0x0); (h << 4) | 0x1: set((h << 4) | 0x1);            \
    (h << 4) | 0x2: set((h << 4) | 0x2); (h << 4) | 0x3: set((h << 4) | 0x3);            \
    (h << 4) | 0x4: set((h << 4) | 0x4); (h << 4) | 0x5: set((h << 4) | 0x5);            \
    (h << 4) | 0x6: set((h << 4) | 0x6); (h << 4) | 0x7: set((h << 4) | 0x7);            \
    (h << 4) | 0x8: set((h << 4) | 0x8); (h << 4) | 0x9: set((h << 4) | 0x9);            \
    (h << 4) | 0xA: set((h << 4) | 0xA); (h << 4) | 0xB: set((h << 4) | 0xB);            \
    (h << 4) | 0xC: set((h << 4) | 0xC); (h << 4) | 0xD: set((h << 4) | 0xD);            \
    (h << 4) | 0xE: set((h << 4) | 0xE); (h << 4) | 0xF: set((h << 4) | 0xF);
#define INT_SHIM_LENGTHS(set)                                                             \
    INT_SHIM_ROW(set, 0x0) INT_SHIM_ROW(set, 0x1) INT_SHIM_ROW(set, 0x2)                  \
    INT_SHIM_ROW(set, 0x3) INT_SHIM_ROW(set, 0x4) INT_SHIM_ROW(set, 0x5)                  \
    INT_SHIM_ROW(set, 0x6) INT_SHIM_ROW(set, 0x7) INT_SHIM_ROW(set, 0x8)                  \
    INT_SHIM_ROW(set, 0x9) INT_SHIM_ROW(set, 0xA) INT_SHIM_ROW(set, 0xB)                  \
    INT_SHIM_ROW(set, 0xC) INT_SHIM_ROW(set, 0xD) INT_SHIM_ROW(set, 0xE)                  \
    INT_SHIM_ROW(set, 0xF)

// The 32 entries of a constant table keyed on a record size in words (Hop ML, 0..31), entry n
// running set(n).
#define INT_HOP_ML_VALUES(set) INT_SHIM_ROW(set, 0x0) INT_SHIM_ROW(set, 0x1)

// One constant table for 4 bits of an instruction bitmap (bits shift+3..shift of `bits`, the
// first of them the most significant), whose 16 actions each run the statements of the bits
// set in their combination: S3..S0 name a macro of statements per bit (NO_FILL for none). A
// record is filled by 4 such lookups, not by 16 tables of one bit each: a Tofino stage has 16
// logical tables for ingress and egress together.
#define NO_FILL
#define FILL_IF_0(S)
#define FILL_IF_1(S) S
#define NIBBLE_ACTION(name, S3, S2, S1, S0, a, b, c, d)                                 \
    @hidden action name##_##a##b##c##d() {                                              \
        FILL_IF_##a(S3) FILL_IF_##b(S2) FILL_IF_##c(S1) FILL_IF_##d(S0)                  \
    }
#define NIBBLE_ENTRY(name, shift, a, b, c, d)                                           \
    (16w##a * 8 + 16w##b * 4 + 16w##c * 2 + 16w##d) << shift &&& 16w0xF << shift:        \
        name##_##a##b##c##d();
#define NIBBLE_ALL(X, ...)                                                              \
    X(__VA_ARGS__, 0, 0, 0, 0) X(__VA_ARGS__, 0, 0, 0, 1) X(__VA_ARGS__, 0, 0, 1, 0)       \
    X(__VA_ARGS__, 0, 0, 1, 1) X(__VA_ARGS__, 0, 1, 0, 0) X(__VA_ARGS__, 0, 1, 0, 1)       \
    X(__VA_ARGS__, 0, 1, 1, 0) X(__VA_ARGS__, 0, 1, 1, 1) X(__VA_ARGS__, 1, 0, 0, 0)       \
    X(__VA_ARGS__, 1, 0, 0, 1) X(__VA_ARGS__, 1, 0, 1, 0) X(__VA_ARGS__, 1, 0, 1, 1)       \
    X(__VA_ARGS__, 1, 1, 0, 0) X(__VA_ARGS__, 1, 1, 0, 1) X(__VA_ARGS__, 1, 1, 1, 0)       \
    X(__VA_ARGS__, 1, 1, 1, 1)
#define NIBBLE_ACTION_REF(name, a, b, c, d) name##_##a##b##c##d;
#define NIBBLE_TABLE(name, bits, shift, S3, S2, S1, S0)                                 \
    NIBBLE_ALL(NIBBLE_ACTION, name, S3, S2, S1, S0)                                     \
    @hidden table name {                                                                \
        key = { bits: ternary; }                                                        \
        actions = { NIBBLE_ALL(NIBBLE_ACTION_REF, name) }                               \
        const default_action = name##_0000();                                           \
        const entries = { NIBBLE_ALL(NIBBLE_ENTRY, name, shift) }                       \
    }

// Words one hop's metadata takes for an instruction bitmap (bit 0 = MSB): bits 4, 5 and 6 are
// 8-byte units, every other bit a 4-byte unit. A lookup per byte of the bitmap, both at once,
// then one addition: the form a Tofino stage can compute (no bit counting in its ALUs); the
// tables are constant and hidden from the control plane.
// The sum is 16 bits wide (at most 19 words): the width of the length fields it is added to, so
// that Tofino's ALUs add it without zero-extension.
control IntHopWords(in bit<16> bitmap, out bit<16> words) {
    bit<16> high = 0;
    bit<16> low = 0;

    @hidden action set_high(bit<16> w) { high = w; }
    @hidden action set_low(bit<16> w) { low = w; }
#define INT_WORDS_SET_HIGH(v, w) set_high(w)
#define INT_WORDS_SET_LOW(v, w) set_low(w)
    @hidden action sum() { words = high + low; }

    @hidden table instruction_words_0_7 {
        key = { bitmap: ternary; }
        actions = { set_high; }
        const default_action = set_high(0);
        const entries = { INT_WORDS_BYTE(INT_WORDS_SET_HIGH, 8, 1, 1, 1, 1, 2, 2, 2, 1) }
    }

    @hidden table instruction_words_8_15 {
        key = { bitmap: ternary; }
        actions = { set_low; }
        const default_action = set_low(0);
        const entries = { INT_WORDS_BYTE(INT_WORDS_SET_LOW, 0, 1, 1, 1, 1, 1, 1, 1, 1) }
    }

    apply {
        instruction_words_0_7.apply();
        instruction_words_8_15.apply();
        sum();
    }
}

#endif
