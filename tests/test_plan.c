/* Tests for the planner (src/plan, include/fathom/plan.h): exact parameter
 * counts from published dimensions, hand-worked memory for each task type,
 * the rules of thumb that must come out of the formulas (not be coded in),
 * the GPU database's validation, safetensors headers, and bad input. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fathom/gpt.h"
#include "fathom/plan.h"
#include "plan/plan_internal.h" /* plan_active_params */
#include "test_util.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static fm_plan_db *db;
static fm_plan_db *tdb; /* tests/data/plan_gpus_test.json: round numbers for hand-computed times */

/* Scratch files go in a directory of this process's own: several checkouts'
 * suites may run this test at the same time on one machine. */
static char scratch[64] = "/tmp/fathom_test_plan_XXXXXX";
static const char *tmp_path(const char *name) {
    static char bufs[4][256];
    static int next;
    char *b = bufs[next++ % 4];
    snprintf(b, 256, "%s/%s", scratch, name);
    return b;
}

static fm_plan_model preset(const char *name) {
    fm_plan_model m;
    if (fm_plan_model_preset(name, &m) != FM_OK) {
        fprintf(stderr, "preset %s: %s\n", name, fm_last_error());
        memset(&m, 0, sizeof m);
    }
    return m;
}

/* Plan a job on one GPU and return its row (the result is kept for freeing). */
static fm_plan_result *last;
static const fm_plan_row *plan_on(const fm_plan_model *m, const fm_plan_job *job, const char *gpu) {
    fm_plan_result_free(last);
    last = fm_plan_compute(m, job, db, gpu);
    if (!last) {
        fprintf(stderr, "plan failed: %s\n", fm_last_error());
        return NULL;
    }
    return &last->rows[0];
}

/* The same on the test database. */
static const fm_plan_row *plan_on_test(const fm_plan_model *m, const fm_plan_job *job, const char *gpu) {
    fm_plan_db *keep = db;
    db = tdb;
    const fm_plan_row *row = plan_on(m, job, gpu);
    db = keep;
    return row;
}

static void test_parse_count(void) {
    double v = 0;
    CHECK(fm_plan_parse_count("7B", &v) == FM_OK && v == 7e9);
    CHECK(fm_plan_parse_count("124M", &v) == FM_OK && v == 124e6);
    CHECK(fm_plan_parse_count("1.5e9", &v) == FM_OK && v == 1.5e9);
    CHECK(fm_plan_parse_count("350k", &v) == FM_OK && v == 350e3);
    CHECK(fm_plan_parse_count("2T", &v) == FM_OK && v == 2e12);
    CHECK(fm_plan_parse_count("-7B", &v) != FM_OK);
    CHECK_ERR_CONTAINS("negative");
    CHECK(fm_plan_parse_count("0", &v) != FM_OK);
    CHECK_ERR_CONTAINS("at least 1");
    CHECK(fm_plan_parse_count("seven", &v) != FM_OK);
    CHECK_ERR_CONTAINS("not a number");
    CHECK(fm_plan_parse_count("7X", &v) != FM_OK);
    CHECK_ERR_CONTAINS("suffixes");
    CHECK(fm_plan_parse_count("1e400", &v) != FM_OK);
    CHECK_ERR_CONTAINS("out of range");
    CHECK(fm_plan_parse_count("9e20", &v) != FM_OK);
    CHECK_ERR_CONTAINS("absurdly large");
    CHECK(fm_plan_parse_count("", &v) != FM_OK);
}

static void test_presets(void) {
    /* The checkpoints' own counts. */
    CHECK(preset("gpt2-124m").params == 124439808);
    CHECK(preset("gpt2-1.5b").params == 1557611200);
    CHECK(preset("llama-2-7b").params == 6738415616);
    CHECK(preset("llama-2-13b").params == 13015864320);
    CHECK(preset("llama-2-70b").params == 68976648192);
    CHECK(preset("llama-3-8b").params == 8030261248);
    CHECK(preset("llama-3-70b").params == 70553706496);
    CHECK(preset("mistral-7b").params == 7241732096);
    CHECK(preset("bert-base").params == 109482240);
    CHECK(preset("minilm-l6").params == 22713216);
    CHECK(preset("resnet-50").params == 25557032);
    CHECK(fm_plan_preset_count() >= 10);

    fm_plan_model m;
    CHECK(fm_plan_model_preset("llama2-7b", &m) != FM_OK);
    CHECK_ERR_CONTAINS("did you mean \"llama-2-7b\"");
    CHECK(fm_plan_model_preset("gpt-2-124m", &m) != FM_OK);
    CHECK_ERR_CONTAINS("gpt2-124m");

    /* Dimensions: defaults and validation. */
    memset(&m, 0, sizeof m);
    m.arch = FM_PLAN_ARCH_LLAMA;
    m.layers = 32; m.hidden = 4096; m.heads = 32; m.vocab = 32000;
    CHECK(fm_plan_model_from_dims(&m) == FM_OK);
    CHECK(m.ffn == 11008);                   /* Llama's 8h/3 rounded up to 256 */
    CHECK(m.params == 6738415616);           /* and so the same count as the preset */
    memset(&m, 0, sizeof m);
    m.arch = FM_PLAN_ARCH_GPT;
    m.layers = 12; m.hidden = 768; m.heads = 10; m.vocab = 50257;
    CHECK(fm_plan_model_from_dims(&m) != FM_OK);
    CHECK_ERR_CONTAINS("does not divide --hidden");
    m.heads = 12; m.kv_heads = 5;
    CHECK(fm_plan_model_from_dims(&m) != FM_OK);
    CHECK_ERR_CONTAINS("--kv-heads 5");
    m.kv_heads = 0; m.layers = 0;
    CHECK(fm_plan_model_from_dims(&m) != FM_OK);
    CHECK_ERR_CONTAINS("--layers 0 is out of range");
    m.layers = 10000; m.hidden = 1000000; m.heads = 1000; m.vocab = 100000000;
    CHECK(fm_plan_model_from_dims(&m) != FM_OK);
    CHECK_ERR_CONTAINS("beyond any real model");

    /* A bare count keeps the count and estimates a shape. */
    CHECK(fm_plan_model_from_params(7e9, &m) == FM_OK);
    CHECK(m.params == 7000000000);
    CHECK(m.layers >= 28 && m.layers <= 36);
    CHECK(m.hidden >= 3584 && m.hidden <= 4608);
    CHECK(fm_plan_model_from_params(0, &m) != FM_OK);
}

static void test_db(void) {
    CHECK(db != NULL);
    if (!db) return;
    CHECK(db->count >= 26);
    static const char *const want[] = {"RTX 3060 12GB", "RTX 4060 Ti 16GB", "RTX 4080 16GB", "RTX 4090 24GB",
                                       "RTX 6000 Ada 48GB", "L4", "T4", "A10G", "A100 40GB SXM", "A100 80GB SXM",
                                       "H100 SXM", "H100 PCIe", "H200 SXM", "B200", "MI300X", "Ascend 910B",
                                       "L40S", "RTX 3090 24GB", "RTX A6000 48GB", "RTX 5090 32GB", "V100 SXM2 32GB",
                                       "H20", "GB200", "MI325X", "MI355X", "Gaudi 3"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(fm_plan_db_find(db, want[i]), "%s", want[i]);
    const fm_plan_gpu *g = fm_plan_db_find(db, "4090");
    CHECK(g && !strcmp(g->name, "RTX 4090 24GB"));
    CHECK(g && g->bf16_tflops == 165.2 && !g->nvlink); /* dense fp32-accumulate, not the 330 fp16-accumulate figure */
    g = fm_plan_db_find(db, "h100 sxm");
    CHECK(g && g->bf16_tflops == 989); /* not the 1979 sparse headline */
    CHECK(g && g->fp8_tflops == 1979); /* fp8 dense: twice the 16-bit rate on Hopper */
    /* measured matmul ceilings (stas00/ml-engineering's MAMF table), with their source */
    CHECK(g && g->matmul_bf16 == 0.803 && g->matmul_fp8 == 0.709 && strstr(g->matmul_source, "b9e2972"));
    g = fm_plan_db_find(db, "T4");
    CHECK(g && !g->bf16 && g->fp8_tflops < 0);
    /* ECC on GDDR6 takes 1/16: nvidia-smi shows 15360 MiB = 15 GiB, not 16 */
    CHECK(g && g->memory_gib == 15360.0 / 1024);
    g = fm_plan_db_find(db, "A10G");
    CHECK(g && g->memory_gib < 23); /* 23028 MiB with ECC, not the 24 GB of the box */
    g = fm_plan_db_find(db, "V100");
    CHECK(g && !g->bf16 && g->fp8_tflops < 0);
    g = fm_plan_db_find(db, "GB200");
    CHECK(g && g->gpus_per_node == 72);
    /* Prices are consistent: spot and reserved never above on-demand (the
     * H100's spot once sat above its reserved price). */
    for (int i = 0; i < db->count; i++) {
        const fm_plan_price *p = db->gpus[i].price;
        if (p[0].usd_per_hour < 0) continue;
        CHECK_MSG(p[1].usd_per_hour <= p[0].usd_per_hour && p[2].usd_per_hour <= p[0].usd_per_hour, "%s",
                  db->gpus[i].name);
    }
    g = fm_plan_db_find(db, "h100 sxm");
    CHECK(g && g->price[FM_PLAN_SPOT].usd_per_hour <= g->price[FM_PLAN_RESERVED].usd_per_hour);
    g = fm_plan_db_find(db, "4060");
    CHECK(g && g->pcie_lanes == 8);
    CHECK(fm_plan_db_find(db, "RTX 4009") == NULL);
    CHECK_ERR_CONTAINS("did you mean \"RTX 4090 24GB\"");
    CHECK(fm_plan_db_find(db, "H100") == NULL);
    CHECK_ERR_CONTAINS("ambiguous");
    for (int i = 0; i < db->count; i++)
        for (int k = 0; k < FM_PLAN_PRICING_COUNT; k++)
            CHECK(db->gpus[i].price[k].date[0] && db->gpus[i].price[k].source[0]);

    /* Malformed and incomplete files name file:line and the field. */
    const char *bad = tmp_path("fathom_test_plan_bad.json");
    FILE *f = fopen(bad, "w");
    fputs("{\n  \"gpus\": [\n    {\"name\": \"X\",,}\n  ]\n}\n", f);
    fclose(f);
    CHECK(fm_plan_db_load(bad) == NULL);
    CHECK_ERR_CONTAINS("fathom_test_plan_bad.json:3:");
    f = fopen(bad, "w");
    fputs("{\n  \"gpus\": [\n"
          "    {\"name\": \"Good\", \"kind\": \"datacenter\", \"memory_gb\": 16, \"bandwidth_gbs\": 300,\n"
          "     \"fp32_tflops\": 8, \"bf16_tflops\": 65, \"fp8_tflops\": null, \"int8_tops\": null, \"tdp_w\": 70,\n"
          "     \"bf16\": true, \"interconnect\": {\"name\": \"PCIe\", \"nvlink\": false, \"pcie_lanes\": 16,\n"
          "     \"link_gbs\": 16, \"gpus_per_node\": 8, \"inter_node_gbs\": 12.5},\n"
          "     \"mfu\": {\"fp32\": null, \"bf16\": 0.4, \"fp8\": null, \"source\": \"s\"},\n"
          "     \"prices\": {\"on_demand\": {\"usd_per_hour\": 1, \"date\": \"d\", \"source\": \"s\"},\n"
          "                \"spot\": {\"usd_per_hour\": null, \"date\": \"d\", \"source\": \"s\"},\n"
          "                \"reserved\": {\"usd_per_hour\": 0.5, \"date\": \"d\", \"source\": \"s\"}}},\n"
          "    {\n      \"name\": \"RTX 4090\", \"kind\": \"consumer\", \"memory_gb\": 24\n    }\n  ]\n}\n", f);
    fclose(f);
    CHECK(fm_plan_db_load(bad) == NULL);
    CHECK_ERR_CONTAINS("fathom_test_plan_bad.json:12: entry \"RTX 4090\": missing field \"bandwidth_gbs\"");
    f = fopen(bad, "w");
    fputs("{\"gpus\": [{\"name\": \"Y\", \"kind\": \"consumer\", \"memory_gb\": -4}]}\n", f);
    fclose(f);
    CHECK(fm_plan_db_load(bad) == NULL);
    CHECK_ERR_CONTAINS("memory_gb");
    /* A spot price above on-demand, a reserved one above it, a memory size in
     * MiB instead of GiB, a missing interconnect field: refused, naming it. */
    static const char *const wrong[][3] = {
        {"\"spot\": {\"usd_per_hour\": 2", "\"spot\": {\"usd_per_hour\": null",
         "prices.spot.usd_per_hour 2 is above prices.on_demand.usd_per_hour 1"},
        {"\"usd_per_hour\": 1.5", "\"usd_per_hour\": 0.5", "prices.reserved.usd_per_hour 1.5 is above"},
        {"\"memory_gb\": 16384", "\"memory_gb\": 16", "field \"memory_gb\" is 16384, beyond any real GPU"},
        {"\"link_gbs\": 16}", "\"link_gbs\": 16, \"gpus_per_node\": 8, \"inter_node_gbs\": 12.5}",
         "missing field \"interconnect.gpus_per_node\""},
        /* the optional measured matmul ceiling: a fraction of the peak, with its source */
        {"\"source\": \"s\", \"matmul\": {\"bf16\": 87, \"fp8\": null, \"source\": \"m\"}},", "\"source\": \"s\"},",
         "field \"mfu.matmul.bf16\" is outside (0, 1]"},
        {"\"source\": \"s\", \"matmul\": {\"bf16\": 0.87, \"fp8\": null}},", "\"source\": \"s\"},",
         "missing field \"mfu.matmul.source\""},
    };
    const char *good =
        "{\n  \"gpus\": [\n"
        "    {\"name\": \"Good\", \"kind\": \"datacenter\", \"memory_gb\": 16, \"bandwidth_gbs\": 300,\n"
        "     \"fp32_tflops\": 8, \"bf16_tflops\": 65, \"fp8_tflops\": null, \"int8_tops\": null, \"tdp_w\": 70,\n"
        "     \"bf16\": true, \"interconnect\": {\"name\": \"PCIe\", \"nvlink\": false, \"pcie_lanes\": 16,\n"
        "     \"link_gbs\": 16, \"gpus_per_node\": 8, \"inter_node_gbs\": 12.5},\n"
        "     \"mfu\": {\"fp32\": null, \"bf16\": 0.4, \"fp8\": null, \"source\": \"s\"},\n"
        "     \"prices\": {\"on_demand\": {\"usd_per_hour\": 1, \"date\": \"d\", \"source\": \"s\"},\n"
        "                \"spot\": {\"usd_per_hour\": null, \"date\": \"d\", \"source\": \"s\"},\n"
        "                \"reserved\": {\"usd_per_hour\": 0.5, \"date\": \"d\", \"source\": \"s\"}}}\n  ]\n}\n";
    f = fopen(bad, "w");
    fputs(good, f);
    fclose(f);
    fm_plan_db *ok = fm_plan_db_load(bad);
    CHECK(ok && ok->count == 1 && ok->gpus[0].gpus_per_node == 8 && ok->gpus[0].fp8_tflops < 0);
    CHECK(ok && ok->gpus[0].matmul_bf16 < 0 && ok->gpus[0].matmul_fp8 < 0); /* optional: not measured */
    fm_plan_db_free(ok);
    for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++) {
        char text[2048];
        const char *at = strstr(good, wrong[w][1]);
        CHECK(at != NULL);
        if (!at) continue;
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - good), good, wrong[w][0], at + strlen(wrong[w][1]));
        f = fopen(bad, "w");
        fputs(text, f);
        fclose(f);
        CHECK(fm_plan_db_load(bad) == NULL);
        CHECK_ERR_CONTAINS("fathom_test_plan_bad.json:3: entry \"Good\"");
        CHECK_ERR_CONTAINS(wrong[w][2]);
    }
    f = fopen(bad, "w");
    fputs("{\"cards\": []}\n", f);
    fclose(f);
    CHECK(fm_plan_db_load(bad) == NULL);
    CHECK_ERR_CONTAINS("missing field \"gpus\"");
    unlink(bad);
    CHECK(fm_plan_db_load("/nonexistent/gpus.json") == NULL);
    CHECK_ERR_CONTAINS("cannot read GPU database /nonexistent/gpus.json (No such file or directory");
    /* a directory, a NUL byte and a file past the 16 MiB limit (sparse: refused by its size, unread) are named */
    CHECK(fm_plan_db_load("/tmp") == NULL);
    CHECK_ERR_CONTAINS("cannot read GPU database /tmp (Is a directory; pass --gpu-db FILE");
    f = fopen(bad, "wb");
    static const char with_nul[] = "{\"gpus\": []}\0\n";
    fwrite(with_nul, 1, sizeof with_nul - 1, f);
    fclose(f);
    CHECK(fm_plan_db_load(bad) == NULL);
    CHECK_ERR_CONTAINS("fathom_test_plan_bad.json: not a text file: it holds a NUL byte");
    CHECK(truncate(bad, (17 << 20)) == 0);
    CHECK(fm_plan_db_load(bad) == NULL);
    CHECK_ERR_CONTAINS("fathom_test_plan_bad.json: too large (a database is a JSON file of at most 16 MiB");
    unlink(bad);
}

/* Hand-worked: Llama-2-7B served in bf16, batch 1, 2048 tokens. */
static void test_inference_memory(void) {
    fm_plan_model m = preset("llama-2-7b");
    fm_plan_job j;
    fm_plan_job_defaults(&j);
    j.seq = 2048;
    fm_plan_memory mem;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.weights, 6738415616.0 * 2, 1e-12);
    /* 2 x 32 layers x 32 kv heads x 128 x 2 bytes = 512 KiB per token (FACTS) */
    CHECK_NEAR(mem.kv_cache, 512.0 * 1024 * 2048, 1e-12);
    CHECK_NEAR(mem.logits, 32000.0 * 4, 1e-12);
    /* one layer live: 2048 x (2h + h + 2kv + h + 2ffn) x 2 B */
    CHECK_NEAR(mem.activations, 2048.0 * (8192 + 12288 + 4096 + 22016) * 2, 1e-12);
    CHECK_NEAR(mem.allocated, mem.weights + mem.kv_cache + mem.logits + mem.activations, 1e-12);
    CHECK_NEAR(mem.total, mem.allocated * 1.10 + GIB, 1e-12);
    CHECK(mem.gradients == 0 && mem.optimizer == 0);

    /* Grouped-query attention: Llama-3-8B has 8 KV heads, a quarter of the cache. */
    fm_plan_model l3 = preset("llama-3-8b");
    CHECK(fm_plan_memory_at(&l3, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.kv_cache, 128.0 * 1024 * 2048, 1e-12);

    /* int4: Q4_0 blocks for the block linears, 16-bit embeddings and head. */
    j.precision = FM_PLAN_INT4;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    double E = 2.0 * 32000 * 4096 + 4096, B = 6738415616.0 - E;
    CHECK_NEAR(mem.weights, B * 18 / 32 + E * 2, 1e-12);
    /* tensor parallel 2 halves weights and cache */
    fm_plan_memory tp;
    j.tensor_parallel = 2;
    CHECK(fm_plan_memory_at(&m, &j, 2, &tp, NULL) == FM_OK);
    CHECK_NEAR(tp.weights, mem.weights / 2, 1e-12);
    CHECK_NEAR(tp.kv_cache, mem.kv_cache / 2, 1e-12);

    /* Decode speed is bandwidth-bound: 0.8 x 1008 GB/s / (weights + KV bytes),
     * less the untied input embedding table (32000 x 4096 x 2 B), of which a
     * step gathers one row. */
    j.tensor_parallel = 1;
    j.precision = FM_PLAN_BF16;
    const fm_plan_row *row = plan_on(&m, &j, "4090");
    CHECK(row && row->gpus == 1);
    if (row) {
        fm_plan_memory_at(&m, &j, 1, &mem, NULL);
        CHECK_NEAR(row->tokens_per_s, 0.8 * 1008e9 / (mem.weights - 262144000.0 + mem.kv_cache), 1e-9);
        /* llama.cpp measured 61 tok/s for F16 on a 4090 at 82% of the ideal */
        CHECK(row->tokens_per_s > 50 && row->tokens_per_s < 70);
    }
    /* On "Test PCIe 24" (1000 GB/s, $1/h), by hand: (13476831232 B weights -
     * 262144000 B input table + 2048 x 524288 B KV = 14288429056 B) per token at
     * 0.8 x 1000 GB/s = 55.9893601 tok/s; $1/h / (55.99 x 3600 tok/h) x 1e6 =
     * $4.9612601 per million tokens. */
    row = plan_on_test(&m, &j, "Test PCIe 24");
    CHECK(row && row->gpus == 1);
    if (row) {
        CHECK_NEAR(row->tokens_per_s, 55.989360122417644, 1e-12);
        CHECK_NEAR(row->cost_per_mtok[FM_PLAN_ON_DEMAND], 4.9612600888888885, 1e-12);
        CHECK_NEAR(row->cost_per_mtok[FM_PLAN_SPOT], 4.9612600888888885 * 0.4, 1e-12);
    }
    /* Serving: replicas scale with the load. */
    j.requests_per_second = 20;
    j.output_tokens = 256;
    j.batch = 8;
    row = plan_on(&m, &j, "H100 SXM");
    CHECK(row && row->replicas >= 2 && row->gpus == row->replicas);
    CHECK(row && row->cost[FM_PLAN_ON_DEMAND] > 0 && row->run_s == 3600);
}

/* The serving solver on the test database, worked by hand for Llama-2-7B
 * (bf16 weights 13476831232 B, KV 524288 B per token). */
static void test_serving(void) {
    fm_plan_model m = preset("llama-2-7b");
    fm_plan_job j;
    fm_plan_job_defaults(&j);
    j.seq = 2048;
    /* Tensor parallel 2 over PCIe (32 GB/s, 20 us a hop): 2 all-reduces per layer
     * of 1 x 4096 x 2 = 8192 B, ring 8192 / 32e9 + 2 x 20 us = 4.0256e-5 s each,
     * x 64 = 0.002576384 s per token on top of reading half the weights (less half
     * the input table, 131072000 B) and cache: (6738415616 - 131072000 + 536870912
     * = 7144214528 B) / (0.8 x 1000 GB/s) = 0.00893026816 s. */
    j.tensor_parallel = 2;
    j.gpus = 2;
    const fm_plan_row *row = plan_on_test(&m, &j, "Test PCIe 24");
    CHECK(row && row->gpus == 2);
    if (row) CHECK_NEAR(row->step_s, 0.00893026816 + 0.002576384, 1e-12);
    /* So 64 PCIe cards in tensor parallel are bounded by their all-reduces (and
     * cross the network beyond a node of 8): nowhere near 64x one card's speed. */
    fm_plan_model l70 = preset("llama-2-70b");
    j.tensor_parallel = 64;
    j.gpus = 64;
    row = plan_on_test(&l70, &j, "Test PCIe 24");
    const fm_plan_row *one = NULL;
    if (row) {
        double tp64 = row->tokens_per_s;
        fm_plan_job j8 = j;
        j8.tensor_parallel = 8;
        j8.gpus = 8;
        one = plan_on_test(&l70, &j8, "Test PCIe 24");
        CHECK(one && tp64 < one->tokens_per_s); /* 64 GPUs decode slower than 8 */
        row = plan_on_test(&l70, &j, "Test PCIe 24");
        int wide = 0;
        for (int i = 0; last && i < last->nwarnings; i++) wide |= strstr(last->warnings[i], "inside a node") != NULL;
        CHECK(wide);
    }
    /* Serving 10 req/s of 256 output tokens at seq 2048 (1792-token prompts) on
     * "Test NVL 80": KV capacity = (80 GiB - (weights + workspace + logits) x 1.1 - 1 GiB) /
     * (16 x 524288 B x 1.1) blocks, / 128 blocks per sequence; decode runs at most 256. */
    j.tensor_parallel = 1;
    j.gpus = 0;
    j.requests_per_second = 10;
    j.output_tokens = 256;
    row = plan_on_test(&m, &j, "Test NVL 80");
    CHECK(row && row->replicas >= 1);
    if (row) {
        fm_plan_memory mem;
        fm_plan_job j1 = j;
        j1.requests_per_second = 0;
        fm_plan_memory_at(&m, &j1, 1, &mem, NULL);
        double fixed = (mem.weights + mem.activations + mem.logits) * 1.1 + GIB;
        double blocks = floor((80 * GIB - fixed) / (16 * 524288.0 * 1.1));
        CHECK(row->kv_capacity_seqs == (int64_t)floor(blocks / 128));
        CHECK(row->decode_batch == (row->kv_capacity_seqs < 256 ? row->kv_capacity_seqs : 256));
        /* prefill = 1792 x (2N + 2 x 32 x 4096 x 1792) / (1000e12 x 0.8, the
         * card's matmul ceiling, not its training MFU of 0.5) + the memory-bound
         * ops between the GEMMs: 1792 tokens x 32 layers x (12h + 4kv + 3ffn =
         * 98560 elements) x 2 B / (0.8 x 2000 GB/s) + one read of the weights
         * but the untied input table (not overlapped) */
        CHECK_NEAR(row->prefill_s, 1792 * (2 * 6738415616.0 + 2 * 32 * 4096.0 * 1792) / 8e14 +
                                       1792 * 32 * 98560.0 * 2 / 1.6e12 +
                                       (row->mem.weights - 32000.0 * 4096 * 2) / 1.6e12, 1e-12);
        CHECK(row->ttft_s == row->prefill_s);
        double per_req = row->prefill_s + 256 * row->step_s / (double)row->decode_batch;
        CHECK(row->replicas == (int)ceil(10 * per_req));
    }
    /* A short prompt is mostly one read of the weights, not its FLOPs:
     * 64 tokens x (2N + 2 x 32 x 4096 x 64) / (1000e12 x 0.8) = 1.1 ms + 0.25 ms
     * of memory-bound ops, plus
     * (weights - the untied input table, 32000 x 4096 x 2 B) / (0.8 x 2000 GB/s)
     * = 8.3 ms. In tensor parallel over 2 GPUs the prefill also pays 2
     * all-reduces per layer of 64 x 4096 x 2 B: ring = bytes / 400 GB/s + 2 hops
     * of 10 us (NVLink). A static batch of 4 such prompts is prefilled together:
     * 4x the compute and the all-reduced bytes, one read of the weights. */
    {
        fm_plan_job js;
        fm_plan_job_defaults(&js);
        js.batch = 1;
        js.seq = 64;
        const fm_plan_row *r1 = plan_on_test(&m, &js, "Test NVL 80");
        CHECK(r1 != NULL);
        double cmp = 64 * (2 * 6738415616.0 + 2 * 32 * 4096.0 * 64) / 8e14 + 64 * 32 * 98560.0 * 2 / 1.6e12;
        double rd1 = r1 ? (r1->mem.weights - 32000.0 * 4096 * 2) / (0.8 * 2000e9) : 0;
        CHECK(cmp < rd1);
        if (r1) CHECK_NEAR(r1->prefill_s, cmp + rd1, 1e-12);
        js.tensor_parallel = 2;
        const fm_plan_row *r2 = plan_on_test(&m, &js, "Test NVL 80");
        CHECK(r2 != NULL);
        if (r2) {
            double rd2 = (r2->mem.weights - 32000.0 * 4096 * 2 / 2) / (0.8 * 2000e9);
            double comm = 2 * 32 * (64 * 4096 * 2 / 400e9 + 2 * 10e-6);
            CHECK_NEAR(r2->prefill_s, cmp / 2 + rd2 + comm, 1e-12);
            CHECK(r2->ttft_s == r2->prefill_s);
            js.batch = 4;
            const fm_plan_row *r3 = plan_on_test(&m, &js, "Test NVL 80");
            CHECK(r3 != NULL);
            double comm4 = 2 * 32 * (4 * 64 * 4096 * 2 / 400e9 + 2 * 10e-6);
            if (r3) CHECK_NEAR(r3->prefill_s, 4 * cmp / 2 + rd2 + comm4, 1e-12);
        }
    }
    /* Absurd rates are refused; an output as long as the context too. */
    j.requests_per_second = 1e9;
    fm_plan_result *r = fm_plan_compute(&m, &j, tdb, NULL);
    CHECK(r == NULL);
    CHECK_ERR_CONTAINS("more than exist");
    fm_plan_result_free(r);
    j.requests_per_second = 1;
    j.output_tokens = 4096;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("longer than llama-2-7b's context of 4096 tokens");
    /* No fp8 on a card without it: the row is not planned, and a warning says why. */
    fm_plan_job_defaults(&j);
    j.precision = FM_PLAN_FP8;
    row = plan_on(&m, &j, "A100 80GB SXM");
    CHECK(row && row->tokens_per_s < 0);
    int said = 0;
    for (int i = 0; last && i < last->nwarnings; i++) said |= strstr(last->warnings[i], "no fp8 tensor cores") != NULL;
    CHECK(said);

    /* An 8-bit KV cache halves its bytes and the step reads half as much cache:
     * (13476831232 - 262144000 + 2048 x 262144 B) / (0.8 x 1000 GB/s). */
    fm_plan_job_defaults(&j);
    j.seq = 2048;
    j.kv_cache_8bit = 1;
    fm_plan_memory m16, m8;
    CHECK(fm_plan_memory_at(&m, &j, 1, &m8, NULL) == FM_OK);
    j.kv_cache_8bit = 0;
    CHECK(fm_plan_memory_at(&m, &j, 1, &m16, NULL) == FM_OK);
    CHECK_NEAR(m8.kv_cache, m16.kv_cache / 2, 1e-12);
    j.kv_cache_8bit = 1;
    row = plan_on_test(&m, &j, "Test PCIe 24");
    CHECK(row && row->gpus == 1);
    if (row) CHECK_NEAR(row->step_s, (13476831232.0 - 262144000.0 + 2048 * 262144.0) / 0.8e12, 1e-12);
    /* A decode kernel that reads a KV head once per query head of its group
     * (TensorRT-LLM's masked MHA before XQA): Llama-3-8B has 32 query heads
     * over 8 KV heads, so the step reads 4x its KV cache, 3 x 2048 tokens x
     * 131072 B more at 0.8 x 1000 GB/s; Llama-2-7B (MHA) reads the same. */
    fm_plan_model g3 = preset("llama-3-8b");
    fm_plan_job_defaults(&j);
    j.seq = 2048;
    row = plan_on_test(&g3, &j, "Test PCIe 24");
    double grouped = row ? row->step_s : 0;
    j.kv_read_per_query_head = 1;
    row = plan_on_test(&g3, &j, "Test PCIe 24");
    CHECK(row && row->gpus == 1 && grouped > 0);
    if (row) CHECK_NEAR(row->step_s - grouped, 3 * 2048 * 131072.0 / 0.8e12, 1e-12);
    row = plan_on_test(&m, &j, "Test PCIe 24");
    if (row) CHECK_NEAR(row->step_s, (13476831232.0 - 262144000.0 + 2048 * 524288.0) / 0.8e12, 1e-12);
    /* A tied head is the token table and is read in full; only GPT-2's learned
     * position table (1024 x 768 x 2 B) is gathered, not streamed:
     * (248879616 - 1572864 + 1024 x 36864 B KV) / (0.8 x 1000 GB/s). */
    fm_plan_model g = preset("gpt2-124m");
    fm_plan_job_defaults(&j);
    j.seq = 1024;
    row = plan_on_test(&g, &j, "Test PCIe 24");
    CHECK(row && row->gpus == 1);
    if (row) CHECK_NEAR(row->step_s, (248879616.0 - 1572864.0 + 1024 * 36864.0) / 0.8e12, 1e-12);
}

/* Hand-worked: GPT-2 124M trained in fp32 with AdamW, batch 8, seq 1024,
 * no flash attention, so Korthikanti's 34 + 5as/h applies in full. */
static void test_train_memory(void) {
    fm_plan_model m = preset("gpt2-124m");
    fm_plan_job j;
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_TRAIN;
    j.precision = FM_PLAN_FP32;
    j.batch = 8;
    j.seq = 1024;
    j.flash_attention = 0;
    fm_plan_memory mem;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    double P = 124439808.0, s = 1024, b = 8, h = 768, a = 12, L = 12, V = 50257;
    CHECK_NEAR(mem.weights, 4 * P, 1e-12);
    CHECK_NEAR(mem.gradients, 4 * P, 1e-12);
    CHECK_NEAR(mem.optimizer, 8 * P, 1e-12); /* fp32 m + v: 16 B/param in all */
    CHECK_NEAR(mem.activations, L * s * b * h * (34 + 5 * a * s / h) * 2, 1e-12); /* x2: fp32 */
    CHECK_NEAR(mem.logits, b * s * V * 4 * 2, 1e-12);

    /* Checkpointing modes. */
    j.checkpointing = FM_PLAN_CKPT_SELECTIVE;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.activations, L * s * b * h * 34 * 2, 1e-12);
    j.checkpointing = FM_PLAN_CKPT_FULL;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.activations, (L * 2 * s * b * h + s * b * h * 34) * 2, 1e-12);

    /* Without dropout (Llama, MPT) no masks are kept: Korthikanti's 34 less
     * the two 1-byte masks is 32, and eager attention keeps 2as^2b of scores
     * (the softmax output) instead of 5. A fused cross-entropy kernel keeps
     * the logits and their gradient at the compute width. */
    j.no_dropout = 1;
    j.checkpointing = FM_PLAN_CKPT_NONE;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.activations, L * s * b * h * (32 + 2 * a * s / h) * 2, 1e-12);
    j.flash_attention = 1;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.activations, L * s * b * h * 32 * 2, 1e-12);
    j.checkpointing = FM_PLAN_CKPT_FULL;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.activations, (L * 2 * s * b * h + s * b * h * 32) * 2, 1e-12);
    j.fused_loss = 1;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.logits, b * s * V * 4 * 2, 1e-12); /* fp32 here: 4 B logits + 4 B gradient */
    j.precision = FM_PLAN_BF16;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.logits, b * s * V * 2 * 2, 1e-12);
    j.chunked_loss = 1;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) != FM_OK);
    CHECK(strstr(fm_last_error(), "--fused-loss") != NULL);
    j.chunked_loss = 0;
    j.fused_loss = 0;
    j.no_dropout = 0;
    j.flash_attention = 0;
    j.precision = FM_PLAN_FP32;

    /* Mixed-precision AdamW: 2 + 2 + 12 = 16 B/param; SGD fp32: 4 + 4 + 4. */
    j.precision = FM_PLAN_BF16;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.weights + mem.gradients + mem.optimizer, 16 * P, 1e-12);
    j.optimizer = FM_PLAN_ADAM8BIT;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.optimizer, 6 * P, 1e-12); /* fp32 master + two int8 moments */
    j.optimizer = FM_PLAN_SGD;
    j.precision = FM_PLAN_FP32;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.weights + mem.gradients + mem.optimizer, 12 * P, 1e-12);

    /* ZeRO over 4 GPUs: stage 1 shards the optimizer, 2 also gradients,
     * 3 also weights (plus two gathered layers). */
    j.optimizer = FM_PLAN_ADAMW;
    j.precision = FM_PLAN_BF16;
    j.zero = 2;
    CHECK(fm_plan_memory_at(&m, &j, 4, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.optimizer, 12 * P / 4, 1e-12);
    CHECK_NEAR(mem.gradients, 2 * P / 4, 1e-12);
    CHECK_NEAR(mem.weights, 2 * P, 1e-12);
    j.zero = 3;
    CHECK(fm_plan_memory_at(&m, &j, 4, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.weights, 2 * P / 4 + 2 * (double)m.largest_layer * 2, 1e-12);

}

/* Training time on the test database, worked by hand. */
static void test_train_time(void) {
    fm_plan_model m = preset("gpt2-124m");
    fm_plan_job j;
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_TRAIN;
    j.batch = 8;
    j.seq = 1024;
    double P = 124439808.0, s = 1024, h = 768, L = 12;
    /* Time on "Test NVL 80" (1000 TF bf16, MFU 0.5,
     * 2000 GB/s, NVLink 400 GB/s, 8 per node, 50 GB/s between nodes, $4/h),
     * worked by hand:
     *   FLOPs/token = 6 x 124439808 + 12 x 12 x 1024 x 768 = 746638848 + 113246208 = 859885056
     *   compute     = 859885056 x 8192 tokens / (1e15 x 0.5) = 7044178378752 / 5e14 = 0.014088356757504 s
     *   overhead    = 0.005 s + optimizer update (2 + 2 + 12 B read, 2 + 12 B written per param:
     *                 30 x 124439808 = 3733194240 B) / 2000 GB/s = 0.005 + 0.00186659712 s
     *   step        = 0.020954953877504 s; 1e9 tokens = 122070.3125 steps = 2557.98 s; $4/h -> $2.8422 */
    j.zero = 0;
    j.checkpointing = FM_PLAN_CKPT_NONE;
    j.flash_attention = 1;
    j.tokens = 1e9;
    const fm_plan_row *row = plan_on_test(&m, &j, "Test NVL 80");
    CHECK(row && row->gpus == 1);
    if (row) {
        CHECK_NEAR(last->flops_per_token, 859885056.0, 1e-12);
        CHECK_NEAR(row->compute_s, 0.014088356757504, 1e-12);
        CHECK_NEAR(row->overhead_s, 0.00686659712, 1e-12);
        CHECK_NEAR(row->step_s, 0.020954953877504, 1e-12);
        CHECK_NEAR(row->run_s, 1e9 / 8192 * 0.020954953877504, 1e-12);
        CHECK_NEAR(row->cost[FM_PLAN_ON_DEMAND], 2557.9777682500 / 3600 * 4, 1e-9);
        CHECK_NEAR(row->cost[FM_PLAN_SPOT], 2557.9777682500 / 3600 * 2, 1e-9);
    }
    /* 8 GPUs in one node: ring all-reduce of the 2-byte gradients,
     * 2 x 7/8 x 248879616 B / 400e9 + 2 x 7 x 10 us = 0.00108884832 + 0.00014 = 0.00122884832 s
     * (the tree's 2 x 248879616 / 400e9 + 2 x 3 x 10 us = 0.00130439808 s is slower); it hides
     * under the backward pass (2/3 x 0.0140884 s), so nothing is exposed. */
    j.gpus = 8;
    row = plan_on_test(&m, &j, "Test NVL 80");
    CHECK(row && row->gpus == 8);
    if (row) {
        CHECK_NEAR(row->dp_comm_s, 0.00122884832, 1e-12);
        CHECK(row->comm_s == 0);
        CHECK_NEAR(row->step_s, 0.020954953877504, 1e-12);
    }
    /* 16 GPUs span two nodes: the same in each node, then 1/8 of the bytes
     * (31109952 B) between the 2 nodes: ring 2 x 1/2 x 31109952 / 50e9 + 2 x 1 x 25 us
     * = 0.00062219904 + 0.00005 s; total 0.00190104736 s. */
    j.gpus = 16;
    row = plan_on_test(&m, &j, "Test NVL 80");
    if (row) CHECK_NEAR(row->dp_comm_s, 0.00190104736, 1e-12);
    /* Tensor parallel 2 on the PCIe card (32 GB/s, 20 us a hop): 4 all-reduces per layer of
     * b x s x h x 2 = 12582912 B: ring 12582912 / 32e9 + 2 x 20 us = 0.000433216 s each,
     * x 12 layers x 4 = 0.020794368 s, exposed. */
    j.gpus = 2;
    j.tensor_parallel = 2;
    row = plan_on_test(&m, &j, "Test PCIe 24");
    if (row) {
        CHECK_NEAR(row->tp_comm_s, 0.020794368, 1e-12);
        CHECK_NEAR(row->comm_s, row->tp_comm_s, 1e-12);
    }
    /* A 4-stage pipeline with the default 16 micro-batches: bubble = compute x 3/16. */
    j.tensor_parallel = 1;
    j.gpus = 4;
    j.pipeline_parallel = 4;
    row = plan_on_test(&m, &j, "Test NVL 80");
    if (row) {
        CHECK_NEAR(row->compute_s, 859885056.0 * 8192 * 16 / (4 * 1e15 * 0.5), 1e-12);
        CHECK_NEAR(row->pp_bubble_s, row->compute_s * 3 / 16, 1e-12);
    }
    /* Interleaved: 2 model chunks per stage halve the bubble (Narayanan et al.
     * 2021); the compute does not change. The first stage's stored
     * activations grow by (pp - 1)/(pp v) = 3/8 (Korthikanti et al. 2022). */
    if (row) {
        double c1 = row->compute_s, b1 = row->pp_bubble_s, a1 = row->mem.activations;
        j.virtual_stages = 2;
        const fm_plan_row *r2 = plan_on_test(&m, &j, "Test NVL 80");
        if (r2) {
            CHECK_NEAR(r2->compute_s, c1, 1e-12);
            CHECK_NEAR(r2->pp_bubble_s, b1 / 2, 1e-12);
            CHECK_NEAR(r2->mem.activations, a1 * (1 + 3.0 / 8), 1e-3);
        }
        j.virtual_stages = 1;
    }
    /* Full recompute is counted as FLOPs: one more forward, 2N + 4Lsh, which
     * runs at the card's forward-only matmul efficiency (0.8 of 1000 TF), not
     * at the training MFU (0.5). Selective recompute (4Lsh, inside the flash
     * attention backward) stays at the MFU. */
    j.pipeline_parallel = 1;
    j.gpus = 1;
    j.checkpointing = FM_PLAN_CKPT_FULL;
    row = plan_on_test(&m, &j, "Test NVL 80");
    if (row) CHECK_NEAR(row->compute_s, 859885056.0 * 8192 / 5e14 + (2 * P + 4 * L * s * h) * 8192 / 8e14, 1e-12);
    j.checkpointing = FM_PLAN_CKPT_SELECTIVE;
    row = plan_on_test(&m, &j, "Test NVL 80");
    if (row) CHECK_NEAR(row->compute_s, (859885056.0 + 4 * L * s * h) * 8192 / 5e14, 1e-12);
    /* --mfu sets every efficiency, the recomputed forward's too. */
    j.checkpointing = FM_PLAN_CKPT_FULL;
    j.mfu = 0.5;
    row = plan_on_test(&m, &j, "Test NVL 80");
    if (row) CHECK_NEAR(row->compute_s, (859885056.0 + 2 * P + 4 * L * s * h) * 8192 / 5e14, 1e-12);
    j.mfu = 0;
    /* fp8 runs at the fp8 peak (2000 TF) and its MFU (0.25): the same rate as bf16 here. */
    j.checkpointing = FM_PLAN_CKPT_NONE;
    j.precision = FM_PLAN_FP8;
    row = plan_on_test(&m, &j, "Test NVL 80");
    if (row) CHECK(row->peak_tflops == 2000 && row->mfu == 0.25 && fabs(row->compute_s - 0.014088356757504) < 1e-12);
    j.precision = FM_PLAN_BF16;
    /* train without --tokens assumes Chinchilla's 20 tokens per parameter */
    j.tokens = 0;
    row = plan_on(&m, &j, "H100 SXM");
    CHECK(last && last->tokens_defaulted && last->job.tokens == 20 * P);
}

/* Hand-worked LoRA and QLoRA on Llama-2-7B, rank 16 on every block linear. */
static void test_lora_memory(void) {
    fm_plan_model m = preset("llama-2-7b");
    fm_plan_job j;
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_LORA;
    j.batch = 1;
    j.seq = 2048;
    j.checkpointing = FM_PLAN_CKPT_FULL;
    fm_plan_memory mem;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    /* per layer: q (h+h), k (h+kv), v (h+kv), o (h+h), gate/up (h+f), down (f+h) */
    double per = 8192 + 2 * 8192 + 8192 + 2 * (4096 + 11008) + (11008 + 4096);
    double T = 16 * 32 * per, P = 6738415616.0;
    CHECK_NEAR(T, 39976960, 1e-12);
    CHECK_NEAR(mem.weights, P * 2 + T * 2, 1e-12);
    CHECK_NEAR(mem.gradients, T * 2, 1e-12);
    CHECK_NEAR(mem.optimizer, T * 12, 1e-12); /* LoRA: 16 B per trainable param in all */
    CHECK_NEAR(mem.activations, 32 * 2 * 2048.0 * 4096 + 2048.0 * 4096 * 34, 1e-12);

    j.task = FM_PLAN_QLORA;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    double E = 2.0 * 32000 * 4096 + 4096;
    CHECK_NEAR(mem.weights, (P - E) * 4.127 / 8 + E * 2 + T * 2, 1e-12); /* NF4 + double quantization */

    /* LoRA FLOPs: 4N + 8Lsh per token plus a recomputed forward. */
    j.tokens = 1e8;
    const fm_plan_row *row = plan_on(&m, &j, "A100 80GB SXM");
    CHECK(row != NULL);
    if (row) CHECK_NEAR(last->flops_per_token, 4 * P + 8 * 32 * 2048.0 * 4096 + 2 * P + 4 * 32 * 2048.0 * 4096, 1e-12);
}

static void test_cnn(void) {
    fm_plan_model m = preset("resnet-50");
    fm_plan_job j;
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_TRAIN;
    j.precision = FM_PLAN_FP32;
    j.batch = 32;
    j.optimizer = FM_PLAN_SGD;
    j.tokens = 1.28e6 * 90; /* 90 ImageNet epochs */
    fm_plan_memory mem;
    CHECK(fm_plan_memory_at(&m, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.activations, 32 * 24e6 * 4, 1e-12);
    CHECK_NEAR(mem.weights + mem.gradients + mem.optimizer, 12 * 25557032.0, 1e-12);
    CHECK(mem.kv_cache == 0 && mem.logits == 0);
    /* On "Test NVL 80" in fp32 (50 TF; no fp32 MFU given, so the bf16 0.5):
     * step = 3 x 8.2e9 x 32 / (50e12 x 0.5) + 0.005 + SGD fp32 update (4 + 4 + 4 read, 4 + 4
     * written = 20 B x 25557032 = 511140640 B / 2000e9) = 0.031488 + 0.005 + 0.00025557032 s */
    const fm_plan_row *row = plan_on_test(&m, &j, "Test NVL 80");
    CHECK(row && row->gpus == 1);
    if (row) CHECK_NEAR(row->run_s, 1.28e6 * 90 / 32 * (0.031488 + 0.005 + 0.00025557032), 1e-9);
    j.tensor_parallel = 2;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("splits attention heads");
}

/* The seeds' rules of thumb, derived by the planner from the formulas. */
static void test_rules_of_thumb(void) {
    fm_plan_job j;
    const fm_plan_row *row;

    /* 7B inference in INT8 fits a 12 GB card. */
    fm_plan_model l7 = preset("llama-2-7b");
    fm_plan_job_defaults(&j);
    j.precision = FM_PLAN_INT8;
    row = plan_on(&l7, &j, "RTX 3060 12GB");
    CHECK(row && row->fits && row->min_gpus == 1);
    j.precision = FM_PLAN_BF16; /* but not in 16 bits */
    row = plan_on(&l7, &j, "RTX 3060 12GB");
    CHECK(row && !row->fits);

    /* 13B-34B inference needs 16-24 GB with quantization. */
    fm_plan_model l13 = preset("llama-2-13b"), c34 = preset("codellama-34b");
    fm_plan_job_defaults(&j);
    row = plan_on(&l13, &j, "RTX 4090 24GB");
    CHECK(row && !row->fits); /* bf16 13B: no */
    j.precision = FM_PLAN_INT4;
    row = plan_on(&l13, &j, "RTX 4060 Ti 16GB");
    CHECK(row && row->fits); /* 4-bit 13B: a 16 GB card */
    row = plan_on(&c34, &j, "RTX 4090 24GB");
    CHECK(row && row->fits); /* 4-bit 34B: a 24 GB card ... */
    row = plan_on(&c34, &j, "RTX 4080 16GB");
    CHECK(row && !row->fits); /* ... not a 16 GB one */
    j.precision = FM_PLAN_BF16;
    row = plan_on(&c34, &j, "RTX 4090 24GB");
    CHECK(row && !row->fits);

    /* A10G 24 GB (h2o-llmstudio #448): 7B bf16 fits, 13B bf16 not, 13B 4-bit yes. */
    fm_plan_job_defaults(&j);
    row = plan_on(&l7, &j, "A10G");
    CHECK(row && row->fits);
    row = plan_on(&l13, &j, "A10G");
    CHECK(row && !row->fits);
    j.precision = FM_PLAN_INT4;
    row = plan_on(&l13, &j, "A10G");
    CHECK(row && row->fits);

    /* 7B-13B fine-tuning needs 24 GB-class cards with memory-saving settings. */
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_FINETUNE;
    j.batch = 1;
    j.seq = 2048;
    row = plan_on(&l7, &j, "RTX 4090 24GB");
    CHECK(row && !row->fits && row->min_gpus == 0); /* plain full fine-tune: 16 B/param, no */
    j.task = FM_PLAN_LORA;
    j.checkpointing = FM_PLAN_CKPT_FULL;
    row = plan_on(&l7, &j, "RTX 4090 24GB");
    CHECK(row && row->fits);                 /* LoRA + checkpointing: a 24 GB card */
    row = plan_on(&l7, &j, "RTX 3060 12GB");
    CHECK(row && !row->fits);                /* not a 12 GB one */
    j.task = FM_PLAN_QLORA;
    row = plan_on(&l13, &j, "RTX 4090 24GB");
    CHECK(row && row->fits);                 /* 13B QLoRA + checkpointing: 24 GB */
    j.task = FM_PLAN_LORA;
    row = plan_on(&l13, &j, "RTX 4090 24GB");
    CHECK(row && !row->fits);                /* 13B 16-bit LoRA does not */

    /* 70B training needs several 80 GB GPUs. */
    fm_plan_model l70 = preset("llama-3-70b");
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_TRAIN;
    j.seq = 4096;
    j.checkpointing = FM_PLAN_CKPT_FULL;
    j.zero = 3;
    row = plan_on(&l70, &j, "H100 SXM");
    CHECK(row && row->min_gpus >= 4 && row->min_gpus <= 64);
    j.zero = 0; /* without sharding no number of GPUs helps */
    row = plan_on(&l70, &j, "H100 SXM");
    CHECK(row && row->min_gpus == 0 && row->min_gpus_zero3 >= 4);
    CHECK(last && last->nwarnings > 0);
}

static void test_bad_jobs(void) {
    fm_plan_model m = preset("llama-2-7b");
    fm_plan_job j;
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_QLORA;
    j.precision = FM_PLAN_FP32;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("qlora with fp32 is impossible");
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_TRAIN;
    j.kv_cache_8bit = 1;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("--kv-cache-dtype fp8 is for inference");
    fm_plan_job_defaults(&j);
    j.tensor_parallel = 3;
    j.gpus = 3;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("does not divide the 32 attention heads");
    j.tensor_parallel = 2;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("not a multiple of --tensor-parallel");
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_TRAIN;
    j.precision = FM_PLAN_INT4;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("--task qlora");
    fm_plan_job_defaults(&j);
    j.zero = 2;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("does not apply");
    fm_plan_job_defaults(&j);
    j.batch = 0;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("--batch 0");
    fm_plan_job_defaults(&j);
    j.batch = -5;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    fm_plan_job_defaults(&j);
    j.requests_per_second = 5;
    CHECK(fm_plan_job_check(&m, &j) != FM_OK);
    CHECK_ERR_CONTAINS("--output-tokens");
    fm_plan_job_defaults(&j);
    CHECK(fm_plan_compute(&m, &j, db, "RTX 9999") == NULL);
    CHECK_ERR_CONTAINS("unknown GPU \"RTX 9999\"");
    /* Llama-2-70B's 8 KV heads with tensor-parallel 16: replicated, allowed. */
    fm_plan_model l70 = preset("llama-2-70b");
    j.tensor_parallel = 16;
    CHECK(fm_plan_job_check(&l70, &j) == FM_OK);
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Write a safetensors file: header JSON + `data` zero bytes; a header length
 * of `lie` (if non-zero) instead of the truth. */
static void write_st(const char *path, const char *hdr, size_t data, uint64_t lie) {
    FILE *f = fopen(path, "wb");
    unsigned char len[8];
    put_u64(len, lie ? lie : strlen(hdr));
    fwrite(len, 1, 8, f);
    fputs(hdr, f);
    for (size_t i = 0; i < data; i++) fputc(0, f);
    fclose(f);
}

static void test_safetensors(void) {
    const char *p = tmp_path("fathom_test_plan.safetensors");
    /* A tiny GPT-2-shaped model: vocab 64, hidden 16, 2 layers. */
    char hdr[2048];
    snprintf(hdr, sizeof hdr,
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[64,16],\"data_offsets\":[0,4096]},"
             "\"wpe.weight\":{\"dtype\":\"F32\",\"shape\":[32,16],\"data_offsets\":[4096,6144]},"
             "\"h.0.mlp.c_fc.weight\":{\"dtype\":\"F16\",\"shape\":[16,64],\"data_offsets\":[6144,8192]},"
             "\"h.1.attn.c_attn.weight\":{\"dtype\":\"BF16\",\"shape\":[16,48],\"data_offsets\":[8192,9728]}}");
    write_st(p, hdr, 9728, 0);
    int64_t n = 0;
    int tensors = 0;
    CHECK(fm_plan_safetensors_count(p, &n, &tensors) == FM_OK);
    CHECK(n == 64 * 16 + 32 * 16 + 16 * 64 + 16 * 48 && tensors == 4);
    fm_plan_model m;
    CHECK(fm_plan_model_from_file(p, &m) == FM_OK);
    CHECK(m.params == n && m.arch == FM_PLAN_ARCH_GPT && m.layers == 2 && m.hidden == 16 && m.vocab == 64);
    CHECK(m.ffn == 64 && m.max_seq == 32);

    /* A fathom model directory holding model.safetensors. */
    const char *dir = tmp_path("fathom_test_plan_dir");
    mkdir(dir, 0755);
    char inner[256];
    snprintf(inner, sizeof inner, "%s/model.safetensors", dir);
    write_st(inner, hdr, 9728, 0);
    CHECK(fm_plan_model_from_file(dir, &m) == FM_OK && m.params == n);
    unlink(inner);
    CHECK(fm_plan_model_from_file(dir, &m) != FM_OK);
    CHECK_ERR_CONTAINS("without model.safetensors");
    rmdir(dir);

    /* Lies and damage. */
    write_st(p, hdr, 9728, 1ull << 40);
    CHECK(fm_plan_safetensors_count(p, &n, &tensors) != FM_OK);
    CHECK_ERR_CONTAINS("header length");
    write_st(p, hdr, 100, 0); /* data shorter than the offsets claim */
    CHECK(fm_plan_safetensors_count(p, &n, &tensors) != FM_OK);
    CHECK_ERR_CONTAINS("data_offsets");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0);
    CHECK(fm_plan_safetensors_count(p, &n, &tensors) != FM_OK);
    CHECK_ERR_CONTAINS("needs 12 bytes");
    write_st(p, "{not json}", 0, 0);
    CHECK(fm_plan_safetensors_count(p, &n, &tensors) != FM_OK);
    CHECK_ERR_CONTAINS("not a JSON object");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-3],\"data_offsets\":[0,0]}}", 0, 0);
    CHECK(fm_plan_safetensors_count(p, &n, &tensors) != FM_OK);
    CHECK_ERR_CONTAINS("bad dimension");
    FILE *f = fopen(p, "wb");
    fputs("abc", f);
    fclose(f);
    CHECK(fm_plan_safetensors_count(p, &n, &tensors) != FM_OK);
    CHECK_ERR_CONTAINS("too short");
    unlink(p);
    CHECK(fm_plan_model_from_file("/nonexistent/model.safetensors", &m) != FM_OK);
    CHECK(fm_last_status() == FM_ERR_IO);
}

/* Hugging Face configs (tests/data/plan_configs): the parameter counts the
 * model cards publish, which the planner derives from the dimensions alone. */
static void test_hf_configs(void) {
    static const struct { const char *dir; int64_t params; fm_plan_arch arch; } want[] = {
        {"llama-2-7b", 6738415616, FM_PLAN_ARCH_LLAMA},  {"mistral-7b", 7241732096, FM_PLAN_ARCH_LLAMA},
        {"mixtral-8x7b", 46702792704, FM_PLAN_ARCH_LLAMA}, {"qwen2-7b", 7615616512, FM_PLAN_ARCH_LLAMA},
        {"gemma-7b", 8537680896, FM_PLAN_ARCH_LLAMA},    {"gpt2", 124439808, FM_PLAN_ARCH_GPT},
        {"bert-base-uncased", 109482240, FM_PLAN_ARCH_BERT},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/data/plan_configs/%s", want[i].dir);
        fm_plan_model m;
        fm_status st = fm_plan_model_from_file(path, &m);
        CHECK_MSG(st == FM_OK, "%s: %s", path, fm_last_error());
        CHECK_MSG(st == FM_OK && m.params == want[i].params && m.arch == want[i].arch, "%s: %lld params", path,
                  (long long)m.params);
    }
    /* Mixtral runs 2 of its 8 experts: 12.9 B active parameters (Mistral's
     * announcement): 46702792704 - 32 layers x 6 idle experts x 3 x 4096 x 14336. */
    fm_plan_model mx;
    CHECK(fm_plan_model_from_file("tests/data/plan_configs/mixtral-8x7b/config.json", &mx) == FM_OK);
    CHECK(mx.experts == 8 && mx.experts_active == 2);
    CHECK_NEAR(plan_active_params(&mx), 12879925248.0, 1e-12);
    /* Gemma-7B's heads are 256 wide (16 x 256 = 4096 != hidden 3072): KV cache
     * 2 x 28 layers x 16 heads x 256 x 2 B = 448 KiB per token. */
    fm_plan_model gm;
    CHECK(fm_plan_model_from_file("tests/data/plan_configs/gemma-7b", &gm) == FM_OK);
    fm_plan_job j;
    fm_plan_job_defaults(&j);
    j.seq = 1000;
    fm_plan_memory mem;
    CHECK(fm_plan_memory_at(&gm, &j, 1, &mem, NULL) == FM_OK);
    CHECK_NEAR(mem.kv_cache, 448.0 * 1024 * 1000, 1e-12);

    /* Bad configs name the file, the line and the field. */
    static const char *const bad[][2] = {
        {"{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,,\n}\n", "plan_cfg.json:3: malformed JSON"},
        {"{\n  \"model_type\": \"mamba\",\n  \"hidden_size\": 4096\n}\n",
         "plan_cfg.json:2: unknown architecture: field \"model_type\" is \"mamba\""},
        {"{\n  \"model_type\": \"llama\",\n  \"num_hidden_layers\": 2,\n  \"hidden_size\": -4096\n}\n",
         "plan_cfg.json:4: field \"hidden_size\" is -4096; expected 1..1000000"},
        {"{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,\n  \"num_hidden_layers\": 2\n}\n",
         "missing field \"num_attention_heads\""},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"num_hidden_layers\": 2,\n"
         " \"vocab_size\": 100, \"intermediate_size\": 1.5}\n", "plan_cfg.json:2: field \"intermediate_size\" is not a whole number"},
        {"{\"model_type\": \"mixtral\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"num_hidden_layers\": 2,\n"
         " \"vocab_size\": 100, \"intermediate_size\": 128, \"num_local_experts\": 2,\n \"num_experts_per_tok\": 4}\n",
         "plan_cfg.json:3: field \"num_experts_per_tok\" is 4, more than the 2 experts"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"num_hidden_layers\": 2,\n"
         " \"vocab_size\": 100, \"intermediate_size\": 128,\n \"num_key_value_heads\": 3}\n",
         "plan_cfg.json:3: field \"num_key_value_heads\" (3) does not divide the 4 heads"},
        {"[1, 2]\n", "plan_cfg.json:1: not a JSON object"},
    };
    const char *cp = tmp_path("plan_cfg.json");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(cp, "w");
        fputs(bad[i][0], f);
        fclose(f);
        fm_plan_model m;
        CHECK(fm_plan_model_from_file(cp, &m) != FM_OK);
        CHECK_ERR_CONTAINS(bad[i][1]);
    }
    unlink(cp);
}

/* A directory `fathom train` wrote for a layer-list recipe is a CNN or an MLP,
 * never mistaken for a Llama. Hand count for a 1x28x28 input: conv 8x1x3x3
 * (72 weights, 784 output positions each) then a linear 6272 -> 10. */
static void test_fathom_dirs(void) {
    const char *dir = tmp_path("fathom_test_plan_cnn");
    char ini[256], st[256];
    mkdir(dir, 0755);
    snprintf(ini, sizeof ini, "%s/recipe.ini", dir);
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    FILE *f = fopen(ini, "w");
    fputs("[model]\ninput = 1 28 28\nlayer = conv 8 3 pad 1\nlayer = relu\nlayer = flatten\nlayer = linear 10\n", f);
    fclose(f);
    write_st(st,
             "{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[8,1,3,3],\"data_offsets\":[0,288]},"
             "\"0.bias\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[288,320]},"
             "\"3.weight\":{\"dtype\":\"F32\",\"shape\":[10,6272],\"data_offsets\":[320,251200]},"
             "\"3.bias\":{\"dtype\":\"F32\",\"shape\":[10],\"data_offsets\":[251200,251240]}}",
             251240, 0);
    fm_plan_model m;
    CHECK(fm_plan_model_from_file(dir, &m) == FM_OK);
    CHECK(m.arch == FM_PLAN_ARCH_CNN && m.params == 72 + 8 + 62720 + 10);
    CHECK(strstr(m.dims_source, "CNN") != NULL);
    /* 2 x 72 x 784 (conv at 28x28) + 2 x 62720 (linear) = 112896 + 125440 */
    CHECK_NEAR(m.cnn_flops_per_sample, 238336.0, 1e-12);
    /* An MLP: 784 -> 128 -> 10, exact: 2 x (100352 + 1280) FLOPs per sample. */
    f = fopen(ini, "w");
    fputs("[model]\ninput = 784\nlayer = linear 128\nlayer = relu\nlayer = linear 10\n", f);
    fclose(f);
    write_st(st,
             "{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[128,784],\"data_offsets\":[0,401408]},"
             "\"2.weight\":{\"dtype\":\"F32\",\"shape\":[10,128],\"data_offsets\":[401408,406528]}}",
             406528, 0);
    CHECK(fm_plan_model_from_file(dir, &m) == FM_OK);
    CHECK(m.arch == FM_PLAN_ARCH_CNN && strstr(m.dims_source, "MLP") != NULL);
    CHECK_NEAR(m.cnn_flops_per_sample, 203264.0, 1e-12);
    unlink(ini);
    unlink(st);
    rmdir(dir);
}

/* fathom's own config.json, written by the trainer's fm_gpt_config_save: the
 * planner counts exactly the trainer's parameters (fm_gpt_config_num_params),
 * for GPT-2 with and without biases, a GPT-2 whose pruned heads do not tile
 * n_embd (head_dim), and Llama tied, untied, grouped, with its own head_dim and
 * with Qwen2's q/k/v biases (qkv_bias).
 * GPT-2 configs carry an n_kv_head the model ignores (every head has its K/V). */
static void test_fathom_gpt_configs(void) {
    struct { fm_gpt_arch arch; int H, KV, hd; bool bias, untied, qkv_bias; } cs[] = {
        {FM_GPT_GPT2, 4, 12, 0, true, false, false}, {FM_GPT_GPT2, 4, 12, 0, false, false, false},
        {FM_GPT_GPT2, 3, 12, 16, true, false, false}, {FM_GPT_GPT2, 4, 12, 0, true, true, false},
        {FM_GPT_LLAMA, 4, 2, 0, false, false, false}, {FM_GPT_LLAMA, 4, 2, 0, false, true, false},
        {FM_GPT_LLAMA, 3, 1, 8, false, false, false}, {FM_GPT_LLAMA, 4, 2, 0, false, false, true},
    };
    const char *dir = tmp_path("fathom_test_plan_gpt");
    char path[256];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        fm_gpt_config c = fm_gpt_config_default(cs[i].arch);
        c.n_layer = 3;
        c.n_embd = 64;
        c.n_head = cs[i].H;
        c.n_kv_head = cs[i].KV;
        c.head_dim = cs[i].hd;
        c.ffn_hidden = cs[i].arch == FM_GPT_LLAMA ? 176 : 256;
        c.vocab_size = 300;
        c.block_size = 128;
        c.bias = cs[i].bias;
        c.untied_head = cs[i].untied;
        c.qkv_bias = cs[i].qkv_bias;
        CHECK_MSG(fm_gpt_config_validate(&c) == FM_OK, "config %zu: %s", i, fm_last_error());
        CHECK(fm_gpt_config_save(&c, path) == FM_OK);
        fm_plan_model m;
        fm_status st = fm_plan_model_from_file(dir, &m);
        CHECK_MSG(st == FM_OK, "config %zu: %s", i, st ? fm_last_error() : "");
        if (st) continue;
        CHECK_MSG(m.params == fm_gpt_config_num_params(&c), "config %zu: planner %lld, trainer %lld", i,
                  (long long)m.params, (long long)fm_gpt_config_num_params(&c));
        CHECK(m.arch == (cs[i].arch == FM_GPT_LLAMA ? FM_PLAN_ARCH_LLAMA : FM_PLAN_ARCH_GPT));
        CHECK(m.kv_heads == (cs[i].arch == FM_GPT_LLAMA ? cs[i].KV : cs[i].H));
        CHECK(m.tied_embeddings == !cs[i].untied);
    }
    /* A head_dim or bias of the wrong type is refused with the file, line and field. */
    FILE *f = fopen(path, "w");
    fputs("{\n  \"arch\": \"gpt2\",\n  \"n_layer\": 2,\n  \"n_head\": 3,\n  \"n_embd\": 64,\n  \"block_size\": 64,\n"
          "  \"vocab_size\": 100,\n  \"ffn_hidden\": 256,\n  \"bias\": 1\n}\n", f);
    fclose(f);
    fm_plan_model m;
    CHECK(fm_plan_model_from_file(dir, &m) != FM_OK && strstr(fm_last_error(), ":9: field \"bias\" is not true/false"));
    f = fopen(path, "w");
    fputs("{\"arch\": \"gpt2\", \"n_layer\": 2, \"n_head\": 3, \"n_embd\": 64, \"block_size\": 64, \"vocab_size\": 100}\n", f);
    fclose(f);
    CHECK(fm_plan_model_from_file(dir, &m) != FM_OK && strstr(fm_last_error(), "do not divide n_embd 64 (and no head_dim"));
    unlink(path);
    rmdir(dir);
}

static void test_render(void) {
    fm_plan_model m = preset("llama-2-7b");
    fm_plan_job j;
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_QLORA;
    j.checkpointing = FM_PLAN_CKPT_FULL;
    j.tokens = 5e7;
    j.gpus = 2;
    fm_plan_result *r = fm_plan_compute(&m, &j, db, NULL);
    CHECK(r != NULL);
    if (!r) return;
    CHECK(r->nrows == db->count);
    CHECK(r->cheapest >= 0 && r->fastest >= 0);
    /* The cheapest fits and nothing ranked after it is cheaper. */
    for (int i = 1; i < r->nranked; i++)
        CHECK(r->rows[r->ranked[i]].cost[0] >= r->rows[r->ranked[0]].cost[0]);
    char *text = fm_plan_render_text(r);
    CHECK(text && strstr(text, "KV cache") && strstr(text, "allocator headroom") && strstr(text, "cheapest that fits"));
    /* Two consumer cards: the NVLink, PCIe x8 and T4 bf16 warnings. */
    CHECK(text && strstr(text, "lack NVLink"));
    CHECK(text && strstr(text, "PCIe 4.0 x8"));
    CHECK(text && strstr(text, "T4 has no bf16"));
    free(text);
    char *js = fm_plan_render_json(r);
    json_error_t e;
    json_t *o = js ? json_loads(js, 0, &e) : NULL;
    CHECK(o && json_is_array(json_object_get(o, "gpus")));
    CHECK(o && (int)json_array_size(json_object_get(o, "gpus")) == db->count);
    CHECK(o && json_is_string(json_object_get(json_object_get(o, "recommendation"), "cheapest")));
    CHECK(o && json_object_get(json_object_get(o, "assumptions"), "mfu"));
    /* Every row says whether it is priced, and training rows carry each time term. */
    json_t *g0 = o ? json_array_get(json_object_get(o, "gpus"), 0) : NULL;
    CHECK(g0 && json_is_boolean(json_object_get(g0, "priced")) && json_is_string(json_object_get(g0, "mfu_source")));
    CHECK(g0 && json_is_object(json_object_get(g0, "step_terms_seconds")));
    json_decref(o);
    free(js);
    char *ex = fm_plan_render_explain(r);
    CHECK(ex && strstr(ex, "Korthikanti") == NULL); /* full recompute: the 2sbh formula instead */
    CHECK(ex && strstr(ex, "layers x 2sbh") && strstr(ex, "4N + 8*L*s*h") && strstr(ex, "MFU"));
    free(ex);
    fm_plan_result_free(r);

    /* A long training run on spot prices gets the checkpoint-interval advice. */
    fm_plan_model g = preset("gpt2-1.5b");
    fm_plan_job_defaults(&j);
    j.task = FM_PLAN_TRAIN;
    j.pricing = FM_PLAN_SPOT;
    j.batch = 4;
    j.seq = 1024;
    r = fm_plan_compute(&g, &j, db, "H100 SXM");
    CHECK(r != NULL);
    int spot = 0;
    for (int i = 0; r && i < r->nwarnings; i++) spot |= strstr(r->warnings[i], "checkpoint every") != NULL;
    CHECK(spot);
    ex = r ? fm_plan_render_explain(r) : NULL;
    CHECK(ex && strstr(ex, "Korthikanti") && strstr(ex, "6N + 12*L*s*h"));
    free(ex);
    fm_plan_result_free(r);
}

int main(void) {
    if (!mkdtemp(scratch)) {
        perror("mkdtemp");
        return 1;
    }
    db = fm_plan_db_load("data/gpus.json");
    tdb = fm_plan_db_load("tests/data/plan_gpus_test.json");
    if (!tdb) fprintf(stderr, "loading tests/data/plan_gpus_test.json: %s\n", fm_last_error());
    CHECK(tdb != NULL);
    if (!db) fprintf(stderr, "loading data/gpus.json: %s\n", fm_last_error());
    test_parse_count();
    test_presets();
    test_db();
    if (db && tdb) {
        test_inference_memory();
        test_serving();
        test_train_memory();
        test_train_time();
        test_lora_memory();
        test_cnn();
        test_rules_of_thumb();
        test_bad_jobs();
        test_render();
    }
    test_safetensors();
    test_fathom_gpt_configs();
    test_hf_configs();
    test_fathom_dirs();
    fm_plan_result_free(last);
    fm_plan_db_free(db);
    fm_plan_db_free(tdb);
    rmdir(scratch);
    TEST_DONE();
}
