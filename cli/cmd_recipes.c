/* `fathom recipes`: the built-in recipes, each with the first line of its
 * header comment as a description. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "fathom/recipe.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The header comment's first paragraph (comment lines up to an empty one), joined
 * into one line, without the leading "name:". */
static void describe(const char *path, const char *name, char *desc, size_t n) {
    desc[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    size_t len = 0;
    while (fgets(line, sizeof line, f) && (line[0] == '#' || line[0] == ';')) {
        char *p = line;
        while (*p == '#' || *p == ';' || *p == ' ') p++;
        p[strcspn(p, "\r\n")] = 0;
        if (!*p) break; /* the end of the paragraph */
        char *colon = strchr(p, ':'); /* "fashion-cnn: a small CNN ..." -> the part after the name */
        if (len == 0 && colon && !strncmp(p, name, (size_t)(colon - p))) for (p = colon + 1; *p == ' '; p++) {}
        int k = snprintf(desc + len, n - len, "%s%s", len ? " " : "", p);
        if (k < 0 || (size_t)k >= n - len) break;
        len += (size_t)k;
    }
    fclose(f);
}

int fm_cmd_recipes(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: fathom recipes [--json]\n\nLists the built-in recipes (use one with `fathom train NAME`).\n");
            return 0;
        }
        if (!strcmp(argv[i], "--json")) { json = true; continue; }
        fm_cli_error("recipes: unknown argument '%s' (try --help)", argv[i]);
        return 2;
    }
    char dir[512];
    fm_recipe_dir(dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d) { fm_cli_error("no recipe directory at %s (set FATHOM_DATA to fathom's data directory)", dir); return 1; }
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".ini")) names[n++] = strndup(e->d_name, l - 4);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    json_t *arr = json_array();
    if (!json) printf("built-in recipes (%s):\n", dir);
    for (int i = 0; i < n; i++) {
        char path[1024], desc[2048];
        snprintf(path, sizeof path, "%s/%s.ini", dir, names[i]);
        describe(path, names[i], desc, sizeof desc);
        if (json) {
            json_t *o = json_object();
            json_object_set_new(o, "name", json_string(names[i]));
            json_object_set_new(o, "description", json_string(desc));
            json_object_set_new(o, "path", json_string(path));
            json_array_append_new(arr, o);
        } else {
            printf("  %-14s %s\n", names[i], desc);
        }
        free(names[i]);
    }
    if (json) {
        json_t *j = json_object();
        json_object_set_new(j, "recipes", arr);
        char *s = json_dumps(j, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        json_decref(arr);
    }
    return 0;
}
