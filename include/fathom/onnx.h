/* fathom/onnx.h: ONNX models (.onnx files) loaded and run.
 *
 * fm_onnx_load decodes the protobuf (protobuf-c, with the onnx.proto Debian ships),
 * reads the initializers (inline or from external data files next to the model),
 * and checks every node's op and attributes against what fathom implements; an
 * unsupported op, opset or attribute fails the load with the node named. The
 * model then runs on fathom tensors (fm_onnx_run), node by node, on the device of
 * its inputs. docs/ONNX.md lists the ops and the conformance counts. */
#ifndef FATHOM_ONNX_H
#define FATHOM_ONNX_H
#include "fathom/export.h"
#include "fathom/graph.h"
#include "fathom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fm_onnx_model fm_onnx_model;

/* Loads `path` (a ModelProto). External data paths are relative to the model's
 * directory and may not leave it. NULL on error, with the file, node or tensor
 * and the reason in fm_last_error(). */
FM_API fm_onnx_model *fm_onnx_load(const char *path);
FM_API void fm_onnx_free(fm_onnx_model *m);

/* The graph's inputs that the caller feeds (graph inputs without an initializer)
 * and its outputs, in declaration order. */
FM_API int fm_onnx_input_count(const fm_onnx_model *m);
FM_API const char *fm_onnx_input_name(const fm_onnx_model *m, int i);
FM_API int fm_onnx_output_count(const fm_onnx_model *m);
FM_API const char *fm_onnx_output_name(const fm_onnx_model *m, int i);
/* Input i's (output i's) name, element type and shape as the file declares them
 * (FM_DIM_DYNAMIC where a dim is symbolic or unknown; dim_names NULL); the name stays
 * the model's. FM_ERR_UNSUPPORTED when the file declares no rank or no element type
 * fathom has. */
FM_API fm_status fm_onnx_input_info(const fm_onnx_model *m, int i, fm_graph_io *io);
FM_API fm_status fm_onnx_output_info(const fm_onnx_model *m, int i, fm_graph_io *io);
/* The opset of the default ("ai.onnx") domain the model imports. */
FM_API int fm_onnx_opset(const fm_onnx_model *m);
/* The most iterations one Loop node may run in fm_onnx_run (0, the default: no limit, as
 * ONNX Runtime; a Loop whose trip count and condition would go past it fails naming it). */
FM_API fm_status fm_onnx_set_max_iterations(fm_onnx_model *m, int64_t n);

/* Runs the model. inputs[i] feeds the input named names[i] (names NULL: the
 * inputs in declaration order, n_inputs == fm_onnx_input_count). Every input
 * must be given, with the declared dtype, rank and fixed dims, all on one device:
 * the model runs there (on a device other than the CPU the initializers are copied
 * there by the first run and kept with the model: that run must not overlap another
 * run of the same model) and the outputs are on it.
 * outputs receives fm_onnx_output_count new references (all NULL on error). */
FM_API fm_status fm_onnx_run(fm_onnx_model *m, int n_inputs, const char *const *names, fm_tensor *const *inputs,
                             fm_tensor **outputs);

/* The model as an inference graph (fathom/graph.h; save it with fm_graph_save).
 * Values computed from constants and shapes are folded into constants; dynamic
 * dims stay dynamic. A node with no graph form is refused with its name and op
 * (fm_onnx_run still runs such a model). docs/ONNX.md lists what converts. */
FM_API fm_graph *fm_onnx_to_graph(fm_onnx_model *m);

/* Fixes the dynamic input dim `name` (its ONNX dim_param, or <input>_d<k> for an
 * unnamed one) to `size` for fm_onnx_to_graph, as ONNX Runtime's free-dimension
 * overrides and TensorRT's static shapes do: the graph's input takes that size,
 * and shape arithmetic that follows the dim (an exported BERT's attention-mask
 * construction) folds into constants. An unknown name or a size outside
 * [1, 2^31) is refused, naming the model's dynamic dims. */
FM_API fm_status fm_onnx_set_dim(fm_onnx_model *m, const char *name, int64_t size);
/* The same by position: dim d of the input named `input` (what a server's model
 * config declares). A dim that is already fixed must have that size. */
FM_API fm_status fm_onnx_set_input_dim(fm_onnx_model *m, const char *input, int d, int64_t size);

/* Writes the graph as an ONNX model (opset 17) to `path`, atomically: constants
 * become initializers, dynamic input dims dim_params, and each graph op one or a
 * few ONNX ops (gelu through Erf, rms_norm through ReduceMean, ...). An op with no
 * ONNX form yet is refused with the node named, and nothing is written. */
FM_API fm_status fm_graph_export_onnx(fm_graph *g, const char *path);

/* Reads one serialized TensorProto (the .pb files of ONNX's test data). */
FM_API fm_tensor *fm_onnx_read_tensor(const char *path);

#ifdef __cplusplus
}
#endif
#endif
