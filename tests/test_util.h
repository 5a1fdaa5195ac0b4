/* Minimal test harness shared by tests/test_*.c.
 * CHECK records a failure with file:line and continues; tests end with TEST_DONE(),
 * which returns non-zero if anything failed, so ctest reports it. */
#ifndef FATHOM_TEST_UTIL_H
#define FATHOM_TEST_UTIL_H
#include <math.h>
#include <stdio.h>
#include <string.h>

static int t_failures = 0, t_checks = 0;

#define CHECK(cond) do { t_checks++; if (!(cond)) { t_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { t_checks++; if (!(cond)) { t_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_NEAR(a, b, tol) do { double _a = (double)(a), _b = (double)(b); t_checks++; \
    if (!(fabs(_a - _b) <= (tol) * (1.0 + fabs(_b))) || _a != _a) { t_failures++; \
    fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s=%.9g vs %s=%.9g (tol %g)\n", \
            __FILE__, __LINE__, #a, _a, #b, _b, (double)(tol)); } } while (0)
/* An error path: the call must fail and leave a message mentioning `needle`. */
#define CHECK_ERR_CONTAINS(needle) do { t_checks++; const char *_m = fm_last_error(); \
    if (!_m || !strstr(_m, needle)) { t_failures++; \
    fprintf(stderr, "%s:%d: expected error containing \"%s\", got \"%s\"\n", \
            __FILE__, __LINE__, needle, _m ? _m : "(null)"); } } while (0)
#define TEST_DONE() do { fprintf(stderr, "%s: %d checks, %d failures\n", __FILE__, t_checks, t_failures); \
    return t_failures ? 1 : 0; } while (0)
#endif
