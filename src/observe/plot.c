/* Training curves from a TensorBoard log directory, drawn as SVG or PNG.
 *
 * One drawing routine, two back ends: SVG text (vector, any viewer) and a
 * small RGB rasterizer (anti-aliased lines by distance to the segment, a
 * built-in 5x7 bitmap font) whose pixels libpng writes, so a PNG needs no
 * font or graphics library beyond libpng. Panels appear only for the series a
 * run logged: loss (train and validation), accuracy, learning rate,
 * throughput, gradient norm, memory. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#ifdef FATHOM_HAVE_PNG
#include <png.h>
#endif

#include "fathom/io.h" /* fm_atomic_write */
#include "fathom/observe.h"

/* ---- 5x7 font, printable ASCII; each row's 5 low bits, the high one leftmost.
 * g, p, q and y sit two rows lower (their descenders hang below the baseline). ---- */
static const unsigned char font5x7[95][7] = {
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}, /*   */ {0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04}, /* ! */
    {0x0A, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00}, /* " */ {0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A}, /* # */
    {0x04, 0x0F, 0x14, 0x0E, 0x05, 0x1E, 0x04}, /* $ */ {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}, /* % */
    {0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D}, /* & */ {0x04, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00}, /* ' */
    {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}, /* ( */ {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}, /* ) */
    {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00}, /* * */ {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}, /* + */
    {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}, /* , */ {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}, /* - */
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}, /* . */ {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}, /* / */
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}, /* 0 */ {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}, /* 1 */
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}, /* 2 */ {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}, /* 3 */
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}, /* 4 */ {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}, /* 5 */
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}, /* 6 */ {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}, /* 7 */
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}, /* 8 */ {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}, /* 9 */
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}, /* : */ {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x04, 0x08}, /* ; */
    {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02}, /* < */ {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}, /* = */
    {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08}, /* > */ {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04}, /* ? */
    {0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E}, /* @ */ {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11}, /* A */
    {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}, /* B */ {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}, /* C */
    {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}, /* D */ {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}, /* E */
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}, /* F */ {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}, /* G */
    {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}, /* H */ {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}, /* I */
    {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}, /* J */ {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}, /* K */
    {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}, /* L */ {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}, /* M */
    {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}, /* N */ {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}, /* O */
    {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}, /* P */ {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}, /* Q */
    {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}, /* R */ {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}, /* S */
    {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}, /* T */ {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}, /* U */
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}, /* V */ {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}, /* W */
    {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}, /* X */ {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}, /* Y */
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}, /* Z */ {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E}, /* [ */
    {0x00, 0x10, 0x08, 0x04, 0x02, 0x01, 0x00}, /* \ */ {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E}, /* ] */
    {0x04, 0x0A, 0x11, 0x00, 0x00, 0x00, 0x00}, /* ^ */ {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}, /* _ */
    {0x08, 0x04, 0x02, 0x00, 0x00, 0x00, 0x00}, /* ` */ {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}, /* a */
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}, /* b */ {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}, /* c */
    {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}, /* d */ {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}, /* e */
    {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}, /* f */ {0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E}, /* g */
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}, /* h */ {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}, /* i */
    {0x02, 0x00, 0x06, 0x02, 0x02, 0x02, 0x0C}, /* j */ {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}, /* k */
    {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}, /* l */ {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}, /* m */
    {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}, /* n */ {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}, /* o */
    {0x1E, 0x11, 0x11, 0x11, 0x1E, 0x10, 0x10}, /* p */ {0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x01}, /* q */
    {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}, /* r */ {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}, /* s */
    {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}, /* t */ {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}, /* u */
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}, /* v */ {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}, /* w */
    {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}, /* x */ {0x11, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E}, /* y */
    {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}, /* z */ {0x02, 0x04, 0x04, 0x08, 0x04, 0x04, 0x02}, /* { */
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}, /* | */ {0x08, 0x04, 0x04, 0x02, 0x04, 0x04, 0x08}, /* } */
    {0x00, 0x00, 0x08, 0x15, 0x02, 0x00, 0x00}, /* ~ */
};

typedef struct rgb { unsigned char r, g, b; } rgb;

/* ---- canvas: the two back ends behind one set of primitives ---- */

typedef struct canvas {
    bool svg;
    int w, h;
    /* svg */
    char *s;
    size_t n, cap;
    bool oom;
    /* raster */
    unsigned char *px;
} canvas;

static void svg_printf(canvas *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void svg_printf(canvas *c, const char *fmt, ...) {
    if (c->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(c->s ? c->s + c->n : NULL, c->cap - c->n, fmt, ap); /* NULL + 0 is undefined */
        va_end(ap);
        if (k < 0) { c->oom = true; return; }
        if (c->n + (size_t)k < c->cap) { c->n += (size_t)k; return; }
        size_t nc = (c->cap ? c->cap * 2 : 65536) + (size_t)k;
        char *ns = realloc(c->s, nc);
        if (!ns) { c->oom = true; return; }
        c->s = ns;
        c->cap = nc;
    }
}

static void blend(canvas *c, int x, int y, rgb col, double a) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h || a <= 0) return;
    if (a > 1) a = 1;
    unsigned char *p = c->px + 3 * ((size_t)y * (size_t)c->w + (size_t)x);
    p[0] = (unsigned char)(p[0] + (col.r - p[0]) * a + 0.5);
    p[1] = (unsigned char)(p[1] + (col.g - p[1]) * a + 0.5);
    p[2] = (unsigned char)(p[2] + (col.b - p[2]) * a + 0.5);
}

static void c_line(canvas *c, double x0, double y0, double x1, double y1, rgb col, double width) {
    if (c->svg) {
        svg_printf(c, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#%02x%02x%02x\" stroke-width=\"%.1f\"/>\n",
                   x0, y0, x1, y1, col.r, col.g, col.b, width);
        return;
    }
    /* coverage = how much of a pixel lies within width/2 of the segment */
    double hw = width / 2, dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
    int xa = (int)floor(fmin(x0, x1) - hw - 1), xb = (int)ceil(fmax(x0, x1) + hw + 1);
    int ya = (int)floor(fmin(y0, y1) - hw - 1), yb = (int)ceil(fmax(y0, y1) + hw + 1);
    if (xa < 0) xa = 0;
    if (ya < 0) ya = 0;
    if (xb >= c->w) xb = c->w - 1;
    if (yb >= c->h) yb = c->h - 1;
    for (int y = ya; y <= yb; y++)
        for (int x = xa; x <= xb; x++) {
            double px = x + 0.5, py = y + 0.5;
            double t = len2 > 0 ? ((px - x0) * dx + (py - y0) * dy) / len2 : 0;
            t = t < 0 ? 0 : (t > 1 ? 1 : t);
            double ex = px - (x0 + t * dx), ey = py - (y0 + t * dy);
            double d = sqrt(ex * ex + ey * ey);
            blend(c, x, y, col, hw + 0.5 - d);
        }
}

static void c_rect(canvas *c, double x, double y, double w, double h, rgb fill, bool filled, rgb stroke, double sw) {
    if (c->svg) {
        if (filled) svg_printf(c, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#%02x%02x%02x\"", x, y, w, h, fill.r, fill.g, fill.b);
        else svg_printf(c, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\"", x, y, w, h);
        if (sw > 0) svg_printf(c, " stroke=\"#%02x%02x%02x\" stroke-width=\"%.1f\"", stroke.r, stroke.g, stroke.b, sw);
        svg_printf(c, "/>\n");
        return;
    }
    if (filled)
        for (int yy = (int)y; yy < (int)(y + h); yy++)
            for (int xx = (int)x; xx < (int)(x + w); xx++) blend(c, xx, yy, fill, 1);
    if (sw > 0) {
        c_line(c, x, y, x + w, y, stroke, sw);
        c_line(c, x + w, y, x + w, y + h, stroke, sw);
        c_line(c, x + w, y + h, x, y + h, stroke, sw);
        c_line(c, x, y + h, x, y, stroke, sw);
    }
}

static int font_scale(double size) { return size >= 18 ? 3 : 2; }

static double text_width(const canvas *c, const char *s, double size) {
    size_t n = strlen(s);
    if (c->svg) return (double)n * size * 0.56;
    int k = font_scale(size);
    return n ? (double)n * 6 * k - k : 0;
}

/* anchor: 0 start, 1 middle, 2 end; vertical: rotated to read bottom-up. y is the baseline. */
static void c_text(canvas *c, double x, double y, const char *s, double size, int anchor, bool vertical, rgb col, bool bold) {
    double w = text_width(c, s, size);
    if (c->svg) {
        static const char *const anchors[] = {"start", "middle", "end"};
        svg_printf(c, "<text x=\"%.1f\" y=\"%.1f\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"%.0f\" fill=\"#%02x%02x%02x\" text-anchor=\"%s\"%s",
                   x, y, size, col.r, col.g, col.b, anchors[anchor], bold ? " font-weight=\"bold\"" : "");
        if (vertical) svg_printf(c, " transform=\"rotate(-90 %.1f %.1f)\"", x, y);
        svg_printf(c, ">");
        for (const char *p = s; *p; p++) {
            if (*p == '<') svg_printf(c, "&lt;");
            else if (*p == '>') svg_printf(c, "&gt;");
            else if (*p == '&') svg_printf(c, "&amp;");
            else svg_printf(c, "%c", *p);
        }
        svg_printf(c, "</text>\n");
        return;
    }
    int k = font_scale(size);
    double off = anchor == 1 ? w / 2 : (anchor == 2 ? w : 0);
    int pos = 0;
    for (const char *p = s; *p; p++, pos++) {
        unsigned char ch = (unsigned char)*p;
        if (ch < 32 || ch > 126) ch = '?';
        const unsigned char *g = font5x7[ch - 32];
        bool descends = ch == 'g' || ch == 'p' || ch == 'q' || ch == 'y';
        for (int row = 0; row < 7; row++)
            for (int colb = 0; colb < 5; colb++) {
                if (!(g[row] >> (4 - colb) & 1)) continue;
                for (int dy = 0; dy < k; dy++)
                    for (int dx = 0; dx < k + (bold ? 1 : 0); dx++) {
                        /* glyph coordinates: u along the text, v down from the top (7 rows above the baseline) */
                        double u = pos * 6 * k + colb * k + dx - off, v = (row - 7 + (descends ? 2 : 0)) * k + dy;
                        int X = vertical ? (int)(x + v) : (int)(x + u), Y = vertical ? (int)(y - u) : (int)(y + v);
                        blend(c, X, Y, col, 1);
                    }
            }
    }
}

/* ---- axes ---- */

static double nice_step(double range, int target) {
    if (!(range > 0)) return 1;
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static void fmt_tick(double v, double step, char *buf, size_t n) {
    double a = fabs(v);
    if (a < step * 1e-6) { snprintf(buf, n, "0"); return; }
    if (a >= 1e6) snprintf(buf, n, "%gM", v / 1e6);
    else if (a >= 1e4) snprintf(buf, n, "%gk", v / 1e3);
    else if (step < 1e-3) {
        /* "2.5e-4": the mantissa carries as many decimals as the step needs at that exponent */
        int e = (int)floor(log10(a));
        double m = v / pow(10, e), ms = step / pow(10, e);
        int dec = ms >= 1 ? 0 : (int)ceil(-log10(ms) - 1e-9);
        if (dec > 3) dec = 3;
        snprintf(buf, n, "%.*fe%d", dec, m, e);
    } else {
        int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        snprintf(buf, n, "%.*f", dec, v);
    }
}

static const rgb WHITE = {255, 255, 255}, BLACK = {0, 0, 0}, GRID = {225, 225, 225}, AXIS = {90, 90, 90},
                 TEXT = {30, 30, 30};
static const rgb PALETTE[] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189}, {140, 86, 75}};

typedef struct panel {
    const char *title, *ylabel;
    const fm_tb_series *s[6];
    int n;
} panel;

static void draw_panel(canvas *c, const panel *p, double x, double y, double w, double h) {
    const double mr = 32, mt = 34, mb = 48; /* the left margin follows the widest tick label */
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (int i = 0; i < p->n; i++)
        for (int j = 0; j < p->s[i]->n; j++) {
            double v = p->s[i]->value[j];
            if (!isfinite(v)) continue;
            xlo = fmin(xlo, (double)p->s[i]->step[j]);
            xhi = fmax(xhi, (double)p->s[i]->step[j]);
            ylo = fmin(ylo, v);
            yhi = fmax(yhi, v);
        }
    if (!isfinite(xlo)) { xlo = 0; xhi = 1; ylo = 0; yhi = 1; }
    if (xhi <= xlo) { xlo -= 1; xhi += 1; }
    if (yhi <= ylo) { double d = fabs(ylo) > 0 ? fabs(ylo) * 0.1 : 1; ylo -= d; yhi += d; }
    double ypad = (yhi - ylo) * 0.05;
    ylo -= ypad;
    yhi += ypad;
    if (ylo < 0 && ylo + ypad >= 0) ylo = 0; /* non-negative data keeps a zero floor */
    double xs = nice_step(xhi - xlo, 6), ys = nice_step(yhi - ylo, 5);
    double ya = floor(ylo / ys) * ys, yb = ceil(yhi / ys) * ys;
    ylo = ya;
    yhi = yb;
    char buf[48];
    double tickw = 0;
    for (double t = ceil(ylo / ys - 1e-9) * ys; t <= yhi + ys * 1e-9; t += ys) {
        fmt_tick(t, ys, buf, sizeof buf);
        tickw = fmax(tickw, text_width(c, buf, 12));
    }
    double ml = tickw + 44;
    double px = x + ml, py = y + mt, pw = w - ml - mr, ph = h - mt - mb;
#define MAPX(v) (px + ((v) - xlo) / (xhi - xlo) * pw)
#define MAPY(v) (py + ph - ((v) - ylo) / (yhi - ylo) * ph)
    c_rect(c, px, py, pw, ph, WHITE, true, WHITE, 0);
    c_text(c, x + w / 2, y + 22, p->title, 16, 1, false, TEXT, true);
    for (double t = ceil(ylo / ys - 1e-9) * ys; t <= yhi + ys * 1e-9; t += ys) {
        double Y = MAPY(t);
        c_line(c, px, Y, px + pw, Y, GRID, 1);
        c_line(c, px - 5, Y, px, Y, AXIS, 1);
        fmt_tick(t, ys, buf, sizeof buf);
        c_text(c, px - 8, Y + 5, buf, 12, 2, false, TEXT, false);
    }
    for (double t = ceil(xlo / xs - 1e-9) * xs; t <= xhi + xs * 1e-9; t += xs) {
        double X = MAPX(t);
        c_line(c, X, py, X, py + ph, GRID, 1);
        c_line(c, X, py + ph, X, py + ph + 5, AXIS, 1);
        fmt_tick(t, xs, buf, sizeof buf);
        c_text(c, X, py + ph + 20, buf, 12, 1, false, TEXT, false);
    }
    c_line(c, px, py + ph, px + pw, py + ph, AXIS, 1.2);
    c_line(c, px, py, px, py + ph, AXIS, 1.2);
    c_text(c, px + pw / 2, py + ph + 40, "step", 13, 1, false, TEXT, false);
    c_text(c, px - tickw - 22, py + ph / 2, p->ylabel, 13, 1, true, TEXT, false);
    /* series */
    for (int i = 0; i < p->n; i++) {
        const fm_tb_series *s = p->s[i];
        rgb col = PALETTE[i % 6];
        bool markers = s->n <= 60;
        if (c->svg) {
            bool open = false;
            for (int j = 0; j < s->n; j++) {
                if (!isfinite(s->value[j])) {
                    if (open) svg_printf(c, "\"/>\n");
                    open = false;
                    continue;
                }
                if (!open) svg_printf(c, "<polyline fill=\"none\" stroke=\"#%02x%02x%02x\" stroke-width=\"2\" stroke-linejoin=\"round\" points=\"", col.r, col.g, col.b);
                svg_printf(c, "%.1f,%.1f ", MAPX((double)s->step[j]), MAPY(s->value[j]));
                open = true;
            }
            if (open) svg_printf(c, "\"/>\n");
            if (markers)
                for (int j = 0; j < s->n; j++)
                    if (isfinite(s->value[j]))
                        svg_printf(c, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#%02x%02x%02x\"/>\n", MAPX((double)s->step[j]),
                                   MAPY(s->value[j]), col.r, col.g, col.b);
        } else {
            for (int j = 1; j < s->n; j++)
                if (isfinite(s->value[j]) && isfinite(s->value[j - 1]))
                    c_line(c, MAPX((double)s->step[j - 1]), MAPY(s->value[j - 1]), MAPX((double)s->step[j]), MAPY(s->value[j]), col, 2);
            if (markers)
                for (int j = 0; j < s->n; j++)
                    if (isfinite(s->value[j])) {
                        double X = MAPX((double)s->step[j]), Y = MAPY(s->value[j]);
                        c_line(c, X, Y, X, Y, col, 7); /* a zero-length thick line is a dot */
                    }
        }
    }
    /* legend, top right inside the plot */
    double lw = 0;
    for (int i = 0; i < p->n; i++) lw = fmax(lw, text_width(c, p->s[i]->tag, 12));
    double bw = lw + 46, bh = 8 + 20.0 * p->n, bx = px + pw - bw - 8, by = py + 8;
    /* top right unless the curves run through it more than through the bottom right (rising curves) */
    int hits_top = 0, hits_bottom = 0;
    for (int i = 0; i < p->n; i++)
        for (int j = 0; j < p->s[i]->n; j++) {
            double X = MAPX((double)p->s[i]->step[j]), Y = MAPY(p->s[i]->value[j]);
            if (X < bx - 4 || !isfinite(Y)) continue;
            hits_top += Y <= by + bh + 4;
            hits_bottom += Y >= py + ph - 8 - bh - 4;
        }
    if (hits_top > hits_bottom) by = py + ph - 8 - bh;
    c_rect(c, bx, by, bw, bh, WHITE, true, (rgb){160, 160, 160}, 1);
    for (int i = 0; i < p->n; i++) {
        double ly = by + 16 + 20.0 * i;
        c_line(c, bx + 8, ly - 4, bx + 32, ly - 4, PALETTE[i % 6], 2.5);
        c_text(c, bx + 38, ly + 1, p->s[i]->tag, 12, 0, false, TEXT, false);
    }
#undef MAPX
#undef MAPY
}

/* ---- which series go where ---- */

static bool has(const char *tag, const char *key) { return strstr(tag, key) != NULL; }
static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static void add_series(panel *p, const fm_tb_series *s) {
    if (p->n < 6 && s->n > 0) p->s[p->n++] = s;
}

bool fm_plot_png_supported(void) {
#ifdef FATHOM_HAVE_PNG
    return true;
#else
    return false;
#endif
}

#ifdef FATHOM_HAVE_PNG
static fm_status write_png(const canvas *c, FILE *f, const char *path) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, &info);
        return fm_set_error(FM_ERR_OOM, "plot: out of memory in libpng");
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        return fm_set_error(FM_ERR_IO, "plot: writing PNG '%s' failed", path);
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < c->h; y++) png_write_row(png, c->px + 3 * (size_t)y * (size_t)c->w);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return FM_OK;
}
#endif

fm_status fm_plot_curves(const fm_tb_scalars *sc, const char *out_path, const char *title) {
    if (!sc || !out_path) return fm_set_error(FM_ERR_INVALID, "plot: needs scalars and an output path");
    const char *dot = strrchr(out_path, '.');
    bool svg;
    if (dot && !strcasecmp(dot, ".svg")) svg = true;
    else if (dot && !strcasecmp(dot, ".png")) {
        if (!fm_plot_png_supported())
            return fm_set_error(FM_ERR_UNSUPPORTED, "plot: this build has no libpng, so no PNG output; write .svg instead");
        svg = false;
    } else {
        return fm_set_error(FM_ERR_INVALID, "plot: output '%s' must end in .svg or .png", out_path);
    }

    panel panels[6] = {
        {"Loss", "loss", {0}, 0},           {"Accuracy", "accuracy", {0}, 0},
        {"Learning rate", "learning rate", {0}, 0}, {"Throughput", "items / s", {0}, 0},
        {"Gradient norm", "global norm", {0}, 0},  {"Memory", "bytes", {0}, 0},
    };
    for (int i = 0; i < sc->n; i++) {
        const fm_tb_series *s = &sc->series[i];
        const char *t = s->tag;
        if (has(t, "loss_scale") || has(t, "loss scale")) continue; /* AMP's scaler, not a loss */
        if (has(t, "loss")) add_series(&panels[0], s);
        else if (has(t, "acc")) add_series(&panels[1], s);
        else if (ends_with(t, "lr") || has(t, "learning_rate")) add_series(&panels[2], s);
        else if (has(t, "throughput") || has(t, "per_sec") || has(t, "per_s")) add_series(&panels[3], s);
        else if (has(t, "grad_norm")) add_series(&panels[4], s);
        else if (has(t, "memory") || has(t, "bytes")) add_series(&panels[5], s);
    }
    panel use[6];
    int np = 0;
    for (int i = 0; i < 6; i++)
        if (panels[i].n) use[np++] = panels[i];
    if (!np)
        return fm_set_error(FM_ERR_INVALID, "plot: no loss, accuracy, learning-rate or throughput scalars among the %d series in the logs", sc->n);

    canvas c = {0};
    c.svg = svg;
    int cols = np == 1 ? 1 : 2, rows = (np + cols - 1) / cols;
    const int pw = 600, ph = 360, top = 50;
    c.w = cols * pw;
    c.h = top + rows * ph;
    if (!svg) {
        c.px = malloc((size_t)c.w * (size_t)c.h * 3);
        if (!c.px) return fm_set_error(FM_ERR_OOM, "plot: out of memory");
        memset(c.px, 246, (size_t)c.w * (size_t)c.h * 3);
    } else {
        svg_printf(&c, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
                   c.w, c.h, c.w, c.h);
        c_rect(&c, 0, 0, c.w, c.h, (rgb){246, 246, 246}, true, BLACK, 0);
    }
    c_text(&c, c.w / 2.0, 32, title && *title ? title : "training curves", 20, 1, false, TEXT, true);
    for (int i = 0; i < np; i++) draw_panel(&c, &use[i], (i % cols) * pw, top + (i / cols) * ph, pw, ph);
    if (svg) svg_printf(&c, "</svg>\n");

    fm_status st = FM_OK;
    if (c.oom) st = fm_set_error(FM_ERR_OOM, "plot: out of memory");
    /* the image is made in memory and written with the library's atomic write:
     * an interrupted plot leaves the previous file, never half a picture */
    char *img = NULL;
    size_t img_n = 0;
    if (st == FM_OK && svg) {
        fm_io_chunk ch = {c.s, c.n};
        st = fm_atomic_write(out_path, 1, &ch);
    }
#ifdef FATHOM_HAVE_PNG
    else if (st == FM_OK) {
        FILE *f = open_memstream(&img, &img_n);
        if (!f) st = fm_set_error(FM_ERR_OOM, "plot: out of memory");
        else {
            st = write_png(&c, f, out_path);
            if (fclose(f) != 0 && st == FM_OK) st = fm_set_error(FM_ERR_OOM, "plot: out of memory");
        }
        if (st == FM_OK) {
            fm_io_chunk ch = {img, img_n};
            st = fm_atomic_write(out_path, 1, &ch);
        }
    }
#endif
    free(img);
    if (st != FM_OK && !c.oom) fm_error_prefix("plot: cannot write '%s'", out_path);
    free(c.s);
    free(c.px);
    return st;
}
