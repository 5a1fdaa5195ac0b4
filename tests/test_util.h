/* Minimal test harness shared by tests/test_*.c.
 * CHECK records a failure with file:line and continues; tests end with TEST_DONE(),
 * which returns non-zero if anything failed, so ctest reports it.
 *
 * Skipping. A part that cannot run here (no CUDA device, a data set not installed)
 * calls TEST_SKIP("reason") and returns; the other parts still run. TEST_DONE()'s
 * exit status follows one rule, the same in tests/cli_*.sh:
 *   1  if any check failed (whether or not something was skipped);
 *   77 if nothing failed but at least one part was skipped: ctest's SKIP_RETURN_CODE
 *      (set for every test in CMakeLists.txt), so ctest reports "Skipped", never
 *      "Passed", for a test that did not do all it claims; the reasons are printed;
 *   0  if nothing failed and nothing was skipped.
 * A failure is never hidden behind a skip, and a skip never reads as a pass.
 *
 * EXPECT_CHECK_FAILS(stmt) proves that a check can fail: stmt must record at least
 * one failure, which is then taken back (a harness self-test, see test_golden.c). */
#ifndef FATHOM_TEST_UTIL_H
#define FATHOM_TEST_UTIL_H
#include <math.h>
#include <stdio.h>
#include <string.h>

static int t_failures = 0, t_checks = 0;
static int t_skips __attribute__((unused)) = 0; /* unused in the tests/ops groups */

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
#define TEST_SKIP(...) do { t_skips++; fprintf(stderr, "SKIP: "); fprintf(stderr, __VA_ARGS__); \
    fputc('\n', stderr); } while (0)
#define EXPECT_CHECK_FAILS(stmt) do { int _before = t_failures; \
    fprintf(stderr, "%s:%d: expecting a failure (not counted) from: %s\n", __FILE__, __LINE__, #stmt); stmt; \
    int _got = t_failures - _before; t_failures = _before; t_checks++; \
    if (_got <= 0) { t_failures++; \
    fprintf(stderr, "%s:%d: expected %s to fail a check; it passed\n", __FILE__, __LINE__, #stmt); } } while (0)
#define TEST_SKIP_CODE 77
#define TEST_DONE() do { fprintf(stderr, "%s: %d checks, %d failures, %d parts skipped\n", __FILE__, \
    t_checks, t_failures, t_skips); \
    return t_failures ? 1 : t_skips ? TEST_SKIP_CODE : 0; } while (0)
#endif
