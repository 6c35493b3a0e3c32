/*
 * What INT source, transit and the ingress check agree on: the size of one hop's record.
 */
#ifndef XINGMAI_INT_COMMON_P4
#define XINGMAI_INT_COMMON_P4

// Words one hop's metadata takes for an instruction bitmap (bit 0 = MSB): bits 4, 5 and 6 are
// 8-byte units, every other bit a 4-byte unit.
bit<5> int_hop_words(in bit<16> bm) {
    return (bit<5>)bm[15:15] + (bit<5>)bm[14:14] + (bit<5>)bm[13:13] + (bit<5>)bm[12:12]
        + ((bit<5>)bm[11:11] << 1) + ((bit<5>)bm[10:10] << 1) + ((bit<5>)bm[9:9] << 1)
        + (bit<5>)bm[8:8] + (bit<5>)bm[7:7] + (bit<5>)bm[6:6] + (bit<5>)bm[5:5]
        + (bit<5>)bm[4:4] + (bit<5>)bm[3:3] + (bit<5>)bm[2:2] + (bit<5>)bm[1:1]
        + (bit<5>)bm[0:0];
}

#endif
