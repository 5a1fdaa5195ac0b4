/* Helpers for the tests of the Hugging Face layer: the reference fixtures are made
 * at test time by tests/hf/fixtures.py with the Python libraries (tokenizers,
 * transformers, sentence-transformers); none is committed. */
#ifndef FATHOM_TEST_HF_UTIL_H
#define FATHOM_TEST_HF_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The Python to run: $FATHOM_PYTHON, .venv/bin/python, then python3. */
static inline const char *hf_python(void) {
    const char *p = getenv("FATHOM_PYTHON");
    if (p && *p) return p;
    if (access(".venv/bin/python", X_OK) == 0) return ".venv/bin/python";
    return "python3";
}

/* Runs `fixtures.py MODE DIR [ARGS]`: 0 made, 77 a library is missing (the reason
 * is in *why), else failed. */
static inline int hf_fixtures(const char *mode, const char *dir, const char *args, char *why, size_t why_n) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s tests/hf/fixtures.py %s '%s' %s 2>&1", hf_python(), mode, dir, args ? args : "");
    FILE *f = popen(cmd, "r");
    if (!f) { snprintf(why, why_n, "cannot run %.200s", cmd); return 1; }
    size_t o = 0;
    char line[512];
    why[0] = 0;
    while (fgets(line, sizeof line, f)) {
        fputs(line, stderr);
        size_t l = strlen(line);
        if (o + l < why_n) { memcpy(why + o, line, l + 1); o += l; }
    }
    int rc = pclose(f);
    int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
    if (code == 127) { snprintf(why, why_n, "%s not found", hf_python()); return 77; }
    return code;
}

static inline char *hf_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t)(n > 0 ? n : 0) + 1);
    size_t got = s && n > 0 ? fread(s, 1, (size_t)n, f) : 0;
    fclose(f);
    if (s) s[got] = 0;
    if (len) *len = got;
    return s;
}
#endif
