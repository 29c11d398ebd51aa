#!/usr/bin/env python3
"""check_make_vars.py - part of `make test-harness-selftest` (tests/tests.mk).

The make fragments share one namespace (the top-level Makefile includes them
all), so a variable two fragments set silently takes one value: cuda.mk's
`FUZZ_SECONDS ?= 0`, included first, once turned `make fuzz` (documented as
60 s) into a run without end. This check fails when
  - a fragment sets a variable that does not carry its prefix (table below);
  - two files (the Makefile and the fragments) set the same variable;
  - a documented default is not what `make -n TARGET` runs with no arguments.
Prints one line per failure and exits 1, or one summary line."""
import re
import subprocess
import sys

# fragment -> the prefix of every variable it sets (case-insensitive: t_ for
# functions); the Makefile holds the shared, unprefixed ones.
FRAGMENTS = {
    "tests/tests.mk": "T_",
    "tests/hardening.mk": "H_",
    "cuda.mk": "CUDA_",
    "examples/gemma/gemma.mk": "GEMMA_",
    "examples/llama.cpp/llama-cpp.mk": "LLAMA_CPP_",
    "bench/attention.mk": "ATTN_",
    "bench/tp.mk": "TP_",
    "install/install.mk": "INSTALL_",
}
# GNU's own names for an install's destination keep their names.
CONVENTIONS = {"install/install.mk": {"PREFIX", "DESTDIR"}}
# target -> what its recipe must contain when called with no arguments.
DEFAULTS = {
    "fuzz": "-max_total_time=60 ",
    "test-gpu-fuzz": "--iters 300 --seconds 0",
}

ASSIGN = re.compile(r"^\s*(?:override\s+|export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*(?::{1,3}=|\?=|\+=|!=|=)")
TARGET_ASSIGN = re.compile(r"^[^\t#=][^=]*?[^:=]:\s*(?:override\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*(?::=|\?=|\+=|=)")
EVAL_ASSIGN = re.compile(r"\$\(eval\s+([A-Za-z_][A-Za-z0-9_]*)")
DEFINE = re.compile(r"^\s*define\s+([A-Za-z_][A-Za-z0-9_]*)")


def variables_set(path):
    names, in_define = set(), False
    with open(path) as f:
        text = re.sub(r"\\\n", " ", f.read())  # a continued line is one line
        for line in text.splitlines(True):
            if in_define:
                in_define = not line.strip().startswith("endef")
                continue
            if line.startswith("\t") or line.lstrip().startswith("#"):
                continue
            m = DEFINE.match(line)
            if m:
                names.add(m.group(1))
                in_define = True
                continue
            m = ASSIGN.match(line) or TARGET_ASSIGN.match(line)
            if m:
                names.add(m.group(1))
            names.update(EVAL_ASSIGN.findall(line))
    return names


def main():
    fail = []
    owner = {}
    for path in ["Makefile"] + list(FRAGMENTS):
        for name in sorted(variables_set(path)):
            prefix = FRAGMENTS.get(path)
            if prefix and not name.upper().startswith(prefix) and name not in CONVENTIONS.get(path, set()):
                fail.append(f"{path} sets {name}, which lacks the fragment's prefix {prefix}")
            if name in owner:
                fail.append(f"{name} is set by both {owner[name]} and {path}")
            owner.setdefault(name, path)
    for target, expect in DEFAULTS.items():
        out = subprocess.run(["make", "-n", "--no-print-directory", target], capture_output=True, text=True).stdout
        if expect not in out:
            fail.append(f"`make {target}` with no arguments does not run with '{expect.strip()}'")
    for line in fail:
        print("FAIL:", line)
    if fail:
        return 1
    print(f"make variables: {len(owner)} set in {1 + len(FRAGMENTS)} files, each fragment's prefixed, none set twice; "
          f"{len(DEFAULTS)} documented defaults hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
