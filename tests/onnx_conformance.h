/* The ONNX backend-test runner shared by tests/test_onnx_conformance.c: runs the
 * cases of one suite directory (<case>/model.onnx + test_data_set_0/{input,output}_N.pb)
 * and sorts each into pass, fail or skip. A case is skipped only for a reason read
 * from the model itself (an op fathom does not list, a training-domain op, a map or
 * sparse value or a sequence/optional of such, an element type fathom lacks); every
 * other case is "claimed" and must pass: its outputs match within rtol 1e-3, atol 1e-7
 * (the tolerances of ONNX's own backend tests), with equal dtypes and shapes; a sequence
 * output has the expected number of tensors, each matching; an optional is empty when
 * expected so, else its element matches. The .pb of an input or output the model declares
 * a sequence or optional is a SequenceProto or OptionalProto (onnx-data.proto, which
 * Debian's libonnx-dev does not ship, so those two are read from the wire here; the
 * TensorProtos inside them through protobuf-c). */
#ifndef FATHOM_TESTS_ONNX_CONFORMANCE_H
#define FATHOM_TESTS_ONNX_CONFORMANCE_H
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data_internal.h"
#include "onnx/onnx_internal.h"

typedef enum { C_PASS, C_FAIL, C_SKIP_OP, C_SKIP_TRAINING, C_SKIP_TYPE, C_SKIP_DTYPE, C_KINDS } case_kind;
static const char *const kind_names[C_KINDS] = {"pass", "FAIL", "skip: op not supported", "skip: training op",
                                                "skip: sequence/map/optional type", "skip: dtype not supported"};

typedef struct {
    int count[C_KINDS];
    FILE *list; /* each non-passing case, one line */
    /* graph mode: every case that passes is also converted with fm_onnx_to_graph and
     * run with fm_graph_run on the same data */
    bool graph;
    int graph_pass, graph_fail, graph_refused;
    /* each graph that matches is exported back to ONNX (fm_graph_export_onnx),
     * reloaded and run by the interpreter */
    int export_pass, export_fail, export_refused;
    /* the device the inputs are given on (fm_onnx_run runs on the inputs' device);
     * outputs are brought back to the host to compare */
    fm_device dev;
} suite_result;

/* A graph input's or output's declared type: false for a map, a sparse tensor or a sequence
 * or optional of those; else *elem is the element type of the tensor (of a sequence's or
 * optional's tensors; 0: not declared). */
static bool type_is_supported(const Onnx__ValueInfoProto *vi, int32_t *elem) {
    *elem = 0;
    const Onnx__TypeProto *t = vi->type;
    if (t && t->value_case == ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE) t = t->optional_type->elem_type;
    if (t && t->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE) t = t->sequence_type->elem_type;
    if (!t) return true;
    if (t->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE) return false;
    if (t->tensor_type->has_elem_type) *elem = t->tensor_type->elem_type;
    return true;
}

static bool graph_uses_attr_tensor_dtype(const Onnx__NodeProto *n, char *why, size_t wn) {
    fm_dtype dt;
    for (size_t a = 0; a < n->n_attribute; a++) {
        const Onnx__AttributeProto *at = n->attribute[a];
        if (at->t && at->t->has_data_type && !onnx_dtype_to_fm(at->t->data_type, &dt)) {
            snprintf(why, wn, "%s attribute '%s' is %s", n->op_type, at->name, onnx_dtype_name(at->t->data_type));
            return true;
        }
        if (!strcmp(n->op_type, "Cast") && at->name && !strcmp(at->name, "to") && !onnx_dtype_to_fm((int32_t)at->i, &dt)) {
            snprintf(why, wn, "Cast to %s", onnx_dtype_name((int32_t)at->i));
            return true;
        }
    }
    return false;
}

/* Why a case is outside what fathom claims (C_PASS: it is claimed). */
static case_kind classify(const Onnx__ModelProto *m, char *why, size_t wn) {
    const Onnx__GraphProto *g = m->graph;
    fm_dtype dt;
    int32_t el;
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        if (n->domain && strstr(n->domain, "training")) { snprintf(why, wn, "%s (%s)", n->op_type, n->domain); return C_SKIP_TRAINING; }
        /* training-mode BatchNormalization (batch statistics, running-stat outputs) and
         * Dropout (random): training ops, not inference */
        bool train = !strcmp(n->op_type, "Dropout") && n->n_input > 2 && *n->input[2];
        for (size_t a = 0; a < n->n_attribute; a++)
            train |= n->attribute[a]->name && !strcmp(n->attribute[a]->name, "training_mode") && n->attribute[a]->i;
        if (train) { snprintf(why, wn, "%s in training mode", n->op_type); return C_SKIP_TRAINING; }
        if (!onnx_find_op_domain(n->domain, n->op_type)) {
            snprintf(why, wn, "%s%s%s", n->op_type, n->domain && *n->domain ? " in domain " : "", n->domain ? n->domain : "");
            return C_SKIP_OP;
        }
    }
    const Onnx__ValueInfoProto *const *lists[2] = {(const Onnx__ValueInfoProto *const *)g->input,
                                                   (const Onnx__ValueInfoProto *const *)g->output};
    size_t counts[2] = {g->n_input, g->n_output};
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < counts[l]; i++) {
            if (!type_is_supported(lists[l][i], &el)) {
                snprintf(why, wn, "'%s' is a map or sparse value, or holds one", lists[l][i]->name);
                return C_SKIP_TYPE;
            }
            if (el && !onnx_dtype_to_fm(el, &dt)) { snprintf(why, wn, "'%s' is %s", lists[l][i]->name, onnx_dtype_name(el)); return C_SKIP_DTYPE; }
        }
    for (size_t i = 0; i < g->n_initializer; i++)
        if (!onnx_dtype_to_fm(g->initializer[i]->data_type, &dt)) {
            snprintf(why, wn, "initializer '%s' is %s", g->initializer[i]->name, onnx_dtype_name(g->initializer[i]->data_type));
            return C_SKIP_DTYPE;
        }
    for (size_t i = 0; i < g->n_node; i++)
        if (graph_uses_attr_tensor_dtype(g->node[i], why, wn)) return C_SKIP_DTYPE;
    return C_PASS;
}

/* Compares one output; a mismatch is described in why. */
static bool outputs_match(const fm_tensor *got, const fm_tensor *want, char *why, size_t wn) {
    if (got->dtype != want->dtype) { snprintf(why, wn, "dtype %s, expected %s", fm_dtype_name(got->dtype), fm_dtype_name(want->dtype)); return false; }
    char a[96], b[96];
    if (got->ndim != want->ndim || memcmp(got->shape, want->shape, (size_t)got->ndim * sizeof(int64_t))) {
        snprintf(why, wn, "shape %s, expected %s", fm_shape_str(got->ndim, got->shape, a, sizeof a),
                 fm_shape_str(want->ndim, want->shape, b, sizeof b));
        return false;
    }
    int64_t n = fm_tensor_numel(want);
    bool fl = fm_dtype_is_float(want->dtype);
    for (int64_t i = 0; i < n; i++) {
        double x = fm_tensor_get(got, i), y = fm_tensor_get(want, i);
        bool ok = fl ? ((isnan(x) && isnan(y)) || x == y || fabs(x - y) <= 1e-7 + 1e-3 * fabs(y)) : x == y;
        if (!ok) { snprintf(why, wn, "element %lld is %.9g, expected %.9g", (long long)i, x, y); return false; }
    }
    return true;
}

/* A TensorProto read from the test data. ONNX 1.12's test data stores bfloat16 tensors as
 * uint16 (numpy had no bfloat16); fathom has no uint16, so a uint16 .pb in a claimed case is
 * the bfloat16 bits. */
static fm_tensor *tensor_of_pb(Onnx__TensorProto *tp, const char *path) {
    if (tp->has_data_type && tp->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__UINT16)
        tp->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
    fm_tensor *t = onnx_tensor_from_proto(tp, NULL, path);
    protobuf_c_message_free_unpacked(&tp->base, NULL);
    return t;
}

static fm_tensor *read_pb(const char *path, char *name, size_t nn) {
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n)) return NULL;
    Onnx__TensorProto *tp = (Onnx__TensorProto *)onnx_unpack(&onnx__tensor_proto__descriptor, buf, n, path);
    free(buf);
    if (!tp) return NULL;
    snprintf(name, nn, "%s", tp->name ? tp->name : "");
    return tensor_of_pb(tp, path);
}

/* ---- SequenceProto and OptionalProto, from the protobuf wire format ---- */
typedef struct { const uint8_t *p, *end; } pb_in;

static bool pb_varint(pb_in *r, uint64_t *v) {
    *v = 0;
    for (int sh = 0; sh < 64 && r->p < r->end; sh += 7) {
        const uint8_t b = *r->p++;
        *v |= (uint64_t)(b & 0x7f) << sh;
        if (!(b & 0x80)) return true;
    }
    return false;
}

/* The next field: 1 (its number in *field; a length-delimited one's bytes in *data, *n,
 * else *data NULL), 0 at the end, -1 on corrupt data. */
static int pb_next(pb_in *r, int *field, const uint8_t **data, size_t *n) {
    uint64_t tag, v;
    *field = 0, *data = NULL, *n = 0;
    if (r->p == r->end) return 0;
    if (!pb_varint(r, &tag)) return -1;
    *field = (int)(tag >> 3);
    switch (tag & 7) {
    case 0: return pb_varint(r, &v) ? 1 : -1;
    case 1: return r->end - r->p >= 8 ? (r->p += 8, 1) : -1;
    case 5: return r->end - r->p >= 4 ? (r->p += 4, 1) : -1;
    case 2:
        if (!pb_varint(r, &v) || v > (uint64_t)(r->end - r->p)) return -1;
        *data = r->p, *n = (size_t)v, r->p += v;
        return 1;
    default: return -1;
    }
}

/* A SequenceProto (optional false) or OptionalProto of tensors from its bytes; a sequence
 * is of dtype dt when typed (its tensors must have it); name receives the proto's. */
static onnx_value *parse_value(const uint8_t *p, size_t len, bool optional, fm_dtype dt, bool typed, char *name, size_t nn,
                               const char *path) {
    pb_in r = {p, p + len};
    onnx_value *v = optional ? onnx_opt_new(NULL, NULL) : onnx_seq_new(dt, typed, 0);
    int f = 0, st;
    const uint8_t *d = NULL;
    size_t n = 0;
    while (v && (st = pb_next(&r, &f, &d, &n)) != 0) {
        const char *bad = st < 0 ? "corrupt data" : (f == 4 || f == 6 || f == 7 || (f == 5 && !optional)) && d
                                                        ? "a map, sparse tensor or nested sequence or optional (not supported)" : NULL;
        if (f == 1 && d && name) snprintf(name, nn, "%.*s", (int)(n < 127 ? n : 127), (const char *)d);
        if (!bad && f == 3 && d) {
            Onnx__TensorProto *tp = (Onnx__TensorProto *)onnx_unpack(&onnx__tensor_proto__descriptor, d, n, path);
            fm_tensor *t = tp ? tensor_of_pb(tp, path) : NULL;
            if (!t) bad = fm_last_error();
            else if (!optional && onnx_seq_push(v, t)) bad = fm_last_error();
            else if (optional && !v->t && !v->v) v->t = t;
            else if (optional) {
                bad = "two elements in an optional";
                fm_tensor_release(t);
            }
        } else if (!bad && f == 5 && d) {
            if (v->t || v->v) bad = "two elements in an optional";
            else if (!(v->v = parse_value(d, n, false, dt, typed, NULL, 0, path))) bad = fm_last_error();
        }
        if (bad) {
            fm_set_error(FM_ERR_FORMAT, "%s: %s", path, bad);
            onnx_value_release(v);
            v = NULL;
        }
    }
    return v;
}

/* Test data file `path`: a TensorProto into *t where decl declares a tensor (or nothing),
 * else a SequenceProto or OptionalProto into *v. false with the error set. */
static bool read_data(const char *path, const onnx_input *decl, fm_tensor **t, onnx_value **v, char *name, size_t nn) {
    *t = NULL, *v = NULL, *name = 0;
    if (!decl || decl->kind == ONNX_TENSOR) return (*t = read_pb(path, name, nn)) != NULL;
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n)) return false;
    fm_dtype dt = FM_F32;
    const bool typed = decl->item_type && onnx_dtype_to_fm(decl->item_type, &dt);
    *v = parse_value(buf, n, decl->kind == ONNX_OPT, dt, typed, name, nn, path);
    free(buf);
    return *v != NULL;
}

/* A sequence or optional output against the expected one. */
static bool values_match(const onnx_value *got, const onnx_value *want, char *why, size_t wn) {
    if (!got || got->kind != want->kind) {
        snprintf(why, wn, "%s, expected %s", got ? onnx_value_what(got) : "a tensor", onnx_value_what(want));
        return false;
    }
    if (want->kind == ONNX_OPT) {
        if (!want->t != !got->t || !want->v != !got->v) {
            snprintf(why, wn, "optional holds %s, expected %s", got->t ? "a tensor" : got->v ? "a sequence" : "nothing",
                     want->t ? "a tensor" : want->v ? "a sequence" : "nothing");
            return false;
        }
        return want->t ? outputs_match(got->t, want->t, why, wn) : want->v ? values_match(got->v, want->v, why, wn) : true;
    }
    if (got->n != want->n) {
        snprintf(why, wn, "a sequence of %d tensors, expected %d", got->n, want->n);
        return false;
    }
    for (int i = 0; i < want->n; i++) {
        char w[200];
        if (!outputs_match(got->items[i], want->items[i], w, sizeof w)) {
            snprintf(why, wn, "tensor %d of the sequence: %s", i, w);
            return false;
        }
    }
    return true;
}

/* Outputs on a device brought to the host to compare (false: why says why). */
static bool outputs_to_host(fm_tensor **out, int n, char *why, size_t wn) {
    for (int i = 0; i < n; i++) {
        if (!out[i] || out[i]->storage->device.type == FM_DEV_CPU) continue;
        fm_tensor *h = fm_tensor_to(out[i], FM_CPU);
        fm_tensor_release(out[i]);
        if (!(out[i] = h)) { snprintf(why, wn, "output %d to the host: %s", i, fm_last_error()); return false; }
    }
    return true;
}

/* The graph exported to ONNX, reloaded and run on the same inputs: 1 pass, 0
 * fail, -1 refused by the exporter. */
static int export_case(const char *dir, fm_graph *g, fm_tensor *const *in, const char *const *names, int nin, int nout,
                       char *why, size_t wn) {
    char path[512];
    snprintf(path, sizeof path, "/tmp/fathom_onnx_export_%d.onnx", (int)getpid());
    if (fm_graph_export_onnx(g, path)) { snprintf(why, wn, "export: %s", fm_last_error()); return -1; }
    fm_onnx_model *m = fm_onnx_load(path);
    fm_tensor *out[64] = {0};
    int ok = m && nout <= 64 && fm_onnx_run(m, nin, names, in, out) == FM_OK;
    if (!ok) snprintf(why, wn, "exported model: %s", fm_last_error());
    if (ok && !outputs_to_host(out, nout, why, wn)) ok = 0;
    char pb[4200], nm[128], w[256];
    for (int i = 0; ok && i < nout; i++) {
        snprintf(pb, sizeof pb, "%s/test_data_set_0/output_%d.pb", dir, i);
        fm_tensor *want = read_pb(pb, nm, sizeof nm);
        if (!want || !outputs_match(out[i], want, w, sizeof w)) {
            snprintf(why, wn, "exported output %d: %s", i, want ? w : fm_last_error());
            ok = 0;
        }
        fm_tensor_release(want);
    }
    for (int i = 0; i < 64; i++) fm_tensor_release(out[i]);
    fm_onnx_free(m);
    unlink(path);
    return ok;
}

/* The graph form of a passing case on the same inputs (model order): 1 pass,
 * 0 fail, -1 refused by the converter; why says what happened. */
static int graph_case(const char *dir, fm_onnx_model *m, fm_tensor *const *in, const char *const *names, int nin,
                      char *why, size_t wn, int *exported, fm_device dev) {
    fm_graph *g = fm_onnx_to_graph(m);
    if (!g) { snprintf(why, wn, "%s", fm_last_error()); return -1; }
    int nout = fm_graph_num_outputs(g), ok = 1;
    if (dev.type != FM_DEV_CPU && fm_graph_to_device(g, dev) != FM_OK) { /* a graph runs where its constants are */
        snprintf(why, wn, "graph to the device: %s", fm_last_error());
        ok = 0;
    }
    fm_tensor *out[64] = {0};
    if (nout > 64 || nout != fm_onnx_output_count(m)) {
        snprintf(why, wn, "graph has %d outputs; the model %d", nout, fm_onnx_output_count(m));
        ok = 0;
    }
    const char *onames[64];
    for (int i = 0; i < nout && i < 64; i++) onames[i] = fm_onnx_output_name(m, i);
    if (ok && fm_graph_run_named(g, nin, names, in, nout, onames, out) != FM_OK) {
        snprintf(why, wn, "%s", fm_last_error());
        ok = 0;
    }
    if (ok && !outputs_to_host(out, nout, why, wn)) ok = 0;
    if (ok && dev.type != FM_DEV_CPU && fm_graph_to_device(g, FM_CPU) != FM_OK) { /* the exporter reads host memory */
        snprintf(why, wn, "graph back to the host: %s", fm_last_error());
        ok = 0;
    }
    char path[4200], nm[128], w[256];
    for (int i = 0; ok && i < nout; i++) {
        snprintf(path, sizeof path, "%s/test_data_set_0/output_%d.pb", dir, i);
        fm_tensor *want = read_pb(path, nm, sizeof nm);
        if (!want || !outputs_match(out[i], want, w, sizeof w)) {
            snprintf(why, wn, "graph output %d: %s", i, want ? w : fm_last_error());
            ok = 0;
        }
        fm_tensor_release(want);
    }
    for (int i = 0; i < 64; i++) fm_tensor_release(out[i]);
    if (ok) *exported = export_case(dir, g, in, names, nin, fm_onnx_output_count(m), why, wn);
    fm_graph_free(g);
    return ok;
}

/* The graph form of a passing case (r->graph), counted in r. */
static void graph_check(const char *dir, fm_onnx_model *m, fm_tensor *const *in, const char *const *names, bool by_name, int nin,
                        suite_result *r) {
    const char *model_names[64];
    for (int i = 0; i < nin; i++) model_names[i] = by_name ? names[i] : fm_onnx_input_name(m, i);
    char gw[1024] = "";
    int ex = -2, g = graph_case(dir, m, in, model_names, nin, gw, sizeof gw, &ex, r->dev);
    if (g > 0) r->graph_pass++;
    else if (g == 0) r->graph_fail++;
    else r->graph_refused++;
    if (g <= 0 && r->list) fprintf(r->list, "%s\tgraph %s\t%s\n", dir, g ? "refused" : "FAIL", gw);
    if (ex > 0) r->export_pass++;
    else if (ex == 0) r->export_fail++;
    else if (ex == -1) r->export_refused++;
    if (ex >= -1 && ex <= 0 && r->list) fprintf(r->list, "%s\texport %s\t%s\n", dir, ex ? "refused" : "FAIL", gw);
}

static bool same_device(fm_device a, fm_device b) { return a.type == b.type && a.index == b.index; }

/* Output i (a tensor, or a sequence or optional) checked to be on dev and brought to the host. */
static bool output_home(fm_tensor **t, onnx_value **v, int i, fm_device dev, bool check_dev, char *why, size_t wn) {
    fm_device d = FM_CPU;
    bool has = *t ? (d = (*t)->storage->device, true) : onnx_value_device(*v, &d);
    if (has && check_dev && !same_device(d, dev)) {
        snprintf(why, wn, "output %d is on another device than the inputs", i);
        return false;
    }
    if (!has || d.type == FM_DEV_CPU) return true;
    if (*t) {
        fm_tensor *h = fm_tensor_to(*t, FM_CPU);
        fm_tensor_release(*t);
        *t = h;
    } else {
        onnx_value *h = onnx_value_to(*v, FM_CPU);
        onnx_value_release(*v);
        *v = h;
    }
    if (!*t && !*v) snprintf(why, wn, "output %d to the host: %s", i, fm_last_error());
    return *t || *v;
}

/* The case's inputs (in model order; a name each where the files give one) on r->dev:
 * the number read, or -1 (why says why). */
static int read_inputs(const char *dir, fm_onnx_model *m, fm_tensor **in, onnx_value **xin, char names_buf[][128], bool *by_name,
                       const suite_result *r, char *why, size_t wn) {
    char path[4200];
    int nin = 0;
    *by_name = true;
    for (; nin < 64; nin++) {
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", dir, nin);
        if (access(path, R_OK)) break;
        if (!read_data(path, nin < m->n_inputs ? &m->inputs[nin] : NULL, &in[nin], &xin[nin], names_buf[nin], 128)) {
            snprintf(why, wn, "input %d: %s", nin, fm_last_error());
            return -1;
        }
        *by_name &= names_buf[nin][0] != 0;
        if (r->dev.type == FM_DEV_CPU) continue;
        fm_tensor *d = in[nin] ? fm_tensor_to(in[nin], r->dev) : NULL;
        onnx_value *dv = xin[nin] ? onnx_value_to(xin[nin], r->dev) : NULL;
        fm_tensor_release(in[nin]);
        onnx_value_release(xin[nin]);
        in[nin] = d, xin[nin] = dv;
        if (!d && !dv) {
            snprintf(why, wn, "input %d to the device: %s", nin, fm_last_error());
            return -1;
        }
    }
    return nin;
}

/* Output i against output_i.pb (false: why says why). */
static bool output_matches(const char *dir, fm_onnx_model *m, int i, const fm_tensor *got, const onnx_value *xgot, char *why,
                           size_t wn) {
    char path[4200], nm[128], w[256];
    snprintf(path, sizeof path, "%s/test_data_set_0/output_%d.pb", dir, i);
    fm_tensor *want = NULL;
    onnx_value *xwant = NULL;
    bool ok = read_data(path, &m->out_decl[i], &want, &xwant, nm, sizeof nm);
    if (!ok) snprintf(w, sizeof w, "%s", fm_last_error());
    else if (want && !got) {
        snprintf(w, sizeof w, "%s, expected a tensor", onnx_value_what(xgot));
        ok = false;
    } else ok = want ? outputs_match(got, want, w, sizeof w) : values_match(xgot, xwant, w, sizeof w);
    if (!ok) snprintf(why, wn, "output %d '%s': %s", i, fm_onnx_output_name(m, i), w);
    fm_tensor_release(want);
    onnx_value_release(xwant);
    return ok;
}

/* Runs one case: C_PASS or C_FAIL (why says what failed). */
static case_kind run_case(const char *dir, fm_onnx_model *m, char *why, size_t wn, suite_result *r) {
    fm_tensor *in[64] = {0}, *out[64] = {0};
    onnx_value *xin[64] = {0}, *xout[64] = {0};
    char names_buf[64][128];
    const char *names[64];
    int nout = fm_onnx_output_count(m);
    bool by_name = true, ok = true;
    int nin = read_inputs(dir, m, in, xin, names_buf, &by_name, r, why, wn);
    for (int i = 0; i < nin; i++) names[i] = names_buf[i];
    if (nin < 0) ok = false;
    else if (nout > 64) ok = false, snprintf(why, wn, "too many outputs");
    else if (onnx_execute_values(m, nin, by_name ? (const char *const *)names : NULL, in, xin, out, xout)) {
        snprintf(why, wn, "%s", fm_last_error());
        ok = false;
    }
    bool on_dev = false; /* no input holding a tensor (none, or empty optionals): it runs on the CPU */
    fm_device d;
    for (int i = 0; i < nin; i++) on_dev |= in[i] || onnx_value_device(xin[i], &d);
    for (int i = 0; ok && i < nout; i++)
        ok = output_home(&out[i], &xout[i], i, r->dev, on_dev && r->dev.type != FM_DEV_CPU, why, wn);
    for (int i = 0; ok && i < nout; i++) ok = output_matches(dir, m, i, out[i], xout[i], why, wn);
    if (ok && r->graph) graph_check(dir, m, in, names, by_name, nin, r);
    for (int i = 0; i < 64; i++) {
        fm_tensor_release_n(2, in[i], out[i]);
        onnx_value_release(xin[i]);
        onnx_value_release(xout[i]);
    }
    return ok ? C_PASS : C_FAIL;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static case_kind one_case(const char *dir, char *why, size_t wn, suite_result *r) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n)) { snprintf(why, wn, "%s", fm_last_error()); return C_FAIL; }
    Onnx__ModelProto *mp = (Onnx__ModelProto *)onnx_unpack(&onnx__model_proto__descriptor, buf, n, path);
    free(buf);
    if (!mp || !mp->graph) {
        snprintf(why, wn, "%s", mp ? "no graph" : fm_last_error());
        if (mp) protobuf_c_message_free_unpacked(&mp->base, NULL);
        return C_FAIL;
    }
    case_kind k = classify(mp, why, wn);
    protobuf_c_message_free_unpacked(&mp->base, NULL);
    if (k != C_PASS) return k;
    fm_onnx_model *m = fm_onnx_load(path);
    if (!m) { snprintf(why, wn, "%s", fm_last_error()); return C_FAIL; }
    k = run_case(dir, m, why, wn, r);
    fm_onnx_free(m);
    return k;
}

/* Runs every case directory under root; false when root cannot be read. */
static bool run_suite(const char *root, suite_result *r) {
    DIR *d = opendir(root);
    if (!d) return false;
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap && !(names = realloc(names, (cap = cap ? 2 * cap : 256) * sizeof *names))) break;
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        char dir[4096], why[1024] = "";
        snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
        case_kind k = one_case(dir, why, sizeof why, r);
        r->count[k]++;
        if (k != C_PASS && r->list) fprintf(r->list, "%s\t%s\t%s\n", names[i], kind_names[k], why);
        free(names[i]);
    }
    free(names);
    return true;
}
#endif
