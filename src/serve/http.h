/* Internals shared by server.c (the daemon) and http_routes.c (the endpoints). */
#ifndef FATHOM_SERVE_HTTP_H
#define FATHOM_SERVE_HTTP_H
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "serve/repository.h"
#include "serve/shm.h"
#include "serve/server.h"

struct fm_server {
    fm_server_options opt;
    fm_repo *repo;
    fm_shm_registry *shm;   /* system shared memory regions (shm.h) */
    struct MHD_Daemon *http, *metrics;
    int port, mport;
    atomic_bool draining, ready;
    atomic_int in_flight;
    atomic_ullong accepted; /* requests accepted so far (the idle memory release watches it) */
    pthread_t poll_th;
    bool poll_started, poll_stop;
    pthread_mutex_t poll_mu;
    pthread_cond_t poll_cv;
};

typedef struct fm_http_req {
    char *body;
    size_t len, cap;
    bool too_big, counted;
    int64_t t0_ns;
} fm_http_req;

/* The error body for the request this thread handles now: under /v1/ OpenAI's
 * {"error": {"message", "type", "param", "code"}}, elsewhere KServe's {"error": msg}. */
void fm_http_error_style(const char *url);
/* Queues the error body (fm_http_error_style) with `status`. */
enum MHD_Result fm_http_error(struct MHD_Connection *c, int status, const char *msg);
/* Whether the request carries the server's API key (Authorization: Bearer KEY or
 * X-API-Key: KEY), or the server has none. */
bool fm_http_authorized(fm_server *s, struct MHD_Connection *c);
enum MHD_Result fm_http_route(fm_server *s, struct MHD_Connection *c, const char *url, const char *method, fm_http_req *r);
/* /v1/completions (OpenAI style text generation; http_openai.c). */
enum MHD_Result fm_http_openai(fm_server *s, struct MHD_Connection *c, char **seg, int n, const char *method, fm_http_req *r);
/* {"error": msg} with a printf-style message. */
enum MHD_Result fm_http_errorf(struct MHD_Connection *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
enum MHD_Result fm_http_send(struct MHD_Connection *c, int status, char *buf, size_t len, const char *type);
/* The metrics daemon's handler: GET /metrics. */
enum MHD_Result fm_http_metrics(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                const char *version, const char *up, size_t *up_size, void **con_cls);
#endif
