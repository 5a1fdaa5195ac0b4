/* The planner's GPU database (src/plan/plan_db.c): a database that loads is
 * then used to plan a 7B model for training and for serving, rendered three
 * ways, so the figures it accepts go through the time, cost and serving
 * arithmetic too (a float-to-integer overflow there is UB that UBSan reports). */
#include "fathom/plan.h"
#include "fuzz_util.h"

static void plan_with(const fm_plan_db *db, fm_plan_task task) {
    fm_plan_model m;
    if (fm_plan_model_preset("llama-2-7b", &m) != FM_OK) abort();
    fm_plan_job job;
    fm_plan_job_defaults(&job);
    job.task = task;
    if (task == FM_PLAN_TRAIN) job.tokens = 1e9;
    else {
        job.requests_per_second = 5;
        job.output_tokens = 128;
    }
    fm_plan_result *r = fm_plan_compute(&m, &job, db, NULL);
    if (!r) return;
    free(fm_plan_render_text(r));
    free(fm_plan_render_json(r));
    free(fm_plan_render_explain(r));
    fm_plan_result_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_plan_db *db = fm_plan_db_load(fuzz_file(data, size, ".json"));
    if (db) {
        plan_with(db, FM_PLAN_INFERENCE);
        plan_with(db, FM_PLAN_TRAIN);
        (void)fm_plan_db_find(db, "h100");
    }
    fm_plan_db_free(db);
    fm_clear_error();
    return 0;
}
