/* Progress reporting for training, evaluation and calibration loops.
 *
 * On a terminal one line is redrawn in place (\r + erase-line), throttled to
 * ten redraws a second so that a fast loop does not spend its time printing.
 * Anywhere else (a log file, CI, a pipe) redraws would pile up as garbage, so
 * plain lines are printed at every tenth of the way and at least every
 * interval. Quiet prints nothing. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "fathom/observe.h"

struct fm_progress {
    FILE *out;
    fm_progress_mode mode;
    char label[128], unit[32];
    int64_t total, done, items;
    int64_t start; /* done at begin (a resumed run): ETA counts only the steps this run has made */
    double loss;
    double t0, last_draw, last_plain, interval;
    int last_decile;
    int64_t last_plain_done;
    bool drawn; /* a TTY line is on screen and has to be erased before other text */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

fm_progress_mode fm_progress_detect(FILE *out) {
    if (!out) out = stderr;
    const char *term = getenv("TERM");
    if (isatty(fileno(out)) && !(term && !strcmp(term, "dumb"))) return FM_PROGRESS_TTY;
    return FM_PROGRESS_PLAIN;
}

fm_progress *fm_progress_begin(const char *label, int64_t total, const char *unit, fm_progress_mode mode, FILE *out) {
    fm_progress *p = calloc(1, sizeof *p);
    if (!p) { fm_set_error(FM_ERR_OOM, "progress: out of memory"); return NULL; }
    p->out = out ? out : stderr;
    p->mode = mode == FM_PROGRESS_AUTO ? fm_progress_detect(p->out) : mode;
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    snprintf(p->unit, sizeof p->unit, "%s", unit && *unit ? unit : "steps");
    p->total = total > 0 ? total : 0;
    p->loss = NAN;
    p->t0 = p->last_plain = now_s();
    p->last_draw = -1;
    p->interval = 30;
    p->last_plain_done = -1;
    return p;
}

void fm_progress_set_start(fm_progress *p, int64_t done) {
    if (!p || done < 0) return;
    p->start = p->done = done;
    if (p->total) p->last_decile = (int)(10 * done / p->total);
}

void fm_progress_set_interval(fm_progress *p, double seconds) {
    if (p && seconds > 0) p->interval = seconds;
}

fm_progress_mode fm_progress_get_mode(const fm_progress *p) { return p ? p->mode : FM_PROGRESS_QUIET; }

static void fmt_duration(double s, char *buf, size_t n) {
    if (!isfinite(s) || s < 0) { snprintf(buf, n, "?"); return; }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void fmt_rate(double r, const char *unit, char *buf, size_t n) {
    if (r >= 1e6) snprintf(buf, n, "%.2fM %s/s", r / 1e6, unit);
    else if (r >= 1e4) snprintf(buf, n, "%.1fk %s/s", r / 1e3, unit);
    else if (r >= 100) snprintf(buf, n, "%.0f %s/s", r, unit);
    else snprintf(buf, n, "%.2f %s/s", r, unit);
}

/* The fields both modes share: "45/100 (45%), ETA 0:12, 1234 samples/s, loss 0.4321". */
static void fmt_fields(const fm_progress *p, double now, bool eta, char *buf, size_t n) {
    double el = now - p->t0;
    char rate[48] = "", dur[32] = "", lossb[48] = "";
    double per = el > 0 ? (p->items > 0 ? p->items : p->done - p->start) / el : 0;
    if (el > 0 && p->done > p->start) fmt_rate(per, p->unit, rate, sizeof rate);
    if (isfinite(p->loss)) snprintf(lossb, sizeof lossb, "loss %.4f", p->loss);
    size_t k = 0;
    if (p->total) k += (size_t)snprintf(buf + k, n - k, "%lld/%lld (%d%%)", (long long)p->done, (long long)p->total,
                                        (int)(100.0 * p->done / p->total));
    else k += (size_t)snprintf(buf + k, n - k, "%lld", (long long)p->done);
    if (k >= n) return;
    if (eta && p->total) {
        if (p->done > p->start) fmt_duration(el * (double)(p->total - p->done) / (double)(p->done - p->start), dur, sizeof dur);
        else snprintf(dur, sizeof dur, "?");
        k += (size_t)snprintf(buf + k, n - k, ", ETA %s", dur);
    } else if (!eta) {
        fmt_duration(el, dur, sizeof dur);
        k += (size_t)snprintf(buf + k, n - k, " in %s", dur);
    }
    if (k < n && *rate) k += (size_t)snprintf(buf + k, n - k, ", %s", rate);
    if (k < n && *lossb) snprintf(buf + k, n - k, ", %s", lossb);
}

static int term_width(FILE *f) {
    struct winsize ws;
    if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20) return ws.ws_col;
    return 80;
}

static void draw_tty(fm_progress *p, double now) {
    char fields[256], line[512];
    fmt_fields(p, now, true, fields, sizeof fields);
    size_t k = 0;
    if (*p->label) k += (size_t)snprintf(line + k, sizeof line - k, "%s ", p->label);
    if (p->total) {
        enum { BAR = 24 };
        int fill = (int)((double)BAR * p->done / p->total);
        if (fill > BAR) fill = BAR;
        char bar[BAR + 1];
        for (int i = 0; i < BAR; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
        bar[BAR] = 0;
        k += (size_t)snprintf(line + k, sizeof line - k, "[%s] ", bar);
    }
    if (k < sizeof line) snprintf(line + k, sizeof line - k, "%s", fields);
    int w = term_width(p->out) - 1;
    if ((int)strlen(line) > w) line[w] = 0; /* a wrapped line cannot be redrawn with \r */
    fprintf(p->out, "\r\033[K%s", line);
    fflush(p->out);
    p->drawn = true;
    p->last_draw = now;
}

static void print_plain(fm_progress *p, double now, bool final) {
    char fields[256];
    fmt_fields(p, now, !final, fields, sizeof fields);
    fprintf(p->out, "%s%s%s %s\n", p->label, *p->label ? ":" : "", final ? " done" : "", fields);
    fflush(p->out);
    p->last_plain = now;
    p->last_plain_done = p->done;
}

void fm_progress_update(fm_progress *p, int64_t done, int64_t items, double loss) {
    if (!p || p->mode == FM_PROGRESS_QUIET) {
        if (p) { p->done = done; p->items = items; p->loss = loss; }
        return;
    }
    p->done = done;
    p->items = items;
    p->loss = loss;
    double now = now_s();
    if (p->mode == FM_PROGRESS_TTY) {
        if (p->last_draw < 0 || now - p->last_draw >= 0.1 || (p->total && done >= p->total)) draw_tty(p, now);
        return;
    }
    int decile = p->total ? (int)(10 * done / p->total) : 0;
    if ((p->total && decile > p->last_decile) || now - p->last_plain >= p->interval) {
        if (decile > p->last_decile) p->last_decile = decile;
        if (!(p->total && done >= p->total)) print_plain(p, now, false); /* the final line comes from end() */
    }
}

void fm_progress_log(fm_progress *p, const char *fmt, ...) {
    if (p && p->mode == FM_PROGRESS_QUIET) return;
    FILE *f = p ? p->out : stderr;
    if (p && p->drawn) fputs("\r\033[K", f);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    size_t n = strlen(fmt);
    if (!n || fmt[n - 1] != '\n') fputc('\n', f);
    if (p && p->drawn) draw_tty(p, now_s());
    fflush(f);
}

void fm_progress_clear(fm_progress *p) {
    if (!p || !p->drawn) return;
    fputs("\r\033[K", p->out);
    fflush(p->out);
    p->drawn = false;
    p->last_draw = -1; /* the next update draws again at once */
}

void fm_progress_cancel(fm_progress *p) {
    fm_progress_clear(p);
    free(p);
}

void fm_progress_end(fm_progress *p) {
    if (!p) return;
    double now = now_s();
    if (p->mode == FM_PROGRESS_TTY) {
        char fields[256];
        fmt_fields(p, now, false, fields, sizeof fields);
        fprintf(p->out, "\r\033[K%s%sdone %s\n", p->label, *p->label ? " " : "", fields);
        fflush(p->out);
    } else if (p->mode == FM_PROGRESS_PLAIN) {
        print_plain(p, now, true);
    }
    free(p);
}
