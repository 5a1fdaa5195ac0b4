/* A graph saved into dir and loaded back computes the same bits on x (the tests of
 * quantized graphs); returns whether it did, after CHECKs naming what failed. Needs
 * test_util.h and a rel_diff(a, b, x) of the including test (max |a - b| / max |a|). */
#ifndef FATHOM_GRAPH_ROUNDTRIP_H
#define FATHOM_GRAPH_ROUNDTRIP_H
#include "fathom/graph.h"

static double rel_diff(const fm_graph *a, const fm_graph *b, fm_tensor *x);

static bool graph_roundtrip_same(fm_graph *g, const char *dir, fm_tensor *x) {
    CHECK_MSG(fm_graph_save(g, dir) == FM_OK, "save to %s: %s", dir, fm_last_error());
    fm_graph *l = fm_graph_load(dir);
    CHECK_MSG(l != NULL, "%s", fm_last_error());
    const bool same = l && rel_diff(g, l, x) == 0;
    CHECK_MSG(same, "the graph loaded from %s differs from the one saved", dir);
    fm_graph_free(l);
    return same;
}
#endif
