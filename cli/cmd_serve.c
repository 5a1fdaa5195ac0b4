/* `fathom serve --model-repository DIR ...`: the inference server (src/serve).
 * SIGTERM or SIGINT drains it: requests in flight finish, new ones get 503, then
 * it exits 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "device_arg.h"
#include "serve/server.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: fathom serve --model-repository DIR [--host 127.0.0.1] [--port 8000] [--metrics-port 8002]\n"
            "                    [--api-key KEY] [--model-control poll|explicit] [--device cpu|cuda|cuda:N]\n"
            "                    [--load-model NAME]... [--poll-secs 5] [--max-body-mb 64]\n"
            "                    [--connection-timeout 30] [--max-connections 512] [--release-idle-secs 2]\n\n"
            "Serves the models in DIR (DIR/<model>/<version>/, config in DIR/<model>/config.pbtxt or\n"
            "config.json) with the KServe v2 / Triton HTTP protocol (with its statistics, classification and\n"
            "system shared memory extensions), OpenAI's /v1/completions, /v1/chat/completions and\n"
            "/v1/embeddings for text models, and Prometheus metrics on GET /metrics of the metrics port.\n\n"
            "  --host ADDR            address to bind (numeric or localhost; default loopback)\n"
            "  --port N               HTTP port (0: any free port, printed at start)\n"
            "  --metrics-port N       metrics port (0: any free port; -1: none)\n"
            "  --api-key KEY          required for /v2/repository/..., shared memory and /v1 (Authorization: Bearer KEY)\n"
            "  --model-control MODE   poll (default): load every model and rescan DIR every --poll-secs;\n"
            "                         explicit: load/unload through the API (and --load-model at start)\n"
            "  --load-model NAME      explicit mode: load NAME at start ('*': every model)\n"
            "  --device cpu|cuda[:N]  device for models whose config names none (check: the test device)\n"
            "  --max-body-mb N        larger request bodies get 413\n"
            "  --connection-timeout S close a connection idle or stalled for S seconds\n"
            "  --release-idle-secs S  after S seconds with no request, return cached tensor memory to the\n"
            "                         system (0: never)\n\n"
            "docs/SERVING.md describes the endpoints, the config file and the metrics.\n");
}

static int parse_args(int argc, char **argv, fm_server_options *o, const char **load, int max_load) {
    long long v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { serve_usage(stdout); return 0; }
        bool takes = !strcmp(a, "--model-repository") || !strcmp(a, "--host") || !strcmp(a, "--port") ||
                     !strcmp(a, "--metrics-port") || !strcmp(a, "--api-key") || !strcmp(a, "--model-control") ||
                     !strcmp(a, "--device") || !strcmp(a, "--load-model") || !strcmp(a, "--poll-secs") ||
                     !strcmp(a, "--max-body-mb") || !strcmp(a, "--connection-timeout") || !strcmp(a, "--max-connections") ||
                     !strcmp(a, "--release-idle-secs");
        if (!takes) { fm_cli_error("serve: unknown option '%s'", a); return 2; }
        if (!val) { fm_cli_error("serve: %s needs a value", a); return 2; }
        i++;
        if (!strcmp(a, "--model-repository")) o->repository = val;
        else if (!strcmp(a, "--host")) o->host = val;
        else if (!strcmp(a, "--api-key")) {
            if (!*val) { fm_cli_error("serve: --api-key must not be empty"); return 2; }
            o->api_key = val;
        } else if (!strcmp(a, "--model-control")) {
            if (strcmp(val, "poll") && strcmp(val, "explicit")) {
                fm_cli_error("serve: --model-control must be poll or explicit, got '%s'", val);
                return 2;
            }
            o->explicit_control = !strcmp(val, "explicit");
        } else if (!strcmp(a, "--device")) {
            int rc = fm_cli_device("serve", val, &o->device); /* cpu, cuda, cuda:N or check (tests) */
            if (rc) return rc;
        } else if (!strcmp(a, "--load-model")) {
            if (o->n_load == max_load) { fm_cli_error("serve: at most %d --load-model options", max_load); return 2; }
            load[o->n_load++] = val;
        } else if (!strcmp(a, "--release-idle-secs")) {
            if (!fm_cli_parse_int_range("serve", a, val, 0, 100000, &v)) return 2;
            o->release_idle_secs = (int)v;
        } else if (!strcmp(a, "--port") || !strcmp(a, "--metrics-port")) {
            if (!fm_cli_parse_int_range("serve", a, val, !strcmp(a, "--port") ? 0 : -1, 65535, &v)) return 2;
            if (!strcmp(a, "--port")) o->port = (int)v;
            else o->metrics_port = (int)v;
        } else {
            long long max = !strcmp(a, "--max-body-mb") ? 4096 : 100000;
            if (!fm_cli_parse_int_range("serve", a, val, 1, max, &v)) return 2;
            if (!strcmp(a, "--poll-secs")) o->poll_secs = (int)v;
            else if (!strcmp(a, "--max-body-mb")) o->max_body = (size_t)v << 20;
            else if (!strcmp(a, "--connection-timeout")) o->connection_timeout_s = (int)v;
            else o->max_connections = (int)v;
        }
    }
    if (!o->repository) { fm_cli_error("serve: --model-repository DIR is required"); return 2; }
    if (o->explicit_control && !o->api_key && !fm_server_host_is_loopback(o->host)) {
        fm_cli_error("serve: refusing to serve model control (load/unload) on the non-loopback address %s without "
                     "--api-key; give a key or bind 127.0.0.1", o->host);
        return 2;
    }
    if (o->n_load && !o->explicit_control) { fm_cli_error("serve: --load-model needs --model-control explicit"); return 2; }
    return -1;
}

int fm_cmd_serve(int argc, char **argv) {
    fm_server_options o;
    fm_server_options_init(&o);
    o.log = stderr;
    const char *load[64];
    o.load = load;
    int rc = parse_args(argc, argv, &o, load, 64);
    if (rc >= 0) {
        if (rc == 2) fprintf(stderr, "Run `fathom serve --help` for the options.\n");
        return rc;
    }
    /* every thread the server starts inherits this mask, so the signals reach sigwait below */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    fm_server *s = fm_server_start(&o);
    if (!s) { fm_cli_error("serve: %s", fm_last_error()); return 1; }
    fprintf(stderr, "fathom serve: listening on http://%s:%d", o.host, fm_server_port(s));
    if (fm_server_metrics_port(s) >= 0) fprintf(stderr, " (metrics: http://%s:%d/metrics)", o.host, fm_server_metrics_port(s));
    fprintf(stderr, "\n");
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "fathom serve: %s: draining (in-flight requests finish, new ones get 503)\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT");
    fm_server_drain(s);
    fm_server_stop(s);
    fprintf(stderr, "fathom serve: stopped\n");
    return 0;
}
