/* --device parsing shared by train, eval, predict and generate (device_arg.h). */
#include "device_arg.h"

#include "commands.h"

int fm_cli_device_check(const char *cmd, const char *v, fm_device dev) {
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
