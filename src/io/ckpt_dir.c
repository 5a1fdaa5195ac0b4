/* Checkpoint directories: a step's files committed as one unit (io_internal.h).
 *
 * Order of a commit, each step durable before the next:
 *   1. the files are written into ckpt/step-N.tmp.PID (each fm_atomic_write fsyncs);
 *   2. MANIFEST (format, step, then "file NAME SIZE CRC32" lines) is written last;
 *   3. the directory is fsynced and renamed to ckpt/step-N, ckpt/ is fsynced;
 *   4. OUT/NAME become hard links to the new files (each by link + rename);
 *   5. older checkpoints beyond `keep` are removed.
 * A crash before 3 leaves a .tmp.PID directory that fm_ckpt_clean_stale removes;
 * after 3 the checkpoint is complete whatever happens to 4 and 5. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "io/io_internal.h"

#define MANIFEST_MAGIC "fathom-checkpoint 1"

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Removes a file or a directory of files (checkpoints hold no subdirectories,
 * but one level more costs nothing). */
static int remove_tree(const char *path, int depth) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(sb.st_mode)) return unlink(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    char sub[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) continue;
        if (depth < 2) remove_tree(sub, depth + 1);
    }
    closedir(d);
    return rmdir(path);
}

fm_status fm_file_crc32(const char *path, uint32_t *crc, int64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return fm_set_error(FM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    int64_t total = 0;
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        c = crc32(c, buf, (uInt)got);
        total += (int64_t)got;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) return fm_set_error(FM_ERR_IO, "reading %s failed", path);
    *crc = (uint32_t)c;
    *size = total;
    return FM_OK;
}

/* "step-N" -> N; anything else (including step-N.tmp.PID) -> -1. */
static int64_t step_of(const char *name) {
    if (strncmp(name, "step-", 5)) return -1;
    const char *s = name + 5;
    if (*s < '0' || *s > '9') return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < 0) return -1;
    return v;
}

fm_status fm_ckpt_begin(fm_ckpt_tx *tx, const char *out_dir, int64_t step) {
    memset(tx, 0, sizeof *tx);
    if (snprintf(tx->out_dir, sizeof tx->out_dir, "%s", out_dir) >= (int)sizeof tx->out_dir)
        return fm_set_error(FM_ERR_INVALID, "path too long: %s", out_dir);
    tx->step = step;
    if (snprintf(tx->final, sizeof tx->final, "%s/ckpt/step-%08" PRId64, out_dir, step) >= (int)sizeof tx->final ||
        snprintf(tx->tmp, sizeof tx->tmp, "%s.tmp.%ld", tx->final, (long)getpid()) >= (int)sizeof tx->tmp)
        return fm_set_error(FM_ERR_INVALID, "path too long: %s", out_dir);
    fm_status st = fm_mkdir_p(tx->out_dir);
    char ck[PATH_MAX];
    snprintf(ck, sizeof ck, "%s/ckpt", out_dir);
    if (st == FM_OK) st = fm_mkdir_p(ck);
    if (st) return st;
    remove_tree(tx->tmp, 0); /* a leftover of this very pid (pids repeat in containers) */
    if (mkdir(tx->tmp, 0755) != 0) return fm_set_error(FM_ERR_IO, "cannot create directory %s: %s", tx->tmp, strerror(errno));
    return FM_OK;
}

const char *fm_ckpt_path(const fm_ckpt_tx *tx, const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", tx->tmp, name);
    return buf;
}

void fm_ckpt_abort(fm_ckpt_tx *tx) {
    if (tx->tmp[0]) remove_tree(tx->tmp, 0);
    tx->tmp[0] = 0;
}

static fm_status write_manifest(const fm_ckpt_tx *tx, int n, const char *const *names) {
    char path[PATH_MAX + 32];
    const size_t cap = (size_t)n * 320 + 128; /* a line: "file " NAME (< 256) SIZE CRC */
    char *text = malloc(cap);
    if (!text) return fm_set_error(FM_ERR_OOM, "out of host memory for a checkpoint manifest");
    int len = snprintf(text, cap, MANIFEST_MAGIC "\nstep %" PRId64 "\n", tx->step);
    for (int i = 0; i < n; i++) {
        uint32_t crc;
        int64_t size;
        fm_status st = fm_file_crc32(fm_ckpt_path(tx, names[i], path, sizeof path), &crc, &size);
        if (st) { free(text); return st; }
        len += snprintf(text + len, cap - (size_t)len, "file %s %" PRId64 " %08" PRIx32 "\n", names[i], size, crc);
    }
    len += snprintf(text + len, cap - (size_t)len, "end\n");
    fm_io_chunk c = {text, (size_t)len};
    fm_status st = fm_atomic_write(fm_ckpt_path(tx, "MANIFEST", path, sizeof path), 1, &c);
    free(text);
    return st;
}

/* OUT/NAME -> the committed file: a hard link made under a temporary name and
 * renamed over the old one (a copy where the file system has no hard links;
 * FATHOM_TEST_NO_LINK=1 takes that path on purpose, for tests). */
static fm_status export_file(const char *out_dir, const char *ckpt, const char *name) {
    char src[PATH_MAX + 64], dst[PATH_MAX], tmp[PATH_MAX + 32];
    if (snprintf(src, sizeof src, "%s/%s", ckpt, name) >= (int)sizeof src ||
        snprintf(dst, sizeof dst, "%s/%s", out_dir, name) >= (int)sizeof dst)
        return fm_set_error(FM_ERR_INVALID, "path too long: %s", out_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dst, (long)getpid());
    struct stat a, b;
    if (stat(src, &a) == 0 && stat(dst, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) return FM_OK;
    unlink(tmp);
    const char *no_link = getenv("FATHOM_TEST_NO_LINK");
    if (!(no_link && *no_link == '1') && link(src, tmp) == 0) {
        if (fm_io_rename(tmp, dst) == 0) {
            unlink(tmp); /* rename() does nothing when both names are already links to one file */
            return FM_OK;
        }
        int e = errno;
        unlink(tmp);
        return fm_set_error(FM_ERR_IO, "renaming %s to %s: %s", tmp, dst, strerror(e));
    }
    fm_status st;
    const char *why;
    size_t got = 0;
    char *buf = fm_read_file(src, SIZE_MAX / 2, &got, &st, &why); /* fathom's own file: no limit of its own */
    if (!buf) return fm_set_error(st, "cannot copy %s: %s%s%s", src, why, st == FM_ERR_IO ? ": " : "",
                                  st == FM_ERR_IO ? strerror(errno) : "");
    fm_io_chunk c = {buf, got};
    st = fm_atomic_write(dst, 1, &c);
    free(buf);
    return st;
}

typedef struct step_dir { int64_t step; char name[64]; } step_dir;

static int cmp_desc(const void *a, const void *b) {
    int64_t x = ((const step_dir *)a)->step, y = ((const step_dir *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The committed step-N directories of ckpt/, newest first (*out is malloc'd). */
static int list_steps(const char *ck, step_dir **out) {
    *out = NULL;
    DIR *d = opendir(ck);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s = step_of(e->d_name);
        if (s < 0 || strlen(e->d_name) >= sizeof((step_dir *)0)->name) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            step_dir *g = realloc(*out, (size_t)cap * sizeof *g);
            if (!g) break;
            *out = g;
        }
        (*out)[n].step = s;
        memcpy((*out)[n].name, e->d_name, strlen(e->d_name) + 1); /* the length was checked above */
        n++;
    }
    closedir(d);
    if (n > 1) qsort(*out, (size_t)n, sizeof **out, cmp_desc);
    return n;
}

/* Keeps the newest `keep` checkpoints at or before this step. Those after it
 * belong to an earlier run (one that this run did not resume from, or whose
 * newer checkpoints were incomplete) and would otherwise shadow the new ones. */
static void prune(const fm_ckpt_tx *tx, int keep, FILE *log) {
    char ck[PATH_MAX], p[PATH_MAX + 64];
    snprintf(ck, sizeof ck, "%s/ckpt", tx->out_dir);
    step_dir *s;
    int n = list_steps(ck, &s), kept = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].step <= tx->step && kept < keep) { kept++; continue; }
        snprintf(p, sizeof p, "%s/%s", ck, s[i].name);
        if (s[i].step > tx->step && log)
            fprintf(log, "removing %s: newer than this run's step %" PRId64 " (left by an earlier run)\n", p, tx->step);
        remove_tree(p, 0);
    }
    free(s);
}

fm_status fm_ckpt_commit(fm_ckpt_tx *tx, int n, const char *const *names, int keep, FILE *log) {
    char ck[PATH_MAX], old[PATH_MAX + 32];
    if (n > FM_CKPT_MAX_FILES) return fm_set_error(FM_ERR_INVALID, "a checkpoint holds at most %d files", FM_CKPT_MAX_FILES);
    fm_status st = write_manifest(tx, n, names);
    if (st) goto fail;
    fm_fsync_dir(tx->tmp);
    snprintf(ck, sizeof ck, "%s/ckpt", tx->out_dir);
    if (is_dir(tx->final)) {
        /* the same step again (a resumed run that ends where it started, or a new run
         * into an earlier run's directory): the two directories swap names in one
         * step, and the old one, now under the temporary name, is removed */
        const char *no = getenv("FATHOM_TEST_NO_EXCHANGE");
        int rc = no && *no == '1' ? (errno = EINVAL, -1) : fm_io_exchange(tx->tmp, tx->final);
        if (rc == 0) {
            fm_fsync_dir(ck);
            remove_tree(tx->tmp, 0);
            tx->tmp[0] = 0;
            goto committed;
        }
        /* no exchange on this file system: the old one is set aside first */
        if ((errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) ||
            snprintf(old, sizeof old, "%s.old.tmp.%ld", tx->final, (long)getpid()) >= (int)sizeof old ||
            fm_io_rename(tx->final, old) != 0) {
            st = fm_set_error(FM_ERR_IO, "replacing %s: %s", tx->final, strerror(errno));
            goto fail;
        }
    } else old[0] = 0;
    if (fm_io_rename(tx->tmp, tx->final) != 0) {
        st = fm_set_error(FM_ERR_IO, "renaming %s to %s: %s", tx->tmp, tx->final, strerror(errno));
        if (old[0]) rename(old, tx->final);
        goto fail;
    }
    tx->tmp[0] = 0;
    fm_fsync_dir(ck);
    if (old[0]) remove_tree(old, 0);
committed:
    for (int i = 0; i < n && st == FM_OK; i++) st = export_file(tx->out_dir, tx->final, names[i]);
    fm_fsync_dir(tx->out_dir);
    if (st) {
        fm_error_prefix("checkpoint %s is complete, but updating %s/ failed", tx->final, tx->out_dir);
        return st;
    }
    prune(tx, keep > 0 ? keep : 1, log);
    return FM_OK;
fail:
    fm_ckpt_abort(tx);
    fm_error_prefix("checkpoint of step %" PRId64 " not written; the previous checkpoints in %s are unchanged", tx->step, ck);
    return st;
}

/* Checks one step-N directory against its MANIFEST; NULL when complete, else why not. */
static const char *verify(const char *dir, int64_t step, char *why, size_t wn) {
    char path[PATH_MAX + 16], line[512];
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    FILE *f = fopen(path, "r");
    if (!f) { snprintf(why, wn, "no MANIFEST (%s)", strerror(errno)); return why; }
    int files = 0;
    bool magic = false, have_step = false, end = false;
    why[0] = 0;
    while (!why[0] && fgets(line, sizeof line, f)) {
        char name[256];
        long long v, size;
        unsigned crc;
        if (!magic) {
            if (strcmp(line, MANIFEST_MAGIC "\n")) snprintf(why, wn, "MANIFEST is not a fathom checkpoint manifest");
            magic = true;
        } else if (end) {
            snprintf(why, wn, "MANIFEST has lines after 'end'");
        } else if (sscanf(line, "step %lld", &v) == 1) {
            if (v != step) snprintf(why, wn, "MANIFEST names step %lld, the directory step %" PRId64, v, step);
            have_step = true;
        } else if (sscanf(line, "file %255s %lld %x", name, &size, &crc) == 3) {
            uint32_t got;
            int64_t gsize;
            if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) snprintf(why, wn, "path too long");
            else if (strchr(name, '/')) snprintf(why, wn, "MANIFEST names a file outside the directory");
            else if (fm_file_crc32(path, &got, &gsize) != FM_OK) snprintf(why, wn, "%s is missing or unreadable", name);
            else if (gsize != size) snprintf(why, wn, "%s has %" PRId64 " bytes, MANIFEST says %lld", name, gsize, size);
            else if (got != crc) snprintf(why, wn, "%s fails its checksum (crc32 %08x, MANIFEST %08x)", name, got, crc);
            files++;
        } else if (!strcmp(line, "end\n")) {
            end = true;
        } else {
            snprintf(why, wn, "MANIFEST has a malformed line");
        }
    }
    fclose(f);
    fm_clear_error();
    if (!why[0] && (!have_step || !end || files == 0)) snprintf(why, wn, "MANIFEST is truncated");
    return why[0] ? why : NULL;
}

fm_status fm_ckpt_find(const char *out_dir, fm_ckpt_found *f, FILE *log) {
    memset(f, 0, sizeof *f);
    f->step = -1;
    char ck[PATH_MAX], p[PATH_MAX], q[PATH_MAX], why[400];
    snprintf(ck, sizeof ck, "%s/ckpt", out_dir);
    if (!is_dir(ck)) {
        snprintf(p, sizeof p, "%s/model.safetensors", out_dir);
        snprintf(q, sizeof q, "%s/train_state.safetensors", out_dir);
        struct stat a, b;
        if (stat(p, &a) == 0 && stat(q, &b) == 0) {
            snprintf(f->dir, sizeof f->dir, "%s", out_dir);
            f->legacy = true;
        }
        return FM_OK;
    }
    step_dir *s;
    int n = list_steps(ck, &s);
    for (int i = 0; i < n; i++) {
        if (snprintf(p, sizeof p, "%s/%s", ck, s[i].name) >= (int)sizeof p) continue;
        if (verify(p, s[i].step, why, sizeof why)) {
            if (log) fprintf(log, "ignoring the incomplete checkpoint %s: %s\n", p, why);
            continue;
        }
        snprintf(f->dir, sizeof f->dir, "%s", p);
        f->step = s[i].step;
        break;
    }
    free(s);
    return FM_OK;
}

fm_status fm_ckpt_relink(const char *out_dir, const fm_ckpt_found *f) {
    if (f->legacy || !f->dir[0]) return FM_OK;
    char path[PATH_MAX + 16], line[512], name[256];
    snprintf(path, sizeof path, "%s/MANIFEST", f->dir);
    FILE *m = fopen(path, "r");
    if (!m) return fm_set_error(FM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    fm_status st = FM_OK;
    long long size;
    unsigned crc;
    while (st == FM_OK && fgets(line, sizeof line, m))
        if (sscanf(line, "file %255s %lld %x", name, &size, &crc) == 3) st = export_file(out_dir, f->dir, name);
    fclose(m);
    fm_fsync_dir(out_dir);
    return st;
}

int64_t fm_ckpt_set_aside(const char *out_dir, int64_t step, char *moved, size_t moved_n, FILE *log) {
    char ck[PATH_MAX], from[PATH_MAX + 32], to[PATH_MAX + 48];
    fm_ckpt_found f;
    if (moved_n) moved[0] = 0;
    snprintf(ck, sizeof ck, "%s/ckpt", out_dir);
    /* only when an earlier complete checkpoint is there to go back to */
    step_dir *s;
    int n = list_steps(ck, &s);
    bool earlier = false;
    for (int i = 0; i < n && !earlier; i++) {
        if (s[i].step >= step || snprintf(from, sizeof from, "%s/%s", ck, s[i].name) >= (int)sizeof from) continue;
        char why[400];
        earlier = verify(from, s[i].step, why, sizeof why) == NULL;
    }
    free(s);
    if (!earlier) return -1;
    if (snprintf(from, sizeof from, "%s/step-%08" PRId64, ck, step) >= (int)sizeof from ||
        snprintf(to, sizeof to, "%s.diverged", from) >= (int)sizeof to || !is_dir(from))
        return -1;
    remove_tree(to, 0); /* one set aside at this step by an earlier run */
    if (fm_io_rename(from, to) != 0) {
        if (log) fprintf(log, "could not move %s to %s: %s\n", from, to, strerror(errno));
        return -1;
    }
    fm_fsync_dir(ck);
    if (moved_n) snprintf(moved, moved_n, "%s", to);
    fm_ckpt_find(out_dir, &f, log);
    if (f.step >= 0 && fm_ckpt_relink(out_dir, &f) != FM_OK && log)
        fprintf(log, "%s/ still links to the checkpoint moved to %s: %s\n", out_dir, to, fm_last_error());
    return f.step;
}

/* "NAME.tmp.PID" (PID digits to the end) -> PID; else -1. */
static long tmp_pid(const char *name) {
    const char *t = NULL;
    for (const char *p = strstr(name, ".tmp."); p; p = strstr(p + 1, ".tmp.")) t = p;
    if (!t || !t[5]) return -1;
    char *end;
    long v = strtol(t + 5, &end, 10);
    return *end || v <= 0 ? -1 : v;
}

static void clean_in(const char *dir, FILE *log) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        long pid = tmp_pid(e->d_name);
        if (pid < 0) continue;
        /* a live process other than this one may still be writing it */
        if (pid != (long)getpid() && !(kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (remove_tree(p, 0) == 0 && log)
            fprintf(log, "removed %s, left by an interrupted write (process %ld)\n", p, pid);
    }
    closedir(d);
}

void fm_ckpt_clean_stale(const char *out_dir, FILE *log) {
    char ck[PATH_MAX];
    clean_in(out_dir, log);
    snprintf(ck, sizeof ck, "%s/ckpt", out_dir);
    clean_in(ck, log);
}
