/* Observability: CRC-32C known vectors and TFRecord framing of TensorBoard
 * event files (written, read back, torn and corrupted), progress output on a
 * pseudo-terminal vs a plain file vs quiet, trace summaries (hand-built traces
 * with known splits, truncated and invalid files, a real profiler trace), and
 * plots.
 *
 * `test_observe --write-tb DIR` writes a small log directory and prints
 * "expect TAG=STEP:VALUE" lines: tools/read_tensorboard.py --self-test uses
 * it to check the files with TensorBoard's own reader. */
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pty.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/parallel.h"
#include "fathom/fathom.h"
#include "fathom/gpt.h"
#include "fathom/nn.h"
#include "fathom/observe.h"
#include "fathom/profile.h"
#include "test_util.h"

static char tmpdir[] = "/tmp/fathom_observe_XXXXXX";

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* ---- CRC-32C ---- */
static void test_crc(void) {
    CHECK(fm_crc32c("123456789", 9) == 0xE3069283u);
    unsigned char b[32];
    memset(b, 0, 32);
    CHECK(fm_crc32c(b, 32) == 0x8A9136AAu);
    memset(b, 0xff, 32);
    CHECK(fm_crc32c(b, 32) == 0x62A8AB43u);
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
    CHECK(fm_crc32c(b, 32) == 0x46DD794Eu);
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
    CHECK(fm_crc32c(b, 32) == 0x113FDB5Cu);
    CHECK(fm_crc32c("", 0) == 0);
    CHECK(fm_crc32c_extend(fm_crc32c("1234", 4), "56789", 5) == 0xE3069283u);
    CHECK(fm_tfrecord_mask_crc(0) == 0xa282ead8u);
    uint32_t c = 0x12345678u;
    CHECK(fm_tfrecord_mask_crc(c) == (((c >> 15) | (c << 17)) + 0xa282ead8u));
}

/* ---- TensorBoard ---- */
typedef struct seen { int n_scalar, n_histo; double loss5, histo_num, histo_min, histo_max, histo_sum, bucket_total; } seen;
static void on_value(void *ctx, const char *tag, int64_t step, double wall, double value, const fm_tb_histo *h) {
    seen *s = ctx;
    CHECK(wall > 1e9); /* seconds since 1970 */
    if (h) {
        s->n_histo++;
        s->histo_num = h->num;
        s->histo_min = h->min;
        s->histo_max = h->max;
        s->histo_sum = h->sum;
        for (int i = 0; i < h->n_buckets; i++) s->bucket_total += h->bucket[i];
        CHECK(!strcmp(tag, "weights/w") && step == 3);
        return;
    }
    s->n_scalar++;
    if (!strcmp(tag, "train/loss") && step == 5) s->loss5 = value;
}

static uint64_t le64(const unsigned char *p) { uint64_t v = 0; for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i); return v; }
static uint32_t le32(const unsigned char *p) { uint32_t v = 0; for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i); return v; }

static void test_tensorboard(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/logs/run1", tmpdir); /* parents are created */
    fm_tb_writer *w = fm_tb_writer_open(dir);
    CHECK(w != NULL);
    if (!w) return;
    const char *path = fm_tb_writer_path(w);
    CHECK(strstr(path, "/events.out.tfevents.") != NULL);
    for (int s = 0; s < 10; s++) CHECK(fm_tb_add_scalar(w, "train/loss", s, 1.0 / (s + 1)) == FM_OK);
    CHECK(fm_tb_add_scalar(w, "val/accuracy", 9, 0.875) == FM_OK);
    double v[100];
    for (int i = 0; i < 100; i++) v[i] = i * 0.5 - 10;
    CHECK(fm_tb_add_histogram(w, "weights/w", 3, v, 100) == FM_OK);
    char *saved = strdup(path);
    CHECK(fm_tb_writer_close(w) == FM_OK);

    /* framing by hand: the first record holds file_version */
    size_t len = 0;
    unsigned char *b = (unsigned char *)read_all(saved, &len);
    CHECK(b && len > 16);
    if (b && len > 16) {
        uint64_t n = le64(b);
        CHECK(le32(b + 8) == fm_tfrecord_mask_crc(fm_crc32c(b, 8)));
        CHECK(n + 16 <= len);
        if (n + 16 <= len) {
            CHECK(le32(b + 12 + n) == fm_tfrecord_mask_crc(fm_crc32c(b + 12, n)));
            CHECK(memmem(b + 12, n, "brain.Event:2", 13) != NULL);
            CHECK(b[12] == 0x09); /* field 1 (wall_time), wire type 1 (64-bit) */
            /* the second record: Event{wall_time, step=0, summary{value{tag="train/loss", simple_value=1.0f}}} */
            const unsigned char *r = b + 16 + n;
            uint64_t n2 = le64(r);
            CHECK(le32(r + 8) == fm_tfrecord_mask_crc(fm_crc32c(r, 8)));
            const unsigned char *e = r + 12;
            const unsigned char tail[] = {0x10, 0x00, 0x2A, 0x13, 0x0A, 0x11, 0x0A, 0x0A, 't', 'r', 'a', 'i', 'n', '/', 'l', 'o', 's',
                                          's', 0x15, 0x00, 0x00, 0x80, 0x3F};
            CHECK(n2 == 9 + sizeof tail);
            CHECK(e[0] == 0x09 && n2 >= 9 + sizeof tail && !memcmp(e + 9, tail, sizeof tail));
        }
    }
    free(b);

    seen s = {0};
    int64_t nrec = 0;
    CHECK(fm_tb_read_file(saved, on_value, &s, &nrec) == FM_OK);
    CHECK(nrec == 13);
    CHECK(s.n_scalar == 11 && s.n_histo == 1);
    CHECK_NEAR(s.loss5, 1.0 / 6, 1e-7);
    CHECK_NEAR(s.histo_num, 100, 0);
    CHECK_NEAR(s.histo_min, -10, 0);
    CHECK_NEAR(s.histo_max, 39.5, 0);
    CHECK_NEAR(s.histo_sum, 1475, 1e-12);
    CHECK_NEAR(s.bucket_total, 100, 0);

    /* the directory reader: run subdirectories prefix the tags */
    char logs[512];
    snprintf(logs, sizeof logs, "%s/logs", tmpdir);
    fm_tb_scalars sc;
    CHECK(fm_tb_read_scalars(logs, &sc) == FM_OK);
    const fm_tb_series *loss = fm_tb_scalars_find(&sc, "run1/train/loss");
    CHECK(loss && loss->n == 10);
    if (loss && loss->n == 10) CHECK(loss->step[9] == 9 && fabs(loss->value[9] - 0.1) < 1e-7);
    CHECK(sc.n == 2);
    fm_tb_scalars_free(&sc);

    /* a torn last record (a writer that crashed mid-write) is dropped quietly */
    CHECK(truncate(saved, (off_t)(len - 5)) == 0);
    memset(&s, 0, sizeof s);
    CHECK(fm_tb_read_file(saved, on_value, &s, &nrec) == FM_OK);
    CHECK(nrec == 12 && s.n_histo == 0);
    /* a flipped payload byte is corruption */
    int fd = open(saved, O_RDWR);
    unsigned char x;
    CHECK(pread(fd, &x, 1, 30) == 1);
    x ^= 0x40;
    CHECK(pwrite(fd, &x, 1, 30) == 1);
    close(fd);
    CHECK(fm_tb_read_file(saved, on_value, &s, NULL) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("corrupt record");
    unlink(saved);
    free(saved);

    /* logdir that cannot be written: a path through a regular file */
    char file[512], bad[600];
    snprintf(file, sizeof file, "%s/plainfile", tmpdir);
    write_text(file, "x");
    snprintf(bad, sizeof bad, "%s/sub", file);
    CHECK(fm_tb_writer_open(bad) == NULL);
    CHECK_ERR_CONTAINS("cannot create log directory");
    CHECK(fm_tb_writer_open("") == NULL);
    CHECK(fm_tb_read_scalars("/nonexistent/fathom/logs", &sc) == FM_ERR_IO);
    CHECK(fm_tb_read_scalars(tmpdir, &sc) != FM_OK); /* the only event file is gone: nothing to read */
    CHECK_ERR_CONTAINS("no event files");
    unlink(file);
    /* a non-TFRecord file */
    snprintf(file, sizeof file, "%s/events.out.tfevents.bogus", tmpdir);
    write_text(file, "this is not a tfrecord file at all");
    CHECK(fm_tb_read_file(file, on_value, &s, NULL) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("not a TFRecord");
    unlink(file);
}

/* ---- progress ---- */
static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* What a progress test wrote to a tmpfile (closed), or to a pseudo-terminal's master end. */
static void read_tmpfile(FILE *f, char *buf, size_t cap) {
    long n = ftell(f);
    rewind(f);
    size_t got = fread(buf, 1, n < (long)cap - 1 ? (size_t)n : cap - 1, f);
    buf[got] = 0;
    fclose(f);
    CHECK(got > 0);
}

static void read_pty(int master, char *buf, size_t cap) {
    size_t got = 0;
    fcntl(master, F_SETFL, O_NONBLOCK);
    for (;;) {
        ssize_t k = read(master, buf + got, cap - 1 - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    buf[got] = 0;
    close(master);
}

static void drive(fm_progress *p) {
    for (int i = 1; i <= 100; i++) fm_progress_update(p, i, i * 32, 2.0 / i);
    fm_progress_log(p, "epoch 1: val loss %.3f", 0.5);
    fm_progress_end(p);
}

static void test_progress(void) {
    /* plain: a file */
    FILE *f = tmpfile();
    fm_progress *p = fm_progress_begin("epoch 1/3", 100, "samples", FM_PROGRESS_AUTO, f);
    CHECK(fm_progress_get_mode(p) == FM_PROGRESS_PLAIN);
    drive(p);
    char plain[8192];
    read_tmpfile(f, plain, sizeof plain);
    CHECK(!strchr(plain, '\r') && !strchr(plain, '\033'));
    CHECK_MSG(count(plain, "\n") == 11, "plain output:\n%s", plain); /* 10%..90%, the log line, the final line */
    CHECK(strstr(plain, "epoch 1/3: 10/100 (10%), ETA") != NULL);
    CHECK(strstr(plain, "samples/s") && strstr(plain, "loss 0.0200"));
    CHECK(strstr(plain, "epoch 1/3: done 100/100 (100%) in") != NULL);

    /* a terminal: a pseudo-terminal's slave end */
    int master, slave;
    CHECK(openpty(&master, &slave, NULL, NULL, NULL) == 0);
    FILE *t = fdopen(slave, "w");
    p = fm_progress_begin("epoch 1/3", 100, "samples", FM_PROGRESS_AUTO, t);
    CHECK(fm_progress_get_mode(p) == FM_PROGRESS_TTY);
    drive(p);
    fclose(t);
    char tty[8192];
    read_pty(master, tty, sizeof tty);
    CHECK_MSG(count(tty, "\r\033[K") >= 3, "tty output: %s", tty); /* first draw, final draw, end, log */
    CHECK(strstr(tty, "[========================] 100/100 (100%)") != NULL);
    CHECK(strstr(tty, "epoch 1: val loss 0.500") != NULL);
    CHECK(count(tty, "\n") == 2); /* the log line and the end; redraws never start a new line */
    CHECK(strcmp(tty, plain) != 0);

    /* quiet */
    f = tmpfile();
    p = fm_progress_begin("x", 100, NULL, FM_PROGRESS_QUIET, f);
    drive(p);
    CHECK(ftell(f) == 0);
    fclose(f);
    fm_progress_end(NULL);
}

/* A resumed loop (fm_progress_set_start): the ETA divides by the steps this run
 * made, not by all of them; decile lines start after the resumed point. And
 * fm_progress_clear / fm_progress_cancel on a terminal. */
static void test_progress_resume_clear(void) {
    FILE *f = tmpfile();
    fm_progress *p = fm_progress_begin("train", 100000, "tokens", FM_PROGRESS_PLAIN, f);
    fm_progress_set_start(p, 99990);
    usleep(60 * 1000);
    fm_progress_set_interval(p, 1e-9); /* a line at the next update */
    fm_progress_update(p, 99991, 64, 1.5);
    fm_progress_end(p);
    char out[1024];
    read_tmpfile(f, out, sizeof out);
    /* one step in >= 60 ms with 9 left: ETA >= 0.5 s; counted over all 99991 steps it would be 0:00 */
    CHECK_MSG(strstr(out, "train: 99991/100000 (99%), ETA ") && !strstr(out, "ETA 0:00"), "resumed progress: %s", out);
    CHECK(strstr(out, "train: done 99991/100000 (99%)") != NULL);

    /* deciles: resumed at 55 of 100, the first decile line is at 60, not at the first update */
    f = tmpfile();
    p = fm_progress_begin("train", 100, NULL, FM_PROGRESS_PLAIN, f);
    fm_progress_set_start(p, 55);
    for (int i = 56; i <= 100; i++) fm_progress_update(p, i, 0, NAN);
    fm_progress_end(p);
    read_tmpfile(f, out, sizeof out);
    CHECK_MSG(count(out, "\n") == 5 && !strstr(out, "train: 56/100") && strstr(out, "train: 60/100 (60%)"),
              "resumed deciles: %s", out); /* 60, 70, 80, 90, done */

    int master, slave;
    CHECK(openpty(&master, &slave, NULL, NULL, NULL) == 0);
    FILE *t = fdopen(slave, "w");
    p = fm_progress_begin("train", 10, "tokens", FM_PROGRESS_TTY, t);
    fm_progress_update(p, 1, 8, 2.0);
    fm_progress_clear(p);
    fputs("SAMPLE\n", t);
    fm_progress_update(p, 2, 16, 2.0); /* within 0.1 s of the last draw, but the line was cleared: drawn again */
    fm_progress_cancel(p);
    fputs("ERR\n", t);
    fclose(t);
    char tty[4096];
    read_pty(master, tty, sizeof tty);
    const char *s1 = strstr(tty, "] 1/10 (10%)"), *c = strstr(tty, "\r\033[KSAMPLE"), *s2 = strstr(tty, "] 2/10 (20%)");
    CHECK_MSG(s1 && c && s2 && s1 < c && c < s2, "clear, then redraw: %s", tty);
    CHECK_MSG(strstr(tty, "\r\033[KERR") && !strstr(tty, "done"), "cancel: %s", tty);
    fm_progress_cancel(NULL);
    fm_progress_clear(NULL);
}

/* ---- trace summaries ---- */
/* One 1000 us step: data 100, matmul 300 (compute), add 100 (memory), the
 * autograd engine 300 holding a 200 us backward matmul, an optimizer span of
 * 150 holding an op, 50 us of gaps: overhead = 50 + 100 (engine) = 150. */
static const char *TRACE_EVENTS =
    "[\n"
    "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"fathom\"}},\n"
    "{\"name\":\"data\",\"cat\":\"data\",\"ph\":\"X\",\"ts\":0,\"dur\":100,\"pid\":1,\"tid\":7},\n"
    "{\"name\":\"matmul\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":100,\"dur\":300,\"pid\":1,\"tid\":7,\"args\":{\"flops\":3e8,\"bytes\":1e6,\"out\":\"[64, 64]\",\"device\":\"cpu\"}},\n"
    "{\"name\":\"add\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":400,\"dur\":100,\"pid\":1,\"tid\":7,\"args\":{\"flops\":4096,\"bytes\":49152,\"device\":\"cpu\"}},\n"
    "{\"name\":\"memory\",\"ph\":\"C\",\"ts\":450,\"pid\":1,\"tid\":0,\"args\":{\"allocated\":1024}},\n"
    "{\"name\":\"matmul\",\"cat\":\"backward\",\"ph\":\"X\",\"ts\":550,\"dur\":200,\"pid\":1,\"tid\":7,\"args\":{\"flops\":2e8,\"bytes\":1e6,\"device\":\"cpu\"}},\n"
    "{\"name\":\"backward\",\"cat\":\"autograd\",\"ph\":\"X\",\"ts\":500,\"dur\":300,\"pid\":1,\"tid\":7},\n"
    "{\"name\":\"mul\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":820,\"dur\":80,\"pid\":1,\"tid\":7,\"args\":{\"flops\":100,\"bytes\":1200,\"device\":\"cpu\"}},\n"
    "{\"name\":\"adamw\",\"cat\":\"optimizer\",\"ph\":\"X\",\"ts\":800,\"dur\":150,\"pid\":1,\"tid\":7},\n"
    "{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":0,\"dur\":1000,\"pid\":1,\"tid\":7},\n"
    "{\"name\":\"loader worker\",\"cat\":\"data\",\"ph\":\"X\",\"ts\":0,\"dur\":900,\"pid\":1,\"tid\":9}";

static void check_known_split(const fm_trace_summary *s) {
    CHECK(s->n_steps == 1);
    CHECK_NEAR(s->step_us, 1000, 1e-9);
    CHECK_NEAR(s->compute_us, 500, 1e-9);
    CHECK_NEAR(s->memory_us, 100, 1e-9);
    CHECK_NEAR(s->data_us, 100, 1e-9); /* the loader worker's own track is not waiting */
    CHECK_NEAR(s->optimizer_us, 150, 1e-9);
    CHECK_NEAR(s->overhead_us, 150, 1e-9);
    CHECK_NEAR(s->step_flops, 5e8 + 4096 + 100, 1e-12);
    CHECK_NEAR(s->achieved_gflops, (5e8 + 4196) / 1000 / 1e3, 1e-9);
    CHECK_NEAR(s->gemm_gflops, 5e8 / 500 / 1e3, 1e-9);
    CHECK(!strcmp(s->bottleneck, "compute"));
    CHECK(s->n_ops == 4 && !strcmp(s->ops[0].name, "matmul") && !strcmp(s->ops[1].name, "matmul [bwd]"));
    CHECK(s->n_ops == 4 && s->ops[0].calls == 1 && s->ops[0].compute && !s->ops[2].compute);
}

/* A CUDA run: one 1000 us step whose host spans ran on cuda:0, and the device
 * track with CUDA-event times: a 300 us kernel and a 100 us copy inside the step,
 * and a 50 us kernel after it. GPU busy = 400 us of the step: 60% idle. The
 * device spans stay out of the op table and the split; the host copy is an op. */
static void test_trace_gpu(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/gpu.json", tmpdir);
    write_text(path,
               "[\n"
               "{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":0,\"dur\":1000,\"pid\":1,\"tid\":7},\n"
               "{\"name\":\"copy h2d\",\"cat\":\"memcpy\",\"ph\":\"X\",\"ts\":10,\"dur\":120,\"pid\":1,\"tid\":7,\"args\":{\"bytes\":4e6,\"device\":\"cuda:0\"}},\n"
               "{\"name\":\"matmul\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":200,\"dur\":700,\"pid\":1,\"tid\":7,\"args\":{\"flops\":1e9,\"device\":\"cuda\"}},\n"
               "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1000000000,\"args\":{\"name\":\"cuda:0 kernels\"}},\n"
               "{\"name\":\"memcpy h2d\",\"cat\":\"gpu memcpy\",\"ph\":\"X\",\"ts\":20,\"dur\":100,\"pid\":1,\"tid\":1000000000,\"args\":{\"bytes\":4e6,\"device\":\"cuda:0\"}},\n"
               "{\"name\":\"matmul\",\"cat\":\"gpu kernel\",\"ph\":\"X\",\"ts\":250,\"dur\":300,\"pid\":1,\"tid\":1000000000,\"args\":{\"device\":\"cuda:0\"}},\n"
               "{\"name\":\"add\",\"cat\":\"gpu kernel\",\"ph\":\"X\",\"ts\":1200,\"dur\":50,\"pid\":1,\"tid\":1000000000,\"args\":{\"device\":\"cuda:0\"}}\n"
               "]\n");
    fm_trace_summary s;
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK(s.has_gpu && s.gpu_event_timed);
    CHECK_NEAR(s.gpu_idle_pct, 60, 1e-9);
    CHECK_NEAR(s.step_us, 1000, 1e-9);
    CHECK(s.n_ops == 2); /* matmul and the host copy; no device-track spans */
    int64_t mm = 0, cp = 0;
    for (int i = 0; i < s.n_ops; i++) {
        if (!strcmp(s.ops[i].name, "matmul")) mm = s.ops[i].calls;
        if (!strcmp(s.ops[i].name, "copy h2d")) { cp = s.ops[i].calls; CHECK_NEAR(s.ops[i].bytes, 4e6, 0); }
    }
    CHECK(mm == 1 && cp == 1);
    CHECK_NEAR(s.compute_us, 700, 1e-9);
    CHECK_NEAR(s.memory_us, 120, 1e-9);
    char *js = fm_trace_summary_json(&s);
    CHECK(js && strstr(js, "\"gpu_idle_from_events\": true"));
    free(js);
    fm_trace_summary_free(&s);
}

/* The profiler's own time (args.prof_us of op spans) comes out of the overhead: a 1000 us
 * step with 400 us of ops leaves 600 outside them, 60 of it the profiler's; a trace that
 * charges more than the overhead has is clamped to it, so the parts still add up. */
static void test_trace_profiler_time(void) {
    char path[512], text[4096];
    snprintf(path, sizeof path, "%s/trace_prof.json", tmpdir);
    for (int big = 0; big < 2; big++) {
        snprintf(text, sizeof text,
                 "[\n{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":0,\"dur\":1000,\"pid\":1,\"tid\":7},\n"
                 "{\"name\":\"matmul\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":100,\"dur\":300,\"pid\":1,\"tid\":7,"
                 "\"args\":{\"flops\":3e8,\"bytes\":1e6,\"device\":\"cpu\",\"prof_us\":%s}},\n"
                 "{\"name\":\"add\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":500,\"dur\":100,\"pid\":1,\"tid\":7,"
                 "\"args\":{\"flops\":4096,\"bytes\":49152,\"device\":\"cpu\",\"prof_us\":20}}\n]\n",
                 big ? "5000" : "40");
        write_text(path, text);
        fm_trace_summary s;
        CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
        CHECK_NEAR(s.profiler_us, big ? 600 : 60, 1e-9);
        CHECK_NEAR(s.overhead_us, big ? 0 : 540, 1e-9);
        CHECK_NEAR(s.compute_us + s.memory_us + s.data_us + s.optimizer_us + s.overhead_us + s.profiler_us, s.step_us, 1e-9);
        char *js = fm_trace_summary_json(&s);
        json_error_t err;
        json_t *j = js ? json_loads(js, 0, &err) : NULL;
        CHECK(j && fabs(json_number_value(json_object_get(json_object_get(json_object_get(j, "split"), "profiler"), "ms")) -
                        (big ? 0.6 : 0.06)) < 1e-9);
        json_decref(j);
        free(js);
        fm_trace_summary_free(&s);
    }
    unlink(path);
}

/* bf16 products (args.products): a step of 1000 us with 6e8 FLOPs of bf16 matmul and
 * 2e8 of f32 matmul. Held to 400 GFLOP/s bf16 and 100 f32, the mix's peak is
 * 8e8 / (2e8/100 + 6e8/400) GFLOP/s = 228.57; each verdict branch on its own rates. */
static void test_trace_lowp_products(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/trace_lowp.json", tmpdir);
    write_text(path,
               "[\n{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":0,\"dur\":1000,\"pid\":1,\"tid\":7},\n"
               "{\"name\":\"matmul\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":10,\"dur\":600,\"pid\":1,\"tid\":7,"
               "\"args\":{\"flops\":6e8,\"device\":\"cpu\",\"products\":\"bf16\"}},\n"
               "{\"name\":\"matmul\",\"cat\":\"backward\",\"ph\":\"X\",\"ts\":620,\"dur\":300,\"pid\":1,\"tid\":7,"
               "\"args\":{\"flops\":2e8,\"device\":\"cpu\",\"products\":\"fp8-or-other\"}}\n]\n");
    fm_trace_summary s;
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK_NEAR(s.lowp_flops, 6e8, 0); /* an unknown products value counts as f32 */
    fm_trace_summary_set_peaks(&s, 100, 400);
    CHECK_NEAR(s.peak_gflops, 8e8 / (2e8 / 100 + 6e8 / 400), 1e-9);
    CHECK_NEAR(s.mfu, s.achieved_gflops / s.peak_gflops, 1e-12);
    CHECK(strstr(s.verdict, "already in bf16") != NULL); /* 75% of the FLOPs in bf16 */
    char *js = fm_trace_summary_json(&s);
    json_error_t err;
    json_t *j = js ? json_loads(js, 0, &err) : NULL;
    CHECK(j && json_number_value(json_object_get(j, "lowp_flops")) == 6e8);
    CHECK(j && json_number_value(json_object_get(j, "bf16_peak_gflops")) == 400);
    CHECK(j && json_number_value(json_object_get(j, "f32_peak_gflops")) == 100);
    json_decref(j);
    free(js);
    /* one peak given by hand: the whole mix is held to it */
    fm_trace_summary_set_peak(&s, 300);
    CHECK_NEAR(s.peak_gflops, 300, 0);
    CHECK(!s.lowp_peak_known);
    fm_trace_summary_free(&s);

    /* the same FLOPs all in f32: the verdict names bf16 only where it is faster here */
    write_text(path,
               "[\n{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":0,\"dur\":1000,\"pid\":1,\"tid\":7},\n"
               "{\"name\":\"matmul\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":10,\"dur\":900,\"pid\":1,\"tid\":7,"
               "\"args\":{\"flops\":8e8,\"device\":\"cpu\"}}\n]\n");
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK(s.lowp_flops == 0);
    fm_trace_summary_set_peaks(&s, 1000, 2000);
    CHECK_NEAR(s.peak_gflops, 1000, 0);
    CHECK(strstr(s.verdict, "--precision bf16") != NULL);
    fm_trace_summary_set_peaks(&s, 1000, 0); /* measured: no bf16 hardware path */
    CHECK(strstr(s.verdict, "no faster than f32") != NULL && !strstr(s.verdict, "--precision bf16"));
    fm_trace_summary_set_peaks(&s, 1000, 1100); /* 1.1x: not worth naming */
    CHECK(strstr(s.verdict, "no faster than f32") != NULL);
    fm_trace_summary_free(&s);
    unlink(path);
}

static void test_trace(void) {
    char path[512], text[8192];
    snprintf(path, sizeof path, "%s/trace.json", tmpdir);
    snprintf(text, sizeof text, "%s\n]\n", TRACE_EVENTS);
    write_text(path, text);
    fm_trace_summary s;
    CHECK(fm_trace_summarize(path, 1e5, &s) == FM_OK);
    check_known_split(&s);
    CHECK(!s.truncated && s.n_events == 11);
    CHECK_NEAR(s.mfu, s.achieved_gflops / 1e5, 1e-12);
    CHECK(strstr(s.verdict, "bigger batch") != NULL); /* GEMMs at 1% of the peak: small GEMMs */
    char *js = fm_trace_summary_json(&s);
    json_error_t err;
    json_t *j = js ? json_loads(js, 0, &err) : NULL;
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "bottleneck")), "compute"));
    CHECK(j && json_array_size(json_object_get(j, "ops")) == 4);
    CHECK(j && fabs(json_number_value(json_object_get(json_object_get(json_object_get(j, "split"), "data"), "pct")) - 10) < 1e-9);
    json_decref(j);
    free(js);
    FILE *devnull = fopen("/dev/null", "w");
    fm_trace_summary_print(&s, devnull, 2);
    fclose(devnull);
    fm_trace_summary_free(&s);

    /* still being written: no closing bracket, half an event at the end */
    snprintf(text, sizeof text, "%s,\n{\"name\":\"relu\",\"cat\":\"forw", TRACE_EVENTS);
    write_text(path, text);
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK(s.truncated);
    check_known_split(&s);
    CHECK(s.peak_gflops == 0 && s.mfu == 0);
    fm_trace_summary_free(&s);
    /* cut right after a comma */
    snprintf(text, sizeof text, "%s,\n", TRACE_EVENTS);
    write_text(path, text);
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK && s.truncated);
    fm_trace_summary_free(&s);
    /* the object form */
    snprintf(text, sizeof text, "{\"traceEvents\": %s]}", TRACE_EVENTS);
    write_text(path, text);
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    check_known_split(&s);
    fm_trace_summary_free(&s);

    /* thread ids as real numbers: 3.7 files under thread 3; ones beyond int64 (the fuzzer's 2.4e28) or
       below it file under thread 0 instead of overflowing the conversion (UBSan flags that) */
    write_text(path, "[{\"name\":\"relu\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":0,\"dur\":100,\"pid\":1,\"tid\":2.4e28},"
                     "{\"name\":\"exp\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":100,\"dur\":100,\"pid\":1,\"tid\":-1e300},"
                     "{\"name\":\"tanh\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":200,\"dur\":100,\"pid\":1,\"tid\":3.7}]");
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK(s.n_events == 3);
    fm_trace_summary_free(&s);

    /* data-bound */
    write_text(path, "[{\"name\":\"next batch\",\"cat\":\"data\",\"ph\":\"X\",\"ts\":0,\"dur\":700,\"pid\":1,\"tid\":1},"
                     "{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":700,\"dur\":300,\"pid\":1,\"tid\":1},"
                     "{\"name\":\"relu\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":710,\"dur\":250,\"pid\":1,\"tid\":1}]");
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK_NEAR(s.step_us, 1000, 1e-9); /* the wait before the step counts */
    CHECK_NEAR(s.data_us, 700, 1e-9);
    CHECK(!strcmp(s.bottleneck, "data") && strstr(s.verdict, "workers"));
    fm_trace_summary_free(&s);
    /* no step spans: the op thread's interval; gaps are overhead */
    write_text(path, "[{\"name\":\"relu\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":0,\"dur\":100,\"pid\":1,\"tid\":1},"
                     "{\"name\":\"exp\",\"cat\":\"forward\",\"ph\":\"X\",\"ts\":400,\"dur\":100,\"pid\":1,\"tid\":1}]");
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK(s.n_steps == 0);
    CHECK_NEAR(s.step_us, 500, 1e-9);
    CHECK_NEAR(s.overhead_us, 300, 1e-9);
    CHECK(!strcmp(s.bottleneck, "overhead"));
    fm_trace_summary_free(&s);
    /* no spans at all (an empty array; only metadata and instant events): nothing to sort
     * (qsort(NULL, 0) was undefined behaviour; the sanitizer build's UBSan sees it) */
    const char *empty[] = {"[]", "[{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"main\"}},"
                                 "{\"name\":\"mark\",\"ph\":\"i\",\"ts\":5,\"pid\":1,\"tid\":1}]"};
    write_text(path, empty[0]);
    CHECK(fm_trace_summarize(path, 0, &s) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("holds no trace events");
    fm_trace_summary_free(&s);
    write_text(path, empty[1]); /* events, none of them a span */
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK(s.n_events == 2 && s.n_steps == 0 && s.n_ops == 0 && strstr(s.verdict, "no timed spans"));
    fm_trace_summary_free(&s);

    /* bad input */
    CHECK(fm_trace_summarize("/nonexistent/trace.json", 0, &s) == FM_ERR_IO);
    CHECK_ERR_CONTAINS("cannot read trace");
    write_text(path, "hello, world");
    CHECK(fm_trace_summarize(path, 0, &s) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("not a Chrome trace");
    write_text(path, "[{\"name\":\"a\",\"ph\":\"X\",\"ts\":0,\"dur\":1},\n{\"name\": oops},\n{\"name\":\"b\",\"ph\":\"X\",\"ts\":0}]");
    CHECK(fm_trace_summarize(path, 0, &s) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("line 2");
    write_text(path, "");
    CHECK(fm_trace_summarize(path, 0, &s) == FM_ERR_FORMAT);
    write_text(path, "{\"foo\": 1}");
    CHECK(fm_trace_summarize(path, 0, &s) == FM_ERR_FORMAT);
    CHECK_ERR_CONTAINS("traceEvents");

    /* a real trace from the profiler, still open (the way a crashed run leaves it) */
    CHECK(fm_profiler_start(path) == FM_OK);
    int64_t sa[2] = {32, 48}, sb[2] = {48, 16};
    fm_tensor *a = fm_tensor_randn(2, sa, FM_F32, NULL), *b = fm_tensor_randn(2, sb, FM_F32, NULL);
    for (int i = 0; i < 300; i++) {
        fm_profile_push("step", "step");
        fm_tensor *y = fm_matmul(a, b), *r = fm_relu(y);
        fm_tensor_release_n(2, y, r);
        fm_profile_pop();
    }
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK); /* mid-run: whatever has been flushed so far */
    CHECK(s.truncated && s.n_steps > 10);
    fm_trace_summary_free(&s);
    CHECK(fm_profiler_stop() == FM_OK);
    CHECK(fm_trace_summarize(path, 0, &s) == FM_OK);
    CHECK(s.n_steps == 300 && !s.truncated);
    bool found = false;
    for (int i = 0; i < s.n_ops; i++)
        if (!strcmp(s.ops[i].name, "matmul")) {
            found = true;
            CHECK(s.ops[i].calls == 300);
            CHECK_NEAR(s.ops[i].flops, 300 * 2.0 * 32 * 16 * 48, 0);
        }
    CHECK(found);
    CHECK_NEAR(s.compute_us + s.memory_us + s.data_us + s.optimizer_us + s.overhead_us + s.profiler_us, s.step_us, 1e-6);
    /* the profiler's own time between the 300 ops is measured and kept out of the overhead */
    CHECK_MSG(s.profiler_us > 0 && s.overhead_us >= 0, "profiler %g us, overhead %g us", s.profiler_us, s.overhead_us);
    fm_trace_summary_free(&s);
    fm_tensor_release_n(2, a, b);
    unlink(path);
}

/* ---- plots ---- */
static void test_plot(void) {
    char dir[512], out[600];
    snprintf(dir, sizeof dir, "%s/plotlogs", tmpdir);
    fm_tb_writer *w = fm_tb_writer_open(dir);
    CHECK(w != NULL);
    if (!w) return;
    for (int s = 0; s <= 50; s++) {
        fm_tb_add_scalar(w, "train/loss", s, 2.0 * exp(-s / 10.0) + 0.1);
        fm_tb_add_scalar(w, "train/lr", s, 1e-3 * (1 - s / 50.0));
        fm_tb_add_scalar(w, "train/throughput", s, 5000 + 10 * s);
        if (s % 10 == 0) fm_tb_add_scalar(w, "val/loss", s, 2.0 * exp(-s / 10.0) + 0.2);
    }
    fm_tb_writer_close(w);
    fm_tb_scalars sc;
    CHECK(fm_tb_read_scalars(dir, &sc) == FM_OK);
    CHECK(sc.n == 4);
    snprintf(out, sizeof out, "%s/curves.svg", tmpdir);
    CHECK(fm_plot_curves(&sc, out, "test") == FM_OK);
    char *svg = read_all(out, NULL);
    CHECK(svg && strstr(svg, "<svg") && strstr(svg, "</svg>") && strstr(svg, ">Loss<") && strstr(svg, ">val/loss<") &&
          strstr(svg, ">Learning rate<") && strstr(svg, ">Throughput<") && strstr(svg, "<polyline"));
    free(svg);
    unlink(out);
    snprintf(out, sizeof out, "%s/curves.png", tmpdir);
    if (fm_plot_png_supported()) {
        CHECK(fm_plot_curves(&sc, out, "test") == FM_OK);
        size_t n = 0;
        char *png = read_all(out, &n);
        CHECK(png && n > 1000 && !memcmp(png, "\x89PNG\r\n\x1a\n", 8));
        free(png);
        unlink(out);
    } else {
        CHECK(fm_plot_curves(&sc, out, "test") == FM_ERR_UNSUPPORTED);
    }
    snprintf(out, sizeof out, "%s/curves.gif", tmpdir);
    CHECK(fm_plot_curves(&sc, out, "test") == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS(".svg or .png");
    CHECK(fm_plot_curves(&sc, "/nonexistent/dir/c.svg", "test") == FM_ERR_IO);
    CHECK_ERR_CONTAINS("cannot write");
    fm_tb_scalars_free(&sc);
    fm_tb_scalars empty = {0};
    CHECK(fm_plot_curves(&empty, "/tmp/x.svg", NULL) == FM_ERR_INVALID);
}

/* ---- model summary ---- */
static void test_summary(void) {
    fm_rng rng;
    fm_rng_init(&rng, 1);
    fm_module *m = fm_nn_sequential(), *inner = fm_nn_sequential();
    CHECK(fm_sequential_add(m, fm_nn_linear(4, 8, true, &rng)) == FM_OK);
    CHECK(fm_sequential_add(m, fm_nn_simple(FM_MOD_RELU)) == FM_OK);
    CHECK(fm_sequential_add(inner, fm_nn_linear(8, 3, true, &rng)) == FM_OK);
    CHECK(fm_sequential_add(inner, fm_nn_layernorm(3, 1e-5)) == FM_OK);
    CHECK(fm_sequential_add(m, inner) == FM_OK);
    fm_named_list ps;
    CHECK(fm_module_parameters(m, &ps) == FM_OK);
    int fi = fm_named_list_find(&ps, "2.0.bias");
    CHECK(fi >= 0);
    if (fi >= 0) fm_tensor_requires_grad_(ps.items[fi].tensor, false); /* frozen */
    fm_named_list_free(&ps);
    int64_t in[2] = {5, 4};
    fm_model_summary s;
    CHECK(fm_model_summarize(m, 2, in, &s) == FM_OK);
    CHECK(s.total_params == fm_module_num_params(m));
    CHECK(s.total_params == 4 * 8 + 8 + 8 * 3 + 3 + 3 + 3);
    CHECK(s.frozen == 3 && s.trainable == s.total_params - 3);
    CHECK(s.n == 5); /* linear, relu, the inner sequential and its two children */
    if (s.n == 5) {
        CHECK(!strcmp(s.layers[3].name, "2.0") && s.layers[3].depth == 1);
        CHECK(s.layers[2].container && s.layers[2].params == 8 * 3 + 3 + 6);
        CHECK(s.layers[4].out_ndim == 2 && s.layers[4].out_shape[0] == 5 && s.layers[4].out_shape[1] == 3);
        CHECK_NEAR(s.layers[0].flops, 2.0 * 5 * 4 * 8 + 5 * 8, 0);
        CHECK_NEAR(s.layers[1].flops, 5 * 8, 0);
        CHECK_NEAR(s.layers[2].flops, (2.0 * 5 * 8 * 3 + 5 * 3) + 5.0 * 5 * 3, 0);
        CHECK_NEAR(s.act_bytes, 4.0 * (5 * 8 + 5 * 8 + 5 * 3 + 5 * 3), 0);
    }
    CHECK_NEAR(s.total_flops, (2.0 * 5 * 4 * 8 + 5 * 8) + 5 * 8 + (2.0 * 5 * 8 * 3 + 5 * 3) + 5.0 * 5 * 3, 0);
    char *js = fm_model_summary_json(&s);
    CHECK(js && strstr(js, "\"total_params\": 73"));
    free(js);
    FILE *devnull = fopen("/dev/null", "w");
    fm_model_summary_print(&s, devnull);
    fclose(devnull);
    fm_model_summary_free(&s);
    /* an input the first layer cannot take */
    int64_t bad[2] = {5, 7};
    CHECK(fm_model_summarize(m, 2, bad, &s) != FM_OK);
    CHECK_ERR_CONTAINS("linear 4->8");
    fm_module_free(m);
}

/* Weight and gradient histograms of a parameter list, and fathom's reader listing them. */
static void test_histograms_of_params(void) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/hist", tmpdir);
    int64_t s6[1] = {6}, s4[2] = {2, 2};
    fm_tensor *a = fm_tensor_randn(1, s6, FM_F32, NULL), *b = fm_tensor_randn(2, s4, FM_F32, NULL);
    fm_tensor_requires_grad_(a, true);
    fm_tensor_requires_grad_(b, true);
    fm_tensor *sq = fm_mul(a, a), *l = fm_sum(sq, 0, NULL, false);
    CHECK(fm_backward(l, NULL, false) == FM_OK); /* a gets a gradient, b does not */
    fm_named_list ps = {0};
    CHECK(fm_named_list_push(&ps, "fc.weight", a, false, false) == FM_OK);
    CHECK(fm_named_list_push(&ps, "fc.bias", b, true, false) == FM_OK);
    fm_tb_writer *w = fm_tb_writer_open(dir);
    CHECK(w != NULL);
    CHECK(fm_tb_add_histograms(w, NULL, &ps, false, 7) == FM_OK);
    CHECK(fm_tb_add_histograms(w, NULL, &ps, true, 7) == FM_OK);
    CHECK(fm_tb_add_histograms(w, "grads", &ps, true, 9) == FM_OK);
    CHECK(fm_tb_add_scalar(w, "train/loss", 7, 1.5) == FM_OK);
    CHECK(fm_tb_writer_close(w) == FM_OK);
    fm_tb_scalars sc;
    CHECK(fm_tb_read_scalars(dir, &sc) == FM_OK);
    CHECK(sc.n == 1 && sc.n_histograms == 3); /* weights/fc.weight, weights/fc.bias, grads/fc.weight */
    const fm_tb_series *gw = NULL, *wb = NULL;
    for (int i = 0; i < sc.n_histograms; i++) {
        if (!strcmp(sc.histograms[i].tag, "grads/fc.weight")) gw = &sc.histograms[i];
        if (!strcmp(sc.histograms[i].tag, "weights/fc.bias")) wb = &sc.histograms[i];
        CHECK(strcmp(sc.histograms[i].tag, "grads/fc.bias") != 0); /* no gradient: no histogram */
    }
    CHECK(gw && gw->n == 2 && gw->step[0] == 7 && gw->step[1] == 9 && gw->value[1] == 6);
    CHECK(wb && wb->n == 1 && wb->value[0] == 4);
    fm_tb_scalars_free(&sc);
    CHECK(fm_tb_add_histograms(NULL, NULL, &ps, false, 0) == FM_ERR_INVALID);
    fm_named_list_free(&ps); /* borrowed tensors: freed below */
    fm_tensor_release_n(4, a, b, sq, l);
}

/* ---- GPT summary ---- */
static const fm_layer_summary *find_row(const fm_model_summary *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->layers[i].name, name)) return &s->layers[i];
    return NULL;
}

/* Forward FLOPs the profiler records for one real forward pass, by op name. */
static void traced_forward_flops(fm_gpt *m, int64_t B, int64_t T, double *matmul, double *sdpa) {
    *matmul = *sdpa = 0;
    char path[600];
    snprintf(path, sizeof path, "%s/gpt_trace.json", tmpdir);
    int64_t sh[2] = {B, T};
    fm_tensor *idx = fm_tensor_zeros(2, sh, FM_I64, FM_CPU);
    CHECK(fm_profiler_start(path) == FM_OK);
    bool prev = fm_set_grad_enabled(false);
    fm_tensor *logits = fm_gpt_forward(m, idx, NULL, NULL);
    fm_set_grad_enabled(prev);
    CHECK(fm_profiler_stop() == FM_OK);
    CHECK(logits && logits->ndim == 3 && logits->shape[2] == fm_gpt_get_config(m)->vocab_size);
    fm_tensor_release_n(2, idx, logits);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK(root != NULL);
    for (size_t i = 0; root && i < json_array_size(root); i++) {
        json_t *e = json_array_get(root, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *cat = json_string_value(json_object_get(e, "cat"));
        if (!name || !cat || strcmp(cat, "forward")) continue;
        double f = json_number_value(json_object_get(json_object_get(e, "args"), "flops"));
        if (!strcmp(name, "matmul")) *matmul += f;
        if (!strcmp(name, "scaled_dot_product_attention") || !strcmp(name, "sdpa_qkv")) *sdpa += f; /* unfused / fused */
    }
    json_decref(root);
}

static void test_gpt_summary(void) {
    /* GPT-2 style, with biases: B 2, T 8, C 16, 2 heads of 8, MLP 64, vocab 32, 2 layers */
    fm_gpt_config c = fm_gpt_config_default(FM_GPT_GPT2);
    c.n_layer = 2; c.n_head = 2; c.n_embd = 16; c.block_size = 8; c.vocab_size = 32; c.ffn_hidden = 64;
    fm_rng rng;
    fm_rng_init(&rng, 3);
    fm_gpt *m = fm_gpt_new(&c, &rng);
    CHECK(m != NULL);
    if (!m) return;
    fm_model_summary s;
    CHECK(fm_gpt_summarize(m, 2, 8, &s) == FM_OK);
    /* the count of the built model's tensors, and the same by hand: wte 32*16, wpe 8*16,
     * per block ln_1 2*16, qkv 16*48+48, proj 16*16+16, ln_2 2*16, fc 16*64+64, proj 64*16+16; ln_f 2*16 */
    CHECK(s.total_params == fm_gpt_num_params(m));
    CHECK(s.total_params == 512 + 128 + 2 * (32 + 816 + 272 + 32 + 1088 + 1040) + 32);
    CHECK(s.trainable == s.total_params && s.frozen == 0);
    const fm_layer_summary *head = find_row(&s, "lm_head"), *wte = find_row(&s, "wte"), *h0 = find_row(&s, "h.0");
    CHECK(head && wte && h0);
    if (head && wte && h0) {
        CHECK(head->params == 0 && head->tied_params == 32 * 16 && !strcmp(head->tied_to, "wte.weight"));
        CHECK(wte->params == 32 * 16 && s.tied_params == 32 * 16);
        CHECK(head->out_ndim == 3 && head->out_shape[0] == 2 && head->out_shape[1] == 8 && head->out_shape[2] == 32);
        CHECK_NEAR(head->flops, 2.0 * 16 * 16 * 32, 0); /* B*T rows of a 16 -> 32 GEMM */
        CHECK(h0->container && h0->params == 32 + 816 + 272 + 32 + 1088 + 1040);
        /* one block by hand, B*T = 16 tokens:
         *   ln_1       5 * 16*16                          =  1280
         *   qkv        2*16*16*48 + 16*48 (bias)          = 25344
         *   attention  4*B*H*T*T*D / 2 = 4*2*2*8*8*8 / 2  =  4096  (causal half)
         *   proj       2*16*16*16 + 256 (bias) + 256 (residual) = 8704
         *   ln_2                                          =  1280
         *   fc         2*16*16*64 + 16*64                 = 33792
         *   gelu       16*64                              =  1024
         *   proj       2*16*64*16 + 256 + 256             = 33280 */
        CHECK_NEAR(h0->flops, 108800, 0);
    }
    const fm_layer_summary *fc = find_row(&s, "h.1.mlp.fc");
    CHECK(fc && fc->depth == 2 && fc->out_shape[2] == 64 && fc->params == 1088);
    /* the GEMM and attention terms are what the profiler counts on a real forward pass */
    double mm, sd;
    traced_forward_flops(m, 2, 8, &mm, &sd);
    CHECK_NEAR(mm, 2 * (2.0 * 16 * (16 * 48 + 16 * 16 + 16 * 64 + 64 * 16)) + 2.0 * 16 * 16 * 32, 0);
    const fm_layer_summary *sdpa = find_row(&s, "h.0.attn.sdpa");
    CHECK(sdpa && sdpa->params == 0);
    if (sdpa) CHECK_NEAR(sd, 2 * sdpa->flops, 0);
    char *js = fm_model_summary_json(&s);
    CHECK(js && strstr(js, "\"tied_to\": \"wte.weight\"") && strstr(js, "\"input\": \"token ids\""));
    free(js);
    FILE *devnull = fopen("/dev/null", "w");
    fm_model_summary_print(&s, devnull);
    fclose(devnull);
    fm_model_summary_free(&s);

    /* a frozen tensor is counted as such */
    const fm_named_list *ps = fm_gpt_parameters(m);
    int fi = fm_named_list_find(ps, "h.1.ln_2.weight");
    CHECK(fi >= 0);
    if (fi >= 0) fm_tensor_requires_grad_(ps->items[fi].tensor, false);
    CHECK(fm_gpt_summarize(m, 1, 4, &s) == FM_OK);
    CHECK(s.frozen == 16 && s.trainable == s.total_params - 16);
    const fm_layer_summary *ln = find_row(&s, "h.1.ln_2");
    CHECK(ln && ln->frozen == 16);
    fm_model_summary_free(&s);
    /* a sequence longer than the context, and no model */
    CHECK(fm_gpt_summarize(m, 1, 9, &s) == FM_ERR_INVALID);
    CHECK_ERR_CONTAINS("block_size 8");
    CHECK(fm_gpt_summarize(NULL, 1, 1, &s) == FM_ERR_INVALID);
    fm_gpt_free(m);

    /* Llama style: grouped-query attention (4 heads, 2 kv heads of 16), SwiGLU 172, no biases */
    c = fm_gpt_config_default(FM_GPT_LLAMA);
    c.n_layer = 2; c.n_head = 4; c.n_kv_head = 2; c.n_embd = 64; c.block_size = 32; c.vocab_size = 256; c.ffn_hidden = 172;
    m = fm_gpt_new(&c, &rng);
    CHECK(m != NULL);
    if (!m) return;
    CHECK(fm_gpt_summarize(m, 4, 32, &s) == FM_OK);
    CHECK(s.total_params == fm_gpt_num_params(m));
    /* embed 256*64; per layer: 2 norms 64, q 64*64, k and v 64*32, o 64*64, gate/up/down 3*64*172; final norm 64 */
    CHECK(s.total_params == 256 * 64 + 2 * (2 * 64 + 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 172) + 64);
    const fm_layer_summary *qkv = find_row(&s, "h.0.attn.qkv"), *rope = find_row(&s, "h.0.attn.rope");
    CHECK(qkv && qkv->out_shape[2] == 128 && rope && rope->out_ndim == 4);
    CHECK(find_row(&s, "wpe") == NULL);
    traced_forward_flops(m, 4, 32, &mm, &sd);
    CHECK_NEAR(mm, 2 * (2.0 * 128 * (64 * 128 + 64 * 64 + 64 * 344 + 172 * 64)) + 2.0 * 128 * 64 * 256, 0);
    sdpa = find_row(&s, "h.1.attn.sdpa");
    if (sdpa) CHECK_NEAR(sd, 2 * sdpa->flops, 0);
    fm_model_summary_free(&s);
    fm_gpt_free(m);
}

/* Sample logs for tools/read_tensorboard.py --self-test. */
static int write_tb(const char *dir) {
    fm_tb_writer *w = fm_tb_writer_open(dir);
    if (!w) { fprintf(stderr, "%s\n", fm_last_error()); return 1; }
    for (int s = 0; s < 20; s++) {
        double loss = 2.0 / (1 + s), lr = 0.01 * (s + 1) / 20;
        fm_tb_add_scalar(w, "train/loss", s, loss);
        fm_tb_add_scalar(w, "train/lr", s, lr);
        if (s % 5 == 4) printf("expect train/loss=%d:%.9g\nexpect train/lr=%d:%.9g\n", s, (double)(float)loss, s, (double)(float)lr);
    }
    fm_tb_add_scalar(w, "val/accuracy", 19, 0.9125);
    printf("expect val/accuracy=19:%.9g\n", (double)(float)0.9125);
    double v[256];
    for (int i = 0; i < 256; i++) v[i] = sin(i * 0.1);
    fm_tb_add_histogram(w, "weights/fc1.weight", 19, v, 256);
    printf("expect-histogram weights/fc1.weight\n");
    return fm_tb_writer_close(w) == FM_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-tb")) return write_tb(argv[2]);
    CHECK(mkdtemp(tmpdir) != NULL);
    test_crc();
    test_tensorboard();
    test_progress();
    test_progress_resume_clear();
    test_trace();
    test_trace_profiler_time();
    test_trace_lowp_products();
    test_trace_gpu();
    test_plot();
    test_summary();
    test_histograms_of_params();
    test_gpt_summary();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    CHECK(system(cmd) == 0);
    fm_parallel_shutdown();
    TEST_DONE();
}
