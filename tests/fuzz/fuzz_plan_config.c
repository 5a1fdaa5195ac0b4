/* The planner's config.json reader (src/plan/plan_hf.c: Hugging Face llama,
 * mistral, mixtral, qwen2, gemma, gpt2 and bert configs, and fathom's GPT
 * config). A config that is accepted is then planned for inference, serving
 * and training on a two-GPU database, so the dimensions it lets through go
 * through the memory, time and serving arithmetic too. */
#include "fathom/plan.h"
#include "fuzz_util.h"
#include "plan/plan_internal.h"

static const char db_json[] =
    "{\"gpus\": [{\"name\": \"Fuzz 24\", \"kind\": \"consumer\", \"memory_gb\": 24, \"bandwidth_gbs\": 1000,"
    " \"fp32_tflops\": 50, \"bf16_tflops\": 100, \"fp8_tflops\": null, \"int8_tops\": 400, \"tdp_w\": 300,"
    " \"bf16\": true, \"interconnect\": {\"name\": \"PCIe\", \"nvlink\": false, \"pcie_lanes\": 16,"
    " \"link_gbs\": 32, \"gpus_per_node\": 8, \"inter_node_gbs\": 4}, \"mfu\": {\"fp32\": null, \"bf16\": 0.5,"
    " \"fp8\": null, \"source\": \"fuzz\"}, \"prices\": {\"on_demand\": {\"usd_per_hour\": 1, \"date\": \"x\","
    " \"source\": \"x\"}, \"spot\": {\"usd_per_hour\": null, \"date\": \"x\", \"source\": \"x\"},"
    " \"reserved\": {\"usd_per_hour\": 0.5, \"date\": \"x\", \"source\": \"x\"}}},"
    " {\"name\": \"Fuzz 80\", \"kind\": \"datacenter\", \"memory_gb\": 80, \"bandwidth_gbs\": 3000,"
    " \"fp32_tflops\": 60, \"bf16_tflops\": 1000, \"fp8_tflops\": 2000, \"int8_tops\": 2000, \"tdp_w\": 700,"
    " \"bf16\": true, \"interconnect\": {\"name\": \"NVLink\", \"nvlink\": true, \"pcie_lanes\": 16,"
    " \"link_gbs\": 900, \"gpus_per_node\": 8, \"inter_node_gbs\": 50}, \"mfu\": {\"fp32\": null, \"bf16\": 0.4,"
    " \"fp8\": 0.3, \"source\": \"fuzz\"}, \"prices\": {\"on_demand\": {\"usd_per_hour\": null,"
    " \"date\": \"x\", \"source\": \"unpriced\"}, \"spot\": {\"usd_per_hour\": null, \"date\": \"x\","
    " \"source\": \"unpriced\"}, \"reserved\": {\"usd_per_hour\": null, \"date\": \"x\","
    " \"source\": \"unpriced\"}}}]}";

static fm_plan_db *fuzz_db(void) {
    static fm_plan_db *db;
    if (!db) {
        db = fm_plan_db_load(fuzz_file((const uint8_t *)db_json, sizeof db_json - 1, "-db.json"));
        if (!db) {
            fprintf(stderr, "fuzz_plan_config: its own database does not load: %s\n", fm_last_error());
            abort();
        }
    }
    return db;
}

static void plan_as(const fm_plan_model *m, fm_plan_task task, double rate) {
    fm_plan_job job;
    fm_plan_job_defaults(&job);
    job.task = task;
    job.requests_per_second = rate;
    if (rate > 0) job.output_tokens = 64;
    if (fm_plan_job_check(m, &job) != FM_OK) return;
    fm_plan_result *r = fm_plan_compute(m, &job, fuzz_db(), NULL);
    if (!r) return;
    free(fm_plan_render_text(r));
    free(fm_plan_render_json(r));
    free(fm_plan_render_explain(r));
    fm_plan_result_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_plan_db *db = fuzz_db();
    (void)db;
    fm_plan_model m;
    if (plan_model_from_config(fuzz_file(data, size, "-config.json"), &m) == FM_OK) {
        plan_as(&m, FM_PLAN_INFERENCE, 0);
        plan_as(&m, FM_PLAN_INFERENCE, 10);
        plan_as(&m, FM_PLAN_TRAIN, 0);
    }
    fm_clear_error();
    return 0;
}
