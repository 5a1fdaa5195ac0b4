/* tiny.c: the README's C example. Builds a small MLP, trains it for a few
 * steps on a fixed batch with AdamW, and prints the loss as it falls.
 * Build: cc tiny.c $(pkg-config --cflags --libs fathom) */
#include <stdio.h>
#include <fathom/fathom.h>
#include <fathom/nn.h>
#include <fathom/optim.h>

int main(void) {
    fm_rng rng;
    fm_rng_init(&rng, 42);
    fm_module *model = fm_nn_sequential();
    fm_sequential_add(model, fm_nn_linear(4, 16, true, &rng));
    fm_sequential_add(model, fm_nn_simple(FM_MOD_RELU));
    fm_sequential_add(model, fm_nn_linear(16, 3, true, &rng));
    fm_optim_config cfg = fm_optim_default_config(FM_OPTIM_ADAMW);
    cfg.lr = 0.05;
    fm_optim *opt = fm_optim_new(&cfg);
    fm_optim_add_params(opt, model);
    fm_tensor *x = fm_tensor_randn(2, (int64_t[]){8, 4}, FM_F32, &rng);
    int64_t labels[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    fm_tensor *y = fm_tensor_from_data(labels, 1, (int64_t[]){8}, FM_I64);
    for (int step = 0; step < 20; step++) {
        fm_tensor *logits = fm_module_forward(model, x);
        fm_tensor *loss = fm_cross_entropy(logits, y, -100, 0.0, FM_REDUCE_MEAN);
        if (step % 5 == 0 || step == 19) printf("step %2d  loss %.4f\n", step, fm_tensor_item(loss));
        fm_backward(loss, NULL, false);
        fm_optim_step(opt);
        fm_optim_zero_grad(opt);
        fm_tensor_release_n(2, logits, loss);
    }
    fm_tensor_release_n(2, x, y);
    fm_optim_free(opt);
    fm_module_free(model);
    return 0;
}
