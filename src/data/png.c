/* PNG input for `fathom predict` (and PNG output for tests and tools), through
 * libpng's simplified API, which handles palettes, 16-bit samples and alpha for
 * us. Built only when CMake found libpng (FATHOM_HAVE_PNG). */
#include "data/data_internal.h"

#include <stdlib.h>
#include <string.h>

#ifdef FATHOM_HAVE_PNG
#include <png.h>

bool fm_png_available(void) { return true; }

fm_tensor *fm_png_read(const char *path) {
    if (!path) {
        fm_set_error(FM_ERR_INVALID, "png_read: no file name given");
        return NULL;
    }
    /* read through our own file reader so a missing file gets the usual I/O error */
    unsigned char *buf;
    size_t n;
    if (fm_data_read_file(path, &buf, &n) != FM_OK) return NULL;
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&img, buf, n)) {
        fm_set_error(FM_ERR_FORMAT, "%s: not a readable PNG (%s)", path, img.message);
        png_image_free(&img);
        free(buf);
        return NULL;
    }
    int channels = (img.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1;
    img.format = channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
    size_t hw = 0;
    if (img.width == 0 || img.height == 0 || !fm_mul_ok(img.width, img.height, &hw) || hw > ((size_t)1 << 28)) {
        fm_set_error(FM_ERR_FORMAT, "%s: PNG size %ux%u is empty or too large", path, img.width, img.height);
        png_image_free(&img);
        free(buf);
        return NULL;
    }
    unsigned char *pix = malloc(PNG_IMAGE_SIZE(img));
    if (!pix) {
        fm_set_error(FM_ERR_OOM, "%s: out of memory for %ux%u pixels", path, img.width, img.height);
        png_image_free(&img);
        free(buf);
        return NULL;
    }
    if (!png_image_finish_read(&img, NULL, pix, 0, NULL)) {
        fm_set_error(FM_ERR_FORMAT, "%s: corrupt PNG (%s)", path, img.message);
        png_image_free(&img);
        free(pix);
        free(buf);
        return NULL;
    }
    free(buf);
    int64_t shape[3] = {channels, img.height, img.width};
    fm_tensor *t = fm_tensor_empty(3, shape, FM_F32, FM_CPU);
    if (t) {
        float *d = fm_tensor_data(t);
        for (int c = 0; c < channels; c++)
            for (size_t i = 0; i < hw; i++) d[(size_t)c * hw + i] = (float)pix[i * (size_t)channels + (size_t)c] / 255.0f;
    } else {
        fm_error_prefix("%s", path);
    }
    free(pix);
    return t;
}

fm_status fm_png_write(const char *path, const fm_tensor *t) {
    if (!path || !t) return fm_set_error(FM_ERR_INVALID, "png_write: NULL path or tensor");
    int c = t->ndim == 2 ? 1 : t->ndim == 3 ? (int)t->shape[0] : 0;
    if ((c != 1 && c != 3) || (t->dtype != FM_U8 && t->dtype != FM_F32)) {
        char sb[160];
        return fm_set_error(FM_ERR_INVALID, "png_write: %s: need U8 or F32 [H, W] or [1|3, H, W], got %s %s", path,
                            fm_dtype_name(t->dtype), fm_shape_str(t->ndim, t->shape, sb, sizeof sb));
    }
    int64_t h = t->shape[t->ndim - 2], w = t->shape[t->ndim - 1];
    if (h <= 0 || w <= 0 || h > 65535 || w > 65535)
        return fm_set_error(FM_ERR_INVALID, "png_write: %s: bad image size %lldx%lld", path, (long long)w, (long long)h);
    size_t hw = (size_t)h * (size_t)w;
    unsigned char *pix = malloc(hw * (size_t)c);
    if (!pix) return fm_set_error(FM_ERR_OOM, "png_write: out of memory");
    for (int ch = 0; ch < c; ch++)
        for (size_t i = 0; i < hw; i++) {
            double v = fm_tensor_get(t, (int64_t)((size_t)ch * hw + i));
            if (t->dtype == FM_F32) v = v * 255.0 + 0.5;
            pix[i * (size_t)c + (size_t)ch] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)w;
    img.height = (png_uint_32)h;
    img.format = c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
    int ok = png_image_write_to_file(&img, path, 0, pix, 0, NULL);
    free(pix);
    if (!ok) {
        fm_status st = fm_set_error(FM_ERR_IO, "png_write: %s: %s", path, img.message);
        png_image_free(&img);
        return st;
    }
    return FM_OK;
}

#else

bool fm_png_available(void) { return false; }

fm_tensor *fm_png_read(const char *path) {
    fm_set_error(FM_ERR_UNSUPPORTED, "%s: this build of fathom has no PNG support (rebuild with libpng-dev installed)",
                 path ? path : "(null)");
    return NULL;
}

fm_status fm_png_write(const char *path, const fm_tensor *t) {
    (void)t;
    return fm_set_error(FM_ERR_UNSUPPORTED, "%s: this build of fathom has no PNG support (rebuild with libpng-dev installed)",
                        path ? path : "(null)");
}

#endif
