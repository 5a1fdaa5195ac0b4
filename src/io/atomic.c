/* Atomic file writes: temp file in the target's directory, fsync, rename, fsync
 * of the directory. rename() within one file system replaces the name in one
 * step, so readers (and a crash) see either the old file or the complete new
 * one. The directory fsync makes the rename itself durable.
 *
 * FATHOM_TEST_FAIL_WRITE_AFTER=N simulates a full disk after N bytes so the
 * tests can check that a failed checkpoint leaves the previous one intact, and
 * each write is a FATHOM_FAULT point (fault.c), struck with half the data
 * written. Temporary names end in .tmp.<pid> so that a dead process's leftovers
 * can be told from a live one's: each write of PATH first sweeps PATH.tmp.<pid>
 * of processes that are gone (fm_stale_sweep, dir_commit.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fathom/io.h"
#include "io/io_internal.h"

static fm_status write_all(int fd, const char *path, const void *data, size_t n, size_t *written, long long limit) {
    const char *p = data;
    while (n > 0) {
        size_t want = n;
        if (limit >= 0) {
            if ((long long)*written >= limit) {
                errno = ENOSPC;
                return fm_set_error(FM_ERR_IO, "writing %s: %s (simulated by FATHOM_TEST_FAIL_WRITE_AFTER)", path,
                                    strerror(ENOSPC));
            }
            if ((long long)(*written + want) > limit) want = (size_t)(limit - (long long)*written);
        }
        ssize_t w = write(fd, p, want);
        if (w < 0) {
            if (errno == EINTR) continue;
            return fm_set_error(FM_ERR_IO, "writing %s: %s", path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
        *written += (size_t)w;
    }
    return FM_OK;
}

fm_status fm_atomic_write(const char *path, int n, const fm_io_chunk *chunks) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return fm_set_error(FM_ERR_INVALID, "path too long: %s", path);
    fm_stale_sweep(path, stderr); /* PATH.tmp.PID of writers that died */
    long long limit = -1;
    const char *env = getenv("FATHOM_TEST_FAIL_WRITE_AFTER");
    if (env && *env) limit = atoll(env);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fm_set_error(FM_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    size_t written = 0, total = 0, half;
    for (int i = 0; i < n; i++) total += chunks[i].n;
    half = total / 2;
    fm_status st = FM_OK;
    for (int i = 0; i < n && st == FM_OK; i++) {
        const char *p = chunks[i].data;
        size_t left = chunks[i].n;
        if (written <= half && written + left > half) { /* the fault point sits in the middle of the data */
            size_t first = half - written;
            st = write_all(fd, tmp, p, first, &written, limit);
            if (st == FM_OK && fm_fault_point(FM_FAULT_WRITE, path) != 0)
                st = fm_set_error(FM_ERR_IO, "writing %s: %s (injected by FATHOM_FAULT)", tmp, strerror(EIO));
            p += first;
            left -= first;
        }
        if (st == FM_OK) st = write_all(fd, tmp, p, left, &written, limit);
    }
    if (st == FM_OK && total == 0 && fm_fault_point(FM_FAULT_WRITE, path) != 0)
        st = fm_set_error(FM_ERR_IO, "writing %s: %s (injected by FATHOM_FAULT)", tmp, strerror(EIO));
    if (st == FM_OK && fsync(fd) != 0) st = fm_set_error(FM_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == FM_OK) st = fm_set_error(FM_ERR_IO, "closing %s: %s", tmp, strerror(errno));
    if (st == FM_OK && fm_io_rename(tmp, path) != 0)
        st = fm_set_error(FM_ERR_IO, "renaming %s to %s: %s", tmp, path, strerror(errno));
    if (st != FM_OK) {
        unlink(tmp);
        fm_error_prefix("%s was not written; any previous version is unchanged", path);
        return st;
    }
    /* make the rename durable */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    fm_fsync_dir(dir);
    return FM_OK;
}

fm_status fm_mkdir_p(const char *path) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return fm_set_error(FM_ERR_INVALID, "path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return fm_set_error(FM_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return fm_set_error(FM_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
    struct stat sb;
    if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode)) return fm_set_error(FM_ERR_IO, "%s is not a directory", buf);
    return FM_OK;
}
