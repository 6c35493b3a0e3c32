/*
 * What INT source, transit and the ingress check agree on: the size of one hop's record.
 */
#ifndef XINGMAI_INT_COMMON_P4
#define XINGMAI_INT_COMMON_P4

// The 16 entries of a table that maps a 4-bit slice of the instruction bitmap (bits s+3..s) to
// the words its instructions take; w3..w0 are the words of the slice's bits, most significant
// first. The key is the whole bitmap, masked to the slice: with the slice itself as key, bf-p4c
// splits the bitmap, and every field it is copied to, into single bits for PHV allocation.
#define INT_NIBBLE_WORDS(set, s, w3, w2, w1, w0) \
    0x0 << s &&& 0xF << s: set(0);                  0x1 << s &&& 0xF << s: set(w0); \
    0x2 << s &&& 0xF << s: set(w1);                 0x3 << s &&& 0xF << s: set(w1 + w0); \
    0x4 << s &&& 0xF << s: set(w2);                 0x5 << s &&& 0xF << s: set(w2 + w0); \
    0x6 << s &&& 0xF << s: set(w2 + w1);            0x7 << s &&& 0xF << s: set(w2 + w1 + w0); \
    0x8 << s &&& 0xF << s: set(w3);                 0x9 << s &&& 0xF << s: set(w3 + w0); \
    0xA << s &&& 0xF << s: set(w3 + w1);            0xB << s &&& 0xF << s: set(w3 + w1 + w0); \
    0xC << s &&& 0xF << s: set(w3 + w2);            0xD << s &&& 0xF << s: set(w3 + w2 + w0); \
    0xE << s &&& 0xF << s: set(w3 + w2 + w1);       0xF << s &&& 0xF << s: set(w3 + w2 + w1 + w0);

// Words one hop's metadata takes for an instruction bitmap (bit 0 = MSB): bits 4, 5 and 6 are
// 8-byte units, every other bit a 4-byte unit. A lookup per 4-bit slice, each adding its words
// to the sum: the form a Tofino stage can compute (no bit counting in its ALUs); the tables
// are constant and hidden from the control plane.
// The sum is 16 bits wide (at most 19 words): the width of the length fields it is added to, so
// that Tofino's ALUs add it without zero-extension.
control IntHopWords(in bit<16> bitmap, out bit<16> words) {
    bit<16> sum = 0;

    @hidden action add_words(bit<16> w) { sum = sum + w; }

    @hidden table instruction_words_0_3 {
        key = { bitmap: ternary; }
        actions = { add_words; }
        const default_action = add_words(0);
        const entries = { INT_NIBBLE_WORDS(add_words, 12, 1, 1, 1, 1) }
    }

    @hidden table instruction_words_4_7 {
        key = { bitmap: ternary; }
        actions = { add_words; }
        const default_action = add_words(0);
        const entries = { INT_NIBBLE_WORDS(add_words, 8, 2, 2, 2, 1) }
    }

    @hidden table instruction_words_8_11 {
        key = { bitmap: ternary; }
        actions = { add_words; }
        const default_action = add_words(0);
        const entries = { INT_NIBBLE_WORDS(add_words, 4, 1, 1, 1, 1) }
    }

    @hidden table instruction_words_12_15 {
        key = { bitmap: ternary; }
        actions = { add_words; }
        const default_action = add_words(0);
        const entries = { INT_NIBBLE_WORDS(add_words, 0, 1, 1, 1, 1) }
    }

    apply {
        instruction_words_0_3.apply();
        instruction_words_4_7.apply();
        instruction_words_8_11.apply();
        instruction_words_12_15.apply();
        words = sum;
    }
}

#endif
