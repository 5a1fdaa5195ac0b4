/* The GPU database: data/gpus.json, loaded at run time so that prices (which go
 * stale in months) and new cards are edited without rebuilding.
 *
 * Validation is strict: a planner that silently treats a missing bandwidth as
 * zero would print nonsense with confidence. Every problem names the file, the
 * line of the offending entry and the missing field. jansson reports syntax
 * errors with a line; for missing fields we find the entry's line ourselves by
 * scanning the raw text, since jansson keeps no positions for values. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "io/io_internal.h" /* fm_read_text_file */
#include "plan/plan_internal.h"

/* The most a GPU database may hold (data/gpus.json: 44 KB). */
#define PLAN_DB_MAX_BYTES (16 << 20)

const char *fm_plan_db_default_path(void) {
    const char *env = getenv("FATHOM_GPU_DB");
    if (env && *env) return env;
#ifdef FATHOM_DATA_DIR
    /* The source tree's copy wins while developing; an installed build falls
     * back to the installed data directory. */
    if (access(FATHOM_DATA_DIR "/gpus.json", R_OK) == 0) return FATHOM_DATA_DIR "/gpus.json";
#endif
#ifdef FATHOM_INSTALL_DATA_DIR
    return FATHOM_INSTALL_DATA_DIR "/gpus.json";
#else
    return "data/gpus.json";
#endif
}

/* Line numbers (1-based) where each object of the top-level "gpus" array
 * starts. A tiny scanner that understands strings and nesting is enough,
 * because jansson has already accepted the text as valid JSON. */
static int *entry_lines(const char *text, size_t len, int *count) {
    int cap = 16, n = 0;
    int *lines = malloc(sizeof(int) * (size_t)cap);
    if (!lines) return NULL;
    int line = 1, depth = 0, in_gpus = 0, gpus_depth = -1;
    int last_key_gpus = 0; /* the previous string at depth 1 was the key "gpus" */
    int named = 0;         /* the current entry's line already points at its "name" */
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '\n') { line++; continue; }
        if (c == '"') {
            size_t start = i + 1;
            for (i++; i < len && text[i] != '"'; i++) {
                if (text[i] == '\\') i++;
                else if (text[i] == '\n') line++;
            }
            if (depth == 1) last_key_gpus = (i - start == 4 && !strncmp(text + start, "gpus", 4));
            /* Point at the entry's "name" line: that is what a reader searches for. */
            if (in_gpus && n > 0 && !named && depth == gpus_depth + 1 && i - start == 4 &&
                !strncmp(text + start, "name", 4)) {
                lines[n - 1] = line;
                named = 1;
            }
            continue;
        }
        if (c == '{' || c == '[') {
            if (c == '[' && depth == 1 && last_key_gpus) { in_gpus = 1; gpus_depth = depth + 1; }
            else if (c == '{' && in_gpus && depth == gpus_depth) {
                if (n == cap) {
                    cap *= 2;
                    int *nl = realloc(lines, sizeof(int) * (size_t)cap);
                    if (!nl) { free(lines); return NULL; }
                    lines = nl;
                }
                lines[n++] = line;
                named = 0;
            }
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
            if (in_gpus && c == ']' && depth == gpus_depth - 1) in_gpus = 0;
        } else if (c == ',' && depth == 1) {
            last_key_gpus = 0;
        }
    }
    *count = n;
    return lines;
}

/* Read a required number; `allow_null` lets "unknown" (null) stand for a rate a
 * vendor does not publish, which the planner then shows as "-". */
static int get_num(json_t *obj, const char *key, int allow_null, int positive, double *out, const char **bad) {
    json_t *v = json_object_get(obj, key);
    if (!v) { *bad = "missing"; return 0; }
    if (json_is_null(v) && allow_null) { *out = -1; return 1; }
    if (!json_is_number(v)) { *bad = "not a number in"; return 0; }
    *out = json_number_value(v);
    if (positive && !(*out > 0)) { *bad = "not a positive number in"; return 0; }
    if (*out < 0) { *bad = "negative"; return 0; }
    return 1;
}

static int get_str(json_t *obj, const char *key, char *out, size_t cap, const char **bad) {
    json_t *v = json_object_get(obj, key);
    if (!v) { *bad = "missing"; return 0; }
    if (!json_is_string(v)) { *bad = "not a string in"; return 0; }
    snprintf(out, cap, "%s", json_string_value(v));
    return 1;
}

/* Parse one entry; on failure fill `field` with the dotted name of what is wrong. */
static int parse_entry(json_t *e, fm_plan_gpu *g, char *field, size_t fcap, const char **bad) {
    static const char *const nums[] = {"memory_gb", "bandwidth_gbs", "fp32_tflops", "bf16_tflops",
                                       "fp8_tflops", "int8_tops", "tdp_w"};
    double *dst[] = {&g->memory_gib, &g->bandwidth_gbs, &g->fp32_tflops, &g->bf16_tflops,
                     &g->fp8_tflops, &g->int8_tops, &g->tdp_w};
    /* Memory, bandwidth and the 16-bit rate drive every estimate: they must be real. */
    const int nullable[] = {0, 0, 1, 0, 1, 1, 1};
    for (int i = 0; i < 7; i++) {
        if (!get_num(e, nums[i], nullable[i], !nullable[i], dst[i], bad)) {
            snprintf(field, fcap, "%s", nums[i]);
            return 0;
        }
    }
    if (!get_str(e, "kind", g->kind, sizeof g->kind, bad)) { snprintf(field, fcap, "kind"); return 0; }
    json_t *bf = json_object_get(e, "bf16");
    if (!bf) { *bad = "missing"; snprintf(field, fcap, "bf16"); return 0; }
    if (!json_is_boolean(bf)) { *bad = "not true/false in"; snprintf(field, fcap, "bf16"); return 0; }
    g->bf16 = json_is_true(bf);

    json_t *ic = json_object_get(e, "interconnect");
    if (!ic || !json_is_object(ic)) {
        *bad = ic ? "not an object in" : "missing";
        snprintf(field, fcap, "interconnect");
        return 0;
    }
    if (!get_str(ic, "name", g->link, sizeof g->link, bad)) { snprintf(field, fcap, "interconnect.name"); return 0; }
    json_t *nv = json_object_get(ic, "nvlink");
    if (!nv || !json_is_boolean(nv)) {
        *bad = nv ? "not true/false in" : "missing";
        snprintf(field, fcap, "interconnect.nvlink");
        return 0;
    }
    g->nvlink = json_is_true(nv);
    double lanes = 0;
    if (!get_num(ic, "pcie_lanes", 0, 1, &lanes, bad)) { snprintf(field, fcap, "interconnect.pcie_lanes"); return 0; }
    if (lanes > 64 || lanes != floor(lanes)) {
        *bad = "not a whole number of lanes (1..64) in";
        snprintf(field, fcap, "interconnect.pcie_lanes");
        return 0;
    }
    g->pcie_lanes = (int)lanes;
    if (!get_num(ic, "link_gbs", 0, 1, &g->link_gbs, bad)) { snprintf(field, fcap, "interconnect.link_gbs"); return 0; }
    double node = 0;
    if (!get_num(ic, "gpus_per_node", 0, 1, &node, bad)) { snprintf(field, fcap, "interconnect.gpus_per_node"); return 0; }
    if (node > 4096 || node != floor(node)) {
        *bad = "not a whole number of GPUs (1..4096) in";
        snprintf(field, fcap, "interconnect.gpus_per_node");
        return 0;
    }
    g->gpus_per_node = (int)node;
    if (!get_num(ic, "inter_node_gbs", 0, 1, &g->inter_node_gbs, bad)) {
        snprintf(field, fcap, "interconnect.inter_node_gbs");
        return 0;
    }

    json_t *mf = json_object_get(e, "mfu");
    if (!mf || !json_is_object(mf)) {
        *bad = mf ? "not an object in" : "missing";
        snprintf(field, fcap, "mfu");
        return 0;
    }
    static const char *const mk[] = {"fp32", "bf16", "fp8"};
    double *md[] = {&g->mfu_fp32, &g->mfu_bf16, &g->mfu_fp8};
    for (int i = 0; i < 3; i++) {
        /* The 16-bit figure drives every default estimate: it must be real. */
        if (!get_num(mf, mk[i], i != 1, i == 1, md[i], bad)) { snprintf(field, fcap, "mfu.%s", mk[i]); return 0; }
        if (*md[i] > 1) { *bad = "above 1 (a fraction of the peak) in"; snprintf(field, fcap, "mfu.%s", mk[i]); return 0; }
    }
    if (!get_str(mf, "source", g->mfu_source, sizeof g->mfu_source, bad)) { snprintf(field, fcap, "mfu.source"); return 0; }
    /* Optional: the measured maximum achievable matmul efficiency. */
    g->matmul_bf16 = g->matmul_fp8 = -1;
    g->matmul_source[0] = 0;
    json_t *mm = json_object_get(mf, "matmul");
    if (mm) {
        if (!json_is_object(mm)) { *bad = "not an object in"; snprintf(field, fcap, "mfu.matmul"); return 0; }
        static const char *const mmk[] = {"bf16", "fp8"};
        double *mmd[] = {&g->matmul_bf16, &g->matmul_fp8};
        for (int i = 0; i < 2; i++) {
            if (!get_num(mm, mmk[i], 1, 0, mmd[i], bad)) { snprintf(field, fcap, "mfu.matmul.%s", mmk[i]); return 0; }
            if (*mmd[i] == 0 || *mmd[i] > 1) {
                *bad = "outside (0, 1]: a fraction of the peak, in";
                snprintf(field, fcap, "mfu.matmul.%s", mmk[i]);
                return 0;
            }
        }
        if (!get_str(mm, "source", g->matmul_source, sizeof g->matmul_source, bad)) {
            snprintf(field, fcap, "mfu.matmul.source");
            return 0;
        }
    }

    json_t *pr = json_object_get(e, "prices");
    if (!pr || !json_is_object(pr)) {
        *bad = pr ? "not an object in" : "missing";
        snprintf(field, fcap, "prices");
        return 0;
    }
    static const char *const kinds[] = {"on_demand", "spot", "reserved"};
    for (int k = 0; k < FM_PLAN_PRICING_COUNT; k++) {
        json_t *p = json_object_get(pr, kinds[k]);
        if (!p || !json_is_object(p)) {
            *bad = p ? "not an object in" : "missing";
            snprintf(field, fcap, "prices.%s", kinds[k]);
            return 0;
        }
        if (!get_num(p, "usd_per_hour", 1, 1, &g->price[k].usd_per_hour, bad)) {
            snprintf(field, fcap, "prices.%s.usd_per_hour", kinds[k]);
            return 0;
        }
        if (!get_str(p, "date", g->price[k].date, sizeof g->price[k].date, bad)) {
            snprintf(field, fcap, "prices.%s.date", kinds[k]);
            return 0;
        }
        if (!get_str(p, "source", g->price[k].source, sizeof g->price[k].source, bad)) {
            snprintf(field, fcap, "prices.%s.source", kinds[k]);
            return 0;
        }
    }
    return 1;
}

/* Figures no real card has (a typo such as MiB for GiB) and prices that
 * contradict each other: spot and reserved are discounts on on-demand. Writes
 * the message's tail into `msg`; returns 0 when the entry is refused. */
static int check_entry(const fm_plan_gpu *g, char *msg, size_t cap) {
    struct { const char *name; double v, max; } lim[] = {
        {"memory_gb", g->memory_gib, 4096}, {"bandwidth_gbs", g->bandwidth_gbs, 100000},
        {"bf16_tflops", g->bf16_tflops, 100000}, {"fp8_tflops", g->fp8_tflops, 200000},
        {"fp32_tflops", g->fp32_tflops, 100000}, {"int8_tops", g->int8_tops, 200000}, {"tdp_w", g->tdp_w, 10000},
        {"interconnect.link_gbs", g->link_gbs, 100000}, {"interconnect.inter_node_gbs", g->inter_node_gbs, 100000},
    };
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        if (lim[i].v > lim[i].max) {
            snprintf(msg, cap, "field \"%s\" is %g, beyond any real GPU (at most %g); check the unit", lim[i].name,
                     lim[i].v, lim[i].max);
            return 0;
        }
    double od = g->price[FM_PLAN_ON_DEMAND].usd_per_hour;
    for (int k = FM_PLAN_SPOT; k <= FM_PLAN_RESERVED; k++) {
        double p = g->price[k].usd_per_hour;
        if (od >= 0 && p > od) {
            snprintf(msg, cap, "prices.%s.usd_per_hour %g is above prices.on_demand.usd_per_hour %g; %s prices are "
                     "discounts on on-demand: fix one of them", k == FM_PLAN_SPOT ? "spot" : "reserved", p, od,
                     fm_plan_pricing_name((fm_plan_pricing)k));
            return 0;
        }
    }
    return 1;
}

fm_plan_db *fm_plan_db_load(const char *path) {
    if (!path) path = fm_plan_db_default_path();
    size_t len = 0;
    fm_status st;
    const char *unread;
    char *text = fm_read_text_file(path, PLAN_DB_MAX_BYTES, &len, &st, &unread);
    if (!text) {
        if (st == FM_ERR_IO)
            fm_set_error(st, "cannot read GPU database %s (%s; pass --gpu-db FILE or set FATHOM_GPU_DB)", path,
                         strerror(errno));
        else if (st == FM_ERR_FORMAT)
            fm_set_error(st, "GPU database %s: %s (a database is a JSON file of at most %d MiB; pass --gpu-db FILE "
                         "or set FATHOM_GPU_DB)", path, unread, PLAN_DB_MAX_BYTES >> 20);
        else fm_set_error(st, "out of host memory reading GPU database %s", path);
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) {
        fm_set_error(FM_ERR_FORMAT, "%s:%d: malformed JSON: %s", path, jerr.line, jerr.text);
        free(text);
        return NULL;
    }
    fm_plan_db *db = NULL;
    int *lines = NULL, nlines = 0;
    json_t *arr = json_is_object(root) ? json_object_get(root, "gpus") : NULL;
    if (!arr || !json_is_array(arr) || json_array_size(arr) == 0) {
        fm_set_error(FM_ERR_FORMAT, "%s:1: missing field \"gpus\" (a non-empty array of GPU entries)", path);
        goto done;
    }
    lines = entry_lines(text, len, &nlines);
    db = calloc(1, sizeof *db);
    if (db) db->gpus = calloc(json_array_size(arr), sizeof *db->gpus);
    if (!db || !db->gpus || !lines) {
        fm_set_error(FM_ERR_OOM, "out of memory loading %s", path);
        fm_plan_db_free(db);
        db = NULL;
        goto done;
    }
    snprintf(db->path, sizeof db->path, "%s", path);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *e = json_array_get(arr, i);
        fm_plan_gpu *g = &db->gpus[i];
        g->line = (int)i < nlines ? lines[i] : 1;
        if (!json_is_object(e)) {
            fm_set_error(FM_ERR_FORMAT, "%s:%d: entry %zu is not an object", path, g->line, i + 1);
            goto fail;
        }
        const char *bad = "missing";
        char field[64];
        if (!get_str(e, "name", g->name, sizeof g->name, &bad) || !g->name[0]) {
            fm_set_error(FM_ERR_FORMAT, "%s:%d: entry %zu: missing field \"name\"", path, g->line, i + 1);
            goto fail;
        }
        if (!parse_entry(e, g, field, sizeof field, &bad)) {
            if (!strcmp(bad, "missing"))
                fm_set_error(FM_ERR_FORMAT, "%s:%d: entry \"%s\": missing field \"%s\"", path, g->line, g->name, field);
            else
                fm_set_error(FM_ERR_FORMAT, "%s:%d: entry \"%s\": field \"%s\" is %s", path, g->line, g->name, field,
                             !strcmp(bad, "negative") ? "negative" : bad);
            goto fail;
        }
        char why[256];
        if (!check_entry(g, why, sizeof why)) {
            fm_set_error(FM_ERR_FORMAT, "%s:%d: entry \"%s\": %s", path, g->line, g->name, why);
            goto fail;
        }
        for (size_t j = 0; j < i; j++)
            if (!strcasecmp(db->gpus[j].name, g->name)) {
                fm_set_error(FM_ERR_FORMAT, "%s:%d: entry \"%s\" duplicates the entry at line %d", path, g->line,
                             g->name, db->gpus[j].line);
                goto fail;
            }
        db->count++;
    }
    goto done;
fail:
    /* jansson phrases like "not a number in" read oddly after "is"; the
     * messages above keep the field name, which is what a user needs. */
    fm_plan_db_free(db);
    db = NULL;
done:
    free(lines);
    json_decref(root);
    free(text);
    return db;
}

void fm_plan_db_free(fm_plan_db *db) {
    if (!db) return;
    free(db->gpus);
    free(db);
}

const fm_plan_gpu *fm_plan_db_find(const fm_plan_db *db, const char *name) {
    char want[128], have[128];
    plan_name_normalize(name ? name : "", want, sizeof want);
    if (!want[0]) {
        fm_set_error(FM_ERR_INVALID, "empty GPU name");
        return NULL;
    }
    const fm_plan_gpu *hit = NULL;
    int nhits = 0;
    for (int i = 0; i < db->count; i++) {
        plan_name_normalize(db->gpus[i].name, have, sizeof have);
        if (!strcmp(have, want)) return &db->gpus[i];
        if (strstr(have, want)) { hit = &db->gpus[i]; nhits++; }
    }
    if (nhits == 1) return hit;
    plan_sb sb = {0};
    const char **names = malloc(sizeof(char *) * (size_t)db->count);
    if (nhits > 1) {
        plan_sb_printf(&sb, "GPU name \"%s\" is ambiguous: it matches", name);
        for (int i = 0; i < db->count; i++) {
            plan_name_normalize(db->gpus[i].name, have, sizeof have);
            if (strstr(have, want)) plan_sb_printf(&sb, " \"%s\"", db->gpus[i].name);
        }
    } else {
        plan_sb_printf(&sb, "unknown GPU \"%s\"", name);
        if (names) {
            for (int i = 0; i < db->count; i++) names[i] = db->gpus[i].name;
            plan_suggest(&sb, name, names, db->count);
        }
        plan_sb_printf(&sb, " (the database %s lists %d GPUs)", db->path, db->count);
    }
    free(names);
    char *msg = plan_sb_take(&sb);
    fm_set_error(FM_ERR_INVALID, "%s", msg ? msg : "unknown GPU");
    free(msg);
    return NULL;
}
