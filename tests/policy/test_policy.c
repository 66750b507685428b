/* test_policy.c — shipped policies load and give the expected encodings; params, overrides, caching, defaults. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/policy/policy.h"
#include "tests/support.h"

static const kv_policy_model llama8b = {"Llama-3-8B", 32, 32, 8, 128};
static const kv_policy_request req1 = {1, 1000, 200, 0.5};

static kv_encoding encode(kv_policy *p, const kv_policy_request *r, int layer, int head)
{
    kv_encoding e;
    kv_error err;
    kv_error_clear(&err);
    int rc = kv_policy_encoding(p, &llama8b, r, layer, head, &e, &err);
    cr_assert_eq(rc, KV_OK, "encode failed: %s", err.msg);
    return e;
}

/* `what` (e.g. "policies/int8.lua key") names the tensor in the messages. */
static void expect_int(const char *what, const kv_tensor_enc *t, int bits, int anchor, int group, int per_channel)
{
    cr_expect_eq(t->kind, KV_TENSOR_INT, "%s: kind %d", what, (int)t->kind);
    cr_expect_eq(t->bits, bits, "%s: bits %d, expected %d", what, t->bits, bits);
    cr_expect_eq(t->anchor_bits, anchor, "%s: anchor_bits %d, expected %d", what, t->anchor_bits, anchor);
    cr_expect_eq(t->group_size, group, "%s: group_size %d, expected %d", what, t->group_size, group);
    cr_expect_eq(t->per_channel, per_channel, "%s: per_channel %d", what, t->per_channel);
}

/* Every (layer, head) of the model gives the same encoding as (0, 0). */
static void expect_uniform(kv_policy *p)
{
    kv_encoding first = encode(p, &req1, 0, 0);
    for (int l = 0; l < llama8b.layers; l++)
        for (int h = 0; h < llama8b.kv_heads; h++) {
            kv_encoding e = encode(p, &req1, l, h);
            cr_assert(memcmp(&e, &first, sizeof e) == 0, "layer %d head %d differs", l, h);
        }
}

Test(shipped, bf16)
{
    kv_policy *p = kvt_policy_load("policies/bf16.lua", NULL, 0);
    cr_expect_str_eq(kv_policy_name(p), "bf16");
    kv_encoding e = encode(p, &req1, 3, 2);
    cr_expect_eq(e.key.kind, KV_TENSOR_BF16);
    cr_expect_eq(e.value.kind, KV_TENSOR_BF16);
    cr_expect_eq(e.key.bits, 16);
    cr_expect_eq(e.key.anchor_bits, 0);
    cr_expect_not(e.diffkv);
    cr_expect_eq(e.full_precision_window, 0);
    expect_uniform(p);
    int k = -1;
    cr_assert_eq(kv_policy_speculation(p, &req1, &k, NULL), KV_OK);
    cr_expect_eq(k, 0);
    kv_transfer_plan tp;
    cr_assert_eq(kv_policy_transfer(p, &req1, &tp, NULL), KV_OK);
    cr_expect_eq(tp.order, KV_ORDER_CONCURRENT);
    cr_expect_eq(tp.priority_mode, 0);
    kv_policy_destroy(p);
}

/* The shipped integer policies: one encoding, the same at every (layer, head). */
typedef struct int_case {
    const char *file;
    int layer, head;                  /* where the first encoding is asked for */
    int key[4], value[4];             /* bits, anchor_bits, group_size, per_channel */
    int window;                       /* full_precision_window */
} int_case;

static const int_case int_cases[] = {
    {"policies/int8.lua", 0, 0, {8, 0, 32, 0}, {8, 0, 32, 0}, 0},
    {"policies/int4.lua", 31, 7, {4, 0, 32, 0}, {4, 0, 32, 0}, 0},
    {"policies/kivi2.lua", 5, 5, {2, 0, 32, 1}, {2, 0, 32, 0}, 128},
};

Test(shipped, int_policies)
{
    for (size_t i = 0; i < sizeof int_cases / sizeof int_cases[0]; i++) {
        const int_case *c = &int_cases[i];
        char key[96], value[96];
        snprintf(key, sizeof key, "%s key", c->file);
        snprintf(value, sizeof value, "%s value", c->file);
        kv_policy *p = kvt_policy_load(c->file, NULL, 0);
        kv_encoding e = encode(p, &req1, c->layer, c->head);
        expect_int(key, &e.key, c->key[0], c->key[1], c->key[2], c->key[3]);
        expect_int(value, &e.value, c->value[0], c->value[1], c->value[2], c->value[3]);
        cr_expect_eq(e.full_precision_window, c->window, "%s: window %d", c->file, e.full_precision_window);
        cr_expect_not(e.diffkv, "%s", c->file);
        expect_uniform(p);
        kv_policy_destroy(p);
    }
}

Test(shipped, lynx)
{
    kv_policy *p = kvt_policy_load("policies/lynx.lua", NULL, 0);
    kv_encoding e = encode(p, &req1, 1, 1);
    expect_int("key", &e.key, 8, 4, 32, 0);
    expect_int("value", &e.value, 8, 4, 32, 0);
    expect_uniform(p);
    kv_transfer_plan tp;
    kv_error err;
    cr_assert_eq(kv_policy_transfer(p, &req1, &tp, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(tp.order, KV_ORDER_ANCHOR_FIRST);
    cr_expect_eq(tp.priority_mode, 1 /* strict */);
    cr_expect_float_eq(tp.anchor_weight, 0.75, 1e-12);
    cr_expect_float_eq(tp.residual_weight, 0.25, 1e-12);
    cr_expect_not(tp.layerwise);
    int k = 0;
    cr_assert_eq(kv_policy_speculation(p, &req1, &k, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(k, 8);
    cr_expect(strstr(kv_policy_describe(p), "4 + 4") != NULL, "describe: %s", kv_policy_describe(p));
    kv_policy_destroy(p);
}

Test(shipped, diffkv)
{
    kv_policy *p = kvt_policy_load("policies/diffkv.lua", NULL, 0);
    kv_encoding e = encode(p, &req1, 2, 6);
    cr_expect(e.diffkv);
    expect_int("key", &e.key, 8, 0, 32, 0);
    expect_int("value", &e.value, 4, 0, 32, 0);
    expect_int("key_low", &e.key_low, 4, 0, 32, 0);
    expect_int("value_low", &e.value_low, 2, 0, 32, 0);
    cr_expect_float_eq(e.alpha_high, 1.0, 1e-12);
    cr_expect_float_eq(e.alpha_low, 0.02, 1e-12);
    cr_expect_eq(e.window, 64);
    expect_uniform(p);
    kv_policy_destroy(p);
}

Test(shipped, params_are_listed_sorted)
{
    kv_policy *p = kvt_policy_load("policies/lynx.lua", NULL, 0);
    cr_assert_eq(kv_policy_param_count(p), 9);
    for (int i = 1; i < kv_policy_param_count(p); i++)
        cr_expect(strcmp(kv_policy_param_key(p, i - 1), kv_policy_param_key(p, i)) < 0);
    char buf[512];
    kv_policy_params_string(p, buf, sizeof buf);
    cr_expect(strstr(buf, "anchor_bits=4 anchor_weight=3.0 bits=8 group_size=32 layerwise=false order=anchor_first")
                  == buf, "got: %s", buf);
    cr_expect(kv_policy_has_hook(p, "encode"));
    cr_expect(kv_policy_has_hook(p, "speculate"));
    cr_expect_not(kv_policy_has_hook(p, "admit"));
    kv_policy_destroy(p);
}

Test(overrides, reach_the_policy)
{
    kv_policy_param set[] = {
        {"anchor_bits", "3", "s.yaml:4:5"}, {"order", "concurrent", "s.yaml:5:5"},
        {"speculate", "4", "s.yaml:6:5"},   {"layerwise", "true", "s.yaml:7:5"},
        {"anchor_weight", "1", "s.yaml:8:5"}, {"priority", "weighted", "s.yaml:9:5"},
    };
    kv_policy *p = kvt_policy_load("policies/lynx.lua", set, 6);
    kv_encoding e = encode(p, &req1, 0, 0);
    expect_int("key", &e.key, 8, 3, 32, 0);
    kv_transfer_plan tp;
    cr_assert_eq(kv_policy_transfer(p, &req1, &tp, NULL), KV_OK);
    cr_expect_eq(tp.order, KV_ORDER_CONCURRENT);
    cr_expect_eq(tp.priority_mode, 2);
    cr_expect(tp.layerwise);
    cr_expect_float_eq(tp.anchor_weight, 0.5, 1e-12);
    int k = 0;
    cr_assert_eq(kv_policy_speculation(p, &req1, &k, NULL), KV_OK);
    cr_expect_eq(k, 4);
    char buf[512];
    kv_policy_params_string(p, buf, sizeof buf);
    cr_expect(strstr(buf, "anchor_bits=3 anchor_weight=1.0") != NULL, "got: %s", buf);
    kv_policy_destroy(p);
}

Test(overrides, integral_float_for_int_and_int_for_float)
{
    kv_policy_param set[] = {{"group_size", "64.0", NULL}, {"alpha_high", "3", NULL}, {"alpha_low", "0", NULL}};
    kv_policy *p = kvt_policy_load("policies/diffkv.lua", set, 3);
    kv_encoding e = encode(p, &req1, 0, 0);
    cr_expect_eq(e.key.group_size, 64);
    cr_expect_float_eq(e.alpha_high, 3.0, 1e-12);
    cr_expect_float_eq(e.alpha_low, 0.0, 1e-12);
    kv_policy_destroy(p);
}

Test(overrides, group_zero_means_head_dim_in_diffkv)
{
    kv_policy_param set[] = {{"group_size", "0", NULL}};
    kv_policy *p = kvt_policy_load("policies/diffkv.lua", set, 1);
    kv_encoding e = encode(p, &req1, 0, 0);
    cr_expect_eq(e.key.group_size, 128);
    cr_expect_eq(e.value_low.group_size, 128);
    kv_policy_destroy(p);
}

Test(overrides, the_name_given_wins_and_two_loads_differ)
{
    kv_policy_param a3[] = {{"anchor_bits", "3", NULL}};
    kv_policy *p = NULL, *q = NULL;
    cr_assert_eq(kv_policy_load("lynx_a3", "policies/lynx.lua", a3, 1, NULL, &p, NULL), KV_OK);
    cr_assert_eq(kv_policy_load("lynx_a4", "policies/lynx.lua", NULL, 0, NULL, &q, NULL), KV_OK);
    cr_expect_str_eq(kv_policy_name(p), "lynx_a3");
    cr_expect_str_eq(kv_policy_path(p), "policies/lynx.lua");
    cr_expect_eq(encode(p, &req1, 0, 0).key.anchor_bits, 3);
    cr_expect_eq(encode(q, &req1, 0, 0).key.anchor_bits, 4);
    kv_policy_destroy(p);
    kv_policy_destroy(q);
}

Test(overrides, unknown_param_suggests_and_names_the_scenario)
{
    kv_policy_param set[] = {{"anchr_bits", "3", "scenarios/x.yaml:12:7"}};
    kv_policy *p = NULL;
    kv_error err;
    int rc = kv_policy_load("lynx", "policies/lynx.lua", set, 1, NULL, &p, &err);
    cr_assert_eq(rc, KV_EINPUT);
    cr_assert_null(p);
    cr_expect(strstr(err.msg, "scenarios/x.yaml:12:7: policy.lynx.anchr_bits:") == err.msg, "got: %s", err.msg);
    cr_expect(strstr(err.msg, "did you mean 'anchor_bits'?"), "got: %s", err.msg);
}

Test(overrides, wrong_type_is_rejected)
{
    const char *cases[][2] = {{"anchor_bits", "three"}, {"anchor_bits", "3.5"}, {"layerwise", "maybe"},
                              {"anchor_weight", "heavy"}};
    for (int i = 0; i < 4; i++) {
        kv_policy_param set[] = {{cases[i][0], cases[i][1], "s.yaml:1:1"}};
        kv_policy *p = NULL;
        kv_error err;
        cr_assert_eq(kv_policy_load("lynx", "policies/lynx.lua", set, 1, NULL, &p, &err), KV_EINPUT, "%s=%s",
                     cases[i][0], cases[i][1]);
        cr_expect(strstr(err.msg, "s.yaml:1:1: policy.lynx.") == err.msg, "got: %s", err.msg);
        cr_expect(strstr(err.msg, "expected"), "got: %s", err.msg);
        cr_expect(strstr(err.msg, cases[i][1]), "got: %s", err.msg);
    }
}

Test(overrides, out_of_range_value_fails_at_first_call_naming_the_override)
{
    kv_policy_param set[] = {{"anchor_bits", "8", "s.yaml:3:9"}};
    kv_policy *p = kvt_policy_load("policies/lynx.lua", set, 1);
    kv_encoding e;
    kv_error err;
    cr_assert_eq(kv_policy_encoding(p, &llama8b, &req1, 0, 0, &e, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "policies/lynx.lua:"), "got: %s", err.msg);
    cr_expect(strstr(err.msg, "key.anchor_bits = 8; expected an integer from 0 to 7"), "got: %s", err.msg);
    cr_expect(strstr(err.msg, "anchor_bits=8 (s.yaml:3:9)"), "got: %s", err.msg);
    kv_policy_destroy(p);
}

Test(defaults, absent_hooks)
{
    kv_policy *p = kvt_policy_load("tests/fixtures/policies/empty.lua", NULL, 0);
    cr_expect_str_eq(kv_policy_name(p), "empty");
    kv_encoding e = encode(p, &req1, 0, 0);
    cr_expect_eq(e.key.kind, KV_TENSOR_BF16);
    cr_expect_eq(e.value.kind, KV_TENSOR_BF16);
    kv_transfer_plan tp;
    cr_assert_eq(kv_policy_transfer(p, &req1, &tp, NULL), KV_OK);
    cr_expect_eq(tp.order, KV_ORDER_CONCURRENT);
    cr_expect_eq(tp.priority_mode, 0);
    cr_expect_not(tp.layerwise);
    int k = -1;
    cr_assert_eq(kv_policy_speculation(p, &req1, &k, NULL), KV_OK);
    cr_expect_eq(k, 0);
    kv_policy_node nodes[] = {{0, 3, 1, 1e9, 0}, {1, 1, 1, 1e9, 0}, {2, 0, 2, 1e9, 0}, {3, 2, 0, 1e9, 0}};
    int n = -1;
    cr_assert_eq(kv_policy_prefill_node(p, &req1, nodes, 4, &n, NULL), KV_OK);
    cr_expect_eq(n, 1, "least loaded, lowest index: got %d", n);
    cr_assert_eq(kv_policy_decode_node(p, &req1, nodes + 2, 2, &n, NULL), KV_OK);
    cr_expect_eq(n, 2);
    bool admit = false;
    cr_assert_eq(kv_policy_admit(p, &req1, &nodes[0], 5e8, &admit, NULL), KV_OK);
    cr_expect(admit);
    cr_assert_eq(kv_policy_admit(p, &req1, &nodes[0], 2e9, &admit, NULL), KV_OK);
    cr_expect_not(admit);
    kv_policy_stats st;
    kv_policy_get_stats(p, &st);
    cr_expect_eq(st.lua_calls, 0);
    cr_expect_eq(st.default_answers, 7);
    kv_policy_destroy(p);
}

Test(placement, custom_hooks)
{
    kv_policy *p = kvt_policy_load("tests/fixtures/policies/placement.lua", NULL, 0);
    kv_policy_node nodes[] = {{0, 0, 0, 1e9, 0}, {1, 5, 5, 4e9, 0}, {2, 0, 0, 2e9, 0}};
    int n = -1;
    kv_error err;
    cr_assert_eq(kv_policy_prefill_node(p, &req1, nodes, 3, &n, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(n, 1);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(kv_policy_decode_node(p, &req1, nodes, 3, &n, &err), KV_OK, "%s", err.msg);
        cr_expect_eq(n, i % 3);
    }
    bool admit = true;
    cr_assert_eq(kv_policy_admit(p, &req1, &nodes[0], 0.9e9, &admit, &err), KV_OK, "%s", err.msg);
    cr_expect_not(admit);
    cr_assert_eq(kv_policy_admit(p, &req1, &nodes[0], 0.7e9, &admit, &err), KV_OK, "%s", err.msg);
    cr_expect(admit);
    kv_policy_destroy(p);
}

Test(cache, request_independent_answers_run_lua_once_per_layer_and_head)
{
    kv_policy *p = kvt_policy_load("policies/lynx.lua", NULL, 0);
    kv_policy_request r2 = {2, 9000, 10, 1.0};
    for (int pass = 0; pass < 3; pass++)
        for (int l = 0; l < llama8b.layers; l++)
            for (int h = 0; h < llama8b.kv_heads; h++)
                encode(p, pass == 1 ? &r2 : &req1, l, h);
    int k;
    kv_transfer_plan tp;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(kv_policy_speculation(p, &req1, &k, NULL), KV_OK);
        cr_assert_eq(kv_policy_transfer(p, &req1, &tp, NULL), KV_OK);
    }
    kv_policy_stats st;
    kv_policy_get_stats(p, &st);
    cr_expect_eq(st.lua_calls, 32 * 8 + 2, "lua calls %llu", (unsigned long long)st.lua_calls);
    cr_expect_eq(st.cache_hits, 2 * 32 * 8 + 6, "cache hits %llu", (unsigned long long)st.cache_hits);
    /* Switching the cache off runs Lua every time and gives the same answers. */
    kv_policy_set_cache(p, false);
    kv_encoding e = encode(p, &req1, 4, 4);
    encode(p, &req1, 4, 4);
    expect_int("key", &e.key, 8, 4, 32, 0);
    kv_policy_get_stats(p, &st);
    cr_expect_eq(st.lua_calls, 32 * 8 + 4);
    kv_policy_destroy(p);
}

Test(cache, per_request_answers_are_not_cached)
{
    kv_policy *p = kvt_policy_load("tests/fixtures/policies/per_request.lua", NULL, 0);
    kv_policy_request shortr = {7, 100, 50, 0}, longr = {8, 8000, 500, 0};
    cr_expect_eq(encode(p, &shortr, 0, 0).key.bits, 8);
    cr_expect_eq(encode(p, &longr, 0, 0).key.bits, 4);
    cr_expect_eq(encode(p, &shortr, 0, 0).key.bits, 8);
    int k;
    cr_assert_eq(kv_policy_speculation(p, &shortr, &k, NULL), KV_OK);
    cr_expect_eq(k, 2);
    cr_assert_eq(kv_policy_speculation(p, &longr, &k, NULL), KV_OK);
    cr_expect_eq(k, 8);
    kv_policy_stats st;
    kv_policy_get_stats(p, &st);
    cr_expect_eq(st.lua_calls, 5);
    cr_expect_eq(st.cache_hits, 0);
    kv_policy_destroy(p);
}

Test(cache, per_layer_answers_and_model_change)
{
    kv_policy *p = kvt_policy_load("tests/fixtures/policies/per_layer.lua", NULL, 0);
    cr_expect_eq(encode(p, &req1, 0, 1).key.kind, KV_TENSOR_BF16);
    kv_encoding e = encode(p, &req1, 1, 1);
    expect_int("key", &e.key, 4, 0, 128, 0);
    expect_int("value", &e.value, 4, 0, 32, 0);
    cr_expect_eq(encode(p, &req1, 1, 2).key.bits, 8);
    cr_expect_eq(encode(p, &req1, 1, 1).key.bits, 4);
    kv_policy_stats st;
    kv_policy_get_stats(p, &st);
    cr_expect_eq(st.lua_calls, 3);
    cr_expect_eq(st.cache_hits, 1);
    /* A different model card empties the cache; the hook sees the new head_dim. */
    kv_policy_model small = {"SmolLM2-135M", 30, 9, 3, 64};
    kv_error err;
    cr_assert_eq(kv_policy_encoding(p, &small, &req1, 1, 1, &e, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(e.key.group_size, 64);
    cr_assert_eq(kv_policy_encoding(p, &small, &req1, 29, 2, &e, &err), KV_OK, "%s", err.msg);
    cr_expect_eq(kv_policy_encoding(p, &small, &req1, 30, 0, &e, &err), KV_EFAIL);
    kv_policy_destroy(p);
}

Test(cache, file_can_opt_out)
{
    kv_policy *p = kvt_policy_load("tests/fixtures/policies/no_cache.lua", NULL, 0);
    cr_expect_eq(encode(p, &req1, 0, 0).key.bits, 8);
    cr_expect_eq(encode(p, &req1, 0, 0).key.bits, 4);
    cr_expect_eq(encode(p, &req1, 0, 0).key.bits, 8);
    kv_policy_destroy(p);
}

Test(cache, random_is_not_cached_and_is_reproducible)
{
    kv_policy *a = kvt_policy_load("tests/fixtures/policies/random.lua", NULL, 0);
    kv_policy *b = kvt_policy_load("tests/fixtures/policies/random.lua", NULL, 0);
    int distinct = 0, prev = -1;
    for (int i = 0; i < 40; i++) {
        int x = encode(a, &req1, 0, 0).key.bits;
        int y = encode(b, &req1, 0, 0).key.bits;
        cr_assert_eq(x, y, "call %d: %d vs %d", i, x, y);
        distinct += x != prev;
        prev = x;
    }
    cr_expect_gt(distinct, 5, "math.random answers were cached");
    kv_policy_destroy(a);
    kv_policy_destroy(b);
}

Test(sandbox, only_safe_libraries)
{
    kv_policy *p = kvt_policy_load("tests/fixtures/policies/sandbox_probe.lua", NULL, 0);
    cr_expect_str_eq(kv_policy_describe(p), "ok");
    kv_policy_destroy(p);
}

Test(sandbox, empty_string_rep_returns_at_once)
{
    kv_policy *p = kvt_policy_load("tests/fixtures/policies/rep_empty.lua", NULL, 0);
    cr_expect_eq(encode(p, &req1, 0, 0).key.kind, KV_TENSOR_BF16);
    kv_policy_destroy(p);
}

Test(sandbox, finalizers_are_refused, .timeout = 20)
{
    kv_policy *p = NULL;
    kv_error err;
    cr_assert_eq(kv_policy_load(NULL, "tests/fixtures/policies/gc_loop.lua", NULL, 0, NULL, &p, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "tests/fixtures/policies/gc_loop.lua:2:") == err.msg, "got: %s", err.msg);
    cr_expect(strstr(err.msg, "__gc metamethods are not allowed"), "got: %s", err.msg);
}

Test(sandbox, endless_close_handler_is_stopped, .timeout = 20)
{
    kv_policy *p = kvt_policy_load("tests/fixtures/policies/close_loop.lua", NULL, 0);
    kv_encoding e;
    kv_error err;
    cr_assert_eq(kv_policy_encoding(p, &llama8b, &req1, 0, 0, &e, &err), KV_EINPUT);
    cr_expect(strstr(err.msg, "instruction budget"), "got: %s", err.msg);
    kv_policy_destroy(p);
}

Test(sandbox, memory_stays_small)
{
    kv_policy *p = kvt_policy_load("policies/lynx.lua", NULL, 0);
    kv_policy_set_cache(p, false);
    for (int i = 0; i < 20000; i++)
        encode(p, &req1, i % 32, i % 8);
    kv_policy_stats st;
    kv_policy_get_stats(p, &st);
    cr_expect_lt(st.memory_peak_bytes, 4u << 20, "peak %llu bytes", (unsigned long long)st.memory_peak_bytes);
    kv_policy_destroy(p);
}

Test(api, null_is_fine)
{
    kv_policy_destroy(NULL);
    cr_expect_null(kv_policy_name(NULL));
    cr_expect_eq(kv_policy_param_count(NULL), 0);
}
