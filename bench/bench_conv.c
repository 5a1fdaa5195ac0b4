/* bench_conv: conv2d forward and forward+backward at the fashion-cnn shapes
 * (N=64, 3x3, pad 1; 1->32 and 32->64 channels at 28x28 and 14x14), side by side
 * with PyTorch when it can be imported, same thread count, one JSON line each:
 *   {"bench":"conv2d_fwd_bwd","shape":"...","metric":"ms","fathom":..,"gflops":..,
 *    "peer":"torch","peer_value":..,"ratio":..,"threads":..}
 * ratio = fathom ms / peer ms (lower is better). The first layer's input needs
 * no gradient (as in a real network), so its backward computes dW and db only.
 * Each side's value is the median of --iters steps; the two sides alternate for
 * --rounds rounds and each keeps its best round (robust on a shared machine).
 * Usage: bench_conv [--no-peer] [--iters N] [--rounds R] [--layout nchw|nhwc]
 * The peer runs through $FATHOM_BENCH_PYTHON, else .venv/bin/python, else python3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "fathom/autograd.h"
#include "fathom/ops.h"
#include "core/parallel.h" /* fm_num_threads, for the report */

typedef struct shape_case { int cin, cout, hw; bool x_grad; } shape_case;
static const shape_case k_cases[] = {
    {1, 32, 28, false}, {32, 64, 28, true}, {1, 32, 14, false}, {32, 64, 14, true},
};
enum { N_CASES = sizeof k_cases / sizeof k_cases[0], BATCH = 64 };

/* One timed step; returns 0 on success. */
static int run_step(fm_tensor *x, fm_tensor *w, fm_tensor *b, const fm_conv2d_params *p, bool backward, fm_tensor *g) {
    fm_tensor *y = fm_conv2d(x, w, b, p);
    if (!y) return 1;
    int rc = 0;
    if (backward) {
        rc = fm_backward(y, g, false) != FM_OK;
        fm_tensor_zero_grad(x);
        fm_tensor_zero_grad(w);
        fm_tensor_zero_grad(b);
    }
    fm_tensor_release(y);
    return rc;
}

/* Median ms over `iters` runs after two warm-up runs. */
static double time_case(const shape_case *c, fm_layout layout, bool backward, int iters) {
    fm_rng r;
    fm_rng_init(&r, 7);
    int64_t xs[4] = {BATCH, c->cin, c->hw, c->hw}, ys[4] = {BATCH, c->cout, c->hw, c->hw};
    if (layout == FM_NHWC) {
        xs[1] = c->hw; xs[2] = c->hw; xs[3] = c->cin;
        ys[1] = c->hw; ys[2] = c->hw; ys[3] = c->cout;
    }
    fm_tensor *x = fm_tensor_randn(4, xs, FM_F32, &r);
    fm_tensor *w = fm_tensor_randn(4, (int64_t[]){c->cout, c->cin, 3, 3}, FM_F32, &r);
    fm_tensor *b = fm_tensor_randn(1, (int64_t[]){c->cout}, FM_F32, &r);
    fm_tensor *g = fm_tensor_ones(4, ys, FM_F32, FM_CPU);
    if (backward) {
        fm_tensor_requires_grad_(x, c->x_grad);
        fm_tensor_requires_grad_(w, true);
        fm_tensor_requires_grad_(b, true);
    }
    fm_conv2d_params p = fm_conv2d_default_params();
    p.padding[0] = p.padding[1] = 1;
    p.layout = layout;
    double *t = malloc(sizeof(double) * (size_t)iters), med = -1;
    for (int i = 0; i < 2; i++)
        if (run_step(x, w, b, &p, backward, g)) goto out;
    for (int i = 0; i < iters; i++) {
        double t0 = bench_now_ms();
        if (run_step(x, w, b, &p, backward, g)) goto out;
        t[i] = bench_now_ms() - t0;
    }
    qsort(t, (size_t)iters, sizeof(double), bench_cmp_d);
    med = t[iters / 2];
out:
    if (med < 0) fprintf(stderr, "bench_conv: %s\n", fm_last_error());
    free(t);
    fm_tensor_release_n(4, x, w, b, g);
    return med;
}

/* The PyTorch peer: one process kept alive over two pipes, fed one case per
 * line ("cin cout hw x_grad backward iters"), answering the median ms, so the
 * two sides can be measured alternately (a shared machine's load then hits
 * both about equally). */
static const char *k_peer_py =
    "import sys,time,torch\n"
    "torch.set_num_threads(int(sys.argv[1])); cl=sys.argv[2]=='nhwc'; F=torch.nn.functional\n"
    "print('torch', torch.__version__, flush=True)\n"
    "for line in sys.stdin:\n"
    "  cin,cout,hw,xg,bwd,it=map(int,line.split())\n"
    "  torch.manual_seed(0)\n"
    "  x=torch.randn(64,cin,hw,hw); w=torch.randn(cout,cin,3,3); b=torch.randn(cout)\n"
    "  if cl: x=x.to(memory_format=torch.channels_last); w=w.to(memory_format=torch.channels_last)\n"
    "  if bwd: x.requires_grad_(bool(xg)); w.requires_grad_(True); b.requires_grad_(True)\n"
    "  def step():\n"
    "    if bwd:\n"
    "      y=F.conv2d(x,w,b,padding=1); y.backward(torch.ones_like(y)); x.grad=None; w.grad=None; b.grad=None\n"
    "    else:\n"
    "      with torch.no_grad(): F.conv2d(x,w,b,padding=1)\n"
    "  step(); step(); ts=[]\n"
    "  for i in range(it):\n"
    "    t0=time.perf_counter(); step(); ts.append((time.perf_counter()-t0)*1e3)\n"
    "  ts.sort(); print(ts[len(ts)//2], flush=True)\n";

typedef struct peer { FILE *to, *from; pid_t pid; char path[64]; char version[64]; } peer;

static int peer_start(peer *p, int threads, fm_layout layout) {
    memset(p, 0, sizeof *p);
    const char *py = getenv("FATHOM_BENCH_PYTHON");
    if (!py) py = access(".venv/bin/python", X_OK) == 0 ? ".venv/bin/python" : "python3";
    snprintf(p->path, sizeof p->path, "/tmp/fathom_bench_conv_XXXXXX");
    int fd = mkstemp(p->path);
    if (fd < 0) return 1;
    FILE *f = fdopen(fd, "w");
    fputs(k_peer_py, f);
    fclose(f);
    int in[2], out[2];
    if (pipe(in) || pipe(out)) { unlink(p->path); return 1; }
    char tbuf[16];
    snprintf(tbuf, sizeof tbuf, "%d", threads);
    p->pid = fork();
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 2);
        close(in[1]);
        close(out[0]);
        execlp(py, py, p->path, tbuf, layout == FM_NHWC ? "nhwc" : "nchw", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if (p->pid < 0) { close(in[1]); close(out[0]); unlink(p->path); return 1; }
    p->to = fdopen(in[1], "w");
    p->from = fdopen(out[0], "r");
    char line[128];
    if (!p->from || !fgets(line, sizeof line, p->from) || strncmp(line, "torch ", 6)) return 1;
    line[strcspn(line, "\n")] = 0;
    line[40] = 0; /* a version string, never longer */
    snprintf(p->version, sizeof p->version, "torch %.32s", line + 6);
    return 0;
}

static double peer_time(peer *p, const shape_case *c, bool backward, int iters) {
    char line[128];
    fprintf(p->to, "%d %d %d %d %d %d\n", c->cin, c->cout, c->hw, c->x_grad, backward, iters);
    fflush(p->to);
    if (!fgets(line, sizeof line, p->from)) return -1;
    return atof(line);
}

static void peer_stop(peer *p) {
    if (p->to) fclose(p->to);
    if (p->from) fclose(p->from);
    if (p->pid > 0) waitpid(p->pid, NULL, 0);
    if (p->path[0]) unlink(p->path);
}

int main(int argc, char **argv) {
    bool use_peer = true;
    int iters = 10, rounds = 3;
    fm_layout layout = FM_NCHW;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-peer")) use_peer = false;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--layout") && i + 1 < argc) layout = strcmp(argv[++i], "nhwc") ? FM_NCHW : FM_NHWC;
        else {
            fprintf(stderr, "usage: bench_conv [--no-peer] [--iters N] [--rounds R] [--layout nchw|nhwc]\n");
            return 2;
        }
    }
    if (iters < 1) iters = 1;
    if (rounds < 1) rounds = 1;
    int threads = fm_num_threads();
    peer pr;
    bool have_peer = use_peer && peer_start(&pr, threads, layout) == 0;
    if (use_peer && !have_peer) fprintf(stderr, "bench_conv: no PyTorch peer (set FATHOM_BENCH_PYTHON); fathom only\n");
    for (int i = 0; i < N_CASES; i++) {
        const shape_case *c = &k_cases[i];
        double fwd_flop = 2.0 * BATCH * c->cout * c->hw * c->hw * c->cin * 9;
        for (int bwd = 0; bwd < 2; bwd++) {
            double ms = -1, pms = -1;
            for (int r = 0; r < rounds; r++) { /* alternate the two sides; keep each side's best round */
                double m = time_case(c, layout, bwd, iters);
                if (m < 0) return 1;
                if (ms < 0 || m < ms) ms = m;
                if (have_peer) {
                    double q = peer_time(&pr, c, bwd, iters);
                    if (q > 0 && (pms < 0 || q < pms)) pms = q;
                }
            }
            double flop = fwd_flop * (bwd ? (c->x_grad ? 3 : 2) : 1);
            printf("{\"bench\":\"conv2d_%s\",\"shape\":\"N%d C%d->%d %dx%d k3 p1 %s%s\",\"metric\":\"ms\",\"fathom\":%.3f,"
                   "\"gflops\":%.1f",
                   bwd ? "fwd_bwd" : "fwd", BATCH, c->cin, c->cout, c->hw, c->hw, layout == FM_NHWC ? "nhwc" : "nchw",
                   bwd && !c->x_grad ? " (no dx)" : "", ms, flop / ms / 1e6);
            if (have_peer && pms > 0)
                printf(",\"peer\":\"%s\",\"peer_value\":%.3f,\"peer_gflops\":%.1f,\"ratio\":%.3f", pr.version, pms,
                       flop / pms / 1e6, ms / pms);
            printf(",\"threads\":%d}\n", threads);
            fflush(stdout);
        }
    }
    if (have_peer) peer_stop(&pr);
    fm_parallel_shutdown();
    return 0;
}
