/* The guard every training command puts before its --out directory (train, distill). */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"

/* A fresh run into a directory that holds an earlier run would replace that run's model at
 * its first checkpoint and remove its later checkpoints (src/io/ckpt_dir.c), so a repeated
 * command would lose a trained model. An earlier run is a committed checkpoint
 * (OUT/ckpt/step-N) or a model file; step-N.tmp.PID (a write a crash cut) and
 * step-N.diverged are none. Read before anything is read or written. */
int fm_cli_out_guard(const char *cmd, const char *out, bool can_resume) {
    char p[PATH_MAX + 32], what[PATH_MAX + 160];
    long long newest = -1, n = 0;
    snprintf(p, sizeof p, "%s/ckpt", out);
    DIR *d = opendir(p);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        char *end;
        if (strncmp(e->d_name, "step-", 5)) continue;
        long long st = strtoll(e->d_name + 5, &end, 10);
        if (end == e->d_name + 5 || *end) continue;
        n++;
        if (st > newest) newest = st;
    }
    if (d) closedir(d);
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    if (n > 0)
        snprintf(what, sizeof what, "%lld checkpoint%s in %s/ckpt, the newest of step %lld", n, n == 1 ? "" : "s", out,
                 newest);
    else if (access(p, F_OK) == 0)
        snprintf(what, sizeof what, "a model, %s", p);
    else
        return 0;
    char resume[PATH_MAX + 40] = "";
    if (can_resume) snprintf(resume, sizeof resume, "--resume %s continues it, ", out);
    fm_cli_error("%s: %s already holds a training run (%s); nothing was written. %s--overwrite trains afresh and "
                 "replaces it, or give another --out", cmd, out, what, resume);
    return 1;
}
