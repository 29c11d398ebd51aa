#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz_api.c (the byte program it reads is
documented there). Each seed is a short, valid session that reaches deep
into one part of the API; libFuzzer mutates from them, and the corpus in
tests/fuzz_corpus is these seeds merged with what a fuzzing run grew from
them (make fuzz-merge). Every op, and every call kind of the placement op,
is reached by at least one seed. Run from anywhere:
    python3 tests/fuzz_seeds.py [DIR]    (writes seed_*.bin into DIR, default
                                         tests/fuzz_corpus; leaves other files)"""
import os
import sys

HERE = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fuzz_corpus')

# ---------------------------------------------------------------- configuration and layer
SMALL = [0]                       # the small valid configuration (segment 8, block 2, threshold 16)
def layer(kv=1, group=2, dtype=0, n=27, dim_idx=0, seed=7, vdtype=0, fill=0, mode=0):
    """dim_idx into {8, 16, 1, 3, 7, 17, 32, 33, 64, 5, 24, 0, -1, 1025}; n is capped by FZ_LAYER_WORK."""
    gsel = (kv - 1) | ((group - 1) << 2)
    view = [mode, 0, 0, fill, 0]  # stride mode, paddings, fill mode, no specials
    return [gsel, dtype, (n - 1) & 255, (n - 1) >> 8, dim_idx] + list(seed.to_bytes(4, 'little')) + view + view + [vdtype] + view

# ---------------------------------------------------------------- ops (op byte = index in run_op)
OP = dict(PLAN_INIT=0, PROFILE=1, PROFILE_HEADS=3, PROFILE_MT=4, CHUNK=5, RESET_FINALIZE=6, CORRUPT=7, ATTENTION=8,
          ATTENTION_MT=10, DECODER_INIT=11, OBSERVE=12, DECODE=14, COMPACT=15, DECODER_RESET=16, SIZES=17, LAYER=18,
          SWAP=19, PLACE=20, PLAN_EDIT=21, SMALL_STACK=22, CELL_POS=23, EDGES=25)
THREADS = 31                      # fz_threads: a byte % 32 == 31 asks for worker threads (once per input)
def PAST_THREADS(i):              # fz_threads: a byte % 32 == 30: n_threads past the limit (i: 0..3), refused
    return 30 | (i << 5)

def PLAN_INIT(flags=0, alt=0, alloc=False):
    return [OP['PLAN_INIT'], alt | (flags << 1) | (8 if alloc else 0), 0]
PROFILE = [OP['PROFILE'], 0, 0, 0]                     # plan, workspace byte, a whole call on one thread
PROFILE_NULL_EXEC = [OP['PROFILE'], 0, 0, 30]          # a NULL ei_exec (refused: no workspace)
PROFILE_NULL_WS = [OP['PROFILE'], 0, 0, 31]            # a NULL workspace with bytes (EI_ERR_NULL)
def PROFILE_PARTS(ith=0, nth=2, rest=1):
    """op_profile kind 1: part ith of nth (ith -1..4, nth 0..5), then (rest & 1) the other parts and
    ei_plan_finalize, (rest & 2) the whole call's plan compared bit for bit (the rest byte is read only after a
    part that returned EI_OK: none after a pair the library refuses)"""
    valid = (nth >= 2 and 0 <= ith < nth) or (nth <= 1 and ith == 0)
    return [OP['PROFILE_HEADS'], 0, ith + 1, nth, 0] + ([rest] if valid else [])
PROFILE_HEADS = PROFILE_PARTS()                        # parts 0 and 1 of 2 (one workspace), finalize
def PROFILE_MT(threads=THREADS):
    return [OP['PROFILE_MT'], 0, threads, 0]
def CHUNK(segments=1, final=False, threads=1):
    """q, k rows (3 bytes each), then the threads byte: n_threads = byte % 4 (0: the caller alone), the workspace
    for them when byte & 4 (else for one thread: refused on 2 or more)"""
    return [OP['CHUNK'], 4 if final else 2, segments - 1, 0, 0, 0, 0, 0, 0, threads]
def CHUNK_PARTS(ith=0, nth=2, every=True, segments=1, final=False):
    """op_chunk with m & 128: part ith (0..4) of nth (0..4); every: the other parts, then ei_plan_finalize"""
    return [OP['CHUNK'], (4 if final else 2) | 128, segments - 1, 0, 0, 0, 0, 0, 0, ith + (5 if every else 0), nth]
FINALIZE = [OP['RESET_FINALIZE'], 0]
RESET = [OP['RESET_FINALIZE'], 1]
def GROW(t=0, alt=0, null=0, pick=0):
    """ei_plan_grow (the byte & 6 == 2): t % 4 = 0 past max_tokens (+1 + (t >> 2) % 64), 1 at or below it,
    2 a value of the pick list (0, -1, EI_MAX_TOKENS + 1, INT64_MAX, INT64_MIN, 2^40), 3 twice it"""
    return [OP['RESET_FINALIZE'], 2, alt | (2 if null else 0), t] + ([pick] if t % 4 == 2 else [])
def MASK(m=1, m2=0, m3=15):
    """ei_plan_mask (the byte & 6 == 4): m: 1 the plan (else dense), (m >> 1) & 3 heads (kv, kv x (1 + m2 % 3),
    1, a bad count), (m >> 3) & 3 dtype (f32, f16, bf16, unknown), 32 keys past the rows, m >> 6 base (none, 1
    head, out's heads, over out); m2 >> 4 & 3 layout (contiguous, head-major, padded, aliasing); m3 % 16 + 1
    rows, (m3 >> 4) & 3 where (the plan's end, inside, 0, a hostile offset), m3 >> 6 == 3 keys 0 / -1"""
    return [OP['RESET_FINALIZE'], 4, m, m2, m3]
def CORRUPT(which, val):
    return [OP['CORRUPT'], which, 1, val, 1, 5, 0, 0, 0]
ATTN_VIEWS = [0, 0, 0] * 3 + [0, 0, 0, 0]             # q, k, v rows (layout 0), out f32 contiguous
ATTN_DENSE = [OP['ATTENTION'], 0] + ATTN_VIEWS + [0, 0, 0]
ATTN_PLAN = [OP['ATTENTION'], 1] + ATTN_VIEWS + [0, 0, 0]
ATTN_CHUNK = [OP['ATTENTION'], 1 | 2 | 4, 30, 20] + ATTN_VIEWS + [1, 0, 0]   # q_offset at a segment start, nth 2
ATTN_MT = [OP['ATTENTION_MT'], 1] + ATTN_VIEWS + [THREADS, 0]
ATTN_PARTS_SHORT = [OP['ATTENTION'], 1] + ATTN_VIEWS + [1, 7, 0]      # 2 parts, the workspace a byte short (refused)
def ATTN_EXEC(b, nth_idx=1):
    """the odd single call: part (b % 6) - 1 of nths[nth_idx] (1, 2, 3, 1, 0, -1, 4) and (b / 6) % 6 = 1 n_threads
    with nth, 2 nth past the limit, 3 n_threads out of range, 4 a NULL workspace with bytes, 5 ith at the int32 edges"""
    return [OP['ATTENTION'], 1] + ATTN_VIEWS + [nth_idx, 0, 7, b]
def ATTN_STEP(nth_idx=1, one_part=0, keep=False, threaded=False):
    """a decode step (m & 128, q[26..27) of the 27-token layer): in parts (nths[nth_idx]) or on threads, one
    workspace of ei_sizes.decode (one_part 7: sized for one part, refused in parts); keep: through a full keep set"""
    km = [17, 0, 0] if keep else [0]
    return [OP['ATTENTION_MT' if threaded else 'ATTENTION'], 128 | 2, 26, 0] + ATTN_VIEWS + km + \
           [THREADS if threaded else nth_idx, one_part, 0]
DEC_INIT = [OP['DECODER_INIT'], 0]
def OBSERVE_PROMPT(n):
    return [OP['OBSERVE'], 0, 0, n - 1, 0, 0, 0]
def OBSERVE_GEN(t):
    return [OP['OBSERVE'], 3, t, 0, 0, 0]
DECODE_KEEP = [OP['DECODE'], 200, 8 | 32, 0, 0, 0]    # keep (selector >= 64): mask and pooled
def DECODE_KEEP_EXEC(sel):
    """the selector % 8: 0-4 one thread (sel & 8: n_threads 0), 5 threads, 6 parts (EI_ERR_CONFIG), 7 a NULL ei_exec"""
    return [OP['DECODE'], 64 + sel, 8 | 32, 0, 0, 0]
def DECODE_ROWS(n, m=0, nth=0):
    """row map shuffled by n-1 u16 draws, scoring in nth % 4 + 1 parts, per head (m & 4: shared); (nth >> 2) & 3:
    1 the workspace of one part (refused), 2 select / shared_add / select_shared in parts, 3 with n_threads 2"""
    return [OP['DECODE'], 10, m] + [0, 0] * (n - 1) + ([0, 0] if m & 1 else []) + ([0, 0, 0, 0, 0, 0] if m & 2 else []) + [nth]
COMPACT_LAST = [OP['COMPACT'], 1] + [0, 0, 0, 0, 0, 0] * 2
COMPACT_ARB = [OP['COMPACT'], 0, 2, 20, 22, 40] + [1] * 40 * 2 + [0, 0, 0, 0, 0, 0] * 2
SIZES = [OP['SIZES'], 0, 6, 4, 4, 3, 3, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0]
SWAP = [OP['SWAP']]

# ---------------------------------------------------------------- placement (op_place)
R = dict(Q=0, K=1, V=2, OUT=3, PLAN=4, PSTRUCT=5, WS=6, DEC=7, DSTRUCT=8, KSTRUCT=9, INDEX=10, POS=11, MASK=12,
         POOLED=13, ROWPOS=14, SCORES=15, SHARED=16)
KINDS = ['profile', 'chunk', 'attention', 'decoder_init', 'observe', 'keep', 'score', 'select', 'shared_add',
         'select_shared', 'compact', 'plan_init', 'step', 'plan_reset', 'decoder_reset']

def used_roles(kind, var):
    """The buffers the call uses (pcall_setup), in role order: one alignment byte each."""
    k = KINDS[kind]
    u = set()
    keep = {R['KSTRUCT'], R['INDEX']} | ({R['POS']} if var & 1 else set()) | ({R['MASK']} if var & 2 else set()) | \
           ({R['POOLED']} if var & 4 else set())
    if k in ('profile', 'chunk', 'attention'):
        u |= {R['Q'], R['K'], R['WS']}
        if k == 'attention':
            u |= {R['V'], R['OUT']}
        if k != 'attention' or var & 1:
            u |= {R['PLAN'], R['PSTRUCT']}
    elif k in ('plan_init', 'plan_reset'):
        u |= {R['PLAN'], R['PSTRUCT']}
    elif k in ('decoder_init', 'decoder_reset'):
        u |= {R['DEC'], R['DSTRUCT']}
    elif k == 'step':  # the partials live in the workspace
        u |= {R['Q'], R['K'], R['V'], R['OUT'], R['KSTRUCT'], R['INDEX'], R['WS']}
    elif k == 'observe':
        u |= {R['Q'], R['DEC'], R['DSTRUCT']}
    elif k in ('keep', 'score'):
        u |= {R['K'], R['DEC'], R['DSTRUCT'], R['WS']}
        if k == 'score':
            u.add(R['SCORES'])
        if var & 8:
            u.add(R['ROWPOS'])
        if k == 'keep':
            u |= keep
    elif k in ('select', 'shared_add', 'select_shared'):
        u |= {R['DEC'], R['DSTRUCT'], R['WS']}
        if k != 'select_shared':
            u.add(R['SCORES'])
        if k != 'select':
            u.add(R['SHARED'])
        if var & 8 or k == 'shared_add':
            u.add(R['ROWPOS'])
        if k != 'shared_add':
            u |= keep
    elif k == 'compact':
        u |= {R['K'], R['V'], R['KSTRUCT'], R['INDEX']}
    return sorted(u)

def PLACE(kind, var=0, lays=(0, 0, 0, 0), odt=0, inter=False, extra=(), align=None, overlap=None, inter_x=1):
    """kind: index in KINDS; var: its variant bits (profile: var & 3 == 1 in 2 + (var >> 2 & 1) parts, 2 on
    threads; score: part (var >> 6) % nth of nth = 1 + (var >> 4) % 3; step: var & 4 on threads, else in
    (var & 3) % 3 + 1 parts); extra: the kind's own bytes (chunk: c1, cnt, pad, threads;
    attention: q_offset, count, threads; observe: count; keep: threads; compact: rows kept; step: count, rows of
    the keep set, rows kept, threads); align: {role: byte} (bits 6-7 = 3
    and an address that is not a multiple of the element size: misaligned); overlap: (x, host_index, guest_index,
    offset u16) over the used roles (x & 7: 0 guest's first byte on host's last, 1 guest's last on host's first,
    2/3 just after/before (no overlap), 4-7 the u16 offset; x & 8: the guest's address as it falls)."""
    var2 = 12 if inter else 0
    roles = used_roles(kind, var)
    b = [OP['PLACE'], kind, var] + list(lays) + [odt, var2] + list(extra) + [0, 0] * 3
    b += [(align or {}).get(r, 0) for r in roles]
    if inter and KINDS[kind] in ('attention', 'compact', 'profile'):
        b += [inter_x]
    elif overlap is None:
        b += [0]
    else:
        x, hi, gi, off = overlap
        b += [1, x, hi, gi] + ([off & 255, off >> 8] if x & 7 >= 4 else [])
    return b

def PLAN_EDIT(which, use, vm=0, value=None):
    """which: 0 max_tokens .. 9 on_device, 10-17 array pointers, 18 n_tokens, 19 n_segments/n_blocks/final,
    20-27 the decoder; use: the call that follows (plan: profile, chunk, heads, attention, finalize, reset,
    copy, profile_mt; decoder: reset, observe, due, keep)."""
    b = [OP['PLAN_EDIT'], which, use, vm]
    if vm & 1 and which != 24:
        b.append(value or 0)
    if which < 20:
        if use % 8 == 3:
            b += [0, 0]              # the out view's paddings
        if use % 8 == 7:
            b.append(1)              # one thread
    elif use % 4 == 1:
        b += [0, 0, 0]               # the observed row's view
    return b

STACK_OPS = ['PROFILE', 'PROFILE_HEADS', 'PROFILE_MT', 'CHUNK', 'ATTENTION', 'ATTENTION_MT', 'DECODE', 'COMPACT',
             'OBSERVE', 'PLACE', 'PLAN_EDIT', 'DECODER_INIT', 'SIZES']
def SMALL_STACK(op_bytes):
    """op_bytes: an op as above; it runs on the 64 KiB-stack thread"""
    return [OP['SMALL_STACK'], STACK_OPS.index(next(k for k, v in OP.items() if v == op_bytes[0] and k in STACK_OPS))] + op_bytes[1:]

def CELL_POS(n, m=0, bad=None):
    b = [OP['CELL_POS'], m | (16 if bad is not None else 0), n - 1]
    if bad is not None:
        b += list((bad[1] & 0xffffffff).to_bytes(4, 'little')) + [bad[0]]
    return b

L = SMALL + SMALL + layer()
seeds = {
    # the original sessions
    'whole_profile_attention': L + PLAN_INIT(2) + PROFILE + ATTN_PLAN + ATTN_DENSE,
    'bf16_gqa4': SMALL + SMALL + layer(kv=1, group=4, dtype=2, vdtype=2, dim_idx=6, n=9) + PLAN_INIT(2) + PROFILE + ATTN_PLAN,
    'f16_odd_dim': SMALL + SMALL + layer(kv=3, group=1, dtype=1, vdtype=1, dim_idx=4, n=24) + PLAN_INIT(0) + PROFILE + ATTN_PLAN,
    'heads_then_mt': SMALL + SMALL + layer(kv=2, group=2, n=19) + PLAN_INIT(0) + PROFILE_HEADS + ATTN_PLAN + PROFILE_MT() + ATTN_MT,
    'chunked': L + PLAN_INIT(1) + CHUNK(1) + CHUNK(2) + ATTN_CHUNK + CHUNK(1, True) + ATTN_PLAN,
    'chunk_out_of_order': L + PLAN_INIT(3) + CHUNK(2) + RESET + CHUNK(1) + CHUNK(1) + CHUNK(1, True) + CHUNK(1),
    'decode_compact': SMALL + SMALL + layer(n=27, kv=1, group=2) + DEC_INIT + OBSERVE_PROMPT(24) + OBSERVE_GEN(24) +
                      OBSERVE_GEN(25) + DECODE_KEEP + COMPACT_LAST,
    'decode_rows_shared': SMALL + SMALL + layer(n=24, kv=1, group=2) + DEC_INIT + OBSERVE_PROMPT(20) + OBSERVE_GEN(20) +
                          DECODE_ROWS(24, m=4, nth=1) + DECODE_ROWS(24, m=3),
    'decode_before_observe': L + DEC_INIT + DECODE_KEEP + OBSERVE_GEN(3) + DECODE_KEEP,
    'compact_arbitrary': L + COMPACT_ARB,
    'corrupt_plan': L + PLAN_INIT(0) + PROFILE + CORRUPT(0, 0) + ATTN_PLAN + PROFILE + CORRUPT(0, 3) + ATTN_PLAN +
                    PROFILE + CORRUPT(1, 3) + ATTN_PLAN + CORRUPT(4, 5) + ATTN_PLAN,
    'sizes': L + SIZES + [OP['SIZES'], 1, 6, 5, 4, 4, 3] + [0] * 13,
    'plan_other_context': SMALL + [2, 0, 1] + layer() + PLAN_INIT(0) + SWAP + PROFILE + ATTN_PLAN,
    'nan_inputs': SMALL + SMALL + [5, 0, 40, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 1, 5, 0, 1, 2, 0] +
                  [0, 0, 0, 0, 1, 9, 0, 0, 0, 2] + [0, 0, 0, 0, 0, 0] + PLAN_INIT(0) + PROFILE + ATTN_DENSE + DEC_INIT +
                  OBSERVE_PROMPT(30),
    'bad_config': [0xff] + [9, 6, 5, 10, 5, 6, 5, 5, 5, 3, 3, 4, 6, 6, 6, 4, 5, 4, 3, 4, 5, 3, 3, 6, 0x3f, 2] + SMALL + layer() + PROFILE,
    'extreme_config': [0x3f, 1, 2, 2, 8, 4, 3, 3, 3, 3, 1, 1, 0, 4, 6, 4, 2, 0, 3, 2, 7, 1, 1, 1] + SMALL + layer(n=110, kv=1, group=1, dim_idx=2) +
                      PLAN_INIT(3) + PROFILE + ATTN_PLAN + DEC_INIT + OBSERVE_PROMPT(100) + DECODE_KEEP,
    # issue 15: cache order, edited plans and decoders, small stacks
    'cell_pos': L + CELL_POS(20) + CELL_POS(20, bad=(5, 7)) + CELL_POS(9, m=4) + CELL_POS(3, m=32),
    'plan_edit_layout': L + PLAN_INIT(1) + PROFILE + PLAN_EDIT(0, 0) + PLAN_EDIT(4, 3, vm=1, value=3) + PLAN_EDIT(10, 4) +
                        PLAN_EDIT(15, 1, vm=1, value=1) + PLAN_EDIT(6, 5, vm=1, value=1) + PLAN_EDIT(7, 7) + ATTN_PLAN,
    'plan_edit_counts': L + PLAN_INIT(2) + PROFILE + PLAN_EDIT(18, 3, vm=66) + PLAN_EDIT(19, 4, vm=2 | 128) +
                        PLAN_EDIT(19, 0, vm=4 | 130) + PLAN_EDIT(19, 1, vm=1, value=5) + PLAN_EDIT(17, 2, vm=1, value=0),
    'decoder_edit': L + DEC_INIT + OBSERVE_PROMPT(20) + PLAN_EDIT(20, 1) + PLAN_EDIT(24, 3) + PLAN_EDIT(25, 0, vm=1, value=2) +
                    PLAN_EDIT(26, 1, vm=1, value=3) + PLAN_EDIT(27, 3, vm=1, value=2) + PLAN_EDIT(23, 2),
    'small_stack': L + PLAN_INIT(0) + SMALL_STACK(PROFILE) + SMALL_STACK(ATTN_PLAN) + SMALL_STACK(PROFILE_MT()) +
                   DEC_INIT + OBSERVE_PROMPT(20) + SMALL_STACK(DECODE_KEEP) + SMALL_STACK(ATTN_MT),
}
# placement: every call kind apart and aligned, then at odd addresses; one buffer over another; misaligned ones
ODD = {r: 1 + 2 * r for r in range(17)}   # odd addresses (library memory may have any; views and arrays refuse)
for kind, name in enumerate(KINDS):
    var = {'attention': 1, 'keep': 1 | 2 | 4 | 8, 'select': 1 | 2 | 4, 'select_shared': 1 | 8, 'score': 8,
           'chunk': 4}.get(name, 0)
    extra = {'chunk': [10, 20], 'observe': [3], 'compact': [5], 'step': [1, 20, 9]}.get(name, [])
    prefix = L + (DEC_INIT + OBSERVE_PROMPT(20) if name in ('observe', 'keep', 'score', 'select', 'shared_add', 'select_shared') else [])
    roles = used_roles(kind, var)
    mem = {r: 1 + 6 * r for r in roles if r in (R['PLAN'], R['WS'], R['DEC'])}   # memory at odd addresses: accepted
    seeds['place_%s' % name] = prefix + PLACE(kind, var, extra=extra) + PLACE(kind, var, extra=extra, align=mem)
    # one buffer over another: each role over the next one, the guest's first byte on the host's last
    over = []
    for i in range(len(roles)):
        over += PLACE(kind, var, extra=extra, overlap=(i % 8, i, (i + 1) % len(roles), 97 * i))
    seeds['place_%s_overlap' % name] = prefix + over
    seeds['place_%s_misaligned' % name] = prefix + PLACE(kind, var, extra=extra, align={r: 0xc0 | 1 for r in roles})
seeds['place_attention_interleaved'] = L + PLACE(2, 0, lays=(3, 0, 0, 3), inter=True) + PLACE(2, 0, lays=(4, 0, 0, 4), inter=True, inter_x=0)
seeds['place_compact_interleaved'] = L + PLACE(10, 0, lays=(0, 3, 3, 0), inter=True, extra=[7]) + \
                                     PLACE(10, 0, lays=(0, 4, 4, 0), inter=True, extra=[7], inter_x=3)
# issue 36: a chunk and a decode step split over threads (every share checked before any runs), finalize
seeds['place_chunk_mt'] = L + PLACE(1, 4 | 32, extra=[10, 20, THREADS], overlap=(0, 2, 0, 0))
seeds['place_step_mt'] = L + PLACE(12, 4 | 8, extra=[2, 20, 9, THREADS]) + PLACE(12, 4, extra=[1, 20, 9, THREADS], overlap=(0, 6, 5, 0))
seeds['place_plan_finalize'] = L + PLACE(13, 4) + PLACE(13, 4, overlap=(4, 0, 1, 200))
# issue 36: every case of the int64-edges op, each at a few edges (after a chunked plan, a decoder and a keep set)
def EDGES(case, value_index, *extra):
    return [OP['EDGES'], case, value_index] + list(extra)
seeds['edges_plan'] = L + PLAN_INIT(1) + CHUNK(1) + [0] + EDGES(0, 0, 0) + EDGES(0, 15, 1) + EDGES(1, 15, 0, 1) + \
    EDGES(1, 13, 1, 0) + EDGES(8, 15, 0) + EDGES(8, 0, 1)
seeds['edges_attention'] = L + EDGES(2, 0) + EDGES(2, 15) + EDGES(3, 15) + EDGES(3, 0)
seeds['edges_decode'] = L + DEC_INIT + OBSERVE_PROMPT(20) + DECODE_KEEP + EDGES(4, 1, 0) + EDGES(4, 8, 1) + \
    EDGES(5, 0) + EDGES(6, 15, 0) + EDGES(6, 0, 1) + EDGES(6, 1, 2) + EDGES(7, 0, 2) + EDGES(7, 15, 0)
seeds['place_profile_qk_shared'] = SMALL + SMALL + layer(kv=2, group=1, n=19) + PLACE(0, 0, lays=(3, 3, 0, 0), inter=True)
# issue 31: one ei_exec per call (threads or parts, one workspace), ei_layer_sizes, ei_plan_grow, ei_plan_mask
L2 = SMALL + SMALL + layer(kv=2, group=2, n=27)
seeds['exec_profile_parts'] = L2 + PLAN_INIT(2) + PROFILE_PARTS(0, 2, 3) + ATTN_PLAN + PROFILE_PARTS(1, 3, 1) + \
    PROFILE_PARTS(2, 2) + PROFILE_PARTS(-1, 0) + PROFILE_PARTS(1, 1) + PROFILE_PARTS(3, 5, 3) + PROFILE_NULL_EXEC + PROFILE_NULL_WS
L3 = SMALL + SMALL + layer(kv=2, group=1, n=27)
seeds['exec_chunk_parts'] = L3 + PLAN_INIT(1) + CHUNK_PARTS(0, 2) + CHUNK_PARTS(1, 3, every=False) + CHUNK(1, threads=0) + \
    CHUNK(1, threads=2 | 4) + CHUNK_PARTS(3, 4, final=True) + ATTN_PLAN
seeds['exec_threads_past'] = L2 + PLAN_INIT(0) + PROFILE_MT(PAST_THREADS(0)) + PROFILE_MT(PAST_THREADS(1)) + \
    PROFILE_MT(PAST_THREADS(2)) + PROFILE_MT(PAST_THREADS(3)) + PROFILE_MT(0) + PROFILE_MT(32)
seeds['exec_attention'] = L2 + PLAN_INIT(0) + PROFILE + ATTN_PARTS_SHORT + ATTN_EXEC(6 + 1) + ATTN_EXEC(12 + 2) + \
    ATTN_EXEC(12 + 3) + ATTN_EXEC(18 + 1, 4) + ATTN_EXEC(24 + 1) + ATTN_EXEC(30 + 1, 0) + ATTN_EXEC(0 + 3, 6) + \
    [OP['ATTENTION'], 1] + ATTN_VIEWS + [2, 0, 0]
seeds['exec_decode_step'] = L + ATTN_STEP(1) + ATTN_STEP(2) + ATTN_STEP(6) + ATTN_STEP(1, one_part=7) + \
    ATTN_STEP(2, keep=True) + ATTN_STEP(0, keep=True) + ATTN_STEP(threaded=True)
seeds['exec_decode'] = L + DEC_INIT + OBSERVE_PROMPT(20) + OBSERVE_GEN(20) + DECODE_KEEP_EXEC(6) + DECODE_KEEP_EXEC(7) + \
    DECODE_KEEP_EXEC(5) + DECODE_KEEP_EXEC(8) + DECODE_ROWS(27, m=4, nth=1 | 8) + DECODE_ROWS(27, nth=2 | 8) + \
    DECODE_ROWS(27, nth=1 | 4) + DECODE_ROWS(27, m=4, nth=3 | 12) + DECODE_KEEP
seeds['layer_sizes'] = L + [OP['SIZES'], 0, 3, 2, 1, 1, 3 | (2 << 2), 8] + [0] * 12 + \
    [OP['SIZES'], 2, 3, 2, 1, 1, 1 | (5 << 2), 8] + [0] * 12 + [OP['SIZES'], 1, 4, 3, 3, 2, 0 | (6 << 2), 0] + [0] * 12 + \
    [OP['SIZES'], 4 | 8, 3, 2, 1, 1, 1 | (1 << 2), 8] + [0] * 12 + [OP['SIZES'], 4, 0, 9, 2, 1, 2 | (9 << 2), 0] + [0] * 12 + \
    [OP['SIZES'], 0, 7, 5, 6, 4, 3 | (8 << 2) | (2 << 6), 8] + [0] * 12
seeds['plan_grow'] = L + PLAN_INIT(1, alloc=True) + CHUNK(1) + GROW(3) + CHUNK(2) + GROW(0) + GROW(1) + GROW(2, pick=2) + \
    GROW(2, pick=4) + GROW(3, alt=1) + GROW(0, null=1) + CHUNK(1, True) + ATTN_PLAN + \
    PLAN_INIT(0) + PROFILE + GROW(0) + GROW(1)
seeds['plan_mask'] = L3 + PLAN_INIT(2) + PROFILE + MASK(1, 0, 15) + MASK(1 | (2 << 1) | (1 << 3) | 32 | (2 << 6), 0x10, 5) + \
    MASK(0 | (1 << 1) | (2 << 3) | (1 << 6), 0x21, 0x13) + MASK(1 | (1 << 1) | 32, 0x01, 0x0f) + MASK(1 | (3 << 6), 0, 15) + \
    MASK(1 | (3 << 1), 1, 15) + MASK(1 | (3 << 3), 0, 15) + MASK(1, 0x31, 0x30) + MASK(1, 0, 0xc0) + MASK(1, 2, 0x1f) + \
    MASK(1 | (2 << 6), 0x20, 0x2f)
seeds['place_profile_parts'] = L2 + PLACE(0, 1) + PLACE(0, 1 | 4) + PLACE(0, 1, overlap=(4, 4, 1, 9))
seeds['place_score_parts'] = L + DEC_INIT + OBSERVE_PROMPT(20) + PLACE(6, 8 | (1 << 4) | (1 << 6)) + \
    PLACE(6, 8 | (2 << 4) | (2 << 6)) + PLACE(6, (1 << 4), overlap=(4, 1, 4, 30))
seeds['place_step_parts'] = L + PLACE(12, 1, extra=[1, 20, 9]) + PLACE(12, 2 | 8, extra=[2, 20, 9]) + \
    PLACE(12, 1, extra=[1, 20, 9], overlap=(4, 4, 3, 40))

for name in list(seeds):
    seeds['seed_' + name] = seeds.pop(name)
for name, data in seeds.items():
    with open(os.path.join(HERE, name + '.bin'), 'wb') as f:
        f.write(bytes(b & 255 for b in data))
print('wrote %d seeds to %s' % (len(seeds), HERE))
