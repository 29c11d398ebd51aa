#!/usr/bin/env python3
"""examples/llama.cpp/bookkeeping_server.py - llama-server's prompt-cache reuse after decode
compression (issue 34; run by bookkeeping.sh, `make llama-cpp-bookkeeping`).

    bookkeeping_server.py SERVER_BINARY MODEL TEXT LOG

Starts llama-server with --entropyinfer (decode_budget 512, one slot) on a free local port, then:
  compress  a prompt of the first 6000 bytes of TEXT, 40 greedy tokens: the slot's cache compressed
  reuse     the same prompt plus that answer: the server logs the first missing position F and reuses
            exactly F cached tokens (timings.cache_n), processing the rest again
  field     "entropyinfer": "no" is refused with HTTP 400 naming the field; "entropyinfer": false
            is accepted
One line per check; exit status 1 when one failed. The server's log goes to LOG.
"""
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_ready(port, proc, seconds=120):
    t_end = time.time() + seconds
    while time.time() < t_end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    return False


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: bookkeeping_server.py SERVER_BINARY MODEL TEXT LOG")
    server, model, text, log_path = sys.argv[1:]
    prompt = open(text, encoding="utf-8", errors="replace").read()[:6000]
    port = free_port()
    failed = 0

    def check(ok, name, detail):
        nonlocal failed
        failed += 0 if ok else 1
        print(f"{'ok' if ok else 'FAIL':4} {name:10} {detail}", flush=True)

    with open(log_path, "w") as log:
        proc = subprocess.Popen([server, "-m", model, "-c", "4096", "-np", "1", "-fa", "on", "-t", "2", "--host", "127.0.0.1",
                                 "--port", str(port), "--entropyinfer", "--entropyinfer-opt", "decode_budget=512"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        if not wait_ready(port, proc):
            sys.exit(f"llama-server did not start (log {log_path})")
        s1, r1 = post(port, {"prompt": prompt, "n_predict": 40, "temperature": 0, "cache_prompt": True})
        check(s1 == 200, "compress", f"HTTP {s1}, {r1['timings']['prompt_n'] if s1 == 200 else r1} prompt tokens, 40 generated")
        if s1 != 200:
            return 1
        s2, r2 = post(port, {"prompt": prompt + r1["content"], "n_predict": 8, "temperature": 0, "cache_prompt": True})
        log_text = open(log_path, encoding="utf-8", errors="replace").read()
        m = re.search(r"entropyinfer evicted position (\d+) of the cache: reusing at most (\d+) tokens", log_text)
        cache_n = r2["timings"].get("cache_n") if s2 == 200 else None
        first = int(m.group(1)) if m else None
        check(s2 == 200 and m is not None and cache_n == first and first < r1["timings"]["prompt_n"], "reuse",
              f"HTTP {s2}; first missing position F = {first} (server log); cached tokens reused {cache_n}, "
              f"processed {r2['timings']['prompt_n'] if s2 == 200 else '-'}")
        s3, r3 = post(port, {"prompt": prompt[:200], "n_predict": 4, "entropyinfer": "no"})
        s4, _ = post(port, {"prompt": prompt[:200], "n_predict": 4, "entropyinfer": False})
        check(s3 == 400 and "entropyinfer" in str(r3) and s4 == 200, "field",
              f"\"entropyinfer\": \"no\" -> HTTP {s3} ({str(r3)[:120]}); false -> HTTP {s4}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
