/* `fathom serve`: the HTTP front (libmicrohttpd, one thread per connection) for
 * the KServe v2 / Triton protocol, the metrics port, model polling and draining. */
#ifndef FATHOM_SERVE_SERVER_H
#define FATHOM_SERVE_SERVER_H
#include <stdio.h>

#include "fathom/tensor.h"

typedef struct fm_server_options {
    const char *repository;
    const char *host;          /* numeric IPv4/IPv6 or "localhost"; default 127.0.0.1 */
    int port;                  /* 0: any free port (fm_server_port says which) */
    int metrics_port;          /* 0: any free port; -1: no metrics endpoint */
    const char *api_key;       /* guards /v2/repository/... when set */
    bool explicit_control;     /* else poll */
    int poll_secs;             /* poll mode: seconds between repository scans */
    int release_idle_secs;     /* after this long with no request in flight, cached tensor memory is returned (0: never) */
    const char *const *load;   /* explicit mode: models to load at start ("*": all) */
    int n_load;
    fm_device device;
    size_t max_body;           /* bytes; larger bodies get 413 */
    int connection_timeout_s;  /* an idle or stalled connection is closed after this */
    int max_connections;
    FILE *log;                 /* model load messages (NULL: quiet) */
} fm_server_options;

typedef struct fm_server fm_server;

void fm_server_options_init(fm_server_options *o);
/* Checks the options, loads the models and starts listening. NULL with
 * fm_last_error() set (a bind failure names the address). */
fm_server *fm_server_start(const fm_server_options *o);
int fm_server_port(const fm_server *s);
int fm_server_metrics_port(const fm_server *s);
/* From now on new requests get 503; returns when none is in flight. */
void fm_server_drain(fm_server *s);
void fm_server_stop(fm_server *s);
/* true for 127.0.0.0/8, ::1 and "localhost" */
bool fm_server_host_is_loopback(const char *host);
#endif
