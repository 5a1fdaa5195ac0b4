/* Output directories written whole, and the temporaries dead processes leave.
 *
 * A directory output (a compiled graph, a pruned model, a Hugging Face export)
 * is written into DIR.tmp.<pid>, each file with fm_atomic_write, and becomes DIR
 * in one step: rename() when DIR does not exist, renameat2(RENAME_EXCHANGE) when
 * it does (the two names swap atomically; the old tree, now at the temporary
 * name, is removed after). A crash at any instant leaves the old DIR or the
 * complete new one, never a mixture and never neither.
 *
 * Where the file system cannot exchange (EINVAL/ENOTSUP, e.g. some network file
 * systems) the old DIR is renamed to DIR.old.<pid> first; a crash between the
 * two renames leaves no DIR, and the next sweep of that name puts DIR.old.<pid>
 * back. FATHOM_TEST_NO_EXCHANGE=1 takes that path on purpose (tests).
 *
 * The sweep matches only fathom's own names, NAME.tmp.<pid> and NAME.old.<pid>
 * with <pid> the digits to the end, and touches one only when that process is
 * gone (kill(pid, 0) says ESRCH): a live writer's files are never removed. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io_internal.h"

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

int fm_remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(sb.st_mode)) return unlink(path);
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* The directory holding `path` ("." for a bare name) and the name in it. */
static void split_path(const char *path, char *dir, size_t dn, const char **base) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, dn, ".");
        *base = path;
    } else {
        snprintf(dir, dn, "%.*s", slash == path ? 1 : (int)(slash - path), path);
        *base = slash + 1;
    }
}

void fm_fsync_parent(const char *path) {
    char dir[PATH_MAX];
    const char *base;
    split_path(path, dir, sizeof dir, &base);
    fm_fsync_dir(dir);
}

/* `name` is BASE.tmp.PID or BASE.old.PID: returns PID and sets *old; else -1. */
static long sibling_pid(const char *name, const char *base, bool *old) {
    size_t bl = strlen(base);
    if (strncmp(name, base, bl)) return -1;
    const char *t = name + bl;
    if (!strncmp(t, ".tmp.", 5)) *old = false;
    else if (!strncmp(t, ".old.", 5)) *old = true;
    else return -1;
    t += 5;
    if (*t < '0' || *t > '9') return -1;
    char *end;
    errno = 0;
    long v = strtol(t, &end, 10);
    return *end || errno || v <= 0 ? -1 : v;
}

/* When process pid started, in seconds since the epoch (Linux: field 22 of
 * /proc/PID/stat, clock ticks since boot, plus /proc/stat's btime); -1 when it
 * cannot be read. */
static double process_start(long pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *s = strrchr(buf, ')'); /* the command may hold spaces and parentheses; the fields after it do not */
    if (!s) return -1;
    int field = 2;
    unsigned long long ticks = 0;
    for (char *save = NULL, *t = strtok_r(s + 1, " ", &save); t; t = strtok_r(NULL, " ", &save))
        if (++field == 22) { ticks = strtoull(t, NULL, 10); break; }
    if (field != 22) return -1;
    f = fopen("/proc/stat", "r");
    if (!f) return -1;
    long long btime = -1;
    while (fgets(buf, sizeof buf, f))
        if (!strncmp(buf, "btime ", 6)) btime = atoll(buf + 6);
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    return btime > 0 && hz > 0 ? (double)btime + (double)ticks / (double)hz : -1;
}

/* The writer of a temporary named after pid is gone: no process has that pid,
 * or (pids are reused, soon in a container) the process that has it now
 * started after the temporary was last changed, so it cannot be its writer.
 * Two seconds of slack cover btime's rounding. */
static bool writer_gone(long pid, const char *tmp_path) {
    if (pid == (long)getpid()) return false;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return true;
    struct stat sb;
    double start = process_start(pid);
    return start > 0 && lstat(tmp_path, &sb) == 0 && (double)sb.st_mtime < start - 2;
}

int fm_stale_sweep(const char *path, FILE *log) {
    char dir[PATH_MAX], p[PATH_MAX];
    const char *base;
    if (!path || !*path) return 0;
    split_path(path, dir, sizeof dir, &base);
    if (!*base) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int done = 0;
    struct dirent *e;
    struct stat sb;
    while ((e = readdir(d)) != NULL) {
        bool old = false;
        long pid = sibling_pid(e->d_name, base, &old);
        if (pid < 0 || snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p || !writer_gone(pid, p)) continue;
        if (old && lstat(path, &sb) != 0 && errno == ENOENT) {
            /* the fallback commit died between its two renames: the old output goes back */
            if (rename(p, path) == 0) {
                done++;
                if (log) fprintf(log, "restored %s from %s, left by an interrupted write (process %ld)\n", path, p, pid);
            }
            continue;
        }
        if (fm_remove_tree(p) == 0) {
            done++;
            if (log) fprintf(log, "removed %s, left by an interrupted write (process %ld)\n", p, pid);
        }
    }
    closedir(d);
    if (done) fm_fsync_dir(dir);
    return done;
}

bool fm_dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n == 0;
}

fm_status fm_dir_begin(fm_dir_tx *tx, const char *dir, bool replace, const char *what) {
    memset(tx, 0, sizeof *tx);
    if (!dir || !*dir) return fm_set_error(FM_ERR_INVALID, "%s: no output directory given", what);
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--; /* "out/" names the directory out */
    if (len >= sizeof tx->dir) return fm_set_error(FM_ERR_INVALID, "%s: output path too long: %s", what, dir);
    memcpy(tx->dir, dir, len);
    tx->dir[len] = 0;
    fm_stale_sweep(tx->dir, stderr);
    struct stat sb;
    if (lstat(tx->dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return fm_set_error(FM_ERR_INVALID, "%s: %s exists and is not a directory; not replacing it (choose a new path)",
                                what, tx->dir);
        if (!replace && !fm_dir_is_empty(tx->dir))
            return fm_set_error(FM_ERR_INVALID, "%s: %s already exists and is not an empty directory; not replacing it "
                                "(choose a new path)", what, tx->dir);
    }
    snprintf(tx->tmp, sizeof tx->tmp, "%s.tmp.%ld", tx->dir, (long)getpid());
    fm_remove_tree(tx->tmp); /* a leftover of this very pid (pids repeat in containers) */
    if (mkdir(tx->tmp, 0755) != 0) {
        fm_status st = fm_set_error(FM_ERR_IO, "%s: cannot create %s: %s", what, tx->tmp, strerror(errno));
        tx->tmp[0] = 0;
        return st;
    }
    return FM_OK;
}

void fm_dir_abort(fm_dir_tx *tx) {
    if (tx->tmp[0]) fm_remove_tree(tx->tmp);
    tx->tmp[0] = 0;
}

/* The old DIR aside, the new one in, the old one removed (FATHOM_TEST_NO_EXCHANGE
 * or a file system without RENAME_EXCHANGE). */
static fm_status commit_by_moving_aside(fm_dir_tx *tx) {
    char old[PATH_MAX];
    snprintf(old, sizeof old, "%s.old.%ld", tx->dir, (long)getpid());
    fm_remove_tree(old);
    if (fm_io_rename(tx->dir, old) != 0)
        return fm_set_error(FM_ERR_IO, "cannot move %s aside to %s: %s", tx->dir, old, strerror(errno));
    if (fm_io_rename(tx->tmp, tx->dir) != 0) {
        fm_status st = fm_set_error(FM_ERR_IO, "cannot rename %s to %s: %s", tx->tmp, tx->dir, strerror(errno));
        if (rename(old, tx->dir) != 0) /* put the previous output back; the sweep does it if this fails too */
            fm_error_prefix("%s is at %s", tx->dir, old);
        return st;
    }
    fm_fsync_parent(tx->dir);
    fm_remove_tree(old);
    return FM_OK;
}

fm_status fm_dir_commit(fm_dir_tx *tx) {
    if (!tx->tmp[0]) return fm_set_error(FM_ERR_STATE, "directory commit without fm_dir_begin");
    fm_fsync_dir(tx->tmp); /* the names inside, before the directory gets its final name */
    struct stat sb;
    bool exists = lstat(tx->dir, &sb) == 0;
    fm_status st = FM_OK;
    if (!exists) {
        if (fm_io_rename(tx->tmp, tx->dir) != 0)
            st = fm_set_error(FM_ERR_IO, "cannot rename %s to %s: %s", tx->tmp, tx->dir, strerror(errno));
    } else if (!S_ISDIR(sb.st_mode)) {
        st = fm_set_error(FM_ERR_INVALID, "%s is no longer a directory; not replacing it", tx->dir);
    } else {
        const char *no = getenv("FATHOM_TEST_NO_EXCHANGE");
        int rc = no && *no == '1' ? (errno = EINVAL, -1) : fm_io_exchange(tx->tmp, tx->dir);
        if (rc == 0) {
            fm_fsync_parent(tx->dir);
            fm_remove_tree(tx->tmp); /* the previous output, now under the temporary name */
            tx->tmp[0] = 0;
            return FM_OK;
        }
        if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) st = commit_by_moving_aside(tx);
        else st = fm_set_error(FM_ERR_IO, "cannot swap %s into %s: %s", tx->tmp, tx->dir, strerror(errno));
    }
    if (st != FM_OK) {
        fm_dir_abort(tx);
        fm_error_prefix("%s was not written; any previous version is unchanged", tx->dir);
        return st;
    }
    fm_fsync_parent(tx->dir);
    tx->tmp[0] = 0;
    return FM_OK;
}

/* ---- the public form (fathom/io.h) ---- */
struct fm_dir_writer {
    fm_dir_tx tx;
};

fm_dir_writer *fm_dir_writer_begin(const char *dir, bool replace, const char *what) {
    fm_dir_writer *w = malloc(sizeof *w);
    if (!w) {
        fm_set_error(FM_ERR_OOM, "%s: out of host memory", what ? what : "directory write");
        return NULL;
    }
    if (fm_dir_begin(&w->tx, dir, replace, what ? what : "directory write") != FM_OK) {
        free(w);
        return NULL;
    }
    return w;
}

const char *fm_dir_writer_path(const fm_dir_writer *w) { return w ? w->tx.tmp : NULL; }

fm_status fm_dir_writer_commit(fm_dir_writer *w) {
    if (!w) return fm_set_error(FM_ERR_INVALID, "fm_dir_writer_commit: no writer");
    fm_status st = fm_dir_commit(&w->tx);
    free(w);
    return st;
}

void fm_dir_writer_abort(fm_dir_writer *w) {
    if (!w) return;
    fm_dir_abort(&w->tx);
    free(w);
}
