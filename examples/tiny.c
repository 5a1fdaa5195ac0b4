/* tiny.c: the README's C example. Learns whether the four inputs sum to more
 * than 2 with a small MLP and AdamW, printing the loss as it falls.
 * Build: cc tiny.c $(pkg-config --cflags --libs fathom) */
#include <fathom/fathom.h>   /* build: cc tiny.c $(pkg-config --cflags --libs fathom) */
#include <fathom/nn.h>
#include <fathom/optim.h>
#include <stdio.h>

int main(void) {
    fm_manual_seed(0);
    int64_t xs[2] = {64, 4}, n = 64;                      /* learn y = sum(x) > 2 */
    fm_tensor *x = fm_tensor_rand(2, xs, FM_F32, NULL), *s = fm_sum(x, 1, (int[]){1}, false);
    fm_tensor *two = fm_tensor_scalar(2.0, FM_F32), *gt = fm_gt(s, two), *y = fm_to_dtype(gt, FM_I64);
    fm_module *net = fm_sequential(3, fm_linear_new(4, 16, true), fm_relu_new(), fm_linear_new(16, 2, true));
    fm_optimizer *opt = fm_optim_adamw(net, 0.01, 0.9, 0.999, 1e-8, 0.0);
    for (int step = 0; step < 50; step++) {
        fm_tensor *logits = fm_module_forward(net, x);
        fm_tensor *loss = fm_cross_entropy(logits, y, -100, 0.0, FM_REDUCE_MEAN);
        fm_optim_zero_grad(opt);
        fm_backward(loss, NULL, false);
        fm_optim_step(opt);
        if (step % 10 == 0) printf("step %d loss %.4f\n", step, fm_tensor_item(loss));
        fm_tensor_release_n(2, logits, loss);
    }
    fm_optim_free(opt); fm_module_free(net);
    fm_tensor_release_n(5, x, s, two, gt, y); (void)n;
    return 0;
}
