/* ONNX backend conformance: Debian's libonnx-testdata suites (node, pytorch-converted,
 * pytorch-operator) through fm_onnx_load + fm_onnx_run. Each suite must pass at least
 * 90% of the cases it claims (tests/onnx_conformance.h says what "claims" means);
 * every other case is listed with its reason.
 *
 *   test_onnx_conformance [SUITE_DIR ...] [--list FILE] [--min PERCENT] [--no-graph] [--device DEV]
 * Every passing case is also converted to the inference graph (fm_onnx_to_graph)
 * and run there (unless --no-graph); a conversion that runs but differs fails.
 * --device DEV (check, cuda, ...) gives every case its inputs on DEV, so the whole
 * interpreter runs there, and so do the graph (moved there with fm_graph_to_device)
 * and the exported file.
 * Without directories: the three suites under /usr/share/libonnx-testdata/data
 * (skipped, exit 77, when the package is not installed). */
#include "onnx_conformance.h"
#include "test_util.h"

static const char *argv_dev_name(fm_device d) {
    static char b[32];
    return fm_device_name(d, b, sizeof b);
}

static void report(const char *root, const suite_result *r, double min_pct) {
    int claimed = r->count[C_PASS] + r->count[C_FAIL], total = 0;
    for (int k = 0; k < C_KINDS; k++) total += r->count[k];
    double pct = claimed ? 100.0 * r->count[C_PASS] / claimed : 0;
    printf("%s: %d cases: %d claimed, %d passed (%.1f%%), %d failed; skipped: %d op not supported, %d training, "
           "%d sequence/map/optional, %d dtype\n", root, total, claimed, r->count[C_PASS], pct, r->count[C_FAIL],
           r->count[C_SKIP_OP], r->count[C_SKIP_TRAINING], r->count[C_SKIP_TYPE], r->count[C_SKIP_DTYPE]);
    if (r->graph)
        printf("%s: graph form of the %d passing cases: %d converted and match, %d converted and differ, %d refused\n", root,
               r->count[C_PASS], r->graph_pass, r->graph_fail, r->graph_refused);
    if (r->graph)
        printf("%s: ONNX export of those %d graphs, reloaded and run: %d match, %d differ, %d refused\n", root, r->graph_pass,
               r->export_pass, r->export_fail, r->export_refused);
    CHECK_MSG(r->export_fail == 0, "%s: %d exported graphs give different outputs", root, r->export_fail);
    CHECK_MSG(r->graph_fail == 0, "%s: %d graph conversions give different outputs", root, r->graph_fail);
    CHECK_MSG(claimed > 0 && pct >= min_pct, "%s: %.1f%% of %d claimed cases pass; at least %.0f%% required", root, pct,
              claimed, min_pct);
}

int main(int argc, char **argv) {
    const char *dirs[16];
    int nd = 0;
    double min_pct = 90;
    bool graph = true;
    FILE *list = stdout;
    fm_device dev = FM_CPU;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list") && i + 1 < argc) {
            if (!(list = fopen(argv[++i], "w"))) { fprintf(stderr, "cannot write %s\n", argv[i]); return 2; }
        } else if (!strcmp(argv[i], "--min") && i + 1 < argc) min_pct = atof(argv[++i]);
        else if (!strcmp(argv[i], "--no-graph")) graph = false;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            if (fm_device_parse(argv[++i], &dev) || fm_device_validate(dev)) {
                fprintf(stderr, "--device %s: %s\n", argv[i], fm_last_error());
                return 2;
            }
        }
        else if (nd < 16) dirs[nd++] = argv[i];
    }
    const char *base = "/usr/share/libonnx-testdata/data";
    static char def[3][256];
    if (nd == 0) {
        const char *suites[3] = {"node", "pytorch-converted", "pytorch-operator"};
        for (int i = 0; i < 3; i++) snprintf(def[i], sizeof def[i], "%s/%s", base, suites[i]), dirs[nd++] = def[i];
    }
    for (int i = 0; i < nd; i++) {
        suite_result r = {.list = list, .graph = graph, .dev = dev};
        if (!run_suite(dirs[i], &r)) {
            TEST_SKIP("%s not found (apt-get install libonnx-testdata)", dirs[i]);
            continue;
        }
        if (dev.type != FM_DEV_CPU) printf("inputs on %s:\n", argv_dev_name(dev));
        report(dirs[i], &r, min_pct);
    }
    if (list != stdout) fclose(list);
    TEST_DONE();
}
