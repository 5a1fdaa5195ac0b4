/* ONNX import: a model built here with protobuf-c (MatMul + Add + Relu, weights
 * inline or in an external file) runs and gives the values computed by hand; every
 * kind of bad input is refused with the file, node or tensor named: truncated and
 * corrupt files (every prefix of a valid file), deep nesting, external data paths
 * that escape the model's directory (.., absolute, symlink) or are short, declared
 * shapes that contradict an initializer, unsupported ops and attributes, and inputs
 * of the wrong dtype or shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fathom/graph.h"
#include "onnx/onnx_internal.h"
#include "test_util.h"

static char g_dir[256];

static const char *tmp(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

static const float k_w[6] = {1, -2, 3, 0.5f, -1, 2}; /* W [2, 3] */
static const float k_b[3] = {0.25f, -10, 1};

/* Options for the model built below. */
typedef struct {
    const char *ext_location; /* W from external data at this path (NULL: inline) */
    int64_t declared_w_dim1;  /* W's declared dim 1 in value_info (0: not declared) */
    const char *op;           /* the last op (default Relu) */
    const char *extra_attr;   /* an INT attribute on the last node */
    bool omit_last_input;     /* the last node's (required) input named "" */
} model_opts;

/* Packs y = op(x @ W + b), x [?, 2] float. Returns a malloc'd buffer. */
static uint8_t *build_model(const model_opts *o, size_t *n) {
    Onnx__ModelProto m = ONNX__MODEL_PROTO__INIT;
    Onnx__OperatorSetIdProto ops = ONNX__OPERATOR_SET_ID_PROTO__INIT, *opsp = &ops;
    ops.domain = "";
    ops.has_version = 1, ops.version = 17;
    m.has_ir_version = 1, m.ir_version = 8;
    m.n_opset_import = 1, m.opset_import = &opsp;
    Onnx__GraphProto g = ONNX__GRAPH_PROTO__INIT;
    m.graph = &g;
    g.name = "g";
    /* initializers */
    Onnx__TensorProto w = ONNX__TENSOR_PROTO__INIT, b = ONNX__TENSOR_PROTO__INIT, *inits[2] = {&w, &b};
    int64_t wd[2] = {2, 3}, bd[1] = {3};
    w.name = "W", w.n_dims = 2, w.dims = wd, w.has_data_type = 1, w.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    Onnx__StringStringEntryProto loc = ONNX__STRING_STRING_ENTRY_PROTO__INIT, *locp = &loc;
    if (o->ext_location) {
        loc.key = "location", loc.value = (char *)o->ext_location;
        w.n_external_data = 1, w.external_data = &locp;
        w.has_data_location = 1, w.data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    } else
        w.n_float_data = 6, w.float_data = (float *)k_w;
    b.name = "b", b.n_dims = 1, b.dims = bd, b.has_data_type = 1, b.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    b.has_raw_data = 1, b.raw_data.len = sizeof k_b, b.raw_data.data = (uint8_t *)k_b;
    g.n_initializer = 2, g.initializer = inits;
    /* input x [N, 2] and output y */
    Onnx__TensorShapeProto__Dimension dn = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT, d2 = dn, *dims[2] = {&dn, &d2};
    dn.value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM, dn.dim_param = "N";
    d2.value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE, d2.dim_value = 2;
    Onnx__TensorShapeProto shp = ONNX__TENSOR_SHAPE_PROTO__INIT;
    shp.n_dim = 2, shp.dim = dims;
    Onnx__TypeProto__Tensor tt = ONNX__TYPE_PROTO__TENSOR__INIT;
    tt.has_elem_type = 1, tt.elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, tt.shape = &shp;
    Onnx__TypeProto tp = ONNX__TYPE_PROTO__INIT;
    tp.value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE, tp.tensor_type = &tt;
    Onnx__ValueInfoProto x = ONNX__VALUE_INFO_PROTO__INIT, y = x, *xin = &x, *yout = &y;
    x.name = "x", x.type = &tp;
    y.name = "y";
    g.n_input = 1, g.input = &xin;
    g.n_output = 1, g.output = &yout;
    /* declared W shape (value_info) */
    Onnx__TensorShapeProto__Dimension wd0 = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT, wd1 = wd0, *wdims[2] = {&wd0, &wd1};
    wd0.value_case = wd1.value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
    wd0.dim_value = 2, wd1.dim_value = o->declared_w_dim1;
    Onnx__TensorShapeProto wshp = ONNX__TENSOR_SHAPE_PROTO__INIT;
    wshp.n_dim = 2, wshp.dim = wdims;
    Onnx__TypeProto__Tensor wtt = tt;
    wtt.shape = &wshp;
    Onnx__TypeProto wtp = tp;
    wtp.tensor_type = &wtt;
    Onnx__ValueInfoProto wvi = ONNX__VALUE_INFO_PROTO__INIT, *wvip = &wvi;
    wvi.name = "W", wvi.type = &wtp;
    if (o->declared_w_dim1) g.n_value_info = 1, g.value_info = &wvip;
    /* nodes */
    char *in0[2] = {"x", "W"}, *out0[1] = {"h"}, *in1[2] = {"h", "b"}, *out1[1] = {"s"}, *in2[1] = {"s"}, *out2[1] = {"y"};
    Onnx__NodeProto n0 = ONNX__NODE_PROTO__INIT, n1 = n0, n2 = n0, *nodes[3] = {&n0, &n1, &n2};
    n0.op_type = "MatMul", n0.name = "mm", n0.n_input = 2, n0.input = in0, n0.n_output = 1, n0.output = out0;
    n1.op_type = "Add", n1.name = "add", n1.n_input = 2, n1.input = in1, n1.n_output = 1, n1.output = out1;
    if (o->omit_last_input) in2[0] = "";
    n2.op_type = (char *)(o->op ? o->op : "Relu"), n2.name = "act", n2.n_input = 1, n2.input = in2, n2.n_output = 1,
    n2.output = out2;
    Onnx__AttributeProto at = ONNX__ATTRIBUTE_PROTO__INIT, *atp = &at;
    if (o->extra_attr) {
        at.name = (char *)o->extra_attr, at.has_type = 1, at.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT, at.has_i = 1, at.i = 1;
        n2.n_attribute = 1, n2.attribute = &atp;
    }
    g.n_node = 3, g.node = nodes;
    *n = protobuf_c_message_get_packed_size(&m.base);
    uint8_t *buf = malloc(*n);
    protobuf_c_message_pack(&m.base, buf);
    return buf;
}

static void save_model(const char *path, const model_opts *o) {
    size_t n;
    uint8_t *buf = build_model(o, &n);
    write_file(path, buf, n);
    free(buf);
}

/* The model on x = [[1, 2], [-1, 0.5]] against the hand-computed relu(x W + b). */
static void check_runs(const char *path) {
    fm_onnx_model *m = fm_onnx_load(path);
    CHECK_MSG(m != NULL, "%s", fm_last_error());
    if (!m) return;
    CHECK(fm_onnx_input_count(m) == 1 && !strcmp(fm_onnx_input_name(m, 0), "x"));
    CHECK(fm_onnx_output_count(m) == 1 && !strcmp(fm_onnx_output_name(m, 0), "y"));
    float xv[4] = {1, 2, -1, 0.5f};
    int64_t sh[2] = {2, 2};
    fm_tensor *x = fm_tensor_from_data(xv, 2, sh, FM_F32), *y = NULL;
    CHECK_MSG(fm_onnx_run(m, 1, NULL, &x, &y) == FM_OK, "%s", fm_last_error());
    if (y) {
        CHECK(y->ndim == 2 && y->shape[0] == 2 && y->shape[1] == 3);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) {
                double v = k_b[j];
                for (int k = 0; k < 2; k++) v += xv[i * 2 + k] * k_w[k * 3 + j];
                CHECK_NEAR(fm_tensor_get(y, i * 3 + j), v > 0 ? v : 0, 1e-6);
            }
    }
    /* by name; wrong name, dtype and fixed dim refused with the input named */
    const char *nm = "x", *bad = "z";
    fm_tensor_release(y);
    y = NULL;
    CHECK(fm_onnx_run(m, 1, &nm, &x, &y) == FM_OK && y);
    fm_tensor_release(y);
    CHECK(fm_onnx_run(m, 1, &bad, &x, &y) != FM_OK);
    CHECK_ERR_CONTAINS("no input 'z'");
    fm_tensor *xd = fm_to_dtype(x, FM_F64), *x3 = fm_tensor_zeros(2, (int64_t[]){2, 3}, FM_F32, FM_CPU);
    CHECK(fm_onnx_run(m, 1, NULL, &xd, &y) != FM_OK);
    CHECK_ERR_CONTAINS("input 'x' must be f32");
    CHECK(fm_onnx_run(m, 1, NULL, &x3, &y) != FM_OK);
    CHECK_ERR_CONTAINS("input 'x' dimension 1 must be 2");
    fm_tensor_release_n(3, x, xd, x3);
    fm_onnx_free(m);
}

static void check_truncated(void) {
    size_t n;
    uint8_t *buf = build_model(&(model_opts){0}, &n);
    int refused = 0, tries = 0;
    for (size_t len = 0; len < n; len++) { /* every strict prefix */
        write_file(tmp("cut.onnx"), buf, len);
        fm_onnx_model *m = fm_onnx_load(tmp("cut.onnx"));
        tries++;
        if (!m) {
            refused++;
            CHECK_MSG(strstr(fm_last_error(), "cut.onnx") != NULL, "error does not name the file: %s", fm_last_error());
        }
        fm_onnx_free(m);
    }
    /* a prefix that ends between fields can still parse; it must then be incomplete */
    CHECK_MSG(refused >= tries - 8, "only %d of %d truncations refused", refused, tries);
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
    write_file(tmp("junk.onnx"), junk, sizeof junk);
    CHECK(fm_onnx_load(tmp("junk.onnx")) == NULL);
    CHECK_ERR_CONTAINS("junk.onnx");
    free(buf);
    /* nesting: 199 levels of GraphProto in an attribute (field 6 of AttributeProto) in a
     * node (field 5 of NodeProto) in a graph (field 1 of GraphProto) ... */
    size_t cap = 1 << 16, len = 0;
    uint8_t *deep = malloc(cap), *tmpb = malloc(cap);
    for (int level = 0; level < 199; level++) { /* ends with a GraphProto */
        uint8_t tag = level % 3 == 0 ? (1 << 3 | 2) : level % 3 == 1 ? (6 << 3 | 2) : (5 << 3 | 2);
        /* graph.node (1), node.attribute (5), attribute.g (6): wrap the bytes so far */
        size_t h = 0;
        tmpb[h++] = tag;
        size_t v = len;
        do { tmpb[h++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)); v >>= 7; } while (v);
        memcpy(tmpb + h, deep, len);
        len += h;
        memcpy(deep, tmpb, len);
    }
    /* outermost: ModelProto.graph (7) */
    size_t h = 0;
    tmpb[h++] = 7 << 3 | 2;
    size_t v = len;
    do { tmpb[h++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)); v >>= 7; } while (v);
    memcpy(tmpb + h, deep, len);
    write_file(tmp("deep.onnx"), tmpb, len + h);
    CHECK(fm_onnx_load(tmp("deep.onnx")) == NULL);
    CHECK_ERR_CONTAINS("nest deeper");
    free(deep);
    free(tmpb);
}

static void check_external(void) {
    write_file(tmp("w.bin"), k_w, sizeof k_w);
    save_model(tmp("ext.onnx"), &(model_opts){.ext_location = "w.bin"});
    check_runs(tmp("ext.onnx"));
    save_model(tmp("dotdot.onnx"), &(model_opts){.ext_location = "../w.bin"});
    CHECK(fm_onnx_load(tmp("dotdot.onnx")) == NULL);
    CHECK_ERR_CONTAINS("initializer 'W': external data location '../w.bin' leaves the model's directory");
    save_model(tmp("abs.onnx"), &(model_opts){.ext_location = "/etc/passwd"});
    CHECK(fm_onnx_load(tmp("abs.onnx")) == NULL);
    CHECK_ERR_CONTAINS("is absolute");
    CHECK(symlink("/etc/hostname", tmp("link.bin")) == 0);
    save_model(tmp("link.onnx"), &(model_opts){.ext_location = "link.bin"});
    CHECK(fm_onnx_load(tmp("link.onnx")) == NULL);
    CHECK_ERR_CONTAINS("outside the model's directory");
    write_file(tmp("short.bin"), k_w, 8);
    save_model(tmp("short.onnx"), &(model_opts){.ext_location = "short.bin"});
    CHECK(fm_onnx_load(tmp("short.onnx")) == NULL);
    CHECK_ERR_CONTAINS("the tensor needs 24 at offset 0");
    save_model(tmp("missing.onnx"), &(model_opts){.ext_location = "nope.bin"});
    CHECK(fm_onnx_load(tmp("missing.onnx")) == NULL);
    CHECK_ERR_CONTAINS("nope.bin");
}

static void check_refusals(void) {
    save_model(tmp("shape.onnx"), &(model_opts){.declared_w_dim1 = 4});
    CHECK(fm_onnx_load(tmp("shape.onnx")) == NULL);
    CHECK_ERR_CONTAINS("tensor 'W': declared dimension 1 is 4 but the initializer's is 3");
    save_model(tmp("shape_ok.onnx"), &(model_opts){.declared_w_dim1 = 3});
    check_runs(tmp("shape_ok.onnx"));
    save_model(tmp("op.onnx"), &(model_opts){.op = "FancyOp"});
    CHECK(fm_onnx_load(tmp("op.onnx")) == NULL);
    CHECK_ERR_CONTAINS("node 2 'act' (FancyOp): op FancyOp is not supported");
    save_model(tmp("attr.onnx"), &(model_opts){.op = "Softmax", .extra_attr = "temperature"});
    CHECK(fm_onnx_load(tmp("attr.onnx")) == NULL);
    CHECK_ERR_CONTAINS("(Softmax): attribute 'temperature' is not supported");
    /* a required input left out (found by fuzz_onnx: Transpose ran on a NULL input) */
    save_model(tmp("omitted.onnx"), &(model_opts){.op = "Transpose", .omit_last_input = true});
    CHECK(fm_onnx_load(tmp("omitted.onnx")) == NULL);
    CHECK_ERR_CONTAINS("(Transpose): input 0 is required, but its name is empty");
    CHECK(fm_onnx_load(tmp("no_such.onnx")) == NULL);
    CHECK_ERR_CONTAINS("no_such.onnx: cannot open");
}

/* On a device that is not the CPU (check:0 and check:1, the CPU's kernels on memory the
 * host may not touch): the output is on the inputs' device with the CPU's values, the
 * initializers are copied there by the first run and reused, a second device gets its
 * own copy; inputs on two devices are refused naming both. */
static void check_devices(const char *path) {
    fm_onnx_model *m = fm_onnx_load(path);
    CHECK_MSG(m != NULL, "%s", fm_last_error());
    if (!m) return;
    float xv[4] = {1, 2, -1, 0.5f};
    int64_t sh[2] = {2, 2};
    fm_tensor *x = fm_tensor_from_data(xv, 2, sh, FM_F32), *ref = NULL;
    CHECK(fm_onnx_run(m, 1, NULL, &x, &ref) == FM_OK);
    fm_device devs[3] = {{FM_DEV_CHECK, 0}, {FM_DEV_CHECK, 0}, {FM_DEV_CHECK, 1}};
    for (int k = 0; k < 3 && ref; k++) {
        fm_tensor *xd = fm_tensor_to(x, devs[k]), *y = NULL, *yh = NULL;
        CHECK_MSG(xd && fm_onnx_run(m, 1, NULL, &xd, &y) == FM_OK, "%s", fm_last_error());
        CHECK(y && y->storage->device.type == FM_DEV_CHECK && y->storage->device.index == devs[k].index);
        CHECK(m->dev_constants && m->dev_of.index == devs[k].index); /* kept for the next run */
        yh = y ? fm_tensor_to(y, FM_CPU) : NULL;
        CHECK(yh && !memcmp(fm_tensor_data(yh), fm_tensor_data(ref), 6 * sizeof(float)));
        fm_tensor_release_n(3, xd, y, yh);
    }
    fm_onnx_free(m);
    /* two inputs: x on check:0, W (an input here, not an initializer) on the CPU */
    const char *conv = "/usr/share/libonnx-testdata/data/node/test_conv_with_strides_padding/model.onnx";
    if ((m = fm_onnx_load(conv)) != NULL) {
        int64_t xs[4] = {1, 1, 7, 5}, ws[4] = {1, 1, 3, 3};
        fm_tensor *in[2] = {fm_tensor_zeros(4, xs, FM_F32, (fm_device){FM_DEV_CHECK, 0}), fm_tensor_zeros(4, ws, FM_F32, FM_CPU)};
        fm_tensor *y = NULL;
        CHECK(fm_onnx_run(m, 2, NULL, in, &y) != FM_OK && y == NULL);
        CHECK_ERR_CONTAINS("input 'W' is on cpu but 'x' is on check:0: give every input on one device");
        fm_tensor_release_n(2, in[0], in[1]);
        fm_onnx_free(m);
    }
    fm_tensor_release_n(2, x, ref);
}

/* The graph form: dynamic N stays dynamic through save and load; the graph gives
 * the eager run's values at two batch sizes. */
static void check_graph(const char *path) {
    fm_onnx_model *m = fm_onnx_load(path);
    fm_graph *g = m ? fm_onnx_to_graph(m) : NULL;
    CHECK_MSG(g != NULL, "%s", fm_last_error());
    if (!g) { fm_onnx_free(m); return; }
    CHECK(fm_graph_save(g, tmp("graph")) == FM_OK);
    fm_graph_free(g);
    g = fm_graph_load(tmp("graph"));
    CHECK_MSG(g != NULL, "%s", fm_last_error());
    fm_graph_io io;
    CHECK(g && fm_graph_input_info(g, 0, &io) == FM_OK && io.shape[0] == FM_DIM_DYNAMIC && io.shape[1] == 2 &&
          io.dim_names[0] && !strcmp(io.dim_names[0], "N"));
    for (int64_t n = 2; g && n <= 5; n += 3) {
        int64_t sh[2] = {n, 2};
        fm_tensor *x = fm_tensor_randn(2, sh, FM_F32, NULL), *ye = NULL, *yg = NULL;
        CHECK(fm_onnx_run(m, 1, NULL, &x, &ye) == FM_OK);
        CHECK_MSG(fm_graph_run(g, &x, &yg) == FM_OK, "%s", fm_last_error());
        for (int64_t i = 0; ye && yg && i < n * 3; i++) CHECK_NEAR(fm_tensor_get(yg, i), fm_tensor_get(ye, i), 1e-6);
        fm_tensor_release_n(3, x, ye, yg);
    }
    fm_graph_free(g);
    /* a model with an op that has no graph form here (Trilu over a dynamic dim) is refused
     * with the node named */
    fm_onnx_free(m);
    save_model(tmp("trilu.onnx"), &(model_opts){.op = "Trilu"});
    m = fm_onnx_load(tmp("trilu.onnx"));
    CHECK(m && fm_onnx_to_graph(m) == NULL);
    CHECK_ERR_CONTAINS("node 2 'act' (Trilu): Trilu has a graph form on fixed last two dims only");
    fm_onnx_free(m);
}

/* Fixing dynamic dims for the graph form: by name (fm_onnx_set_dim) and by input and
 * position (fm_onnx_set_input_dim, what a server's config does); bad names, positions
 * and sizes are refused with what the model has. */
static void check_fixed_dims(const char *path) {
    fm_onnx_model *m = fm_onnx_load(path);
    CHECK(m != NULL);
    if (!m) return;
    CHECK(fm_onnx_set_dim(m, "Q", 4) != FM_OK);
    CHECK_ERR_CONTAINS("no dynamic input dim named 'Q' (its dynamic dims: N)");
    CHECK(fm_onnx_set_dim(m, "N", 0) != FM_OK);
    CHECK_ERR_CONTAINS("a size must be in [1, 2^31)");
    CHECK(fm_onnx_set_input_dim(m, "nope", 0, 4) != FM_OK);
    CHECK_ERR_CONTAINS("no input named 'nope'");
    CHECK(fm_onnx_set_input_dim(m, "x", 2, 4) != FM_OK);
    CHECK_ERR_CONTAINS("has 2 dims; there is no dim 2");
    CHECK(fm_onnx_set_input_dim(m, "x", 1, 3) != FM_OK);
    CHECK_ERR_CONTAINS("dim 1 is fixed at 2 in the model, not 3");
    CHECK(fm_onnx_set_input_dim(m, "x", 1, 2) == FM_OK); /* already that size */
    CHECK(fm_onnx_set_input_dim(m, "x", 0, 4) == FM_OK);
    fm_graph *g = fm_onnx_to_graph(m);
    fm_graph_io io;
    CHECK_MSG(g && fm_graph_input_info(g, 0, &io) == FM_OK && io.shape[0] == 4 && io.shape[1] == 2, "%s", fm_last_error());
    fm_graph_free(g);
    fm_onnx_free(m);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/fathom_onnx_XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    save_model(tmp("inline.onnx"), &(model_opts){0});
    check_runs(tmp("inline.onnx"));
    check_graph(tmp("inline.onnx"));
    check_fixed_dims(tmp("inline.onnx"));
    check_devices(tmp("inline.onnx"));
    check_truncated();
    check_external();
    check_refusals();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_DONE();
}
