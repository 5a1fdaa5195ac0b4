/* graph_quant.h: quantizing graphs (fathom/quant.h is the public face):
 * the transform (graph_quant.c) and calibration (graph_calib.c). */
#ifndef FATHOM_GRAPH_QUANT_H
#define FATHOM_GRAPH_QUANT_H
#include "fathom/quant.h"
#include "graph/graph_internal.h"

/* Runs g on o->calib and sets [lo[i], hi[i]] to the range each value vals[i]
 * (value indices of g) is to be quantized over, by o->method. */
fm_status g_calibrate(const fm_graph *g, const fm_quant_options *o, int n, const int *vals, float *lo, float *hi);
#endif
