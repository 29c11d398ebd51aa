#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz_api.c (the byte program it reads is
documented there). Each seed is a short, valid session that reaches deep
into one part of the API; libFuzzer mutates from them. Run from anywhere:
    python3 tests/fuzz_seeds.py"""
import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fuzz_corpus')

SMALL = [0]                       # the small valid configuration
def layer(kv=2, group=2, dtype=0, n=100, dim_idx=1, seed=7, vdtype=0, fill=0):
    gsel = (kv - 1) | ((group - 1) << 2)
    view = [0, 0, 0, fill, 0]     # contiguous, no padding; fill mode, no specials
    return [gsel, dtype, n & 255, n >> 8, dim_idx] + list(seed.to_bytes(4, 'little')) + view + view + [vdtype] + view

PLAN_INIT = lambda flags=0, alt=0: [0, alt | (flags << 1), 0]
PROFILE = [1, 0, 0, 0]
PROFILE_HEADS = [3, 0, 1, 2, 0, 1]          # kv range [0, 2) then the rest, finalize
PROFILE_MT = [4, 0, 3, 0, 0]                # 2 threads
def CHUNK(segments=1, final=False):
    return [5, 4 if final else 2, segments - 1, 0, 0, 0, 0, 0, 0]
FINALIZE = [6, 0]
RESET = [6, 1]
ATTN_DENSE = [8, 0] + [0, 0, 0] * 3 + [0, 0, 0, 0] + [0, 0, 0]
ATTN_PLAN = [8, 1] + [0, 0, 0] * 3 + [0, 0, 0, 0] + [0, 0, 0]
ATTN_CHUNK = [8, 1 | 2 | 4, 40, 30] + [0, 0, 0] * 3 + [0, 0, 0, 0] + [1, 0, 0]   # q_offset at a segment boundary, nth 2
ATTN_MT = [10, 1] + [0, 0, 0] * 3 + [0, 0, 0, 0] + [2, 0]
DEC_INIT = [11, 0]
def OBSERVE_PROMPT(n):
    return [12, 0, 0, n - 1, 0, 0, 0]
def OBSERVE_GEN(t):
    return [12, 3, t, 0, 0, 0]
DECODE_KEEP = [14, 8 | 32, 0, 0, 0]
COMPACT_LAST = [15, 1] + [0, 0, 0, 0, 0, 0] * 2
COMPACT_ARB = [15, 0, 2, 20, 22, 40] + [1] * 40 * 2 + [0, 0, 0, 0, 0, 0] * 2
SIZES = [17, 0, 6, 4, 4, 3, 3, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0]
SWAP = [19]
CORRUPT = lambda which, val: [7, which, 1, val, 1, 5, 0, 0, 0]   # value from the list, no n_blocks added, entry 5

seeds = {
    'whole_profile_attention': SMALL + SMALL + layer() + PLAN_INIT(2) + PROFILE + ATTN_PLAN + ATTN_DENSE,
    'bf16_gqa4': SMALL + SMALL + layer(kv=1, group=4, dtype=2, vdtype=2, dim_idx=8) + PLAN_INIT(2) + PROFILE + ATTN_PLAN,
    'f16_odd_dim': SMALL + SMALL + layer(kv=3, group=1, dtype=1, vdtype=1, dim_idx=7) + PLAN_INIT(0) + PROFILE + ATTN_PLAN,
    'heads_then_mt': SMALL + SMALL + layer(kv=4, group=2) + PLAN_INIT(0) + PROFILE_HEADS + ATTN_PLAN + PROFILE_MT + ATTN_MT,
    'chunked': SMALL + SMALL + layer(n=90) + PLAN_INIT(1) + CHUNK(1) + CHUNK(2) + ATTN_CHUNK + CHUNK(1, True) + ATTN_PLAN,
    'chunk_out_of_order': SMALL + SMALL + layer(n=90) + PLAN_INIT(3) + CHUNK(2) + RESET + CHUNK(1) + CHUNK(1) + CHUNK(1, True) + CHUNK(1),
    'decode_compact': SMALL + SMALL + layer(n=120) + DEC_INIT + OBSERVE_PROMPT(100) + OBSERVE_GEN(100) + OBSERVE_GEN(101) +
                      OBSERVE_GEN(102) + OBSERVE_GEN(103) + DECODE_KEEP + COMPACT_LAST,
    'decode_before_observe': SMALL + SMALL + layer() + DEC_INIT + DECODE_KEEP + OBSERVE_GEN(3) + DECODE_KEEP,
    'compact_arbitrary': SMALL + SMALL + layer() + COMPACT_ARB,
    'corrupt_plan': SMALL + SMALL + layer() + PLAN_INIT(0) + PROFILE + CORRUPT(0, 0) + ATTN_PLAN + PROFILE + CORRUPT(0, 3) + ATTN_PLAN + PROFILE + CORRUPT(1, 3) + ATTN_PLAN + CORRUPT(4, 5) + ATTN_PLAN,
    'sizes': SMALL + SMALL + layer() + SIZES + [17, 1, 6, 5, 4, 4, 3] + [17, 0, 7, 8, 9, 7, 1],
    # a plan laid out by one context (base budget 16) profiled with another (base budget 2048, same segment/block)
    'plan_other_context': SMALL + [2, 0, 1] + layer() + PLAN_INIT(0) + SWAP + PROFILE + ATTN_PLAN,
    'nan_inputs': SMALL + SMALL + [5, 0, 100, 0, 1, 7, 0, 0, 0, 0, 0, 0, 0, 1, 5, 0, 1, 2, 0] +
                  [0, 0, 0, 0, 1, 9, 0, 0, 0, 2] + [0, 0, 0, 0, 0, 0] + PLAN_INIT(0) + PROFILE + DEC_INIT + OBSERVE_PROMPT(100),
    'bad_config': [0xff] + [9, 6, 5, 10, 5, 6, 5, 5, 5, 3, 3, 4, 6, 6, 6, 4, 5, 4, 3, 4, 5, 3, 3, 6, 0x3f, 2] + SMALL + layer() + PROFILE,
    'extreme_config': [0x3f, 1, 2, 2, 8, 4, 3, 3, 3, 3, 1, 1, 0, 4, 6, 4, 2, 0, 3, 2, 7, 1, 1, 1] + SMALL + layer(n=150) +
                      PLAN_INIT(3) + PROFILE + ATTN_PLAN + DEC_INIT + OBSERVE_PROMPT(150) + DECODE_KEEP,
}

for name, data in seeds.items():
    with open(os.path.join(HERE, name + '.bin'), 'wb') as f:
        f.write(bytes(b & 255 for b in data))
print('wrote %d seeds to %s' % (len(seeds), HERE))
