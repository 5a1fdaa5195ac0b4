/* A served model's config in Triton's protobuf text (config.pbtxt, src/serve/pbtxt.c)
 * and its JSON form (config.json): the same fields give the same configuration;
 * malformed text is refused naming the file, line and column. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve/model_config.h"
#include "serve/pbtxt.h"
#include "test_util.h"

/* A config as Triton's docs and model repositories write them: comments, lists,
 * repeated blocks, enum names, a map, fields fathom does not read. */
static const char *triton_cfg =
    "# a Triton model configuration\n"
    "name: \"mnist\"\n"
    "platform: \"onnxruntime_onnx\"\n"
    "max_batch_size: 64\n"
    "input [\n"
    "  {\n"
    "    name: \"input\"\n"
    "    data_type: TYPE_FP32\n"
    "    format: FORMAT_NCHW\n"
    "    dims: [ 1, 28, 28 ]\n"
    "  }\n"
    "]\n"
    "output {\n"
    "  name: 'logits', data_type: TYPE_FP32; dims: 10   # one dim, written once\n"
    "  label_filename: \"labels.txt\"\n"
    "}\n"
    "instance_group [ { count: 2, kind: KIND_CPU } ]\n"
    "dynamic_batching {\n"
    "  preferred_batch_size: [ 16, 32 ]\n"
    "  max_queue_delay_microseconds: 0x7d0\n"
    "  default_queue_policy { max_queue_size: 256 default_timeout_microseconds: 0 }\n"
    "}\n"
    "version_policy: { specific: { versions: [1, 3] } }\n"
    "parameters { key: \"intra_op_thread_count\" value: { string_value: \"2\" } }\n"
    "parameters { key: \"inter_op_thread_count\" value: { string_value: \"1\" } }\n"
    "optimization { execution_accelerators { cpu_execution_accelerator : [ { name : \"openvino\" } ] } }\n"
    "model_warmup [{ name: \"w\" batch_size: 1 inputs { key: \"input\" value: { data_type: TYPE_FP32 dims: [1, 28, 28] "
    "zero_data: true } } }]\n";

static json_t *parse(const char *text) { return fm_pbtxt_to_json(text, strlen(text), "cfg.pbtxt"); }

static void test_to_json(void) {
    json_t *j = parse(triton_cfg);
    CHECK_MSG(j != NULL, "%s", fm_last_error());
    if (!j) return;
    CHECK(!strcmp(json_string_value(json_object_get(j, "name")), "mnist"));
    CHECK(json_integer_value(json_object_get(j, "max_batch_size")) == 64);
    json_t *in = json_object_get(j, "input"), *out = json_object_get(j, "output");
    CHECK(json_is_array(in) && json_array_size(in) == 1);
    CHECK(json_is_array(out) && json_array_size(out) == 1); /* repeated: an array though written once */
    json_t *dims = json_object_get(json_array_get(in, 0), "dims");
    CHECK(json_array_size(dims) == 3 && json_integer_value(json_array_get(dims, 2)) == 28);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(in, 0), "data_type")), "TYPE_FP32"));
    json_t *odims = json_object_get(json_array_get(out, 0), "dims");
    CHECK(json_is_array(odims) && json_array_size(odims) == 1 && json_integer_value(json_array_get(odims, 0)) == 10);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(out, 0), "name")), "logits"));
    json_t *db = json_object_get(j, "dynamic_batching");
    CHECK(json_integer_value(json_object_get(db, "max_queue_delay_microseconds")) == 2000);
    CHECK(json_array_size(json_object_get(db, "preferred_batch_size")) == 2);
    json_t *params = json_object_get(j, "parameters");
    CHECK(json_is_object(params) && json_object_size(params) == 2);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(params, "inter_op_thread_count"), "string_value")), "1"));
    json_decref(j);

    /* the scalar forms: strings join and unescape, numbers keep their kind, booleans */
    j = parse("a: \"x\\ty\" 'z\\x41\\101\\u00e9'\nb: -1.5e3\nc: 2.5f\nd: true\ne: False\nf: -inf\ng: 0755\n");
    CHECK_MSG(j != NULL, "%s", fm_last_error());
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "a")), "x\tyzAA\xc3\xa9"));
    CHECK(j && json_real_value(json_object_get(j, "b")) == -1500.0 && json_real_value(json_object_get(j, "c")) == 2.5);
    CHECK(j && json_is_true(json_object_get(j, "d")) && json_is_false(json_object_get(j, "e")));
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "f")), "-inf"));
    CHECK(j && json_integer_value(json_object_get(j, "g")) == 0755);
    json_decref(j);

    /* a field fathom does not read, given twice, keeps both values; one it reads may not */
    j = parse("label_filename: 'a' label_filename: 'b'");
    CHECK(j && json_array_size(json_object_get(j, "label_filename")) == 2);
    json_decref(j);
    j = parse("");
    CHECK(j && json_object_size(j) == 0);
    json_decref(j);
}

static void expect_bad(const char *text, const char *where_at, const char *needle) {
    json_t *j = parse(text);
    CHECK_MSG(j == NULL, "accepted: %s", text);
    json_decref(j);
    CHECK_MSG(strstr(fm_last_error(), where_at) && strstr(fm_last_error(), needle), "for %s: %s", text, fm_last_error());
}

static void test_errors(void) {
    expect_bad("max_batch_size: 8\nmax_batch_size: 16\n", "cfg.pbtxt:2:1:", "given twice");
    expect_bad("input {\n  name: \"x\"\n", "cfg.pbtxt:3:1:", "'}' is missing");
    expect_bad("dims: [1, 2\n", "cfg.pbtxt:2:1:", "inside a list");
    expect_bad("dims: [1 2]", "cfg.pbtxt:1:10:", "expected ',' or ']'");
    expect_bad("name \"x\"", "cfg.pbtxt:1:6:", "expected ':' or '{'");
    expect_bad("name: \"abc\n\"", "cfg.pbtxt:1:7:", "no closing quote");
    expect_bad("name: 'a\\q'", "cfg.pbtxt:1:9:", "unknown escape");
    expect_bad("x: 99999999999999999999", "cfg.pbtxt:1:4:", "64 bits");
    expect_bad("x: 1.2.3", "cfg.pbtxt:1:4:", "not a number");
    expect_bad("[ext.field]: 1", "cfg.pbtxt:1:1:", "extension");
    expect_bad("x: 'a\\xff'", "cfg.pbtxt:1:4:", "UTF-8");
    expect_bad("x: }", "cfg.pbtxt:1:4:", "expected a value");
    expect_bad("x: 1 }", "cfg.pbtxt:1:6:", "expected a field name");
    expect_bad("parameters { value: 'v' }", "cfg.pbtxt:1:1:", "needs a key");
    expect_bad("parameters { key: 'k' } parameters { key: 'k' }", "cfg.pbtxt:1:25:", "twice in the map");
    char deep[400] = "";
    for (int i = 0; i < 70; i++) strcat(deep, "a{");
    expect_bad(deep, "cfg.pbtxt:1:", "nested more than 64");
    json_t *j = fm_pbtxt_to_json("a: 1\0b: 2", 9, "cfg.pbtxt");
    CHECK(j == NULL && strstr(fm_last_error(), "NUL"));
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* The same configuration from config.pbtxt and from its JSON form */
static void test_load(void) {
    char dir[] = "/tmp/fathom_test_serve_config_XXXXXX", mdir[128], p[160];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(mdir, sizeof mdir, "%s/mnist", dir);
    mkdir(mdir, 0700);
    snprintf(p, sizeof p, "%s/config.pbtxt", mdir);
    write_file(p, triton_cfg);
    fm_model_config a, b;
    CHECK_MSG(fm_model_config_load(&a, mdir, "mnist") == FM_OK, "%s", fm_last_error());
    CHECK(a.max_batch_size == 64 && a.n_inputs == 1 && a.inputs[0].ndim == 3 && a.inputs[0].dims[0] == 1);
    CHECK(a.n_outputs == 1 && a.outputs[0].ndim == 1 && a.outputs[0].dims[0] == 10 && !strcmp(a.outputs[0].name, "logits"));
    CHECK(a.dynamic_batching && a.n_preferred == 2 && a.preferred[1] == 32 && a.max_queue_delay_us == 2000);
    CHECK(a.max_queue_size == 256 && a.instance_count == 2 && a.device_set && a.device.type == FM_DEV_CPU);
    CHECK(a.policy == FM_VP_SPECIFIC && a.n_specific == 2 && a.specific[1] == 3 && !strcmp(a.platform, "fathom_onnx"));

    json_t *j = fm_model_config_json(&a, "fathom_onnx");
    char *js = json_dumps(j, 0);
    json_decref(j);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", mdir);
    write_file(p, js);
    free(js);
    CHECK_MSG(fm_model_config_load(&b, mdir, "mnist") == FM_OK, "%s", fm_last_error());
    CHECK(b.max_batch_size == a.max_batch_size && b.n_preferred == a.n_preferred && b.max_queue_delay_us == a.max_queue_delay_us &&
          b.instance_count == a.instance_count && b.policy == a.policy && b.n_specific == a.n_specific &&
          b.outputs[0].dims[0] == 10 && b.inputs[0].dims[2] == 28);

    /* both files: refused, naming both */
    snprintf(p, sizeof p, "%s/config.pbtxt", mdir);
    write_file(p, "max_batch_size: 8\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("both config.pbtxt and config.json");
    snprintf(p, sizeof p, "%s/config.json", mdir);
    unlink(p);
    /* a field's error from the pbtxt names the file; the name must match the folder */
    snprintf(p, sizeof p, "%s/config.pbtxt", mdir);
    write_file(p, "name: \"other\"\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("mnist/config.pbtxt");
    write_file(p, "max_batch_size: 8\ninput [ { name: \"x\" data_type: TYPE_QUATERNION dims: [ 3 ] } ]\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("data_type");
    write_file(p, "max_batch_size: 8\ninput [ { name: \"x\" \n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("config.pbtxt:3:1:");
    /* Triton's max_batch_size 0 (no batching) reads; with dynamic_batching it is refused */
    write_file(p, "max_batch_size: 0\ninput [ { name: \"x\" data_type: TYPE_FP32 dims: [ 2, 4 ] } ]\n");
    CHECK_MSG(fm_model_config_load(&b, mdir, "mnist") == FM_OK, "%s", fm_last_error());
    CHECK(b.max_batch_size == 0 && b.max_batch_size_set && b.inputs[0].ndim == 2 && b.inputs[0].dims[0] == 2);
    write_file(p, "max_batch_size: 0\ndynamic_batching { }\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("needs max_batch_size >= 1");
    /* reshape (Triton's densenet_onnx config): read, and a size mismatch refused */
    write_file(p, "max_batch_size: 0\ninput [ { name: \"data_0\" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ]\n"
                  "  reshape { shape: [ 1, 3, 224, 224 ] } } ]\n");
    CHECK_MSG(fm_model_config_load(&b, mdir, "mnist") == FM_OK, "%s", fm_last_error());
    CHECK(b.inputs[0].has_reshape && b.inputs[0].reshape_ndim == 4 && b.inputs[0].reshape[3] == 224 && b.inputs[0].ndim == 3);
    write_file(p, "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]\n");
    CHECK_MSG(fm_model_config_load(&b, mdir, "mnist") == FM_OK, "%s", fm_last_error());
    CHECK(b.inputs[0].has_reshape && b.inputs[0].reshape_ndim == 0);
    write_file(p, "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 4 ] } } ]\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("dims hold 6 elements but reshape.shape 4");
    write_file(p, "input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 2147483648, 2147483648, 2147483648 ]\n"
                  "  reshape { shape: [ 4 ] } } ]\n"); /* a product past int64: refused, not overflowed */
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("more than 2^62 elements");
    /* instance groups: KIND_AUTO is the server's device; gpus names the GPU; several GPUs refused */
    write_file(p, "instance_group [ { count: 2 kind: KIND_AUTO } ]\n");
    CHECK_MSG(fm_model_config_load(&b, mdir, "mnist") == FM_OK, "%s", fm_last_error());
    CHECK(b.instance_count == 2 && !b.device_set);
    write_file(p, "instance_group [ { kind: KIND_GPU gpus: [ 1 ] } ]\n");
    CHECK_MSG(fm_model_config_load(&b, mdir, "mnist") == FM_OK, "%s", fm_last_error());
    CHECK(b.device_set && b.device.type == FM_DEV_CUDA && b.device.index == 1);
    write_file(p, "instance_group [ { kind: KIND_GPU gpus: [ 0, 1 ] } ]\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("must list one GPU index");
    write_file(p, "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("KIND_CPU takes no");
    /* stateful, ensemble and decoupled configurations are refused, not ignored */
    write_file(p, "sequence_batching { max_sequence_idle_microseconds: 5000000 }\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("sequence_batching");
    write_file(p, "ensemble_scheduling { step [ { model_name: \"a\" model_version: -1 } ] }\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("ensemble_scheduling");
    write_file(p, "model_transaction_policy { decoupled: True }\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("decoupled");
    write_file(p, "model_transaction_policy { decoupled: false }\n");
    CHECK_MSG(fm_model_config_load(&b, mdir, "mnist") == FM_OK, "%s", fm_last_error());
    write_file(p, "max_batch_size: -1\n");
    CHECK(fm_model_config_load(&b, mdir, "mnist") != FM_OK);
    CHECK_ERR_CONTAINS("'max_batch_size' is -1");
    unlink(p);
    rmdir(mdir);
    rmdir(dir);
}

int main(void) {
    test_to_json();
    test_errors();
    test_load();
    TEST_DONE();
}
