/* A GPT inference graph (fm_graph_from_gpt's, compiled or quantized) as the model
 * and weights the paged decoder runs (src/gpt/gpt_paged.h), so that `fathom serve`
 * generates text with continuous batching from what `fathom compile` and `fathom
 * quantize` write. Not a public interface. */
#ifndef FATHOM_GRAPH_GPT_PAGED_H
#define FATHOM_GRAPH_GPT_PAGED_H
#include "fathom/graph.h"
#include "gpt/gpt_paged.h"

/* Whether g's metadata says it is a GPT graph (model_kind "gpt"). */
bool fm_graph_is_gpt(const fm_graph *g);
/* The model g was made from, its weights shared with g's constants (g may be freed
 * after), and in *q the linears and token table g keeps quantized (int8 dynamic, int4):
 * their f32 tensors in the model are meta-device placeholders. The GPT configuration
 * comes from the metadata ("gpt_config"); every weight is looked up by its name and
 * checked against the shape the configuration gives. Then a prompt runs through both
 * the graph (fm_graph_gpt_forward) and the paged decoder, and the two must agree
 * (rms of the difference over rms of the graph's: 1e-3 for f32; 0.15 for quantized
 * graphs, whose rounded activations turn float-ordering differences into rounding
 * steps), so a graph whose structure is not
 * the GPT its metadata names is refused. where labels errors. Free with fm_gpt_free and
 * fm_paged_weights_free. */
fm_gpt *fm_graph_gpt_unpack(const fm_graph *g, const char *where, fm_paged_weights *q);

#endif
