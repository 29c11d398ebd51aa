/* tests/test_ops.c - the differential test of every operation, in the
   manner of ggml's test-backend-ops: each case of tests/ops_cases.h's table
   (operation, shapes, dtypes, layout, protocol, configuration) runs on the
   scalar path (the reference, itself checked against check.h's
   double-precision references where there is one), on every other SIMD path
   this CPU and build have, and on the CUDA backend when the plugin loads and
   finds a GPU; every run is compared with the reference's within the
   operation's tolerance of check.h's table (test_tols).

     test_ops                 every case, every path; CUDA when present ("CUDA: skipped" otherwise)
     test_ops --require-gpu   a missing GPU is a failure (make test-cuda)
     test_ops --quick         every case at most 256 tokens (sanitizers, memcheck)
     test_ops --perf          also each case's time per path (best of 3 runs), in ms
     test_ops --scale F       every case at F times its tokens (with --perf: timings at larger sizes)
     test_ops --case I        case I of the table only (--list: the table)

   EI_TEST_SIMD=<path> limits the paths compared (the scalar reference always
   runs). The last lines: checks by operation, runs by path, near-ties, then
   check_summary.

   Every case also runs its other ways (the table's `ways`: the whole call
   on one thread, on nth threads, nth parts with one shared workspace, in
   order or reversed) on each of these, and compares each with the case's
   first way on the same path: bit for bit where the library promises it
   (ops_ways_exact), else within the operation's tolerance.

   A new case is a row of ops_cases[] (tests/ops_cases.h); a new operation an
   OP_* with its run (ops_run_*), what ops_compare compares of it, and its
   tolerance in check.h's test_tols, which every comparing test reads; a new
   protocol a row of ops_protocols, a new configuration a CFG_* in ops_config.
   tests/fuzz_backends.c runs varied cases of the same table every fifth
   iteration. */
#define ENTROPYINFER_IMPLEMENTATION
#include "../entropyinfer.h"
#include "check.h"
#include "ops_cases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The case's first way on side s, reps times (the best time in *best): first. */
static void run_first(const ops_data *D, const side *s, int reps, double *best, ops_result *first) {
    int rep;
    for (rep = 0; rep < reps; ++rep) {
        if (rep) ops_result_free(first);
        ops_run(D, s, first);
        if (!rep || first->seconds < *best) *best = first->seconds;
    }
}
/* The case's other ways on side s, each against its first way's run there;
   returns the near-ties seen, counts the runs in *n_runs. */
static int run_other_ways(const ops_data *D, const side *s, const char *who, ei_simd path, const ops_result *first,
                          int *n_runs) {
    const char *w = D->cs->ways;
    char wf = ops_first_way(D->cs), name[400];
    int i, knife = 0;
    for (i = 1; w && w[0] != '-' && w[i]; ++i) {
        ops_result got;
        snprintf(name, sizeof name, "%s, way '%c' against '%c'", who, w[i], wf);
        ops_run_way(D, s, w[i], &got);
        knife += ops_compare_ways(name, D, first, &got, s->gpu, path, wf, w[i]);
        ops_result_free(&got);
        (*n_runs)++;
    }
    return knife;
}

int main(int argc, char **argv) {
    int quick = 0, perf = 0, require_gpu = 0, only = -1, have_gpu, i, p, ci, runs[TEST_SIMD_END + 1], knife = 0;
    int gpu_runs = 0, gpu_refused = 0, cases_run = 0, op_checks[OP_COUNT], op_cases[OP_COUNT], way_runs = 0;
    double scale = 1.0;
    double t_start = ops_now();
    ei_config probe_cfg = ei_config_default();
    ei_context *probe = NULL;
    memset(runs, 0, sizeof runs);
    memset(op_checks, 0, sizeof op_checks);
    memset(op_cases, 0, sizeof op_cases);
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--perf")) perf = 1;
        else if (!strcmp(argv[i], "--require-gpu")) require_gpu = 1;
        else if (!strcmp(argv[i], "--case") && i + 1 < argc) only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--scale") && i + 1 < argc) scale = atof(argv[++i]);
        else if (!strcmp(argv[i], "--list")) {
            char name[256];
            for (ci = 0; ci < OPS_CASES; ++ci) {
                ops_case_name(&ops_cases[ci], name, sizeof name);
                printf("%3d %s\n", ci, name);
            }
            return 0;
        } else {
            printf("usage: %s [--quick] [--perf] [--scale F] [--require-gpu] [--case I] [--list]\n", argv[0]);
            return 2;
        }
    }
    probe_cfg.backend = EI_BACKEND_CUDA;
    have_gpu = ei_context_create(&probe_cfg, &probe) == EI_OK;
    printf("test_ops: %d cases; paths: scalar (reference)", OPS_CASES);
    for (p = EI_SIMD_SCALAR + 1; p < TEST_SIMD_END; ++p)
        if (test_simd_selected((ei_simd)p)) printf(" %s", ei_simd_name((ei_simd)p));
    if (have_gpu) {
        printf(", CUDA (%s)\n", probe->cuda->api->build_info());
        ei_context_destroy(probe);
    } else {
        printf("\nCUDA: skipped (%s)\n", ei_last_error());
        CHECK(!require_gpu, "--require-gpu: no CUDA backend");
    }
    if (perf) printf("%-70s %10s %10s %10s\n", "case (times in ms, best of 3)", "scalar", "simd", "cuda");
    for (ci = 0; ci < OPS_CASES; ++ci) {
        ops_case cs = ops_cases[ci];
        ops_data D;
        ops_result ref;
        char name[256], who[320];
        side s;
        int f0 = failures, c0 = checks, reps = perf ? 3 : 1;
        double best[3] = {0, 0, 0};
        if (only >= 0 && ci != only) continue;
        if (scale > 0 && scale != 1.0) cs.n = (int32_t)(cs.n * scale) > 100 ? (int32_t)(cs.n * scale) : 100;
        if (quick && cs.n > 256) cs.n = 256;
        ops_case_name(&cs, name, sizeof name);
        ops_data_make(&D, &cs, 0);
        cases_run++;
        { /* the reference: the scalar path */
            ei_config c = D.c;
            c.simd = EI_SIMD_SCALAR;
            s = side_make(0, c);
            run_first(&D, &s, reps, &best[0], &ref);
            snprintf(who, sizeof who, "[%d] %s: scalar", ci, name);
            CHECK(ref.r == EI_OK, "%s: %s (%s)", who, ei_result_name(ref.r), ei_last_error());
            CHECK(ref.intact, "%s: wrote outside its output's elements", who);
            ops_check_ref(who, &D, &ref);
            knife += run_other_ways(&D, &s, who, EI_SIMD_SCALAR, &ref, &way_runs);
            side_free(&s);
            runs[EI_SIMD_SCALAR]++;
        }
        for (p = EI_SIMD_SCALAR + 1; p < TEST_SIMD_END; ++p) {
            ei_config c = D.c;
            ops_result got;
            if (!test_simd_selected((ei_simd)p)) continue;
            c.simd = (ei_simd)p;
            s = side_make(0, c);
            run_first(&D, &s, reps, &best[1], &got);
            snprintf(who, sizeof who, "[%d] %s: %s", ci, name, ei_simd_name((ei_simd)p));
            knife += ops_compare(who, &D, &ref, &got, 0, (ei_simd)p);
            knife += run_other_ways(&D, &s, who, (ei_simd)p, &got, &way_runs);
            ops_result_free(&got);
            side_free(&s);
            runs[p]++;
        }
        if (have_gpu) {
            ops_result got;
            s = side_make(1, D.c);
            run_first(&D, &s, reps, &best[2], &got);
            snprintf(who, sizeof who, "[%d] %s: cuda", ci, name);
            if (ops_gpu_runs(&cs)) {
                knife += ops_compare(who, &D, &ref, &got, 1, EI_SIMD_AUTO);
                gpu_runs++;
            } else {
                CHECK(got.r == EI_ERR_DTYPE || got.r == EI_ERR_UNSUPPORTED, "%s: a case the GPU has no kernel for: %s", who,
                      ei_result_name(got.r));
                gpu_refused++;
            }
            knife += run_other_ways(&D, &s, who, EI_SIMD_AUTO, &got, &way_runs);
            ops_result_free(&got);
            side_free(&s);
        }
        if (perf)
            printf("%-70.70s %10.3f %10.3f %10.3f\n", name, 1e3 * best[0], 1e3 * best[1], have_gpu ? 1e3 * best[2] : 0.0);
        if (failures != f0) printf("FAILED case %d: %s (replay: --case %d)\n", ci, name, ci);
        op_checks[cs.op] += checks - c0;
        op_cases[cs.op]++;
        ops_result_free(&ref);
        ops_data_free(&D);
        fflush(stdout);
    }
    printf("checks by operation:");
    for (i = 0; i < OP_COUNT; ++i)
        if (op_cases[i]) printf(" %s %d (%d cases)%s", ops_op_names[i], op_checks[i], op_cases[i], i < OP_COUNT - 1 ? "," : "");
    printf("\nruns:");
    for (p = EI_SIMD_SCALAR; p < TEST_SIMD_END; ++p)
        if (runs[p]) printf(" %s %d", ei_simd_name((ei_simd)p), runs[p]);
    if (have_gpu) printf(" cuda %d (and %d refused as documented)", gpu_runs, gpu_refused);
    printf("; other ways %d; near-ties and knife-edges %d; %.1f s\n", way_runs, knife, ops_now() - t_start);
    printf("test_ops: %d cases %s\n", cases_run, failures ? "FAILED" : "passed");
    return check_summary();
}
