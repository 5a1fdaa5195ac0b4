/* The KServe v2 / Triton HTTP endpoints (docs/SERVING.md lists them) and the
 * Prometheus endpoint of the metrics port. */
#include <stdarg.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fathom/memory.h"
#include "serve/http.h"
#include "serve/infer_codec.h"

#define MAX_SEGS 8

static enum MHD_Result send_bytes(struct MHD_Connection *c, int status, char *buf, size_t len, const char *type,
                                  size_t header_len) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!resp) { free(buf); return MHD_NO; }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (header_len) {
        char h[32];
        snprintf(h, sizeof h, "%zu", header_len);
        MHD_add_response_header(resp, "Inference-Header-Content-Length", h);
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, json_t *j) {
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) return MHD_NO;
    return send_bytes(c, status, s, strlen(s), "application/json", 0);
}

/* The body's shape: the connection thread's current request set it (fm_http_error_style).
 * libmicrohttpd runs one thread per connection, and a connection handles one request
 * at a time, so a thread-local holds it for exactly that request. */
static _Thread_local bool openai_errors;

void fm_http_error_style(const char *url) { openai_errors = url && (!strncmp(url, "/v1/", 4) || !strcmp(url, "/v1")); }

/* OpenAI's error type for a status: what its clients map to exception classes. */
static const char *openai_error_type(int status) {
    return status == 401 ? "authentication_error" : status == 403 ? "permission_error" : status == 404 ? "not_found_error"
         : status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : "invalid_request_error";
}

enum MHD_Result fm_http_error(struct MHD_Connection *c, int status, const char *msg) {
    if (openai_errors) /* OpenAI clients read error.message (and show only the status without it) */
        return send_json(c, status, json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", msg, "type",
                                              openai_error_type(status), "param", "code", status));
    return send_json(c, status, json_pack("{s:s}", "error", msg));
}

static enum MHD_Result error_fmt(struct MHD_Connection *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static enum MHD_Result error_fmt(struct MHD_Connection *c, int status, const char *fmt, ...) {
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return fm_http_error(c, status, m);
}

enum MHD_Result fm_http_errorf(struct MHD_Connection *c, int status, const char *fmt, ...) {
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return fm_http_error(c, status, m);
}

enum MHD_Result fm_http_send(struct MHD_Connection *c, int status, char *buf, size_t len, const char *type) {
    return send_bytes(c, status, buf, len, type, 0);
}

/* Metadata shapes: [-1, dims...] when batched, the dims alone with max_batch_size 0 */
static json_t *ios_json(const fm_serve_io *ios, int n, bool batched) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        if (batched) json_array_append_new(shape, json_integer(-1));
        for (int d = 0; d < ios[i].ndim; d++) json_array_append_new(shape, json_integer(ios[i].dims[d]));
        json_array_append_new(a, json_pack("{s:s,s:s,s:o}", "name", ios[i].name, "datatype",
                                           fm_serve_dtype_name(ios[i].dtype), "shape", shape));
    }
    return a;
}

static enum MHD_Result model_metadata(fm_server *s, struct MHD_Connection *c, fm_serve_version *v) {
    json_t *vs = fm_repo_versions_json(s->repo, v->model);
    json_t *j = json_pack("{s:s,s:o,s:s,s:o,s:o}", "name", v->model, "versions", vs ? vs : json_array(), "platform", v->platform,
                          "inputs", ios_json(v->cfg.inputs, v->cfg.n_inputs, v->cfg.max_batch_size > 0), "outputs",
                          ios_json(v->cfg.outputs, v->cfg.n_outputs, v->cfg.max_batch_size > 0));
    return send_json(c, 200, j);
}

/* POST .../infer: parse, queue on the version's batcher, answer. */
static enum MHD_Result infer(fm_server *s, struct MHD_Connection *c, fm_serve_version *v, fm_http_req *hr) {
    char err[512] = "";
    const char *enc = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    const char *hl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    long long header_len = -1;
    int status = 0;
    if (enc && strcmp(enc, "identity")) {
        snprintf(err, sizeof err, "Content-Encoding '%s' is not supported; send the body uncompressed", enc);
        status = 400;
    } else if (hl) {
        char *end;
        header_len = strtoll(hl, &end, 10);
        if (end == hl || *end || header_len < 0) {
            snprintf(err, sizeof err, "Inference-Header-Content-Length '%.40s' is not a byte count", hl);
            status = 400;
        }
    }
    fm_infer_request req;
    fm_serve_req q;
    memset(&q, 0, sizeof q);
    memset(&req, 0, sizeof req);
    if (!status) status = fm_infer_parse(hr->body ? hr->body : "", hr->len, header_len, &req, err, sizeof err);
    if (!status) status = fm_infer_resolve_shm(&req, s->shm, err, sizeof err);
    if (!status) status = fm_infer_check_outputs(&req, &v->cfg, err, sizeof err);
    if (!status) status = fm_infer_make_inputs(&req, &v->cfg, q.in, &q.rows, err, sizeof err);
    if (!status) {
        int64_t t_us = req.timeout_us ? req.timeout_us : v->cfg.default_timeout_us;
        q.deadline_ns = t_us ? hr->t0_ns + t_us * 1000 : 0;
        status = fm_batcher_submit(v->batcher, &q);
        if (status != 200) snprintf(err, sizeof err, "%s", q.err);
        else status = 0;
    }
    char *body = NULL;
    size_t len = 0, jlen = 0;
    if (!status) status = fm_infer_make_response(&req, &v->cfg, v->labels, v->model, v->version, q.out, &body, &len, &jlen, err, sizeof err);
    fm_infer_request_free(&req);
    for (int i = 0; i < FM_SERVE_MAX_IO; i++) fm_tensor_release_n(2, q.in[i], q.out[i]);
    int64_t now = fm_now_ns();
    uint64_t queue_us = q.t_start_ns > q.t_enqueue_ns ? (uint64_t)(q.t_start_ns - q.t_enqueue_ns) / 1000 : 0;
    fm_serve_stats_request(&v->stats, status == 0, (uint64_t)(now - hr->t0_ns) / 1000, queue_us);
    if (status) return fm_http_error(c, status, err);
    return send_bytes(c, 200, body, len, jlen ? "application/octet-stream" : "application/json", jlen);
}

/* /v2/models/{m}[/versions/{v}][/ready|/config|/infer] */
/* GET /v2/models/stats and /v2/models/{m}[/versions/{v}]/stats: Triton's statistics extension */
static enum MHD_Result stats(fm_server *s, struct MHD_Connection *c, const char *name, int64_t ver, const char *method) {
    if (strcmp(method, "GET")) return fm_http_error(c, 405, "use GET for the statistics");
    json_t *j = fm_repo_stats_json(s->repo, name, ver);
    if (!j && ver) return error_fmt(c, 404, "model '%s' version %lld is not loaded", name, (long long)ver);
    if (!j) return error_fmt(c, 404, "model '%s' is not loaded", name);
    return send_json(c, 200, j);
}

static enum MHD_Result models(fm_server *s, struct MHD_Connection *c, char **seg, int n, const char *method,
                              fm_http_req *r) {
    const char *name = seg[2], *action = "";
    if (n == 3 && !strcmp(name, "stats")) return stats(s, c, NULL, 0, method);
    int64_t ver = 0;
    int i = 3;
    if (!fm_serve_valid_name(name)) return error_fmt(c, 400, "invalid model name '%.80s'", name);
    if (i < n && !strcmp(seg[i], "versions")) {
        if (i + 1 >= n || !fm_serve_parse_version(seg[i + 1], &ver))
            return error_fmt(c, 400, "invalid model version '%.40s': use a whole number >= 1", i + 1 < n ? seg[i + 1] : "");
        i += 2;
    }
    if (i < n) action = seg[i++];
    if (i < n) return fm_http_error(c, 404, "unknown endpoint");
    if (!strcmp(action, "stats")) return stats(s, c, name, ver, method);
    bool post = !strcmp(action, "infer");
    if (strcmp(action, "") && strcmp(action, "ready") && strcmp(action, "config") && !post)
        return error_fmt(c, 404, "unknown endpoint '%.40s' (use ready, config, stats or infer)", action);
    if (strcmp(method, post ? "POST" : "GET"))
        return error_fmt(c, 405, "use %s for this endpoint", post ? "POST" : "GET");
    int status;
    char err[256];
    fm_serve_version *v = fm_repo_acquire(s->repo, name, ver, &status, err, sizeof err);
    if (!v) return fm_http_error(c, status, err);
    enum MHD_Result ret;
    if (post && !v->batcher)
        ret = error_fmt(c, 400, "model '%s' is %s", name, v->embedder ? "an embedding model: use POST /v1/embeddings"
                                                                        : "a text-generation model: use POST /v1/completions");
    else if (post) ret = infer(s, c, v, r);
    else if (!strcmp(action, "ready")) ret = send_json(c, 200, json_pack("{s:s,s:b}", "name", name, "ready", 1));
    else if (!strcmp(action, "config")) ret = send_json(c, 200, fm_model_config_json(&v->cfg, v->platform));
    else ret = model_metadata(s, c, v);
    fm_repo_release(v);
    return ret;
}

bool fm_http_authorized(fm_server *s, struct MHD_Connection *c) {
    if (!s->opt.api_key) return true;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *k = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-API-Key");
    const char *given = k ? k : (a && !strncmp(a, "Bearer ", 7)) ? a + 7 : NULL;
    if (!given) return false;
    size_t n = strlen(s->opt.api_key), m = strlen(given);
    unsigned char diff = n != m; /* compared in constant time for the key's length */
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(s->opt.api_key[i] ^ (i < m ? given[i] : 0));
    return diff == 0;
}

/* A load request's body: {"parameters": {"config": "<the model config as JSON text>"}}
 * (what tritonclient's load_model(name, config=...) sends) -> *config (NULL: none).
 * Model files sent in the request ("file:..." parameters) are refused: a version's
 * files come from the repository folder. Non-zero with err set when malformed. */
static int load_request_config(const fm_http_req *r, json_t **config, char *err, size_t errn) {
    json_error_t e;
    json_t *j = json_loadb(r->body, r->len, JSON_REJECT_DUPLICATES, &e), *params = json_object_get(j, "parameters");
    const char *key, *bad = NULL;
    json_t *v;
    if (!json_is_object(j) || (params && !json_is_object(params)))
        bad = "the body must be a JSON object, with \"parameters\" an object";
    json_object_foreach(params, key, v) {
        if (!bad && !strncmp(key, "file:", 5))
            bad = "model files in a load request are not supported: put them in the repository folder, then load";
        else if (!bad && !strcmp(key, "config") && !json_is_string(v))
            bad = "\"config\" must be a string holding the model configuration as JSON";
    }
    const char *text = json_string_value(json_object_get(params, "config"));
    if (!bad && text) {
        *config = json_loads(text, JSON_REJECT_DUPLICATES, &e);
        if (!*config) snprintf(err, errn, "load: \"config\" is not JSON: %s (line %d)", e.text, e.line);
        else if (!json_is_object(*config)) bad = "\"config\" must hold a JSON object (Triton's model configuration)";
    }
    json_decref(j);
    if (bad) {
        snprintf(err, errn, "load: %s", bad);
        json_decref(*config);
        *config = NULL;
        return 1;
    }
    return text && !*config;
}

/* /v2/repository/index and /v2/repository/models/{m}/load|unload */
static enum MHD_Result repository(fm_server *s, struct MHD_Connection *c, char **seg, int n, const char *method,
                                  fm_http_req *r) {
    if (strcmp(method, "POST")) return fm_http_error(c, 405, "use POST for the repository endpoints");
    if (!fm_http_authorized(s, c))
        return fm_http_error(c, 401, "repository control needs the server's API key (header Authorization: Bearer KEY "
                                     "or X-API-Key: KEY)");
    if (n == 3 && !strcmp(seg[2], "index")) {
        bool ready = false;
        if (r->len) {
            json_error_t e;
            json_t *j = json_loadb(r->body, r->len, JSON_REJECT_DUPLICATES, &e);
            if (!json_is_object(j)) {
                json_decref(j);
                return error_fmt(c, 400, "index: the body must be a JSON object (%s)", j ? "got another JSON value" : e.text);
            }
            ready = json_is_true(json_object_get(j, "ready"));
            json_decref(j);
        }
        return send_json(c, 200, fm_repo_index(s->repo, ready));
    }
    if (n != 5 || strcmp(seg[2], "models") || (strcmp(seg[4], "load") && strcmp(seg[4], "unload")))
        return fm_http_error(c, 404, "unknown repository endpoint (use index, models/{m}/load or models/{m}/unload)");
    if (!fm_serve_valid_name(seg[3])) return error_fmt(c, 400, "invalid model name '%.80s'", seg[3]);
    if (!s->opt.explicit_control)
        return fm_http_error(c, 400, "load and unload need --model-control explicit (this server polls the repository)");
    bool load = !strcmp(seg[4], "load");
    json_t *config = NULL;
    if (load && r->len) {
        char err[512];
        if (load_request_config(r, &config, err, sizeof err)) return fm_http_error(c, 400, err);
    }
    fm_status st = load ? fm_repo_load_config(s->repo, seg[3], config) : fm_repo_unload(s->repo, seg[3]);
    json_decref(config);
    if (st) return fm_http_error(c, st == FM_ERR_IO ? 404 : 400, fm_last_error());
    return send_json(c, 200, json_object());
}

/* Whether the client is on this host (127.0.0.0/8, ::1 or ::ffff:127.x): shared memory
 * is for clients that share the machine, and registering maps the server's view of it. */
static bool client_is_local(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (sa && sa->sa_family == AF_INET) return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (!sa || sa->sa_family != AF_INET6) return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

/* /v2/systemsharedmemory[/region/{name}]/status|register|unregister (Triton's system
 * shared memory extension) and /v2/cudasharedmemory/... (refused: no CUDA IPC here). */
static enum MHD_Result shared_memory(fm_server *s, struct MHD_Connection *c, char **seg, int n, const char *method,
                                     fm_http_req *r) {
    if (!strcmp(seg[1], "cudasharedmemory"))
        return fm_http_error(c, 400, "CUDA shared memory is not supported by this server; use system shared memory");
    if (!client_is_local(c)) return fm_http_error(c, 403, "shared memory is for clients on the server's own host");
    if (!fm_http_authorized(s, c))
        return fm_http_error(c, 401, "shared memory control needs the server's API key (header Authorization: Bearer KEY "
                                     "or X-API-Key: KEY)");
    const char *name = n == 5 && !strcmp(seg[2], "region") ? seg[3] : NULL, *action = seg[n - 1];
    if (!(n == 3 || name)) return fm_http_error(c, 404, "unknown endpoint (systemsharedmemory[/region/NAME]/status|register|unregister)");
    char err[512];
    if (!strcmp(action, "status")) {
        json_t *j = fm_shm_status(s->shm, name);
        return j ? send_json(c, 200, j) : error_fmt(c, 404, "shared memory region '%.80s' is not registered", name);
    }
    if (strcmp(method, "POST")) return fm_http_error(c, 405, "use POST to register or unregister");
    if (!strcmp(action, "unregister")) {
        int st = fm_shm_unregister(s->shm, name, err, sizeof err);
        return st ? fm_http_error(c, st, err) : send_json(c, 200, json_object());
    }
    if (strcmp(action, "register") || !name) return fm_http_error(c, 404, "unknown shared memory endpoint");
    json_error_t e;
    json_t *j = json_loadb(r->body ? r->body : "", r->len, JSON_REJECT_DUPLICATES, &e);
    const char *key = json_string_value(json_object_get(j, "key"));
    const json_t *off = json_object_get(j, "offset"), *bs = json_object_get(j, "byte_size");
    int st = 400;
    if (!json_is_object(j) || !key || (off && !json_is_integer(off)) || !json_is_integer(bs))
        snprintf(err, sizeof err, "register: the body must be {\"key\": \"/shm_name\", \"offset\": N, \"byte_size\": N}");
    else
        st = fm_shm_register(s->shm, name, key, off ? json_integer_value(off) : 0, json_integer_value(bs), err, sizeof err);
    json_decref(j);
    return st ? fm_http_error(c, st, err) : send_json(c, 200, json_object());
}

static enum MHD_Result server_metadata(struct MHD_Connection *c) {
    return send_json(c, 200, json_pack("{s:s,s:s,s:[s,s,s,s,s,s]}", "name", "fathom", "version", FATHOM_VERSION, "extensions",
                                       "binary_tensor_data", "model_repository", "model_configuration", "statistics",
                                       "classification", "system_shared_memory"));
}

enum MHD_Result fm_http_route(fm_server *s, struct MHD_Connection *c, const char *url, const char *method, fm_http_req *r) {
    char path[1024], *seg[MAX_SEGS];
    int n = 0;
    if (strlen(url) >= sizeof path) return fm_http_error(c, 414, "URL too long");
    strcpy(path, url);
    for (char *save = NULL, *t = strtok_r(path, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (n == MAX_SEGS) return fm_http_error(c, 404, "unknown endpoint");
        seg[n++] = t;
    }
    if (n >= 2 && !strcmp(seg[0], "v1")) return fm_http_openai(s, c, seg, n, method, r);
    if (n == 0 || strcmp(seg[0], "v2")) return fm_http_error(c, 404, "unknown endpoint (the API is under /v2 and /v1)");
    if (n >= 3 && !strcmp(seg[1], "models")) return models(s, c, seg, n, method, r);
    if (n >= 2 && !strcmp(seg[1], "repository")) return repository(s, c, seg, n, method, r);
    if (n >= 3 && (!strcmp(seg[1], "systemsharedmemory") || !strcmp(seg[1], "cudasharedmemory")))
        return shared_memory(s, c, seg, n, method, r);
    if (strcmp(method, "GET")) return fm_http_error(c, 405, "use GET for this endpoint");
    if (n == 1) return server_metadata(c);
    if (n == 3 && !strcmp(seg[1], "health") && !strcmp(seg[2], "live")) return send_json(c, 200, json_object());
    if (n == 3 && !strcmp(seg[1], "health") && !strcmp(seg[2], "ready")) {
        bool ok = atomic_load(&s->ready) && !atomic_load(&s->draining);
        return ok ? send_json(c, 200, json_object()) : fm_http_error(c, 503, "not ready");
    }
    return fm_http_error(c, 404, "unknown endpoint");
}

/* The host's figures and, when models default to another device (--device), that one's too
 * (the devices in use; asking every device would start a CUDA context in a CPU server). */
static void write_memory_metrics(FILE *f, fm_server *s, bool reserved) {
    fm_device devs[2] = {{FM_DEV_CPU, 0}, s->opt.device};
    int n = s->opt.device.type == FM_DEV_CPU ? 1 : 2;
    for (int i = 0; i < n; i++) {
        fm_memory_stats ms;
        char dn[32];
        if (fm_memory_stats_get(devs[i], &ms) != FM_OK) continue;
        fprintf(f, "fathom_memory_%s_bytes{device=\"%s\"} %zu\n", reserved ? "reserved" : "used",
                fm_device_name(devs[i], dn, sizeof dn), reserved ? ms.reserved : ms.allocated);
    }
}

static void write_process_metrics(FILE *f, fm_server *s) {
    fprintf(f, "# HELP fathom_memory_used_bytes Bytes held by tensors, per device\n# TYPE fathom_memory_used_bytes gauge\n");
    write_memory_metrics(f, s, false);
    fprintf(f, "# HELP fathom_memory_reserved_bytes Bytes the allocator holds (in use plus cached), per device\n"
               "# TYPE fathom_memory_reserved_bytes gauge\n");
    write_memory_metrics(f, s, true);
    long pages = 0, rss = 0;
    FILE *sf = fopen("/proc/self/statm", "r");
    if (sf) {
        if (fscanf(sf, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(sf);
    }
    fprintf(f, "# HELP fathom_process_resident_memory_bytes Resident set size of the server process\n"
               "# TYPE fathom_process_resident_memory_bytes gauge\nfathom_process_resident_memory_bytes %lld\n",
            (long long)rss * sysconf(_SC_PAGESIZE));
    fprintf(f, "# HELP fathom_server_in_flight_requests HTTP requests being handled\n"
               "# TYPE fathom_server_in_flight_requests gauge\nfathom_server_in_flight_requests %d\n",
            atomic_load(&s->in_flight));
}

enum MHD_Result fm_http_metrics(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                const char *version, const char *up, size_t *up_size, void **con_cls) {
    fm_server *s = cls;
    fm_http_error_style(NULL);
    if (strcmp(url, "/metrics")) return fm_http_error(c, 404, "the metrics port serves GET /metrics only");
    if (strcmp(method, "GET")) return fm_http_error(c, 405, "use GET /metrics");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MHD_NO;
    fm_repo_write_metrics(s->repo, f);
    write_process_metrics(f, s);
    fclose(f);
    return send_bytes(c, 200, buf, len, "text/plain; version=0.0.4; charset=utf-8", 0);
}
