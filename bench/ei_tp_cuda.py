"""bench/ei_tp_cuda.py - tensor-parallel attention with entropyinfer's CUDA backend.

One layer of n tokens (32 query / 8 kv heads, head_dim 128, bf16, the default
configuration) split by kv heads: rank r of P owns kv heads [r*8/P, (r+1)*8/P)
and their query heads, profiles them (ei_profile) and runs sparse (and dense)
attention on them (ei_attention_prefill) with the CUDA backend, through the C
shim bench/ei_tp_shim.c (build/libei_tp_shim.so, ctypes). Tensors are torch's;
the library gets data_ptr()s and views with token/head strides: a shard is the
full Q/K/V with fewer heads and an offset pointer (no copy). The library runs
on torch's current stream (cfg.cuda_stream), so its kernels are ordered with
torch's. Each rank writes its heads' output head-major ([heads][n][128]), so the
NCCL all-gather of the ranks' buffers is the whole layer's output, [32][n][128],
with no rearrangement.

  --mode shards   one process, one GPU: the unsharded layer, then for each shard
                  count P in --shards the P shards one after the other on the same
                  GPU (each its own context, plan and workspaces), their outputs
                  concatenated; plans and outputs compared bit for bit with the
                  unsharded run; times per shard (this shows that the sharding is
                  exact and how a shard's time scales, not NCCL's cost).
  --mode nccl     one process per GPU (torchrun / python -m torch.distributed.run;
                  run directly it is a world of 1): torch.distributed with the NCCL
                  backend; every rank also runs the unsharded layer (its own 1-GPU
                  run on the same inputs) and checks its plan rows and the gathered
                  outputs against it bit for bit; times (CUDA events on the stream,
                  a barrier before each repetition, medians, the slowest rank):
                  the 1-GPU layer, the P-GPU layer with the all-gather, its share,
                  scaling efficiency = t(1 GPU) / (P x t(P GPUs)).

  python3 bench/ei_tp_cuda.py --mode shards --tokens 32768 --shards 2,4,8
  torchrun --nproc_per_node=2 bench/ei_tp_cuda.py --mode nccl --tokens 131072

Inputs (the same generator on every rank, seeded): even kv heads are peaked (a
sink block dominates: rigid heads), odd kv heads are noise (dynamic heads), as
in bench/ei_bench_cuda.c. Exit status 1 if any check fails.
"""
import argparse
import ctypes
import os
import sys

# NVLink multicast stays off in every process this starts (shared hosts).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

H, KV, D = 32, 8, 128
G = H // KV
SEG, BLK = 512, 8  # ei_config_default(): segment and block size (densities only)
EI_BF16 = 2
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class View(ctypes.Structure):
    """ei_tensor's layout (the shim checks the size): element strides."""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("n_heads", ctypes.c_int32),
                ("head_dim", ctypes.c_int32), ("n_tokens", ctypes.c_int64), ("token_stride", ctypes.c_int64),
                ("head_stride", ctypes.c_int64)]


def view(t, tok_axis, head_axis, h0, nh):
    """Heads [h0, h0 + nh) of a bf16 tensor whose last axis is head_dim: an offset
    pointer and the tensor's own strides, no copy."""
    assert t.dtype == torch.bfloat16 and t.stride(-1) == 1
    return View(t.data_ptr() + h0 * t.stride(head_axis) * t.element_size(), EI_BF16, nh, t.shape[-1],
                t.shape[tok_axis], t.stride(tok_axis), t.stride(head_axis))


class Lib:
    def __init__(self, path):
        L = ctypes.CDLL(path)
        vp, sz, i32, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_int64
        pv = ctypes.POINTER(View)
        L.eitp_view_size.restype = ctypes.c_int
        L.eitp_error.restype = ctypes.c_char_p
        L.eitp_result_name.restype = ctypes.c_char_p
        L.eitp_result_name.argtypes = [ctypes.c_int]
        L.eitp_create.argtypes = [vp, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(vp)]
        L.eitp_destroy.argtypes = [vp]
        L.eitp_destroy.restype = None
        L.eitp_sizes.argtypes = [vp, i64, i32, i32, i32, ctypes.POINTER(sz)]
        L.eitp_plan_create.argtypes = [vp, i64, i32, i32, vp, sz, ctypes.POINTER(vp)]
        L.eitp_plan_destroy.argtypes = [vp]
        L.eitp_plan_destroy.restype = None
        L.eitp_profile.argtypes = [vp, vp, pv, pv, vp, sz]
        L.eitp_attention.argtypes = [vp, vp, pv, pv, pv, pv, vp, sz]
        L.eitp_plan_info.argtypes = [vp, ctypes.POINTER(i64)]
        L.eitp_plan_export.argtypes = [vp, vp] + [vp] * 6
        L.eitp_segment_is_sparse.argtypes = [vp, vp, i32]
        if L.eitp_view_size() != ctypes.sizeof(View):
            sys.exit(f"ei_tp_cuda: ei_tensor is {L.eitp_view_size()} bytes, the ctypes view {ctypes.sizeof(View)}")
        self.L = L

    def check(self, r, what):
        if r != 0:
            raise RuntimeError(f"{what}: {self.L.eitp_result_name(r).decode()}: {self.L.eitp_error().decode()}")


class Shard:
    """What one rank owns: its context (on torch's current stream), its plan and
    workspaces, and views of kv heads [kv0, kv0 + nkv) and their query heads of
    the layer's full Q, K, V (token-major [n][heads][128]); its output is its own
    head-major buffer [nh][n][128]. Nothing is shared with another shard."""

    def __init__(self, lib, cuda_lib, q, k, v, kv0, nkv):
        self.lib, L = lib, lib.L
        n = q.shape[0]
        self.n, self.kv0, self.nkv, self.h0, self.nh = n, kv0, nkv, kv0 * G, nkv * G
        self.ctx = ctypes.c_void_p()
        stream = torch.cuda.current_stream().cuda_stream
        lib.check(L.eitp_create(ctypes.c_void_p(stream), cuda_lib.encode() if cuda_lib else None,
                                0, ctypes.byref(self.ctx)), "ei_context_create (CUDA backend)")
        sizes = (ctypes.c_size_t * 3)()
        lib.check(L.eitp_sizes(self.ctx, n, self.nh, nkv, D, sizes), "sizes")
        dev = q.device
        self.plan_mem = torch.empty(max(sizes[0], 1), dtype=torch.uint8, device=dev)
        self.pws = torch.empty(max(sizes[1], 1), dtype=torch.uint8, device=dev)
        self.aws = torch.empty(max(sizes[2], 1), dtype=torch.uint8, device=dev)
        self.pws_bytes, self.aws_bytes = sizes[1], sizes[2]
        self.plan = ctypes.c_void_p()
        lib.check(L.eitp_plan_create(self.ctx, n, nkv, D, self.plan_mem.data_ptr(), sizes[0], ctypes.byref(self.plan)),
                  "ei_plan_init")
        self.qv = view(q, 0, 1, self.h0, self.nh)
        self.kv = view(k, 0, 1, kv0, nkv)
        self.vv = view(v, 0, 1, kv0, nkv)
        self.out_sparse = torch.empty(self.nh, n, D, dtype=torch.bfloat16, device=dev)
        self.out_dense = torch.empty(self.nh, n, D, dtype=torch.bfloat16, device=dev)
        self.ov_sparse = view(self.out_sparse, 1, 0, 0, self.nh)
        self.ov_dense = view(self.out_dense, 1, 0, 0, self.nh)

    def profile(self):
        self.lib.check(self.lib.L.eitp_profile(self.ctx, self.plan, ctypes.byref(self.qv), ctypes.byref(self.kv),
                                               self.pws.data_ptr(), self.pws_bytes), "ei_profile")

    def sparse(self):
        self.lib.check(self.lib.L.eitp_attention(self.ctx, self.plan, ctypes.byref(self.qv), ctypes.byref(self.kv),
                                                 ctypes.byref(self.vv), ctypes.byref(self.ov_sparse),
                                                 self.aws.data_ptr(), self.aws_bytes), "ei_attention_prefill (plan)")

    def dense(self):
        self.lib.check(self.lib.L.eitp_attention(self.ctx, None, ctypes.byref(self.qv), ctypes.byref(self.kv),
                                                 ctypes.byref(self.vv), ctypes.byref(self.ov_dense),
                                                 self.aws.data_ptr(), self.aws_bytes), "ei_attention_prefill (dense)")

    def plan_arrays(self):
        """The plan read back: dense [kv][segment](...) numpy arrays."""
        L = self.lib.L
        info = (ctypes.c_int64 * 6)()
        self.lib.check(L.eitp_plan_info(self.plan, info), "plan info")
        nkv, nseg, mk = info[1], info[2], info[4]
        a = {"entropy": np.zeros((nkv, nseg), np.float32), "head_class": np.zeros(nkv, np.uint8),
             "budget": np.zeros((nkv, nseg), np.float32), "keep_blocks": np.zeros((nkv, nseg), np.int32),
             "keep_count": np.zeros((nkv, nseg), np.int32), "block_index": np.zeros((nkv, nseg, mk), np.int32)}
        self.lib.check(L.eitp_plan_export(self.ctx, self.plan, *[x.ctypes.data for x in a.values()]), "plan export")
        a["sparse_segments"] = np.array([L.eitp_segment_is_sparse(self.ctx, self.plan, s) for s in range(nseg)],
                                        np.int32)
        a["fields"] = np.array([info[0], info[2], info[3], info[4]], np.int64)  # n_tokens, n_segments, n_blocks, max_keep
        return a

    def close(self):
        self.lib.L.eitp_plan_destroy(self.plan)
        self.lib.L.eitp_destroy(self.ctx)


def make_inputs(n, seed, dev):
    """Q [n][32][128], K and V [n][8][128], bf16, the same on every rank."""
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    d = torch.arange(D, device=dev)

    def noise(shape):
        return torch.rand(shape, generator=g, device=dev) * 3.46 - 1.73

    def pattern(kvh):  # the rigid heads' direction, per head and dim, in {-1, 0, 1}
        return ((kvh[:, None] * 31 + d[None, :] * 7) % 3 - 1).float()

    kvh_q = torch.arange(H, device=dev) // G
    kvh_k = torch.arange(KV, device=dev)
    rq, rk = (kvh_q % 2 == 0)[None, :, None], (kvh_k % 2 == 0)[None, :, None]
    q = noise((n, H, D))
    q = torch.where(rq, pattern(kvh_q)[None] + 0.1 * q, q).to(torch.bfloat16)
    k = noise((n, KV, D))
    sink = (torch.arange(n, device=dev) < BLK).float()[:, None, None] * 2.0 * pattern(kvh_k)[None]
    k = torch.where(rk, sink + 0.1 * k, k).to(torch.bfloat16)
    v = noise((n, KV, D)).to(torch.bfloat16)
    return q, k, v


def time_stages(stages, reps, before=None):
    """One warm-up, then reps timed runs of the stages in order (CUDA events on
    the current stream around each); medians per stage and of the total."""
    for _, fn in stages:
        fn()
    torch.cuda.synchronize()
    rec = {name: [] for name, _ in stages}
    rec["total"] = []
    for _ in range(reps):
        if before:
            before()
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(stages) + 1)]
        ev[0].record()
        for i, (_, fn) in enumerate(stages):
            fn()
            ev[i + 1].record()
        ev[-1].synchronize()
        for i, (name, _) in enumerate(stages):
            rec[name].append(ev[i].elapsed_time(ev[i + 1]))
        rec["total"].append(ev[0].elapsed_time(ev[-1]))
    return {k: float(np.median(v)) for k, v in rec.items()}


def density(p, n):
    """Share of the dense causal (query, key) pairs the plan attends."""
    useful = 0.0
    for s in range(int(p["fields"][1])):
        a, b = s * SEG, min((s + 1) * SEG, n)
        m = b - a
        if p["sparse_segments"][s]:
            useful += G * float(np.sum(p["keep_count"][:, s])) * BLK * m + p["keep_count"].shape[0] * G * m * (m + 1) / 2
        else:
            useful += p["keep_count"].shape[0] * G * (m * (a + 1) + m * (m - 1) / 2)
    nh = p["keep_count"].shape[0] * G
    return useful / (nh * n * (n + 1) / 2)


def plan_rows_equal(full, part, kv0, nkv):
    """The shard's plan equals rows [kv0, kv0 + nkv) of the unsharded plan, bit
    for bit (floats compared as their bits). Returns a list of what differs."""
    bad = []
    if not np.array_equal(full["fields"], part["fields"]):
        bad.append(f"fields {full['fields'].tolist()} vs {part['fields'].tolist()}")
    if not np.array_equal(full["sparse_segments"], part["sparse_segments"]):
        bad.append("sparse segments")
    for key in ("entropy", "head_class", "budget", "keep_blocks", "keep_count", "block_index"):
        a, b = full[key][kv0:kv0 + nkv], part[key]
        if a.dtype == np.float32:
            a, b = a.view(np.uint32), b.view(np.uint32)
        if a.shape != b.shape or not np.array_equal(a, b):
            bad.append(key)
    return bad


def bits_equal(a, b):
    """(equal bit for bit, elements that differ, max |difference|)"""
    ai, bi = a.view(torch.int16), b.view(torch.int16)
    if ai.shape == bi.shape and torch.equal(ai, bi):
        return True, 0, 0.0
    ndiff = int((ai != bi).sum()) if ai.shape == bi.shape else -1
    mad = float((a.float() - b.float()).abs().max()) if ai.shape == bi.shape else float("nan")
    return False, ndiff, mad


def layer_line(tag, t):
    return (f"{tag}: profile {t['profile']:.2f} ms + sparse {t['sparse']:.2f} ms = {t['profile'] + t['sparse']:.2f} ms; "
            f"dense {t['dense']:.2f} ms")


def run_full(lib, cuda_lib, q, k, v, reps, before=None):
    """The unsharded layer on this GPU (the 1-GPU run): times, plan, outputs."""
    s = Shard(lib, cuda_lib, q, k, v, 0, KV)
    ts = time_stages([("profile", s.profile), ("sparse", s.sparse)], reps, before)
    td = time_stages([("dense", s.dense)], reps, before)
    return s, {"profile": ts["profile"], "sparse": ts["sparse"], "dense": td["dense"]}


def mode_shards(args, lib, n, shard_counts):
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    q, k, v = make_inputs(n, args.seed, dev)
    full, t1 = run_full(lib, args.cuda_lib, q, k, v, args.reps)
    pf = full.plan_arrays()
    rigid = int(np.sum(pf["head_class"] == 1))
    print(f"\n== n {n}: unsharded layer (1 GPU, {H}/{KV} heads): {layer_line('', t1)[2:]}; "
          f"plan density {density(pf, n):.4f}, rigid kv heads {rigid}/{KV}", flush=True)
    ok = True
    for P in shard_counts:
        if KV % P:
            print(f"   {P} shards: skipped ({KV} kv heads do not split {P} ways)")
            continue
        per = KV // P
        shards = [Shard(lib, args.cuda_lib, q, k, v, r * per, per) for r in range(P)]
        times = []
        for s in shards:  # one after the other on this GPU
            ts = time_stages([("profile", s.profile), ("sparse", s.sparse)], args.reps)
            td = time_stages([("dense", s.dense)], args.reps)
            times.append({"profile": ts["profile"], "sparse": ts["sparse"], "dense": td["dense"]})
        cat = {}
        tc = time_stages([("sparse", lambda: cat.__setitem__("sparse", torch.cat([s.out_sparse for s in shards]))),
                          ("dense", lambda: cat.__setitem__("dense", torch.cat([s.out_dense for s in shards])))],
                         args.reps)
        plan_bad = []
        for r, s in enumerate(shards):
            bad = plan_rows_equal(pf, s.plan_arrays(), s.kv0, s.nkv)
            if bad:
                plan_bad.append(f"shard {r}: " + ", ".join(bad))
        eq_s = bits_equal(cat["sparse"], full.out_sparse)
        eq_d = bits_equal(cat["dense"], full.out_dense)
        ok &= not plan_bad and eq_s[0] and eq_d[0]
        print(f"-- {P} shards of {per} kv / {per * G} query heads, one after the other on this GPU:")
        for r, t in enumerate(times):
            print(f"   shard {r} (kv heads {r * per}..{r * per + per - 1}): {layer_line('', t)[2:]}")
        lay_s = [t["profile"] + t["sparse"] for t in times]
        lay_d = [t["dense"] for t in times]
        for name, tot1, lay in (("sparse layer (profile + sparse)", t1["profile"] + t1["sparse"], lay_s),
                                ("dense layer", t1["dense"], lay_d)):
            print(f"   {name}: unsharded {tot1:.2f} ms; shards: sum {sum(lay):.2f} ms ({sum(lay) / tot1:.3f}x), "
                  f"slowest {max(lay):.2f} ms = {tot1 / max(lay):.2f}x faster; per-shard scaling "
                  f"t1 / ({P} x slowest) = {tot1 / (P * max(lay)):.3f} (no communication counted)")
        print(f"   concatenation of the shards' outputs (torch.cat, head-major, a local copy, not NCCL): "
              f"sparse {tc['sparse']:.3f} ms, dense {tc['dense']:.3f} ms")
        print(f"   plans (every array, bit for bit) = the unsharded plan's rows: "
              f"{'yes' if not plan_bad else 'NO: ' + '; '.join(plan_bad)}")
        for name, e in (("sparse", eq_s), ("dense", eq_d)):
            print(f"   {name} output, shards concatenated = unsharded, bit for bit: "
                  f"{'yes' if e[0] else f'NO: {e[1]} elements differ, max |diff| {e[2]:.3g}'}")
        sys.stdout.flush()
        for s in shards:
            s.close()
        del shards, cat
        torch.cuda.empty_cache()
    full.close()
    return ok


def mode_nccl(args, lib, n):
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    if KV % world:
        sys.exit(f"ei_tp_cuda: {KV} kv heads do not split over {world} ranks")
    per = KV // world
    q, k, v = make_inputs(n, args.seed, dev)
    torch.cuda.synchronize()

    def barrier():
        dist.barrier()

    # the 1-GPU run on this rank's GPU (every rank: its own reference for the checks)
    full, t1 = run_full(lib, args.cuda_lib, q, k, v, args.reps, barrier)
    pf = full.plan_arrays()
    # this rank's shard: its own context, plan, workspaces; views of its heads
    s = Shard(lib, args.cuda_lib, q, k, v, rank * per, per)
    gathered_s = torch.empty(H, n, D, dtype=torch.bfloat16, device=dev)
    gathered_d = torch.empty(H, n, D, dtype=torch.bfloat16, device=dev)

    def gather_sparse():
        dist.all_gather_into_tensor(gathered_s.view(-1), s.out_sparse.view(-1))

    def gather_dense():
        dist.all_gather_into_tensor(gathered_d.view(-1), s.out_dense.view(-1))

    ts = time_stages([("profile", s.profile), ("sparse", s.sparse), ("gather", gather_sparse)], args.reps, barrier)
    td = time_stages([("dense", s.dense), ("gather", gather_dense)], args.reps, barrier)
    torch.cuda.synchronize()
    plan_bad = plan_rows_equal(pf, s.plan_arrays(), s.kv0, s.nkv)
    eq_s = bits_equal(gathered_s, full.out_sparse)
    eq_d = bits_equal(gathered_d, full.out_dense)
    mine = {"rank": rank, "t1": t1, "ts": ts, "td": td, "plan_bad": plan_bad, "eq_s": eq_s, "eq_d": eq_d,
            "density": density(pf, n), "gpu": torch.cuda.get_device_name(dev)}
    allr = [None] * world
    dist.all_gather_object(allr, mine)
    ok = all(not r["plan_bad"] and r["eq_s"][0] and r["eq_d"][0] for r in allr)
    if rank == 0:
        t1 = allr[0]["t1"]
        l1s, l1d = t1["profile"] + t1["sparse"], t1["dense"]
        # the P-GPU layer: the slowest rank's median of each stage
        worst = lambda tab, key: max(r[tab][key] for r in allr)  # noqa: E731
        lps, lpd = worst("ts", "total"), worst("td", "total")
        gs, gd = worst("ts", "gather"), worst("td", "gather")
        out_bytes = H * n * D * 2
        print(f"\n== n {n}: NCCL, world {world} ({allr[0]['gpu']}), {per} kv / {per * G} query heads per rank; "
              f"plan density {allr[0]['density']:.4f}")
        print(f"   1 GPU (unsharded, rank 0): {layer_line('', t1)[2:]}")
        for r in allr:
            print(f"   rank {r['rank']}: profile {r['ts']['profile']:.2f} + sparse {r['ts']['sparse']:.2f} + "
                  f"all-gather {r['ts']['gather']:.3f} = {r['ts']['total']:.2f} ms; dense {r['td']['dense']:.2f} + "
                  f"all-gather {r['td']['gather']:.3f} = {r['td']['total']:.2f} ms")
        for name, l1, lp, g in (("sparse layer (profile + sparse + all-gather)", l1s, lps, gs),
                                ("dense layer (dense + all-gather)", l1d, lpd, gd)):
            print(f"   {name}: 1 GPU {l1:.2f} ms, {world} GPU(s) {lp:.2f} ms (slowest rank): speed-up {l1 / lp:.2f}x, "
                  f"scaling efficiency {l1 / (world * lp):.3f}; all-gather {g:.3f} ms = {100 * g / lp:.1f}% of the "
                  f"layer ({out_bytes / 2**20:.0f} MiB gathered, {out_bytes / g / 1e6:.1f} GB/s)")
        for r in allr:
            print(f"   rank {r['rank']}: plan rows = unsharded plan's, bit for bit: "
                  f"{'yes' if not r['plan_bad'] else 'NO: ' + ', '.join(r['plan_bad'])}; gathered outputs = unsharded, "
                  f"bit for bit: sparse {'yes' if r['eq_s'][0] else 'NO %d %.3g' % r['eq_s'][1:]}, dense "
                  f"{'yes' if r['eq_d'][0] else 'NO %d %.3g' % r['eq_d'][1:]}")
        sys.stdout.flush()
    s.close()
    full.close()
    del gathered_s, gathered_d
    torch.cuda.empty_cache()
    dist.barrier()
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("shards", "nccl"), default="shards")
    # --tokens, not --n, under torchrun: its own parser takes --n for an ambiguous abbreviation of its options
    ap.add_argument("--tokens", "--n", dest="n", default="131072",
                    help="tokens; a comma list runs each (e.g. 32768,131072)")
    ap.add_argument("--shards", default="2", help="shards mode: shard counts, a comma list (divisors of 8)")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions after one warm-up (medians)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shim", default=os.path.join(ROOT, "build", "libei_tp_shim.so"))
    ap.add_argument("--cuda-lib", default=os.environ.get("EI_CUDA_LIBRARY") or
                    os.path.join(ROOT, "build", "libentropyinfer_cuda.so"))
    args = ap.parse_args()
    sizes = [int(x) for x in args.n.split(",") if x]
    lib = Lib(args.shim)
    ok = True
    if args.mode == "shards":
        print(f"ei_tp_cuda: shard check on one GPU ({torch.cuda.get_device_name(0)}), {H}/{KV} heads, d={D}, bf16, "
              f"default configuration; medians of {args.reps} runs (CUDA events on torch's stream)", flush=True)
        for n in sizes:
            ok &= mode_shards(args, lib, n, [int(x) for x in args.shards.split(",") if x])
    else:
        for n in sizes:
            ok &= mode_nccl(args, lib, n)
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"ei_tp_cuda ({args.mode}): {'all checks passed' if ok else 'CHECKS FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
