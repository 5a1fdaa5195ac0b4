/* Fault injection for the crash-safety tests: FATHOM_FAULT=KIND:N[:ACTION]
 * makes the N-th write or rename of this process fail with EIO or kill the
 * process (see io_internal.h). Unset, each point costs one getenv. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io_internal.h"

static long long g_count[2];

int fm_fault_point(fm_fault_kind kind, const char *path) {
    long long n = ++g_count[kind];
    const char *spec = getenv("FATHOM_FAULT");
    if (!spec || !*spec) return 0;
    const char *name = kind == FM_FAULT_WRITE ? "write" : "rename";
    size_t ln = strlen(name);
    if (strncmp(spec, name, ln) || spec[ln] != ':') return 0;
    char *end;
    long long at = strtoll(spec + ln + 1, &end, 10);
    if (at != n) return 0;
    bool kill_it = !strcmp(end, ":kill");
    fprintf(stderr, "FATHOM_FAULT: %s %lld (%s): %s\n", name, n, path, kill_it ? "killing the process" : "failing with EIO");
    if (kill_it) {
        fflush(NULL);
        raise(SIGKILL);
    }
    errno = EIO;
    return -1;
}

int fm_io_rename(const char *from, const char *to) {
    if (fm_fault_point(FM_FAULT_RENAME, to) != 0) return -1;
    return rename(from, to);
}

int fm_io_exchange(const char *a, const char *b) {
    if (fm_fault_point(FM_FAULT_RENAME, b) != 0) return -1;
    return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
}

void fm_fsync_dir(const char *dir) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}
