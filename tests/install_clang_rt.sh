#!/usr/bin/env bash
# Installs what the hardening targets of tests/hardening.mk need, when it is
# missing: clang, clang's runtime libraries (libFuzzer, sanitizers:
# libclang-rt-<major>-dev on Debian/Ubuntu) and valgrind. Safe to run twice;
# does nothing when everything is already there. Used by .ci/run.
#   tests/install_clang_rt.sh            clang + runtime (make fuzz, test-asan, test-tsan)
#   tests/install_clang_rt.sh --valgrind  also valgrind (make test-valgrind)
set -euo pipefail
want_valgrind=0
[ "${1:-}" = "--valgrind" ] && want_valgrind=1
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi
apt_install() {
  if ! command -v apt-get >/dev/null; then
    echo "install_clang_rt: no apt-get; install $* with your package manager" >&2
    return 1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"
}
command -v clang >/dev/null || apt_install clang
# Does clang link a libFuzzer target with ASan/UBSan, and a TSan program?
probe() {
  local dir; dir=$(mktemp -d)
  printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$dir/f.c"
  printf 'int main(void) { return 0; }\n' > "$dir/t.c"
  local ok=0
  clang -fsanitize=fuzzer,address,undefined "$dir/f.c" -o "$dir/f" 2>/dev/null &&
    clang -fsanitize=thread "$dir/t.c" -o "$dir/t" 2>/dev/null && ok=1
  rm -rf "$dir"
  [ $ok = 1 ]
}
if probe; then
  echo "install_clang_rt: clang $(clang -dumpversion) links libFuzzer, ASan, UBSan and TSan"
else
  major=$(clang -dumpversion | cut -d. -f1)
  echo "install_clang_rt: clang $major lacks its runtime; installing libclang-rt-$major-dev"
  apt_install "libclang-rt-$major-dev" || apt_install "libclang-common-$major-dev"
  probe || { echo "install_clang_rt: clang still cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi
if [ $want_valgrind = 1 ] && ! command -v valgrind >/dev/null; then
  apt_install valgrind
fi
