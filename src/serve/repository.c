/* The model repository: see repository.h. `mu` guards the model table and is
 * held only briefly; `load_mu` serialises loads and unloads, which take long
 * (reading weights) and must not block lookups. */
#include "serve/repository.h"

#include "io/io_internal.h" /* fm_read_text_file */

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#define MAX_MODELS 256
#define PBUF (PATH_MAX + 512) /* a path under the repository root (itself < PATH_MAX) */
#define MAX_VERSIONS 256

/* A version whose load failed, and what its files and the config were then: the
 * poll does not load it again (an ONNX import, say, runs the model twice) until
 * one of them changes. An explicit load always tries. */
typedef struct failed_version {
    int64_t version;
    uint64_t stamp;
    fm_status status;
    char reason[512];
} failed_version;

typedef struct repo_model {
    char name[FM_SERVE_NAME_MAX];
    fm_serve_version *versions; /* highest first */
    bool ready;
    char reason[512];
    struct timespec cfg_mtime;
    off_t cfg_size;
    bool cfg_overridden; /* the loaded versions use a load request's config, not the file's */
    failed_version failed[8]; /* more failed versions than this are simply tried again */
    int n_failed;
} repo_model;

struct fm_repo {
    char root[PATH_MAX];
    fm_device device;
    pthread_mutex_t mu, load_mu;
    int n;
    repo_model *models[MAX_MODELS];
};

bool fm_serve_valid_name(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= FM_SERVE_NAME_MAX || s[0] == '.') return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.') return false;
    return true;
}

bool fm_serve_parse_version(const char *s, int64_t *out) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 18) return false;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v <= 0) return false;
    *out = v;
    return true;
}

fm_repo *fm_repo_open(const char *root, fm_device device) {
    struct stat st;
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fm_set_error(FM_ERR_IO, "model repository '%s' is not a directory", root);
        return NULL;
    }
    fm_repo *r = calloc(1, sizeof *r);
    if (!r || !realpath(root, r->root)) {
        free(r);
        fm_set_error(FM_ERR_IO, "model repository '%s': cannot resolve its path", root);
        return NULL;
    }
    r->device = device;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->load_mu, NULL);
    return r;
}

static void version_free(fm_serve_version *v) {
    for (int k = 0; k < FM_SERVE_MAX_IO; k++) free(v->labels[k].text), free(v->labels[k].line);
    fm_batcher_stop(v->batcher);
    fm_textgen_stop(v->textgen);
    fm_embedder_free(v->embedder);
    fm_serve_stats_destroy(&v->stats);
    free(v);
}

void fm_repo_release(fm_serve_version *v) {
    if (v && atomic_fetch_sub(&v->refs, 1) == 1) version_free(v);
}

static void release_list(fm_serve_version *v) {
    while (v) {
        fm_serve_version *nx = v->next;
        fm_repo_release(v);
        v = nx;
    }
}

/* Under mu. */
static repo_model *find_model(fm_repo *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->models[i]->name, name)) return r->models[i];
    return NULL;
}

static repo_model *get_model(fm_repo *r, const char *name) {
    pthread_mutex_lock(&r->mu);
    repo_model *m = find_model(r, name);
    if (!m && r->n < MAX_MODELS && (m = calloc(1, sizeof *m))) {
        snprintf(m->name, sizeof m->name, "%s", name);
        r->models[r->n++] = m;
    }
    pthread_mutex_unlock(&r->mu);
    return m;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Version folders of a model, highest first. */
static int list_versions(const char *dir, int64_t *vs, int max) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        int64_t v;
        char p[PBUF];
        struct stat st;
        if (!fm_serve_parse_version(e->d_name, &v)) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) vs[n++] = v;
    }
    closedir(d);
    qsort(vs, (size_t)n, sizeof *vs, cmp_desc);
    return n;
}

static int apply_policy(const fm_model_config *c, const int64_t *have, int n, int64_t *want) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        bool take = c->policy == FM_VP_ALL || (c->policy == FM_VP_LATEST && i < c->latest_n);
        for (int j = 0; c->policy == FM_VP_SPECIFIC && j < c->n_specific; j++)
            if (c->specific[j] == have[i]) take = true;
        if (take) want[k++] = have[i];
    }
    return k;
}

/* A BERT sentence encoder (embedder.h), served on /v1/embeddings. Frees v on failure. */
static fm_serve_version *embedder_load(fm_serve_version *v, const char *vdir, const fm_model_config *cfg, const char *where) {
    if (!fm_embedder_dir(vdir))
        fm_set_error(FM_ERR_FORMAT, "%s: the config names platform 'fathom_embed' but this version folder has no BERT "
                     "sentence encoder (config.json with model_type bert, model.safetensors, vocab.txt)", vdir);
    else if (*cfg->platform && strcmp(cfg->platform, "fathom_embed"))
        fm_set_error(FM_ERR_FORMAT, "%s: the config names platform '%s' but this version folder holds a fathom_embed model "
                     "(a BERT sentence encoder)", vdir, cfg->platform);
    else if (cfg->n_inputs || cfg->n_outputs || cfg->dynamic_batching)
        fm_set_error(FM_ERR_FORMAT, "%s: an embedding model takes text on POST /v1/embeddings: its config has no input, "
                     "output or dynamic_batching (instance_group's count says how many requests run at once)", where);
    else {
        fm_serve_stats_init(&v->stats);
        v->platform = "fathom_embed";
        if ((v->embedder = fm_embedder_open(vdir, &v->cfg, &v->stats))) return v;
        fm_serve_stats_destroy(&v->stats);
    }
    free(v);
    return NULL;
}

/* The outputs' label files (label_filename: model_dir/NAME, one label per line, at
 * most 16 MiB of text) into v->labels. */
static fm_status labels_load(fm_serve_version *v, const char *model_dir) {
    for (int k = 0; k < v->cfg.n_outputs; k++) {
        const char *f = v->cfg.outputs[k].label_file;
        if (!*f) continue;
        char p[PBUF + 80];
        snprintf(p, sizeof p, "%s/%s", model_dir, f);
        fm_serve_labels *l = &v->labels[k];
        size_t n = 0;
        fm_status st;
        const char *why;
        if (!(l->text = fm_read_text_file(p, 16u << 20, &n, &st, &why)))
            return fm_set_error(st, "output '%s': label_filename '%s': %s (it must be a text file in the model folder)",
                                v->cfg.outputs[k].name, p, why);
        int64_t lines = 0;
        for (size_t i = 0; i < n; i++) lines += l->text[i] == '\n';
        if (!(l->line = malloc(sizeof *l->line * (size_t)(lines + 1)))) return fm_set_error(FM_ERR_OOM, "out of memory");
        for (char *s = l->text, *e; s < l->text + n; s = e + 1) {
            e = strchr(s, '\n');
            if (!e) e = l->text + n;
            *e = 0;
            if (e > s && e[-1] == '\r') e[-1] = 0;
            l->line[l->n++] = s;
        }
    }
    return FM_OK;
}

static fm_serve_version *version_load(fm_repo *r, const char *model_dir, const fm_model_config *cfg, int64_t ver) {
    char vdir[PBUF], where[PBUF];
    snprintf(vdir, sizeof vdir, "%s/%lld", model_dir, (long long)ver);
    /* the config file, for errors that name it (config.json when there is none) */
    if (fm_model_config_file(model_dir, where, sizeof where) || !*where)
        snprintf(where, sizeof where, "%s/config.json", model_dir);
    fm_serve_version *v = calloc(1, sizeof *v);
    fm_servable *inst[64] = {0};
    if (!v) { fm_set_error(FM_ERR_OOM, "serve: out of memory"); return NULL; }
    v->cfg = *cfg;
    if (!cfg->device_set) v->cfg.device = r->device;
    snprintf(v->model, sizeof v->model, "%s", cfg->name);
    v->version = ver;
    v->loaded_unix = (int64_t)time(NULL);
    atomic_init(&v->refs, 1);
    if (fm_embedder_dir(vdir) || !strcmp(cfg->platform, "fathom_embed")) return embedder_load(v, vdir, cfg, where);
    /* a GPT graph is served for text (with its tokenizer) unless the config asks for
     * platform fathom_graph: then its decode step is a KServe model like any graph */
    bool gpt = fm_textgen_dir_is_gpt(vdir) || (fm_textgen_dir_is_gpt_graph(vdir) && strcmp(cfg->platform, "fathom_graph"));
    if (*cfg->platform && gpt != !strcmp(cfg->platform, "fathom_gpt")) {
        fm_set_error(FM_ERR_FORMAT, "%s: the config names platform '%s' but this version folder %s", vdir, cfg->platform,
                     gpt ? "holds a fathom_gpt model" : "has no GPT model (config.json, model.safetensors, tokenizer.txt; "
                     "or a GPT graph: graph.json, weights.safetensors, tokenizer.txt)");
        free(v);
        return NULL;
    }
    if (gpt && cfg->max_batch_size == 0) {
        fm_set_error(FM_ERR_FORMAT, "%s: max_batch_size 0 (no batching) is not for a text-generation model: its "
                     "max_batch_size is how many sequences decode together (give 1 or more)", where);
        free(v);
        return NULL;
    }
    if (gpt) {
        fm_serve_stats_init(&v->stats);
        v->platform = "fathom_gpt";
        if (!(v->textgen = fm_textgen_open(vdir, &v->cfg, &v->stats))) { fm_serve_stats_destroy(&v->stats); free(v); return NULL; }
        const char *why = NULL;
        const fm_chat_jinja *cj = fm_textgen_chat_template(v->textgen, &why);
        if (why) {
            snprintf(v->chat_refusal, sizeof v->chat_refusal, "%s", why);
            fprintf(stderr, "fathom serve: %s: /v1/chat/completions is refused for this model until its config gives "
                            "text_generation.chat_template (docs/SERVING.md): %s\n", vdir, why);
        } else if (cj) {
            fprintf(stderr, "fathom serve: %s: chat through the model's own template (%s)\n", vdir, cj->file);
        }
        return v;
    }
    int n = cfg->instance_count;
    for (int i = 0; i < n; i++) {
        bool whole = cfg->max_batch_size_set && cfg->max_batch_size == 0; /* the declared dims are whole shapes */
        if (!(inst[i] = fm_servable_open(vdir, v->cfg.device, cfg->platform, cfg->model_filename, cfg->inputs,
                                         cfg->n_inputs, whole)))
            goto fail;
        /* every instance: max_batch_size 0 makes each one's shapes whole */
        if (fm_model_config_complete(&v->cfg, inst[i], where)) goto fail;
    }
    if (labels_load(v, model_dir)) goto fail;
    v->platform = inst[0]->platform;
    fm_serve_stats_init(&v->stats);
    v->batcher = fm_batcher_start(&v->cfg, inst, n, &v->stats);
    if (!v->batcher) { fm_serve_stats_destroy(&v->stats); free(v); return NULL; }
    return v;
fail:
    for (int i = 0; i < n; i++) fm_servable_free(inst[i]);
    for (int k = 0; k < FM_SERVE_MAX_IO; k++) free(v->labels[k].text), free(v->labels[k].line);
    free(v);
    return NULL;
}

static bool cfg_changed(repo_model *m, const char *model_dir, struct stat *out) {
    char p[PBUF];
    fm_model_config_file(model_dir, p, sizeof p); /* both files: the load refuses it before this */
    if (!*p || stat(p, out) != 0) memset(out, 0, sizeof *out);
    return out->st_mtim.tv_sec != m->cfg_mtime.tv_sec || out->st_mtim.tv_nsec != m->cfg_mtime.tv_nsec ||
           out->st_size != m->cfg_size;
}

static void set_reason(repo_model *m, fm_repo *r, bool ready, const char *reason) {
    pthread_mutex_lock(&r->mu);
    m->ready = ready;
    snprintf(m->reason, sizeof m->reason, "%s", reason);
    pthread_mutex_unlock(&r->mu);
}

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ULL; }

/* The config's and the version folder's state: the folder's and each entry's
 * name, mtime and size (summed per entry, so the listing order does not matter). */
static uint64_t version_stamp(const char *model_dir, const struct stat *cst, int64_t version) {
    char vdir[PBUF], p[PBUF + 256];
    struct stat st;
    uint64_t h = mix(mix(mix(0xcbf29ce484222325ULL, (uint64_t)cst->st_mtim.tv_sec), (uint64_t)cst->st_mtim.tv_nsec), (uint64_t)cst->st_size);
    snprintf(vdir, sizeof vdir, "%s/%lld", model_dir, (long long)version);
    if (stat(vdir, &st) == 0) h = mix(mix(h, (uint64_t)st.st_mtim.tv_sec), (uint64_t)st.st_mtim.tv_nsec);
    DIR *d = opendir(vdir);
    struct dirent *e;
    uint64_t sum = 0;
    while (d && (e = readdir(d))) {
        uint64_t eh = 0xcbf29ce484222325ULL;
        for (const char *c = e->d_name; *c; c++) eh = mix(eh, (unsigned char)*c);
        snprintf(p, sizeof p, "%s/%s", vdir, e->d_name);
        if (stat(p, &st) == 0) eh = mix(mix(mix(eh, (uint64_t)st.st_mtim.tv_sec), (uint64_t)st.st_mtim.tv_nsec), (uint64_t)st.st_size);
        sum += eh;
    }
    if (d) closedir(d);
    return mix(h, sum);
}

/* The remembered failure of `version`, or NULL. */
static failed_version *failure_of(repo_model *m, int64_t version) {
    for (int i = 0; i < m->n_failed; i++)
        if (m->failed[i].version == version) return &m->failed[i];
    return NULL;
}

static void remember_failure(repo_model *m, int64_t version, uint64_t stamp, fm_status st, const char *reason) {
    failed_version *f = failure_of(m, version);
    if (!f && m->n_failed == (int)(sizeof m->failed / sizeof *m->failed)) return;
    if (!f) f = &m->failed[m->n_failed++];
    f->version = version, f->stamp = stamp, f->status = st;
    snprintf(f->reason, sizeof f->reason, "%s", reason);
}

static void forget_failure(repo_model *m, int64_t version) {
    failed_version *f = failure_of(m, version);
    if (f) *f = m->failed[--m->n_failed];
}

/* Under load_mu. poll: a version that failed is not tried again while its files
 * and the config are as they were then. */
static fm_status load_locked(fm_repo *r, const char *name, bool poll, const json_t *override) {
    if (!fm_serve_valid_name(name))
        return fm_set_error(FM_ERR_INVALID, "invalid model name '%s': use 1-63 of A-Z a-z 0-9 _ . - , not starting with '.'", name);
    char dir[PATH_MAX + FM_SERVE_NAME_MAX];
    snprintf(dir, sizeof dir, "%s/%s", r->root, name);
    struct stat st, cst;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return fm_set_error(FM_ERR_IO, "model '%s' is not in the repository (no folder %s)", name, dir);
    repo_model *m = get_model(r, name);
    if (!m) return fm_set_error(FM_ERR_OOM, "serve: too many models (at most %d)", MAX_MODELS);
    fm_model_config cfg;
    if (override) fm_model_config_init(&cfg, name);
    fm_status cs = override ? fm_model_config_parse(&cfg, override, "the load request's config")
                            : fm_model_config_load(&cfg, dir, name);
    if (cs) { set_reason(m, r, m->versions != NULL, fm_last_error()); return fm_last_status(); }
    bool reload_all = cfg_changed(m, dir, &cst) || override || m->cfg_overridden;
    int64_t have[MAX_VERSIONS], want[MAX_VERSIONS];
    int n_want = apply_policy(&cfg, have, list_versions(dir, have, MAX_VERSIONS), want);
    if (n_want == 0) {
        set_reason(m, r, m->versions != NULL, "no version folder matches the version policy");
        return fm_set_error(FM_ERR_IO, "model '%s': no version folder (%s/<n>/) matches its version policy", name, dir);
    }
    fm_serve_version *nv[MAX_VERSIONS], *old[MAX_VERSIONS];
    int n_new = 0, n_old = 0;
    fm_status st_all = FM_OK;
    char reason[512] = "";
    for (int i = 0; i < n_want; i++) {
        fm_serve_version *v = NULL;
        pthread_mutex_lock(&r->mu);
        for (fm_serve_version *o = m->versions; o && !reload_all; o = o->next)
            if (o->version == want[i]) { v = o; atomic_fetch_add(&v->refs, 1); }
        pthread_mutex_unlock(&r->mu);
        uint64_t stamp = v ? 0 : version_stamp(dir, &cst, want[i]);
        const failed_version *f = v ? NULL : failure_of(m, want[i]);
        if (poll && f && f->stamp == stamp) { /* unchanged since it failed */
            st_all = f->status;
            snprintf(reason, sizeof reason, "%s", f->reason);
            continue;
        }
        if (!v && !(v = version_load(r, dir, &cfg, want[i]))) {
            st_all = fm_last_status();
            snprintf(reason, sizeof reason, "version %lld: %s", (long long)want[i], fm_last_error());
            remember_failure(m, want[i], stamp, st_all, reason);
            continue;
        }
        forget_failure(m, want[i]);
        nv[n_new++] = v;
    }
    if (n_new == 0) {
        set_reason(m, r, m->versions != NULL, reason);
        return fm_set_error(st_all, "model '%s': %s", name, reason);
    }
    pthread_mutex_lock(&r->mu);
    for (fm_serve_version *o = m->versions; o; o = o->next) old[n_old++] = o;
    for (int i = 0; i < n_new; i++) nv[i]->next = i + 1 < n_new ? nv[i + 1] : NULL;
    m->versions = nv[0];
    m->ready = true;
    snprintf(m->reason, sizeof m->reason, "%s", reason);
    m->cfg_mtime = cst.st_mtim;
    m->cfg_size = cst.st_size;
    m->cfg_overridden = override != NULL; /* a later plain load reloads everything from the file */
    pthread_mutex_unlock(&r->mu);
    /* kept versions were referenced again above: only removed ones drain */
    for (int i = 0; i < n_old; i++) fm_repo_release(old[i]);
    if (st_all) return fm_set_error(st_all, "model '%s': %s", name, reason);
    return FM_OK;
}

fm_status fm_repo_load(fm_repo *r, const char *name) { return fm_repo_load_config(r, name, NULL); }

fm_status fm_repo_load_config(fm_repo *r, const char *name, const json_t *config) {
    pthread_mutex_lock(&r->load_mu);
    fm_status s = load_locked(r, name, false, config);
    pthread_mutex_unlock(&r->load_mu);
    return s;
}

static fm_status unload_locked(fm_repo *r, const char *name, const char *why) {
    pthread_mutex_lock(&r->mu);
    repo_model *m = find_model(r, name);
    fm_serve_version *old = m ? m->versions : NULL;
    if (m) {
        m->versions = NULL;
        m->ready = false;
        snprintf(m->reason, sizeof m->reason, "%s", why);
        memset(&m->cfg_mtime, 0, sizeof m->cfg_mtime);
        m->cfg_size = 0;
    }
    pthread_mutex_unlock(&r->mu);
    release_list(old);
    if (!m) return fm_set_error(FM_ERR_IO, "model '%s' is not loaded", name);
    return FM_OK;
}

fm_status fm_repo_unload(fm_repo *r, const char *name) {
    pthread_mutex_lock(&r->load_mu);
    fm_status s = unload_locked(r, name, "unloaded");
    pthread_mutex_unlock(&r->load_mu);
    return s;
}

void fm_repo_poll(fm_repo *r, FILE *log) {
    pthread_mutex_lock(&r->load_mu);
    DIR *d = opendir(r->root);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[PATH_MAX + 256], before[512];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", r->root, e->d_name);
        if (!fm_serve_valid_name(e->d_name) || stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        pthread_mutex_lock(&r->mu);
        repo_model *m = find_model(r, e->d_name);
        snprintf(before, sizeof before, "%s", m ? m->reason : "");
        pthread_mutex_unlock(&r->mu);
        /* a failure is logged once, not at every poll */
        if (load_locked(r, e->d_name, true, NULL) != FM_OK && log && strcmp(before, m ? m->reason : "~"))
            fprintf(log, "fathom serve: %s\n", fm_last_error());
    }
    if (d) closedir(d);
    /* models whose folder is gone drain and unload */
    char gone[MAX_MODELS][FM_SERVE_NAME_MAX];
    int n_gone = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        char p[PATH_MAX + FM_SERVE_NAME_MAX];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", r->root, r->models[i]->name);
        if (r->models[i]->versions && stat(p, &st) != 0) snprintf(gone[n_gone++], FM_SERVE_NAME_MAX, "%s", r->models[i]->name);
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < n_gone; i++) unload_locked(r, gone[i], "removed from the repository");
    pthread_mutex_unlock(&r->load_mu);
}

fm_serve_version *fm_repo_acquire(fm_repo *r, const char *name, int64_t version, int *status, char *err, size_t errn) {
    pthread_mutex_lock(&r->mu);
    repo_model *m = find_model(r, name);
    fm_serve_version *v = m ? m->versions : NULL;
    while (v && version && v->version != version) v = v->next;
    if (v) atomic_fetch_add(&v->refs, 1);
    else if (!m || !m->versions) snprintf(err, errn, "unknown model '%s' (not loaded)", name);
    else snprintf(err, errn, "model '%s' has no version %lld loaded", name, (long long)version);
    pthread_mutex_unlock(&r->mu);
    *status = v ? 200 : 404;
    return v;
}

json_t *fm_repo_versions_json(fm_repo *r, const char *name) {
    pthread_mutex_lock(&r->mu);
    repo_model *m = find_model(r, name);
    json_t *a = m && m->versions ? json_array() : NULL;
    for (fm_serve_version *v = m ? m->versions : NULL; v; v = v->next) {
        char s[24];
        snprintf(s, sizeof s, "%lld", (long long)v->version);
        json_array_append_new(a, json_string(s));
    }
    pthread_mutex_unlock(&r->mu);
    return a;
}

static void index_add(json_t *a, const char *name, const char *version, const char *state, const char *reason) {
    json_t *o = json_pack("{s:s,s:s}", "name", name, "state", state);
    if (version) json_object_set_new(o, "version", json_string(version));
    if (reason && *reason) json_object_set_new(o, "reason", json_string(reason));
    json_array_append_new(a, o);
}

json_t *fm_repo_index(fm_repo *r, bool ready_only) {
    json_t *a = json_array();
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        repo_model *m = r->models[i];
        for (fm_serve_version *v = m->versions; v; v = v->next) {
            char s[24];
            snprintf(s, sizeof s, "%lld", (long long)v->version);
            index_add(a, m->name, s, "READY", NULL);
        }
        if (!m->versions && !ready_only) index_add(a, m->name, NULL, "UNAVAILABLE", m->reason);
    }
    pthread_mutex_unlock(&r->mu);
    DIR *d = ready_only ? NULL : opendir(r->root);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!fm_serve_valid_name(e->d_name)) continue;
        pthread_mutex_lock(&r->mu);
        bool known = find_model(r, e->d_name) != NULL;
        pthread_mutex_unlock(&r->mu);
        if (!known) index_add(a, e->d_name, NULL, "UNAVAILABLE", "not loaded");
    }
    if (d) closedir(d);
    return a;
}

json_t *fm_repo_text_models_json(fm_repo *r, const char *name) {
    json_t *data = json_array(), *found = NULL;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        const fm_serve_version *v = r->models[i]->versions; /* the highest: what a request without a version gets */
        if (!v || !(v->textgen || v->embedder) || (name && strcmp(name, r->models[i]->name))) continue;
        json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "id", r->models[i]->name, "object", "model", "created",
                              (json_int_t)v->loaded_unix, "owned_by", "fathom");
        if (name) found = o;
        else json_array_append_new(data, o);
    }
    pthread_mutex_unlock(&r->mu);
    if (name) { json_decref(data); return found; }
    return json_pack("{s:s,s:o}", "object", "list", "data", data);
}

json_t *fm_repo_stats_json(fm_repo *r, const char *name, int64_t version) {
    json_t *a = json_array();
    fm_serve_stats *snap = malloc(sizeof *snap);
    if (!snap) { json_decref(a); return NULL; }
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        if (name && strcmp(name, r->models[i]->name)) continue;
        for (fm_serve_version *v = r->models[i]->versions; v; v = v->next) {
            if (version && v->version != version) continue;
            fm_serve_stats_snapshot(&v->stats, snap);
            json_array_append_new(a, fm_serve_stats_json(snap, r->models[i]->name, (long long)v->version));
        }
    }
    pthread_mutex_unlock(&r->mu);
    free(snap);
    if (name && json_array_size(a) == 0) { json_decref(a); return NULL; }
    return json_pack("{s:o}", "model_stats", a);
}

int fm_repo_count_ready(fm_repo *r) {
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) n += r->models[i]->versions != NULL;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void fm_repo_write_metrics(fm_repo *r, FILE *f) {
    static fm_serve_stats snaps[MAX_MODELS];
    const char *names[MAX_MODELS];
    long long vers[MAX_MODELS];
    static pthread_mutex_t write_mu = PTHREAD_MUTEX_INITIALIZER; /* snaps is shared */
    pthread_mutex_lock(&write_mu);
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++)
        for (fm_serve_version *v = r->models[i]->versions; v && n < MAX_MODELS; v = v->next) {
            fm_serve_stats_snapshot(&v->stats, &snaps[n]);
            names[n] = r->models[i]->name; /* models are never freed before fm_repo_close */
            vers[n++] = (long long)v->version;
        }
    pthread_mutex_unlock(&r->mu);
    fm_serve_stats_write(f, n, snaps, names, vers);
    pthread_mutex_unlock(&write_mu);
}

void fm_repo_close(fm_repo *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        release_list(r->models[i]->versions);
        free(r->models[i]);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->load_mu);
    free(r);
}
