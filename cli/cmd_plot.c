/* `fathom plot LOGDIR -o curves.svg`: training curves from the TensorBoard
 * event files a run wrote (`fathom train --logdir DIR`). Thin: reading is
 * fm_tb_read_scalars, drawing fm_plot_curves (src/observe/). */
#include <stdio.h>
#include <string.h>

#include "commands.h"       /* fm_cli_error */
#include "fathom/observe.h" /* fm_tb_read_scalars, fm_plot_curves */

static void usage(FILE *f) {
    fprintf(f,
            "usage: fathom plot LOGDIR -o OUT.svg|OUT.png [--title TEXT] [--list]\n"
            "\n"
            "Draw loss and validation curves, accuracy, learning rate and throughput from the\n"
            "TensorBoard event files in LOGDIR (and its run subdirectories).\n"
            "\n"
            "  -o, --output FILE   .svg, or .png (%s in this build)\n"
            "  --title TEXT        the picture's title (default: the log directory)\n"
            "  --list              print the scalar tags found, with point counts and last values,\n"
            "                      and the histogram tags\n",
            fm_plot_png_supported() ? "available" : "not available: no libpng");
}

int fm_cmd_plot(int argc, char **argv) {
    const char *logdir = NULL, *out = NULL, *title = NULL;
    bool list = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--list")) { list = true; continue; }
        if (!strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--title")) {
            if (i + 1 >= argc) { fm_cli_error("%s needs a value", a); usage(stderr); return 2; }
            if (!strcmp(a, "--title")) title = argv[++i];
            else out = argv[++i];
            continue;
        }
        if (a[0] == '-' && a[1]) {
            static const char *const flags[] = {"--help", "--list", "--output", "--title"};
            fm_cli_unknown_option("plot", a, flags, 4);
            usage(stderr);
            return 2;
        }
        if (logdir) { fm_cli_error("one log directory at a time (got '%s' and '%s')", logdir, a); return 2; }
        logdir = a;
    }
    if (!logdir) { fm_cli_error("no log directory given"); usage(stderr); return 2; }
    if (!out && !list) { fm_cli_error("no output file given (-o curves.svg)"); usage(stderr); return 2; }
    const char *dot = out ? strrchr(out, '.') : NULL;
    if (out && (!dot || (strcasecmp(dot, ".svg") && strcasecmp(dot, ".png")))) {
        fm_cli_error("plot: output '%s' must end in .svg or .png", out);
        usage(stderr);
        return 2;
    }
    fm_tb_scalars sc;
    if (fm_tb_read_scalars(logdir, &sc) != FM_OK) {
        fm_cli_error("%s", fm_last_error());
        return 1;
    }
    if (list) {
        for (int i = 0; i < sc.n; i++)
            printf("%-32s %6d points, last step %lld: %g\n", sc.series[i].tag, sc.series[i].n,
                   (long long)sc.series[i].step[sc.series[i].n - 1], sc.series[i].value[sc.series[i].n - 1]);
        for (int i = 0; i < sc.n_histograms; i++)
            printf("%-32s %6d histograms, last step %lld: %.0f values\n", sc.histograms[i].tag, sc.histograms[i].n,
                   (long long)sc.histograms[i].step[sc.histograms[i].n - 1],
                   sc.histograms[i].value[sc.histograms[i].n - 1]);
    }
    int rc = 0;
    if (out) {
        char t[512];
        snprintf(t, sizeof t, "fathom training curves: %s", logdir);
        if (fm_plot_curves(&sc, out, title ? title : t) != FM_OK) {
            fm_cli_error("%s", fm_last_error());
            rc = 1;
        } else {
            printf("wrote %s\n", out);
        }
    }
    fm_tb_scalars_free(&sc);
    return rc;
}
