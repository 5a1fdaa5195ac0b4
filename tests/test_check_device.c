/* The checked test device (src/backend/check): parsing and naming, copies, the
 * CPU kernels giving bitwise the CPU's results through the device interface
 * (forward and backward of a small conv net, bf16 attention whose kernel makes
 * device temporaries of its own), per-device memory figures and limits, and the
 * point of it all: a host access to device memory, or to a freed block, ends the
 * process with the address named, while other faults still reach their handler. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fathom/autograd.h"
#include "fathom/gpt.h"
#include "fathom/io.h"
#include "fathom/memory.h"
#include "fathom/nn.h"
#include "fathom/ops.h"
#include "fathom/optim.h"
#include "test_util.h"

static const fm_device CHK = {FM_DEV_CHECK, 0};

static void test_parse(void) {
    fm_device d;
    char buf[32];
    CHECK(fm_device_parse("check", &d) == FM_OK && d.type == FM_DEV_CHECK && d.index == 0);
    CHECK(fm_device_parse("check:1", &d) == FM_OK && d.type == FM_DEV_CHECK && d.index == 1);
    CHECK(!strcmp(fm_device_name(d, buf, sizeof buf), "check:1"));
    CHECK(fm_device_parse("cuda:3", &d) == FM_OK && d.type == FM_DEV_CUDA && d.index == 3);
    CHECK(fm_device_parse("cpu", &d) == FM_OK && d.type == FM_DEV_CPU);
    const char *bad[] = {"check:", "checks", "check:x", "check:-1", "check:64", "cuda:", "gpu", "", "cpu:0 "};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(fm_device_parse(bad[i], &d) == FM_ERR_INVALID, "'%s' parsed", bad[i]);
        CHECK_ERR_CONTAINS("expected cpu, cuda, cuda:N, check or check:N");
    }
    CHECK(!fm_device_eq((fm_device){FM_DEV_CHECK, 0}, (fm_device){FM_DEV_CHECK, 1}));
    /* existence: check:0 and check:1 exist, check:2 does not, and cuda says why when absent */
    const char *why = NULL;
    CHECK(fm_device_count(FM_DEV_CHECK, &why) == 2 && fm_device_count(FM_DEV_CPU, NULL) == 1);
    CHECK(fm_device_validate((fm_device){FM_DEV_CHECK, 1}) == FM_OK);
    CHECK(fm_device_validate((fm_device){FM_DEV_CHECK, 2}) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("device check:2 does not exist: this machine has 2 such devices (up to check:1)");
    if (fm_device_count(FM_DEV_CUDA, &why) == 0) {
        CHECK(why && *why);
        CHECK(fm_device_validate((fm_device){FM_DEV_CUDA, 0}) == FM_ERR_UNSUPPORTED);
        CHECK_ERR_CONTAINS("device cuda:0 is not usable: ");
        CHECK_ERR_CONTAINS(why);
    }
}

static fm_tensor *randn(int ndim, const int64_t *shape, uint64_t seed) {
    fm_rng r;
    fm_rng_init(&r, seed);
    return fm_tensor_randn(ndim, shape, FM_F32, &r);
}

static bool same_bits(fm_tensor *a, fm_tensor *b) {
    if (!a || !b || fm_tensor_numel(a) != fm_tensor_numel(b) || a->dtype != b->dtype) return false;
    size_t n = fm_tensor_nbytes(a);
    char *x = malloc(n), *y = malloc(n);
    bool ok = x && y && fm_tensor_copy_to_host(a, x, a->dtype) == FM_OK && fm_tensor_copy_to_host(b, y, b->dtype) == FM_OK &&
              !memcmp(x, y, n);
    free(x);
    free(y);
    return ok;
}

static void test_copies(void) {
    float src[5] = {1, -2, 3.5f, 4, 1e-3f};
    fm_tensor *h = fm_tensor_from_data(src, 1, (int64_t[]){5}, FM_F32);
    fm_tensor *d = fm_tensor_to(h, CHK);
    CHECK(d && fm_tensor_device(d).type == FM_DEV_CHECK);
    fm_tensor *back = d ? fm_tensor_to(d, FM_CPU) : NULL;
    CHECK(back && !memcmp(fm_tensor_data(back), src, sizeof src));
    fm_tensor *one = d ? fm_slice(d, 0, 2, 3, 1) : NULL;
    CHECK(one && fm_tensor_item(one) == 3.5);
    fm_tensor_release(one);
    /* a strided view of a device tensor to the host, and a device fill */
    fm_tensor *z = fm_tensor_full(2, (int64_t[]){3, 4}, 2.5, FM_F32, CHK);
    fm_tensor *zt = z ? fm_transpose(z, 0, 1) : NULL;
    float out[12] = {0};
    CHECK(zt && fm_tensor_copy_to_host(zt, out, FM_F32) == FM_OK && out[0] == 2.5f && out[11] == 2.5f);
    /* the host-only element access refuses device tensors instead of reading them */
    CHECK(d && isnan(fm_tensor_get(d, 0)));
    fm_tensor_release_n(5, h, d, back, z, zt);
}

/* conv -> batch norm -> relu -> max pool -> linear -> cross entropy, forward and
 * backward, on `dev`; returns the loss and the gradients of the three weights. */
static void conv_net(fm_device dev, fm_tensor *out[4]) {
    fm_tensor *hx = randn(4, (int64_t[]){4, 2, 8, 8}, 1), *hw = randn(4, (int64_t[]){6, 2, 3, 3}, 2);
    fm_tensor *hl = randn(2, (int64_t[]){5, 6 * 3 * 3}, 3), *hb = randn(1, (int64_t[]){6}, 4);
    int64_t tgt[4] = {0, 3, 4, 1};
    fm_tensor *ht = fm_tensor_from_data(tgt, 1, (int64_t[]){4}, FM_I64);
    fm_tensor *x = fm_tensor_to(hx, dev), *w = fm_tensor_to(hw, dev), *l = fm_tensor_to(hl, dev);
    fm_tensor *b = fm_tensor_to(hb, dev), *t = fm_tensor_to(ht, dev);
    fm_tensor_requires_grad_(w, true);
    fm_tensor_requires_grad_(l, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor *rm = fm_tensor_zeros(1, (int64_t[]){6}, FM_F32, dev), *rv = fm_tensor_ones(1, (int64_t[]){6}, FM_F32, dev);
    fm_conv2d_params cp = fm_conv2d_default_params();
    fm_pool2d_params pp = {.kernel = {2, 2}, .stride = {2, 2}, .layout = FM_NCHW};
    fm_tensor *c = fm_conv2d(x, w, b, &cp);
    fm_tensor *n = fm_batch_norm(c, NULL, NULL, rm, rv, true, 0.1, 1e-5, FM_NCHW);
    fm_tensor *r = fm_relu(n), *p = fm_max_pool2d(r, &pp);
    fm_tensor *f = fm_reshape(p, 2, (int64_t[]){4, -1});
    fm_tensor *y = fm_linear(f, l, NULL);
    fm_tensor *loss = fm_cross_entropy(y, t, -100, 0.0, FM_REDUCE_MEAN);
    CHECK_MSG(loss != NULL, "%s", fm_last_error());
    CHECK(loss && fm_backward(loss, NULL, false) == FM_OK);
    out[0] = loss;
    out[1] = fm_tensor_retain(w->grad);
    out[2] = fm_tensor_retain(l->grad);
    out[3] = rm; /* the running mean, updated in place on the device */
    fm_tensor_release_n(16, hx, hw, hl, hb, ht, x, w, l, b, t, rv, c, n, r, p, f);
    fm_tensor_release(y);
}

static void test_bitwise_conv_net(void) {
    fm_tensor *cpu[4], *chk[4];
    conv_net(FM_CPU, cpu);
    conv_net(CHK, chk);
    for (int i = 0; i < 4; i++) {
        CHECK_MSG(chk[i] && fm_tensor_device(chk[i]).type == FM_DEV_CHECK, "result %d not on the device", i);
        CHECK_MSG(same_bits(cpu[i], chk[i]), "result %d differs from the cpu's", i);
        fm_tensor_release(cpu[i]);
        fm_tensor_release(chk[i]);
    }
}

/* bf16 attention: the CPU's low-precision wrapper widens to f32 scratch that it
 * allocates on the call's device, inside the kernel (a kernel-scope block). */
static void test_bitwise_lowp_attention(void) {
    fm_tensor *res[2][2];
    for (int k = 0; k < 2; k++) {
        fm_device dev = k ? CHK : FM_CPU;
        fm_tensor *h = randn(4, (int64_t[]){2, 2, 5, 8}, 7);
        fm_tensor *hb = fm_to_dtype(h, FM_BF16);
        fm_tensor *q = fm_tensor_to(hb, dev);
        fm_tensor_requires_grad_(q, true);
        fm_tensor *o = fm_scaled_dot_product_attention(q, q, q, true, 0);
        fm_tensor *o32 = o ? fm_to_dtype(o, FM_F32) : NULL;
        fm_tensor *s = o32 ? fm_sum(o32, 0, NULL, false) : NULL;
        CHECK_MSG(s != NULL, "%s", fm_last_error());
        CHECK(s && fm_backward(s, NULL, false) == FM_OK);
        res[k][0] = o;
        res[k][1] = fm_tensor_retain(q->grad);
        fm_tensor_release_n(5, h, hb, q, o32, s);
    }
    CHECK(same_bits(res[0][0], res[1][0]));
    CHECK(same_bits(res[0][1], res[1][1]));
    for (int k = 0; k < 2; k++) fm_tensor_release_n(2, res[k][0], res[k][1]);
}

static void test_memory(void) {
    fm_memory_stats s0, s1, c1;
    CHECK(fm_memory_stats_get(CHK, &s0) == FM_OK);
    fm_mem_category prev = fm_memory_tag_push(FM_MEM_WEIGHTS);
    fm_tensor *t = fm_tensor_zeros(1, (int64_t[]){100000}, FM_F32, CHK);
    fm_memory_tag_pop(prev);
    CHECK(fm_memory_stats_get(CHK, &s1) == FM_OK);
    CHECK(s1.allocated >= s0.allocated + 400000 && s1.by_category[FM_MEM_WEIGHTS] >= s0.by_category[FM_MEM_WEIGHTS] + 400000);
    CHECK(s1.allocated_peak >= s1.allocated && s1.reserved >= s1.allocated);
    /* check:1 keeps its own figures */
    CHECK(fm_memory_stats_get((fm_device){FM_DEV_CHECK, 1}, &c1) == FM_OK && c1.allocated == 0);
    fm_tensor_release(t);
    CHECK(fm_memory_stats_get(CHK, &s1) == FM_OK && s1.allocated == s0.allocated);
    /* a limit fails the allocation with the figures */
    CHECK(fm_memory_set_limit(CHK, s1.allocated + 8192) == FM_OK);
    CHECK(fm_tensor_empty(1, (int64_t[]){1 << 20}, FM_F32, CHK) == NULL);
    CHECK_ERR_CONTAINS("out of memory");
    CHECK(fm_memory_set_limit(CHK, 0) == FM_OK);
    fm_memory_empty_cache(CHK);
    /* an index past the devices */
    CHECK(fm_tensor_empty(1, (int64_t[]){4}, FM_F32, (fm_device){FM_DEV_CHECK, 7}) == NULL);
    CHECK_ERR_CONTAINS("device check:7 does not exist");
    CHECK(fm_memory_stats_get((fm_device){FM_DEV_CHECK, 7}, &c1) != FM_OK);
    CHECK_ERR_CONTAINS("out of range");
}

/* An MLP trained for 6 steps on dev (made on the cpu, moved with fm_module_to,
 * so both runs start from the same weights), with gradient clipping; the
 * losses, norms and a saved checkpoint's bytes come back. */
typedef struct run_out { double loss[6], norm[6]; char *file; size_t file_len; } run_out;

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    *len = b ? fread(b, 1, (size_t)n, f) : 0;
    fclose(f);
    return b;
}

static void train_mlp(fm_device dev, bool sgd, const char *dir, run_out *r) {
    memset(r, 0, sizeof *r);
    fm_rng rng;
    fm_rng_init(&rng, 42);
    fm_module *m = fm_nn_sequential();
    fm_sequential_add(m, fm_nn_linear(8, 16, true, &rng));
    fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
    fm_sequential_add(m, fm_nn_linear(16, 4, true, &rng));
    CHECK_MSG(fm_module_to(m, dev) == FM_OK, "%s", fm_last_error());
    fm_optim *o = sgd ? fm_optim_sgd(m, 0.1, 0.9, 1e-4) : fm_optim_adamw(m, 1e-2, 0.9, 0.999, 1e-8, 0.01);
    CHECK_MSG(o != NULL, "%s", fm_last_error());
    fm_tensor *hx = randn(2, (int64_t[]){32, 8}, 5);
    int64_t ys[32];
    for (int i = 0; i < 32; i++) ys[i] = i % 4;
    fm_tensor *hy = fm_tensor_from_data(ys, 1, (int64_t[]){32}, FM_I64);
    fm_tensor *x = fm_tensor_to(hx, dev), *y = fm_tensor_to(hy, dev);
    for (int s = 0; o && s < 6; s++) {
        fm_optim_zero_grad(o);
        fm_tensor *out = fm_module_forward(m, x);
        fm_tensor *loss = out ? fm_cross_entropy(out, y, -100, 0.0, FM_REDUCE_MEAN) : NULL;
        CHECK_MSG(loss && fm_backward(loss, NULL, false) == FM_OK, "%s", fm_last_error());
        CHECK(fm_optim_clip_grad_norm(o, 0.5, &r->norm[s]) == FM_OK);
        fm_mem_category prev = fm_memory_tag_push(FM_MEM_OPTIMIZER);
        CHECK_MSG(fm_optim_step(o) == FM_OK, "%s", fm_last_error());
        fm_memory_tag_pop(prev);
        r->loss[s] = loss ? fm_tensor_item(loss) : NAN;
        fm_tensor_release_n(2, out, loss);
    }
    /* where things live: gradients and optimizer state on the parameters' device */
    fm_named_list ps = {0}, os = {0};
    CHECK(fm_module_parameters(m, &ps) == FM_OK && ps.n == 4);
    for (int i = 0; i < ps.n; i++)
        CHECK(fm_device_eq(fm_tensor_device(ps.items[i].tensor), dev) && ps.items[i].tensor->grad &&
              fm_device_eq(fm_tensor_device(ps.items[i].tensor->grad), dev));
    CHECK(o && fm_optim_state(o, &os) == FM_OK && os.n == (sgd ? 4 : 8));
    for (int i = 0; i < os.n; i++) CHECK(fm_device_eq(fm_tensor_device(os.items[i].tensor), dev));
    /* a checkpoint written from the device */
    char path[512];
    snprintf(path, sizeof path, "%s/%s-%d.safetensors", dir, sgd ? "sgd" : "adamw", (int)dev.type);
    fm_named_list state = {0};
    CHECK(fm_module_state(m, &state) == FM_OK);
    CHECK_MSG(fm_safetensors_save(path, &state, NULL) == FM_OK, "%s", fm_last_error());
    r->file = slurp(path, &r->file_len);
    fm_named_list_free(&state);
    fm_named_list_free(&ps);
    fm_named_list_free(&os);
    fm_tensor_release_n(4, hx, hy, x, y);
    fm_optim_free(o);
    fm_module_free(m);
}

/* Training through the device path gives the CPU's bits: losses, clipped norms
 * and the checkpoint file (device-independent); the file loads into a model on
 * either device (resuming on another device), and the memory report is per device. */
static void test_train_on_device(void) {
    char dir[] = "/tmp/fathom_check_XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    for (int sgd = 0; sgd < 2; sgd++) {
        run_out a, b;
        fm_memory_reset_peak(CHK);
        train_mlp(FM_CPU, sgd, dir, &a);
        train_mlp(CHK, sgd, dir, &b);
        for (int s = 0; s < 6; s++) {
            CHECK_MSG(a.loss[s] == b.loss[s] && a.norm[s] == b.norm[s], "%s step %d: cpu loss %.9g norm %.9g, check %.9g %.9g",
                      sgd ? "sgd" : "adamw", s, a.loss[s], a.norm[s], b.loss[s], b.norm[s]);
        }
        CHECK(a.loss[5] < a.loss[0]);
        CHECK_MSG(a.file && b.file && a.file_len == b.file_len && !memcmp(a.file, b.file, a.file_len),
                  "%s: the checkpoints written from cpu and check differ", sgd ? "sgd" : "adamw");
        free(a.file);
        free(b.file);
        fm_memory_report rep;
        CHECK(fm_memory_report_get(CHK, &rep) == FM_OK && rep.peak[FM_MEM_WEIGHTS] > 0 && rep.peak[FM_MEM_OPTIMIZER] > 0 &&
              rep.peak_allocated >= rep.peak[FM_MEM_WEIGHTS]);
    }
    /* the cpu's checkpoint loaded into a model on the check device */
    char path[600];
    snprintf(path, sizeof path, "%s/adamw-%d.safetensors", dir, (int)FM_DEV_CPU);
    fm_module *m = fm_nn_sequential();
    fm_sequential_add(m, fm_nn_linear(8, 16, true, NULL));
    fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU));
    fm_sequential_add(m, fm_nn_linear(16, 4, true, NULL));
    fm_named_list st = {0}, back = {0};
    CHECK(fm_module_to(m, CHK) == FM_OK && fm_module_state(m, &st) == FM_OK);
    CHECK_MSG(fm_safetensors_load_into(path, &st, NULL) == FM_OK, "%s", fm_last_error());
    CHECK(fm_safetensors_load(path, &back, NULL) == FM_OK && back.n == st.n);
    for (int i = 0; i < st.n && i < back.n; i++) CHECK(same_bits(st.items[i].tensor, back.items[i].tensor));
    fm_named_list_free(&st);
    fm_named_list_free(&back);
    /* a device that does not exist is refused before anything moves */
    CHECK(fm_module_to(m, (fm_device){FM_DEV_CHECK, 5}) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("check:5 does not exist");
    fm_module_free(m);
    for (int sgd = 0; sgd < 2; sgd++)
        for (int d = 0; d < 3; d += 2) {
            snprintf(path, sizeof path, "%s/%s-%d.safetensors", dir, sgd ? "sgd" : "adamw", d);
            remove(path);
        }
    rmdir(dir);
}

/* A small GPT (both architectures) moved to dev: 4 AdamW steps with the loss
 * the model computes, then greedy generation with the KV cache on the device. */
static void train_gpt(fm_device dev, fm_gpt_arch arch, double loss_out[4], int32_t toks[8]) {
    fm_gpt_config c = fm_gpt_config_default(arch);
    c.n_layer = 2; c.n_head = 4; c.n_embd = 32; c.block_size = 16; c.vocab_size = 64;
    c.ffn_hidden = arch == FM_GPT_LLAMA ? 96 : 128;
    c.n_kv_head = arch == FM_GPT_LLAMA ? 2 : 4;
    c.dropout = 0;
    fm_rng r;
    fm_rng_init(&r, 3);
    fm_gpt *m = fm_gpt_new(&c, &r);
    CHECK_MSG(m && fm_gpt_to(m, dev) == FM_OK, "%s", fm_last_error());
    CHECK(m && fm_device_eq(fm_gpt_device(m), dev));
    fm_optim_config oc = fm_optim_default_config(FM_OPTIM_ADAMW);
    oc.lr = 3e-3;
    fm_optim *o = fm_optim_new(&oc);
    int g = fm_optim_add_group(o, 0.01);
    const fm_named_list *ps = m ? fm_gpt_parameters(m) : NULL;
    for (int i = 0; ps && i < ps->n; i++) CHECK(fm_optim_add_param(o, g, ps->items[i].name, ps->items[i].tensor) == FM_OK);
    int64_t ids[2 * 16], tg[2 * 16];
    for (int i = 0; i < 32; i++) { ids[i] = (i * 7 + 3) % 64; tg[i] = (i * 7 + 10) % 64; }
    fm_tensor *hi = fm_tensor_from_data(ids, 2, (int64_t[]){2, 16}, FM_I64), *ht = fm_tensor_from_data(tg, 2, (int64_t[]){2, 16}, FM_I64);
    fm_tensor *x = fm_tensor_to(hi, dev), *y = fm_tensor_to(ht, dev);
    for (int s = 0; m && s < 4; s++) {
        fm_optim_zero_grad(o);
        fm_tensor *loss = NULL, *logits = fm_gpt_forward(m, x, y, &loss);
        CHECK_MSG(logits && loss && fm_backward(loss, NULL, false) == FM_OK, "%s", fm_last_error());
        CHECK_MSG(fm_optim_step(o) == FM_OK, "%s", fm_last_error());
        loss_out[s] = loss ? fm_tensor_item(loss) : NAN;
        fm_tensor_release_n(2, logits, loss);
    }
    fm_gpt_sample_params sp = {0, 0, 1, 1};
    int32_t prompt[3] = {1, 2, 3};
    int n = 0;
    memset(toks, 0, 8 * sizeof *toks);
    CHECK_MSG(m && fm_gpt_generate(m, prompt, 3, 8, &sp, true, toks, &n, NULL, NULL, NULL) == FM_OK && n == 8, "%s",
              fm_last_error());
    fm_tensor_release_n(4, hi, ht, x, y);
    fm_optim_free(o);
    fm_gpt_free(m);
}

static void test_gpt_on_device(void) {
    for (int arch = 0; arch < 2; arch++) {
        double la[4], lb[4];
        int32_t ta[8], tb[8];
        train_gpt(FM_CPU, (fm_gpt_arch)arch, la, ta);
        train_gpt(CHK, (fm_gpt_arch)arch, lb, tb);
        for (int s = 0; s < 4; s++)
            CHECK_MSG(la[s] == lb[s], "gpt arch %d step %d: cpu %.9g, check %.9g", arch, s, la[s], lb[s]);
        CHECK(la[3] < la[0]);
        CHECK_MSG(!memcmp(ta, tb, sizeof ta), "gpt arch %d: generated tokens differ between cpu and check", arch);
    }
}

/* BatchNorm2d as a module on the device: its num_batches_tracked counter is
 * counted there (it was incremented through a host pointer: a host access). */
static void test_batchnorm_module(void) {
    fm_module *m = fm_nn_batchnorm2d(3, 1e-5, 0.1);
    CHECK(m && fm_module_to(m, CHK) == FM_OK);
    fm_tensor *hx = randn(4, (int64_t[]){2, 3, 4, 4}, 9), *x = fm_tensor_to(hx, CHK);
    fm_tensor *y1 = m ? fm_module_forward(m, x) : NULL, *y2 = y1 ? fm_module_forward(m, x) : NULL;
    CHECK_MSG(y2 != NULL, "%s", fm_last_error());
    fm_named_list st = {0};
    CHECK(m && fm_module_state(m, &st) == FM_OK);
    int i = fm_named_list_find(&st, "num_batches_tracked");
    CHECK(i >= 0 && fm_device_eq(fm_tensor_device(st.items[i].tensor), CHK) && fm_tensor_item(st.items[i].tensor) == 2);
    fm_named_list_free(&st);
    fm_tensor_release_n(4, hx, x, y1, y2);
    fm_module_free(m);
}

/* Runs fn in a child; returns its stderr (static buffer) and how it ended. */
static const char *in_child(void (*fn)(void), int *status) {
    static char buf[4096];
    int fds[2];
    buf[0] = 0;
    if (pipe(fds) != 0) return buf;
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        signal(SIGABRT, SIG_DFL);
        fn();
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while ((r = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(fds[0]);
    waitpid(pid, status, 0);
    return buf;
}

static volatile float g_sink;
static void host_read(void) {
    fm_tensor *t = fm_tensor_ones(1, (int64_t[]){16}, FM_F32, CHK);
    g_sink = ((float *)fm_tensor_data(t))[3];
}
static void host_write(void) {
    fm_tensor *t = fm_tensor_ones(1, (int64_t[]){16}, FM_F32, CHK);
    ((float *)fm_tensor_data(t))[15] = 1;
}
static void use_after_free(void) {
    fm_tensor *t = fm_tensor_ones(1, (int64_t[]){16}, FM_F32, CHK);
    float *p = fm_tensor_data(t);
    fm_tensor_release(t);
    g_sink = p[0];
}
static void other_fault(void) {
    fm_tensor *t = fm_tensor_ones(1, (int64_t[]){16}, FM_F32, CHK); /* the handler is installed */
    fm_tensor_release(t);
    raise(SIGSEGV);
}

static void test_host_access_faults(void) {
    if (getenv("FATHOM_UNDER_VALGRIND")) {
        TEST_SKIP("host-access faults: valgrind reports the deliberate faults of the children itself");
        return;
    }
    int st;
    const char *err = in_child(host_read, &st);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "read: status %d", st);
    CHECK_MSG(strstr(err, "host access to check-device memory at 0x") && strstr(err, "byte 12 of a block of 64 bytes"),
              "read: stderr was: %s", err);
    err = in_child(host_write, &st);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(err, "byte 60 of a block"), "write: %s", err);
    err = in_child(use_after_free, &st);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(err, "FREED block"), "use after free: %s", err);
    /* a fault that is not ours goes to the handler that was there (the default: SIGSEGV) */
    err = in_child(other_fault, &st);
    CHECK_MSG(WIFSIGNALED(st) && !strstr(err, "check-device"), "other fault: status %d, %s", st, err);
}

/* bf16 parameters with f32 master weights (src/optim) on the check device: 4 AdamW
 * steps with clipping give the cpu run's parameter, master and moments bit for bit,
 * so the master path (widen, update, round back) never touches device memory from
 * the host. */
static void test_master_weights_on_device(void) {
    fm_device devs[2] = {FM_CPU, CHK};
    fm_tensor *out[2][3] = {{0}};
    int64_t n = 3000;
    for (int d = 0; d < 2; d++) {
        fm_tensor *f = randn(1, &n, 50), *h = fm_to_dtype(f, FM_BF16);
        fm_tensor *p = fm_tensor_to(h, devs[d]);
        fm_tensor_requires_grad_(p, true);
        fm_optim_config c = fm_optim_default_config(FM_OPTIM_ADAMW);
        c.lr = 1e-2;
        fm_optim *o = fm_optim_new(&c);
        CHECK(fm_optim_add_param(o, fm_optim_add_group(o, 0.1), "w", p) == FM_OK);
        for (int s = 0; s < 4; s++) {
            fm_tensor *g = randn(1, &n, 60 + s), *g16 = fm_to_dtype(g, FM_BF16);
            p->grad = fm_tensor_to(g16, devs[d]);
            CHECK(fm_optim_clip_grad_norm(o, 20.0, NULL) == FM_OK);
            CHECK(fm_optim_step(o) == FM_OK);
            fm_optim_zero_grad(o);
            fm_tensor_release_n(2, g, g16);
        }
        fm_named_list l;
        CHECK(fm_optim_state(o, &l) == FM_OK && l.n == 3);
        out[d][0] = fm_tensor_retain(p);
        for (int i = 0; i < l.n && i < 3; i++)
            if (strstr(l.items[i].name, "master_weight")) out[d][1] = fm_tensor_retain(l.items[i].tensor);
            else if (strstr(l.items[i].name, "exp_avg_sq")) out[d][2] = fm_tensor_retain(l.items[i].tensor);
        fm_named_list_free(&l);
        CHECK(out[d][1] && out[d][1]->dtype == FM_F32 && fm_device_eq(fm_tensor_device(out[d][1]), devs[d]));
        fm_optim_free(o);
        fm_tensor_release_n(3, f, h, p);
    }
    for (int k = 0; k < 3; k++) CHECK_MSG(same_bits(out[0][k], out[1][k]), "master weights: tensor %d differs on check", k);
    for (int d = 0; d < 2; d++) fm_tensor_release_n(3, out[d][0], out[d][1], out[d][2]);
}

int main(void) {
    test_parse();
    test_copies();
    test_bitwise_conv_net();
    test_bitwise_lowp_attention();
    test_memory();
    test_train_on_device();
    test_gpt_on_device();
    test_batchnorm_module();
    test_master_weights_on_device();
    test_host_access_faults();
    TEST_DONE();
}
