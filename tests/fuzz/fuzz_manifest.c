/* Checkpoint MANIFESTs (src/io/ckpt_dir.c): the input is the MANIFEST of
 * ckpt/step-00000001 next to one small file it may name. */
#include <sys/stat.h>

#include "io/io_internal.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char root[400], dir[450], path[500];
    snprintf(root, sizeof root, "%s/fathom_fuzz_ckpt_%ld", fuzz_dir(), (long)getpid());
    snprintf(dir, sizeof dir, "%s/ckpt/step-00000001", root);
    mkdir(root, 0755);
    snprintf(path, sizeof path, "%s/ckpt", root);
    mkdir(path, 0755);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/a", dir);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fputs("abc", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    if (!(f = fopen(path, "wb"))) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    fm_ckpt_found found;
    (void)fm_ckpt_find(root, &found, NULL);
    fm_clear_error();
    return 0;
}
