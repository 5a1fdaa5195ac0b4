/* `fathom profile TRACE`: summarize a profiler trace (written by
 * `fathom train --profile FILE` or fm_profiler_start). Thin: the analysis is
 * fm_trace_summarize in src/observe/trace_summary.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"       /* fm_cli_error */
#include "fathom/observe.h" /* fm_trace_summarize, fm_measure_peak_gflops */

static void usage(FILE *f) {
    fputs("usage: fathom profile TRACE [--json] [--top N] [--peak-gflops X]\n"
          "\n"
          "Summarize a Chrome trace-event file from `fathom train --profile TRACE`:\n"
          "an op table (calls, total and self time, FLOPs, GFLOP/s, bytes, GB/s), the split\n"
          "of step time into compute, memory-bound ops, data waiting, optimizer and framework\n"
          "overhead, MFU, and a verdict naming the bottleneck. A trace that is still being\n"
          "written (or was cut short by a crash) is summarized up to its last complete event.\n"
          "\n"
          "  --json            the same as one JSON object on stdout\n"
          "  --top N           op table rows (default 25; 0: all)\n"
          "  --peak-gflops X   the peak MFU is measured against (default: this machine's\n"
          "                    f32 GEMM rate, and its bf16 one for the ops whose products\n"
          "                    ran in bf16, measured now for about 0.3 s each)\n",
          f);
}

int fm_cmd_profile(int argc, char **argv) {
    const char *path = NULL;
    bool json = false;
    int top = 25;
    double peak = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--top") || !strcmp(a, "--peak-gflops")) {
            if (i + 1 >= argc) { fm_cli_error("%s needs a value", a); usage(stderr); return 2; }
            const char *v = argv[++i];
            if (!strcmp(a, "--top")) {
                long long n;
                if (!fm_cli_parse_int_range("profile", a, v, 0, 1000000, &n)) return 2;
                top = (int)n;
                continue;
            }
            char *end;
            errno = 0;
            peak = strtod(v, &end);
            /* 1e9 GFLOPS is an exaflop: no one device comes near */
            if (*end || end == v || errno || !(peak > 0 && peak <= 1e9)) {
                fm_cli_error("profile: --peak-gflops: bad value '%s' (a number in (0, 1e9] is needed)", v);
                return 2;
            }
            continue;
        }
        if (a[0] == '-' && a[1]) {
            static const char *const flags[] = {"--help", "--json", "--top", "--peak-gflops"};
            fm_cli_unknown_option("profile", a, flags, 4);
            usage(stderr);
            return 2;
        }
        if (path) { fm_cli_error("one trace file at a time (got '%s' and '%s')", path, a); return 2; }
        path = a;
    }
    if (!path) { fm_cli_error("no trace file given"); usage(stderr); return 2; }
    fm_trace_summary s;
    if (fm_trace_summarize(path, peak, &s) != FM_OK) {
        fm_cli_error("%s", fm_last_error());
        return 1;
    }
    /* measured here: the f32 and bf16 GEMM rates of this machine (a given peak is the whole mix's) */
    if (peak <= 0) fm_trace_summary_set_peaks(&s, fm_measure_peak_gflops(), s.has_gpu ? -1 : fm_measure_peak_gflops_bf16());
    if (json) {
        char *txt = fm_trace_summary_json(&s);
        if (!txt) { fm_trace_summary_free(&s); fm_cli_error("out of memory"); return 1; }
        puts(txt);
        free(txt);
    } else {
        fm_trace_summary_print(&s, stdout, top);
    }
    fm_trace_summary_free(&s);
    return 0;
}
