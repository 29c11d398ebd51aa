/* synth_qk.h - generated post-RoPE Q/K for demos, tests and benchmarks, with
   both kinds of heads EntropyInfer distinguishes:
   - rigid kv groups: every query carries a component along an attention-sink
     direction that the first key block holds strongly, so each segment's
     block-level attention concentrates on block 0 (entropy ~ 0);
   - dynamic kv groups: that component's strength changes from segment to
     segment, so the entropy rises and falls and the budget follows it.
   Everything else is Gaussian noise. Deterministic for a given seed. */
#ifndef SYNTH_QK_H
#define SYNTH_QK_H
#include <math.h>
#include <stdint.h>

typedef struct synth_rng { uint64_t s; } synth_rng;
static inline uint32_t synth_next(synth_rng *r) {
    r->s ^= r->s << 13; r->s ^= r->s >> 7; r->s ^= r->s << 17;
    return (uint32_t)(r->s >> 32);
}
static inline float synth_uniform(synth_rng *r) { return ((float)synth_next(r) + 0.5f) * (1.0f / 4294967296.0f); }
static inline float synth_gauss(synth_rng *r) {
    float u = synth_uniform(r), v = synth_uniform(r);
    return sqrtf(-2.0f * logf(u)) * cosf(6.28318530718f * v);
}

/* kv head h is rigid when (h % rigid_every) == 0 (rigid_every <= 0: none). */
static inline int synth_is_rigid(int kv_head, int rigid_every) { return rigid_every > 0 && kv_head % rigid_every == 0; }

/* Focus of the query heads of kv head h in segment s. */
static inline float synth_focus(int kv_head, long segment, int rigid_every, uint64_t seed) {
    static const float levels[4] = {0.0f, 0.03f, 0.08f, 0.2f};
    synth_rng r;
    if (synth_is_rigid(kv_head, rigid_every)) return 1.0f;
    r.s = seed * 2654435761u + (uint64_t)kv_head * 97u + (uint64_t)segment * 7919u + 1u;
    synth_next(&r);
    return levels[synth_next(&r) & 3u];
}

/* q [n][heads][dim], k [n][kv_heads][dim], f32, contiguous. */
static inline void synth_qk(float *q, float *k, long n, int heads, int kv_heads, int dim, int segment, int rigid_every,
                     uint64_t seed) {
    synth_rng r;
    long t;
    int h, i, group = heads / kv_heads;
    r.s = seed | 1u;
    for (t = 0; t < n; ++t)
        for (h = 0; h < heads; ++h) {
            float f = synth_focus(h / group, t / segment, rigid_every, seed);
            for (i = 0; i < dim; ++i) q[((size_t)t * heads + h) * dim + i] = 0.5f * synth_gauss(&r) + (i == 0 ? f : 0.0f);
        }
    for (t = 0; t < n; ++t)
        for (h = 0; h < kv_heads; ++h)
            for (i = 0; i < dim; ++i)
                k[((size_t)t * kv_heads + h) * dim + i] = 0.5f * synth_gauss(&r) + (i == 0 && t < 8 ? 60.0f : 0.0f);
}

/* bf16 with round-to-nearest-even (finite inputs). */
static inline uint16_t synth_bf16(float f) {
    union { float f; uint32_t u; } v;
    v.f = f;
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}
#endif
