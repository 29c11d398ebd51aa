/* check.h - the assertion and guard-byte helpers shared by the tests.
   Define before including, when needed:
     CHECK_LOCK() / CHECK_UNLOCK()   serialise reports (threaded tests)
     CHECK_ERR_REACHED(code)         called when an error code and a message
                                     naming it were both seen */
#ifndef EI_TEST_CHECK_H
#define EI_TEST_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CHECK_LOCK
#define CHECK_LOCK() ((void)0)
#define CHECK_UNLOCK() ((void)0)
#endif
#ifndef CHECK_ERR_REACHED
#define CHECK_ERR_REACHED(code) ((void)0)
#endif

static int failures = 0, checks = 0;
#define CHECK(cond, ...)                                                           \
    do {                                                                           \
        CHECK_LOCK();                                                              \
        checks++;                                                                  \
        if (!(cond)) {                                                             \
            failures++;                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                            \
            printf(__VA_ARGS__);                                                   \
            printf("\n");                                                          \
        }                                                                          \
        CHECK_UNLOCK();                                                            \
    } while (0)
/* An expected result code, and (for errors) a message that names it. */
#define CHECK_ERR(expr, code)                                                      \
    do {                                                                           \
        ei_result r_ = (expr);                                                     \
        CHECK(r_ == (code), "%s returned %s, expected %s (%s)", #expr, ei_result_name(r_), #code, ei_last_error()); \
        if (r_ == (code) && r_ != EI_OK) {                                         \
            CHECK(strstr(ei_last_error(), #code) != NULL, "message '%s' lacks %s", ei_last_error(), #code); \
            if (strstr(ei_last_error(), #code)) CHECK_ERR_REACHED(r_);             \
        }                                                                          \
        if (r_ == EI_OK && (code) == EI_OK) CHECK_ERR_REACHED(EI_OK);              \
    } while (0)

/* Buffers with 64 canary bytes on each side; the inside starts as garbage
   (0xFF) so that reading what the library did not write shows up. */
#define GUARD 64
static void *guarded_alloc(size_t n) {
    unsigned char *p = (unsigned char *)malloc(n + 2 * GUARD);
    if (!p) { printf("out of memory\n"); exit(2); }
    memset(p, 0xA5, GUARD);
    memset(p + GUARD, 0xFF, n);
    memset(p + GUARD + n, 0xA5, GUARD);
    return p + GUARD;
}
static int guard_intact(void *mem, size_t n) {
    unsigned char *p = (unsigned char *)mem - GUARD;
    size_t i;
    for (i = 0; i < GUARD; ++i)
        if (p[i] != 0xA5 || p[GUARD + n + i] != 0xA5) return 0;
    return 1;
}
static void guarded_free(void *mem) { if (mem) free((unsigned char *)mem - GUARD); }
#endif
