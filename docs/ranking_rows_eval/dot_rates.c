/* Instruction throughput of vfmadd231ps, vdpbf16ps and vpdpbusd (zmm), 16 independent chains. */
#include <stdint.h>
#include <stdio.h>
static uint64_t tsc(void) { uint32_t lo, hi; __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi)); return ((uint64_t)hi << 32) | lo; }
#define C16(op) op " %%zmm17, %%zmm16, %%zmm0\n\t" op " %%zmm17, %%zmm16, %%zmm1\n\t" op " %%zmm17, %%zmm16, %%zmm2\n\t" op " %%zmm17, %%zmm16, %%zmm3\n\t" \
  op " %%zmm17, %%zmm16, %%zmm4\n\t" op " %%zmm17, %%zmm16, %%zmm5\n\t" op " %%zmm17, %%zmm16, %%zmm6\n\t" op " %%zmm17, %%zmm16, %%zmm7\n\t" \
  op " %%zmm17, %%zmm16, %%zmm8\n\t" op " %%zmm17, %%zmm16, %%zmm9\n\t" op " %%zmm17, %%zmm16, %%zmm10\n\t" op " %%zmm17, %%zmm16, %%zmm11\n\t" \
  op " %%zmm17, %%zmm16, %%zmm12\n\t" op " %%zmm17, %%zmm16, %%zmm13\n\t" op " %%zmm17, %%zmm16, %%zmm14\n\t" op " %%zmm17, %%zmm16, %%zmm15\n\t"
#define LOOP(op, n) __asm__ volatile("vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm17, %%zmm17, %%zmm17\n\t1:\n\t" C16(op) "dec %0\n\tjnz 1b" : "+r"(n) :: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm16","xmm17","cc")
__attribute__((target("avx512f"))) static uint64_t f32fma(void) { uint64_t n = 4096, t = tsc(); LOOP("vfmadd231ps", n); return tsc() - t; }
__attribute__((target("avx512f,avx512bf16"))) static uint64_t dp(void) { uint64_t n = 4096, t = tsc(); LOOP("vdpbf16ps", n); return tsc() - t; }
__attribute__((target("avx512f,avx512vnni"))) static uint64_t vnni(void) { uint64_t n = 4096, t = tsc(); LOOP("vpdpbusd", n); return tsc() - t; }
int main(void) {
    uint64_t bf = -1, bd = -1, bv = -1, t; int r;
    for (r = 0; r < 8; ++r) { f32fma(); dp(); vnni(); }
    for (r = 0; r < 15; ++r) { if ((t = f32fma()) < bf) bf = t; if ((t = dp()) < bd) bd = t; if ((t = vnni()) < bv) bv = t; }
    printf("ticks per 65536 instructions: vfmadd231ps %llu, vdpbf16ps %llu, vpdpbusd %llu\n", (unsigned long long)bf, (unsigned long long)bd, (unsigned long long)bv);
    printf("products per tick (relative to f32 FMA): vdpbf16ps %.2f, vpdpbusd %.2f\n", 2.0 * bf / bd, 4.0 * bf / bv);
    return 0;
}
