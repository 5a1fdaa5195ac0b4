/* The HTTP server: libmicrohttpd with a thread per connection, so a request can
 * block while the batcher runs it. Each request's body is collected up to
 * max_body bytes (a larger declared Content-Length is refused with 413 before
 * any of the body is read), then routed (http_routes.c). Draining: a flag makes
 * every new request a 503, and fm_server_drain waits for the in-flight count,
 * kept by the request-completed callback, to reach zero. */
#include "serve/server.h"

#include <arpa/inet.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/parallel.h"
#include "fathom/memory.h"
#include "serve/http.h"

static int parse_host(const char *host, int port, struct sockaddr_storage *ss, bool *v6) {
    memset(ss, 0, sizeof *ss);
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *v6 = false;
        return 0;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *v6 = true;
        return 0;
    }
    return -1;
}

bool fm_server_host_is_loopback(const char *host) {
    struct sockaddr_storage ss;
    bool v6;
    if (parse_host(host, 0, &ss, &v6)) return false;
    if (!v6) return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    return IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)&ss)->sin6_addr);
}

void fm_server_options_init(fm_server_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->metrics_port = 8002;
    o->poll_secs = 5;
    o->release_idle_secs = 2;
    o->device = FM_CPU;
    o->max_body = 64u << 20;
    o->connection_timeout_s = 30;
    o->max_connections = 512;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *up, size_t *up_size, void **con_cls) {
    fm_server *s = cls;
    fm_http_req *r = *con_cls;
    fm_http_error_style(url);
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        *con_cls = r;
        r->t0_ns = fm_now_ns();
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        /* refused requests are not counted: draining waits only for accepted ones */
        if (atomic_load(&s->draining))
            return fm_http_error(c, 503, "the server is shutting down");
        r->counted = true;
        atomic_fetch_add(&s->in_flight, 1);
        atomic_fetch_add(&s->accepted, 1);
        if (cl && strtoull(cl, NULL, 10) > s->opt.max_body) {
            char m[160];
            snprintf(m, sizeof m, "request body of %s bytes is over the limit of %zu bytes", cl, s->opt.max_body);
            return fm_http_error(c, 413, m);
        }
        return MHD_YES;
    }
    if (*up_size) {
        if (!r->too_big && r->len + *up_size > s->opt.max_body) {
            r->too_big = true;
            free(r->body);
            r->body = NULL;
        }
        if (!r->too_big) {
            if (r->len + *up_size + 1 > r->cap) {
                size_t cap = (r->len + *up_size + 1) * 2;
                if (cap > s->opt.max_body + 1) cap = s->opt.max_body + 1;
                char *nb = realloc(r->body, cap);
                if (!nb) return MHD_NO;
                r->body = nb;
                r->cap = cap;
            }
            memcpy(r->body + r->len, up, *up_size);
            r->len += *up_size;
        }
        *up_size = 0;
        return MHD_YES;
    }
    if (r->too_big) {
        char m[128];
        snprintf(m, sizeof m, "request body is over the limit of %zu bytes", s->opt.max_body);
        return fm_http_error(c, 413, m);
    }
    return fm_http_route(s, c, url, method, r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    fm_server *s = cls;
    fm_http_req *r = *con_cls;
    if (!r) return;
    bool counted = r->counted;
    free(r->body);
    free(r);
    *con_cls = NULL;
    if (counted) atomic_fetch_sub(&s->in_flight, 1);
}

static struct MHD_Daemon *start_daemon(fm_server *s, int port, MHD_AccessHandlerCallback h, int *bound) {
    struct sockaddr_storage ss;
    bool v6;
    if (parse_host(s->opt.host, port, &ss, &v6)) return NULL;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (v6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, h, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->opt.connection_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->opt.max_connections, MHD_OPTION_END);
    if (d) {
        const union MHD_DaemonInfo *i = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        *bound = i ? (int)i->port : port;
    }
    return d;
}

/* Gives the allocator's cached blocks (tensors freed under load, kept for reuse)
 * and glibc's free heap back to the system: a server that served batches of many
 * sizes otherwise keeps the largest footprint it ever had. */
static void release_memory(void) {
    fm_memory_empty_cache(FM_CPU);
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

/* The housekeeping thread: rescans the repository every poll_secs (poll mode) and
 * releases cached memory once the server has been idle (nothing in flight, nothing
 * accepted) for release_idle_secs after serving something. Wakes once a second. */
static void *poll_main(void *arg) {
    fm_server *s = arg;
    int64_t next_poll = fm_now_ns() + (int64_t)s->opt.poll_secs * 1000000000LL, idle_since = fm_now_ns();
    unsigned long long seen = atomic_load(&s->accepted);
    bool released = true;
    pthread_mutex_lock(&s->poll_mu);
    while (!s->poll_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->poll_cv, &s->poll_mu, &ts);
        if (s->poll_stop) break;
        pthread_mutex_unlock(&s->poll_mu);
        int64_t now = fm_now_ns();
        unsigned long long n = atomic_load(&s->accepted);
        if (n != seen || atomic_load(&s->in_flight) > 0) { seen = n; idle_since = now; released = false; }
        if (!released && s->opt.release_idle_secs > 0 && now - idle_since >= (int64_t)s->opt.release_idle_secs * 1000000000LL) {
            release_memory();
            released = true;
        }
        if (!s->opt.explicit_control && s->opt.poll_secs > 0 && now >= next_poll) {
            fm_repo_poll(s->repo, s->opt.log);
            next_poll = now + (int64_t)s->opt.poll_secs * 1000000000LL;
        }
        pthread_mutex_lock(&s->poll_mu);
    }
    pthread_mutex_unlock(&s->poll_mu);
    return NULL;
}

static fm_status load_initial(fm_server *s) {
    const fm_server_options *o = &s->opt;
    if (!o->explicit_control) {
        fm_repo_poll(s->repo, o->log);
        return FM_OK;
    }
    for (int i = 0; i < o->n_load; i++) {
        if (!strcmp(o->load[i], "*")) {
            fm_repo_poll(s->repo, o->log);
        } else if (fm_repo_load(s->repo, o->load[i]) != FM_OK) {
            return fm_last_status();
        }
    }
    return FM_OK;
}

fm_server *fm_server_start(const fm_server_options *o) {
    struct sockaddr_storage ss;
    bool v6;
    if (parse_host(o->host, 0, &ss, &v6)) {
        fm_set_error(FM_ERR_INVALID, "--host '%s' is not a numeric IPv4/IPv6 address or localhost", o->host);
        return NULL;
    }
    if (o->explicit_control && !o->api_key && !fm_server_host_is_loopback(o->host)) {
        fm_set_error(FM_ERR_INVALID, "refusing to serve model control (load/unload) on the non-loopback address %s "
                     "without --api-key; give a key or bind 127.0.0.1", o->host);
        return NULL;
    }
    /* Requests come in bursts with idle gaps: keep the pool's spin before sleeping
     * short (the 30 us of the fixed spin the server was measured with), unless
     * FATHOM_SPIN_US says otherwise. */
    fm_parallel_set_spin_default_us(30);
    fm_server *s = calloc(1, sizeof *s);
    if (!s) { fm_set_error(FM_ERR_OOM, "serve: out of memory"); return NULL; }
    s->opt = *o;
    pthread_mutex_init(&s->poll_mu, NULL);
    pthread_cond_init(&s->poll_cv, NULL);
    if (!(s->shm = fm_shm_registry_new())) { free(s); fm_set_error(FM_ERR_OOM, "serve: out of memory"); return NULL; }
    if (!(s->repo = fm_repo_open(o->repository, o->device)) || load_initial(s) != FM_OK) {
        fm_server_stop(s);
        return NULL;
    }
    if (!(s->http = start_daemon(s, o->port, on_request, &s->port))) {
        fm_set_error(FM_ERR_IO, "could not listen on %s:%d (in use? a privileged port?)", o->host, o->port);
        fm_server_stop(s);
        return NULL;
    }
    if (o->metrics_port >= 0 && !(s->metrics = start_daemon(s, o->metrics_port, fm_http_metrics, &s->mport))) {
        fm_set_error(FM_ERR_IO, "could not listen on %s:%d for metrics (in use?)", o->host, o->metrics_port);
        fm_server_stop(s);
        return NULL;
    }
    release_memory(); /* what loading and the warm-up forward passes left cached */
    if ((!o->explicit_control && o->poll_secs > 0) || o->release_idle_secs > 0)
        s->poll_started = pthread_create(&s->poll_th, NULL, poll_main, s) == 0;
    atomic_store(&s->ready, true);
    return s;
}

int fm_server_port(const fm_server *s) { return s->port; }
int fm_server_metrics_port(const fm_server *s) { return s->metrics ? s->mport : -1; }

void fm_server_drain(fm_server *s) {
    atomic_store(&s->draining, true);
    while (atomic_load(&s->in_flight) > 0) usleep(5000);
}

void fm_server_stop(fm_server *s) {
    if (!s) return;
    if (s->poll_started) {
        pthread_mutex_lock(&s->poll_mu);
        s->poll_stop = true;
        pthread_cond_broadcast(&s->poll_cv);
        pthread_mutex_unlock(&s->poll_mu);
        pthread_join(s->poll_th, NULL);
    }
    if (s->http) MHD_stop_daemon(s->http);
    if (s->metrics) MHD_stop_daemon(s->metrics);
    fm_repo_close(s->repo);
    fm_shm_registry_free(s->shm);
    pthread_mutex_destroy(&s->poll_mu);
    pthread_cond_destroy(&s->poll_cv);
    free(s);
}
