/* test_opencl_shapes.c — the OpenCL attention in both of its shapes (kernels.cl,
 * kv_attention: the GPU shape, one token per work-item, forced on PoCL with
 * KVSIM_OPENCL_LANES=1, and the CPU shape PoCL gets by default) against the
 * CPU reference within the conformance tolerance (relative 1e-5): odd token
 * counts (1, 63, 65, 4097), contexts that are not a multiple of the split
 * chunk, pages longer than a tile, many heads, GQA groups, verification and
 * scores. Without an OpenCL device every test says "skipped: opencl: ..." and
 * is reported as skipped, never passed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "backends/kernels/kv_device.h"
#include "tests/kernels_util.h"

static void run(kv_backend *be, const kv_attn_problem *prob, float *out, float *scores)
{
    kv_error err = {0};
    cr_assert_eq(kv_attn_solve(prob, be, out, scores, &err), KV_OK, "%s", err.msg);
}

#define Q8 {KV_STORE_QUANT, 8, 0, KV_GROUP_TOKEN, 32}
#define Q4 {KV_STORE_QUANT, 4, 0, KV_GROUP_TOKEN, 32}
#define QC2 {KV_STORE_QUANT, 2, 0, KV_GROUP_CHANNEL, 16}
#define QA {KV_STORE_QUANT, 8, 4, KV_GROUP_TOKEN, 32}
#define BF16 {KV_STORE_BF16, 0, 0, 0, 0}
#define F32 {KV_STORE_F32, 0, 0, 0, 0}

typedef struct shape_case {
    const char *name;
    uint32_t n_queries, n_heads, n_kv_heads, head_dim, tokens, page_tokens;
    kv_store_format k[3], v[3];
    uint32_t n_formats;
    int scores;
} shape_case;

static const shape_case cases[] = {
    {"1 token", 1, 8, 2, 128, 1, 32, {Q8}, {Q8}, 1, 1},
    {"63 tokens", 1, 8, 2, 128, 63, 32, {Q4}, {Q8}, 1, 1},
    {"65 tokens, 65-token pages (longer than a tile)", 1, 8, 2, 64, 65, 65, {BF16}, {Q4}, 1, 0},
    {"4097 tokens: 129 pages per KV head, 8 chunks of 17 (the last 10)", 1, 8, 2, 128, 4097, 32, {Q8}, {Q8}, 1, 1},
    {"4097 tokens, 7-token pages, mixed formats", 1, 4, 1, 96, 4097, 7, {Q8, QC2, F32}, {QA, BF16, Q4}, 3, 1},
    {"many heads: 64 query heads, 8 KV heads", 1, 64, 8, 128, 700, 16, {Q8}, {Q4}, 1, 0},
    {"GQA group 8, odd head_dim 33", 1, 16, 2, 33, 1000, 16, {Q4, BF16}, {Q8, F32}, 2, 1},
    {"MHA (group 1), head_dim 256", 1, 4, 4, 256, 600, 32, {BF16}, {Q8}, 1, 0},
    {"verify k=4 over a split context", 4, 8, 2, 128, 2049, 16, {Q8, QA}, {Q4, Q8}, 2, 1},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Every case on one shape of the kernel, against the reference. */
static void check_shape(const char *lanes)
{
    kvt_require_opencl();
    kv_backend *be = kvt_open_opencl_with("KVSIM_OPENCL_LANES", lanes), *ref = kvt_open_reference();
    for (size_t i = 0; i < N_CASES; i++) {
        const shape_case *c = &cases[i];
        kv_attn_spec spec = {c->n_queries, c->n_heads, c->n_kv_heads, c->head_dim, c->tokens, c->page_tokens,
                             c->k, c->v, c->n_formats, c->scores, 0, 500 + i};
        kv_attn_problem *prob = NULL;
        kv_error err = {0};
        cr_assert_eq(kv_attn_problem_create(&spec, &prob, &err), KV_OK, "%s", err.msg);
        size_t no = kv_attn_problem_out_floats(prob), ns = kv_attn_problem_score_floats(prob);
        float *o1 = malloc(no * 4), *o2 = malloc(no * 4), *s1 = malloc(ns * 4 + 4), *s2 = malloc(ns * 4 + 4);
        run(be, prob, o1, s1);
        run(ref, prob, o2, s2);
        double e = kv_attn_rel_error(o1, o2, (size_t)c->n_queries * c->n_heads, c->head_dim);
        cr_expect(e <= 1e-5, "lanes %s, %s: attention differs from the reference by %.3g relative",
                  lanes ? lanes : "default", c->name, e);
        if (c->scores) {
            double es = kv_attn_rel_error(s1, s2, c->n_kv_heads, c->tokens);
            cr_expect(es <= 1e-5, "lanes %s, %s: scores differ from the reference by %.3g relative",
                      lanes ? lanes : "default", c->name, es);
        }
        free(o1), free(o2), free(s1), free(s2);
        kv_attn_problem_destroy(prob);
    }
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(opencl_shapes, gpu_shape_one_token_per_work_item)
{
    check_shape("1");
}

Test(opencl_shapes, device_default_shape)
{
    check_shape(NULL);
}

Test(opencl_shapes, four_lanes_and_work_group_of_one)
{
    kvt_require_opencl();
    setenv("KVSIM_OPENCL_WG_MAX", "1", 1); /* the GPU shape at one work-item, the CPU shape at lanes 4 */
    check_shape("4");
    unsetenv("KVSIM_OPENCL_WG_MAX");
}

/* The split is a function of the launch's shape only: every backend cuts alike. */
Test(opencl_shapes, split_depends_on_the_shape_only)
{
    cr_expect_eq(kv_dev_attn_splits(0, 8), 1u);
    cr_expect_eq(kv_dev_attn_splits(5, 0), 1u);
    cr_expect_eq(kv_dev_attn_splits(8 * 15, 8), 1u);           /* fewer than KV_SPLIT_PAGES pages per head */
    cr_expect_eq(kv_dev_attn_splits(8 * 16, 8), 1u);
    cr_expect_eq(kv_dev_attn_splits(2 * 129, 2), 8u);          /* 4097 tokens in 32-token pages */
    cr_expect_eq(kv_dev_attn_splits(8 * 1024, 8), KV_MAX_SPLITS); /* 32K tokens: capped */
}

Test(opencl_shapes, bad_lanes_is_bad_input_naming_the_variable)
{
    kvt_require_opencl();
    setenv("KVSIM_OPENCL_LANES", "3", 1);
    kv_backend *be = NULL;
    kv_error err = {0};
    int rc = kv_backend_open("opencl", 0, &be, &err);
    unsetenv("KVSIM_OPENCL_LANES");
    cr_assert_eq(rc, KV_EINPUT, "KVSIM_OPENCL_LANES=3 was accepted (rc %d)", rc);
    cr_assert(strstr(err.msg, "KVSIM_OPENCL_LANES=3"), "%s", err.msg);
    cr_assert_null(be);
}
