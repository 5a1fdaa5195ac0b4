/* --device parsing shared by train, eval, predict and generate (device_arg.h). */
#include "device_arg.h"

#include "commands.h"
#include "fathom/amp.h" /* fm_precision_parse */
#include "fathom/graph.h"
#include "fathom/nn.h"
#include "fathom/recipe.h"

int fm_cli_device_check(const char *cmd, const char *v, fm_device dev) {
    if (dev.type == FM_DEV_META) { /* it computes nothing: results would be zeros */
        fm_cli_error("%s: --device meta: the meta device holds shapes, not values (it is the planner's: `fathom plan "
                     "--model RECIPE` runs a step on it); use cpu, cuda or check", cmd);
        return 2;
    }
    fm_status st = fm_device_validate(dev);
    if (st == FM_OK) return 0;
    char dn[32];
    fm_cli_error("%s: --device %s: %s", cmd, v ? v : fm_device_name(dev, dn, sizeof dn), fm_last_error());
    return st == FM_ERR_INVALID ? 2 : 1;
}

int fm_cli_device(const char *cmd, const char *v, fm_device *out) {
    if (!v || !*v) {
        fm_cli_error("%s: --device needs a value: cpu, cuda, cuda:N, check or check:N", cmd);
        return 2;
    }
    if (fm_device_parse(v, out) != FM_OK) {
        fm_cli_error("%s: --device: %s", cmd, fm_last_error());
        return 2;
    }
    return fm_cli_device_check(cmd, v, *out);
}

int fm_cli_precision(const char *cmd, const char *v, fm_dtype *out) {
    if (!v || fm_precision_parse(v, out) != FM_OK) {
        fm_cli_error("%s: --precision %s: expected fp32, bf16 or fp16", cmd, v ? v : "(missing)");
        return 2;
    }
    return 0;
}

int fm_cli_precision_for_graph(const char *cmd, const char *dir, fm_dtype precision) {
    if (precision == FM_F32) return 0;
    fm_cli_error("%s: --precision %s: %s is a graph, which runs in the precision it was compiled or quantized in "
                 "(`fathom quantize` makes int8/int4 graphs); --precision is for a model directory from `fathom train`",
                 cmd, fm_precision_name(precision), dir);
    return 2;
}

int fm_cli_classifier_open(const char *dir, fm_graph *g, fm_device dev, fm_recipe *r, fm_module **m) {
    *m = NULL;
    if (g ? fm_graph_classifier_recipe(g, r) != FM_OK : fm_model_load(dir, r, m) != FM_OK) {
        fm_cli_error(g ? "%s: %s" : "%s%s", g ? dir : "", fm_last_error());
        fm_graph_free(g);
        return 1;
    }
    if ((g ? fm_graph_to_device(g, dev) : fm_module_to(*m, dev)) != FM_OK) {
        fm_cli_error("%s", fm_last_error());
        fm_module_free(*m);
        *m = NULL;
        fm_graph_free(g);
        fm_recipe_free(r);
        return 1;
    }
    return 0;
}
