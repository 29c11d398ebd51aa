#!/usr/bin/env python3
"""examples/llama.cpp/soak_server.py - llama-server with entropyinfer under concurrent requests
(issue 34; run by soak.sh, `make llama-cpp-soak`).

    soak_server.py SERVER_BINARY MODEL TEXT OUT_DIR

Three phases, each a llama-server on a free local port with --entropyinfer and options that make
entropyinfer act on prompts of a few hundred tokens (sparse prefill from 512 tokens, segments of
256, decode budget 256 recompressed every 16 generated tokens):

  parallel  -np 4 --no-kv-unified -c 8192 (2048 cells a slot): 4 client threads x 3 requests at
            once, prompts of 600-1200 tokens cut from TEXT (a fixed seed), some sharing a prefix of
            about 800 tokens (prompt-cache reuse), every fourth with "entropyinfer": false, every
            third streamed, greedy and sampled (seeded). Sparse prefill serves each slot's KV stream,
            and decode compression each slot's sequence, with its own decoders and keep set (after
            decode_gap, 16, generated tokens: once per request of 24 tokens)
  unified   -np 4 -c 8192, llama-server's default cache (unified: one KV stream for the 4 slots): the
            same load; a ubatch that mixes slots is served sequence by sequence, each over its own
            cells (a view, or gathered where the slots' cells interleave), and the exit line counts
            the sequences served
  queued    -np 1 -c 4096: 2 client threads x 2 requests queued on one slot, which compresses while
            decoding; a prompt sharing a prefix reuses the cache up to the first evicted position

The client load runs ROUNDS (3) times per phase, and beside it, in each round, a client sending
malformed requests (not JSON, a JSON array, no prompt, fields of the wrong type, "entropyinfer" not
a boolean) and one dropping two streamed requests of 200 tokens after 3 chunks (cancelled). The
server's RAM prompt cache is bounded (--cache-ram 64), so that its resident memory can be compared
between rounds.

Checks, per phase: every request HTTP 200 with n_predict tokens ("ignore_eos"), the streamed ones
read to their final chunk; every malformed request refused with a 4xx; the dropped streams read
(and the requests after them answered); the greedy entropyinfer probe sent alone after each round
giving the text it gave alone before the load; the server's resident memory after the last round
at most 10% above that after the first plus the prompt cache's bound (64 MiB, which the rounds fill); two greedy probes (cache_prompt false, so the prompt is processed from
position 0), one with entropyinfer and one with "entropyinfer": false, sent alone before the load
and again amid it. In the queued phase both must give the same text (one slot: the probe's prompt
is cut into the same ubatches and its tokens decoded alone, as the first time). In the parallel
phase they are only required to complete (the line says whether the text is the same), because
llama.cpp does not give the same numbers for another batch layout: amid the load the server fills
its batches with other slots' tokens too, so the probe's prompt is cut into other ubatches and its
tokens decoded in batches of several; the CPU backend then takes other kernels (flash attention
and matmul paths chosen by batch size), and it was seen to change the greedy text of the dense
probe. The entropyinfer probe differs for two more reasons: a sparse plan is made per ubatch from
that ubatch's queries, and a ubatch holding a sequence with "entropyinfer": false runs llama.cpp's
attention for all of its sequences (ei_decide). Then: the server alive and answering /health after the load, exit status 0 on SIGTERM, its exit line
"entropyinfer: mode ..., layers L/N, ubatches S/T, density D" with L, S > 0 and D < 1 (sparse
segments ran), and no "decode compression off" message; parallel: tokens reused from the slots'
caches or reuses cut at the first evicted position (the slots compress, so a shared prefix is
reused only up to it), and "compressions C of N sequences" with N > 1 (several slots
compressed); queued:
"compressions C" with C > 0 and "entropyinfer evicted position" reuse lines. A summary line per phase (requests, prompt tokens,
generated tokens, wall time); exit status 1 when a check failed. Server logs: OUT_DIR/<phase>.err.
"""
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

N_PREDICT = 24
# With several slots a probe amid the load shares batches with other slots: llama.cpp cuts its prompt
# into other ubatches, so it is only required to complete there (see the header)
PARALLEL_ONLY_COMPLETES = True
THREADS = os.environ.get("SOAK_THREADS", "2")
# SOAK_BASELINE=1: the same load on a server started without --entropyinfer (llama.cpp's attention; the
# checks of entropyinfer's exit line, compressions and reuses cut at F are skipped): the throughput to
# compare with
BASELINE = os.environ.get("SOAK_BASELINE", "0") == "1"
EI_OPTS = ("threshold_len=512,segment_size=256,base_budget=128,"
           "decode_budget=256,decode_budget_min=64,recompress_every=16")
PHASES = [
    # name, server arguments, client threads, requests per thread
    ("parallel", ["-np", "4", "--no-kv-unified", "-c", "8192"], 4, 3),
    ("unified", ["-np", "4", "-c", "8192"], 4, 3),
    ("queued", ["-np", "1", "-c", "4096"], 2, 2),
]
# the client load runs ROUNDS times per phase; the server's RAM prompt cache is bounded (--cache-ram), so
# its resident memory after the last round must stay within that bound plus MEM_GROWTH of the memory
# after the first round (the cache fills over the rounds: 289, 295, 316 MiB with one slot)
ROUNDS = 3
CACHE_RAM_MIB = 64
MEM_GROWTH = 0.10
# requests a server must refuse with a 4xx, sent amid the load (body bytes, what is wrong)
MALFORMED = [
    (b'{"prompt": "hi", ', "not JSON"),
    (b'[1, 2]', "a JSON array"),
    (b'{"n_predict": 4}', "no prompt"),
    (b'{"prompt": "hi", "n_predict": "abc"}', "n_predict a string"),
    (b'{"prompt": "hi", "n_predict": 4, "temperature": "hot"}', "temperature a string"),
    (b'{"prompt": "hi", "n_predict": 4, "entropyinfer": 3}', "entropyinfer not a boolean"),
]
# streamed requests the client drops after CANCEL_AFTER chunks (the server must stop them and free the slot)
CANCEL_AFTER = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def completion_request(port, data):
    """A POST of data (bytes, or a dict sent as JSON) to the server's /completion."""
    if isinstance(data, dict):
        data = json.dumps(data).encode()
    return urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=data,
                                  headers={"Content-Type": "application/json"})


def post(port, body, timeout=600):
    """One /completion request; streamed requests are read to their final chunk.
    Returns (HTTP status, the final JSON object or the error text, number of streamed chunks)."""
    try:
        with urllib.request.urlopen(completion_request(port, body), timeout=timeout) as r:
            if not body.get("stream"):
                return r.status, json.loads(r.read()), 0
            # server-sent events: "data: {...}" lines; the last one has "stop": true and the timings
            content, chunks, last = [], 0, None
            for raw in r:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data: "):
                    continue
                obj = json.loads(line[6:])
                chunks += 1
                content.append(obj.get("content", ""))
                if obj.get("stop"):
                    last = obj
                    break
            if last is None:
                return r.status, "stream ended without a final chunk", chunks
            last = dict(last)
            last["content"] = "".join(content)
            return r.status, last, chunks
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), 0
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        return -1, f"{type(e).__name__}: {e}", 0


def post_raw(port, data, timeout=120):
    """A /completion request with a raw body: (HTTP status, body text)."""
    try:
        with urllib.request.urlopen(completion_request(port, data), timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        return -1, f"{type(e).__name__}: {e}"


def cancel_stream(port, prompt, n_chunks):
    """A streamed request of 200 tokens dropped after n_chunks chunks: the number of chunks read
    (-1: no HTTP 200)."""
    body = {"prompt": prompt, "n_predict": 200, "ignore_eos": True, "stream": True, "cache_prompt": False}
    try:
        r = urllib.request.urlopen(completion_request(port, body), timeout=600)
    except (urllib.error.URLError, ConnectionError, OSError):
        return -1
    got = 0
    try:
        for raw in r:
            if raw.startswith(b"data: "):
                got += 1
                if got >= n_chunks:
                    break
    finally:
        r.close()  # the connection goes: the server sees the client gone
    return got


def rss_mib(pid):
    """Resident memory of a process (VmRSS), MiB; 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def wait_ready(port, proc, seconds=120):
    t_end = time.time() + seconds
    while time.time() < t_end:
        if proc.poll() is not None:
            return False
        if health(port):
            return True
        time.sleep(0.5)
    return False


def health(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def make_requests(text, rng, n_threads, n_per_thread):
    """The requests of each client thread: prompts cut from text at seeded offsets.
    Licence text is about 4.6 characters per SmolLM2 token: 2800-5500 characters is 600-1200 tokens;
    the second request of every thread, and the third of every other thread, is a shared prefix of
    about 800 tokens and a tail of its own: a thread's third request finds the prefix in the slot of
    its second (the server picks the idle slot with the longest common prefix)."""
    shared = text[1000:1000 + 3500]  # the common prefix (about 800 tokens)
    plans = []
    k = 0
    for t in range(n_threads):
        mine = []
        for i in range(n_per_thread):
            if i >= 1 and (t % 2 == 0 or i == 1):
                off = rng.randrange(len(shared), len(text) - 3000)
                prompt = shared + text[off:off + rng.randrange(400, 2000)]
            else:
                n = rng.randrange(2800, 5500)
                off = rng.randrange(0, len(text) - n)
                prompt = text[off:off + n]
            body = {"prompt": prompt, "n_predict": N_PREDICT, "ignore_eos": True, "cache_prompt": True,
                    "temperature": 0 if k % 2 == 0 else 0.8, "seed": 1000 + k}
            if k % 4 == 3:
                body["entropyinfer"] = False
            if k % 3 == 2:
                body["stream"] = True
            mine.append(body)
            k += 1
        plans.append(mine)
    return plans


def run_phase(name, server_args, n_threads, n_per_thread, server, model, text, out_dir, check):
    log_path = f"{out_dir}/{name}.err"
    port = free_port()
    rng = random.Random(34)
    plans = make_requests(text, rng, n_threads, n_per_thread)
    # the determinism probes: greedy, the prompt processed from position 0 each time; one with
    # entropyinfer, one with "entropyinfer": false (llama.cpp's attention)
    probe_text = text[20000:20000 + 4300]
    probes = {"ei": {"prompt": probe_text, "n_predict": N_PREDICT, "ignore_eos": True, "cache_prompt": False,
                     "temperature": 0},
              "dense": {"prompt": probe_text, "n_predict": N_PREDICT, "ignore_eos": True, "cache_prompt": False,
                        "temperature": 0, "entropyinfer": False}}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([server, "-m", model, "-fa", "on", "-t", THREADS, "--host", "127.0.0.1", "--port", str(port),
                                 "--cache-ram", str(CACHE_RAM_MIB),
                                 ] + ([] if BASELINE else ["--entropyinfer", "--entropyinfer-opt", EI_OPTS]) + server_args,
                                stdout=log, stderr=subprocess.STDOUT)
    t0 = time.time()
    results = []  # (thread, index, body, status, response, chunks, seconds)
    lock = threading.Lock()
    try:
        if not wait_ready(port, proc):
            check(False, name, "start", f"llama-server did not start (log {log_path})")
            return None
        first = {}
        for key, probe in probes.items():
            st, first[key], _ = post(port, probe)
            if st != 200:
                check(False, name, "probe", f"{key}: HTTP {st}: {str(first[key])[:200]}")
                return None

        def client(t, rnd):
            for i, body in enumerate(plans[t]):
                ts = time.time()
                st, r, chunks = post(port, body)
                with lock:
                    results.append((t, i, body, st, r, chunks, time.time() - ts))
                key = ["ei", "dense"][t] if t < 2 else None
                if key and rnd == 0 and i == len(plans[t]) // 2:  # a probe again, amid the other clients' requests
                    st2, r2, _ = post(port, probes[key])
                    with lock:
                        results.append((t, "probe-" + key, probes[key], st2, r2, 0, 0.0))

        misuse, cancels = [], []  # (round, what, status, body), (round, chunks read)

        def misuser(rnd):
            for data, what in MALFORMED:
                st, txt = post_raw(port, data)
                with lock:
                    misuse.append((rnd, what, st, txt[:160]))
                time.sleep(0.5)

        def canceller(rnd):
            for j in range(2):
                got = cancel_stream(port, text[30000 + 5000 * j:30000 + 5000 * j + 3000], CANCEL_AFTER)
                with lock:
                    cancels.append((rnd, got))

        mem, alone = [], []  # RSS after each round; the entropyinfer probe sent alone after each round
        t_load = time.time()
        for rnd in range(ROUNDS):
            threads = [threading.Thread(target=client, args=(t, rnd)) for t in range(n_threads)]
            threads += [threading.Thread(target=misuser, args=(rnd,)), threading.Thread(target=canceller, args=(rnd,))]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            time.sleep(2)  # the dropped streams' slots stop at their next token: the probe then runs alone
            st, r, _ = post(port, probes["ei"])
            alone.append(r.get("content") if st == 200 and isinstance(r, dict) else f"HTTP {st}: {str(r)[:120]}")
            mem.append(rss_mib(proc.pid))
        wall_load = time.time() - t_load

        bad = [(t, i, st, str(r)[:200]) for t, i, body, st, r, _, _ in results
               if st != 200 or not isinstance(r, dict) or r.get("tokens_predicted") != N_PREDICT]
        n_req = len(results)
        prompt_tok = sum(r["timings"]["prompt_n"] + r["timings"].get("cache_n", 0)
                         for *_, st, r, _, _ in results if st == 200 and isinstance(r, dict))
        cached_tok = sum(r["timings"].get("cache_n", 0) for *_, st, r, _, _ in results if st == 200 and isinstance(r, dict))
        gen_tok = sum(r.get("tokens_predicted", 0) for *_, st, r, _, _ in results if st == 200 and isinstance(r, dict))
        n_stream = sum(1 for _, _, body, *_ in results if body.get("stream"))
        n_off = sum(1 for _, _, body, *_ in results if body.get("entropyinfer") is False)
        check(not bad, name, "requests",
              f"{n_req - len(bad)}/{n_req} HTTP 200 with {N_PREDICT} tokens ({n_stream} streamed, "
              f"{n_off} with \"entropyinfer\": false)" + (f"; failed: {bad[:3]}" if bad else ""))
        streamed_ok = all(chunks >= N_PREDICT for _, _, body, st, r, chunks, _ in results if body.get("stream") and st == 200)
        check(streamed_ok, name, "stream", f"{n_stream} streamed requests, each {N_PREDICT}+ chunks and a final one")
        for key in probes:
            again = [r for t, i, _, st, r, _, _ in results if i == "probe-" + key]
            r2 = again[0] if len(again) == 1 and isinstance(again[0], dict) else None
            same = r2 is not None and r2.get("content") == first[key]["content"]
            detail = f"greedy probe ({key}) alone and amid the load: "
            if same:
                detail += "same text"
            else:
                a1 = first[key]["content"]
                a2 = r2.get("content", "") if r2 else str(again)
                n = next((j for j in range(min(len(a1), len(a2))) if a1[j] != a2[j]), min(len(a1), len(a2)))
                detail += f"differ from character {n}: {a1[n:n + 30]!r} vs {a2[n:n + 30]!r}"
            if PARALLEL_ONLY_COMPLETES and server_args[server_args.index("-np") + 1] != "1" and not same and r2 \
                    and r2.get("tokens_predicted") == N_PREDICT:
                detail += " (not required with several slots: completed; see the header)"
                same = True
            check(same, name, "determinism", detail)
        bad4 = [(w, st, txt) for _, w, st, txt in misuse if not 400 <= st < 500]
        check(not bad4, name, "malformed",
              f"{len(misuse) - len(bad4)}/{len(misuse)} malformed requests refused with a 4xx ("
              + ", ".join(sorted({f"{w}: {st}" for _, w, st, _ in misuse})) + ")" + (f"; not 4xx: {bad4[:2]}" if bad4 else ""))
        check(len(cancels) == 2 * ROUNDS and all(g >= 1 for _, g in cancels), name, "cancel",
              f"{len(cancels)} streamed requests of 200 tokens dropped after {CANCEL_AFTER} chunks "
              f"(chunks read: {[g for _, g in cancels]}); the requests after them answered")
        same_alone = all(a == first["ei"]["content"] for a in alone)
        check(same_alone, name, "rounds",
              f"greedy probe (ei) alone before the load and after each of {ROUNDS} rounds: "
              + ("same text" if same_alone else f"differs: {[a[:40] for a in alone]!r} vs {first['ei']['content'][:40]!r}"))
        limit = mem[0] * (1 + MEM_GROWTH) + CACHE_RAM_MIB if mem and mem[0] > 0 else 0.0
        check(bool(mem) and mem[0] > 0 and mem[-1] <= limit, name, "memory",
              f"server resident memory after each round: {', '.join(f'{m:.0f}' for m in mem)} MiB "
              f"(at most {limit:.0f}: the first round's + {100 * MEM_GROWTH:.0f}% + the prompt cache's bound, "
              f"--cache-ram {CACHE_RAM_MIB})")
        alive = proc.poll() is None and health(port)
        check(alive, name, "alive", "server running and /health 200 after the load")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 60 s"
    check(rc == 0, name, "exit", f"exit status {rc} on SIGTERM")
    wall = time.time() - t0
    log_text = open(log_path, encoding="utf-8", errors="replace").read()
    m = re.search(r"entropyinfer: mode \S+, layers (\d+)/(\d+), ubatches (\d+)/(\d+)(?: of \d+ sequences)?, density ([0-9.]+)[^\n]*",
                  log_text)
    served = m is not None and int(m.group(1)) > 0 and int(m.group(3)) > 0 and float(m.group(5)) < 1.0
    if BASELINE:  # entropyinfer off: none of its lines may appear
        check(m is None, name, "baseline", "no \"entropyinfer: mode ...\" line: the server ran llama.cpp's attention")
        check = lambda ok, phase, what, detail: None  # noqa: E731 (the entropyinfer checks below do not apply)
    check(served, name, "served", m.group(0) if m else "no \"entropyinfer: mode ...\" line at exit")
    comp = re.search(r"compressions (\d+) of (\d+) sequence", m.group(0)) if m else None
    n_comp = int(comp.group(1)) if comp else 0
    n_comp_seqs = int(comp.group(2)) if comp else 0
    reuse = len(re.findall(r"entropyinfer evicted position \d+ of the cache: reusing at most \d+ tokens", log_text))
    refused = re.search(r"entropyinfer: [^\n]*decode compression off[^\n]*", log_text)
    if name == "unified":
        # one KV stream for the 4 slots: ubatches that mix slots, or start past cell 0, are served per sequence
        sv = re.search(r"ubatches \d+/\d+ of (\d+) sequences", m.group(0)) if m else None
        check(sv is not None and int(sv.group(1)) > 1, name, "several",
              f"served ubatches of {sv.group(1) if sv else 'one'} sequences in the unified cache")
    if name in ("parallel", "unified"):
        # the slots compress too, so a shared prefix is reused only up to the first evicted position F
        check(cached_tok > 0 or reuse > 0, name, "reuse",
              f"{cached_tok} prompt tokens taken from the slots' caches, {reuse} reuses cut at the first evicted position")
    if name == "queued":
        check(n_comp > 0 and reuse > 0, name, "compress",
              f"{n_comp} decode compressions, {reuse} reuses cut at the first evicted position")
    else:
        # several sequences: each slot compressed with its own keep set
        check(n_comp > 0 and n_comp_seqs > 1, name, "compress",
              f"{n_comp} decode compressions of {n_comp_seqs} sequences (slots)")
    check(refused is None, name, "no-refusal",
          "no \"decode compression off\" message" if refused is None else refused.group(0))
    print(f"summary  {name:8} {'entropyinfer off: ' if BASELINE else ''}{n_req} requests from {n_threads} threads, "
          f"{prompt_tok} prompt tokens ({cached_tok} from the prompt cache), {gen_tok} generated, {n_comp} compressions "
          f"of {n_comp_seqs} sequences; load {wall_load:.1f} s ({n_req / wall_load:.3f} requests/s, "
          f"{(prompt_tok - cached_tok + gen_tok) / wall_load:.1f} tokens/s processed), phase {wall:.1f} s", flush=True)
    return wall


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: soak_server.py SERVER_BINARY MODEL TEXT OUT_DIR")
    server, model, text_path, out_dir = sys.argv[1:]
    text = open(text_path, encoding="utf-8", errors="replace").read()
    if len(text) < 40000:
        sys.exit(f"{text_path}: {len(text)} characters, at least 40000 needed")
    failed = 0

    def check(ok, phase, what, detail):
        nonlocal failed
        failed += 0 if ok else 1
        print(f"{'ok' if ok else 'FAIL':4} {phase:8} {what:11} {detail}", flush=True)

    t0 = time.time()
    for name, args, n_threads, n_per_thread in PHASES:
        if run_phase(name, args, n_threads, n_per_thread, server, model, text, out_dir, check) is None:
            failed += 1
    print(f"total    {time.time() - t0:.1f} s, {failed} failed checks", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
