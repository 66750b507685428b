/* test_policy_errors.c — every way a policy can go wrong gives a clear message, the right code, and no hang. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/policy/policy.h"
#include "tests/support.h"

#define FIX "tests/fixtures/policies/"

static const kv_policy_model llama8b = {"Llama-3-8B", 32, 32, 8, 128};
static const kv_policy_request req42 = {42, 1000, 200, 0.5};

/* Loading must fail with KV_EINPUT; returns the message (static storage per test). */
static const char *load_fails(const char *file)
{
    static kv_error err;
    kv_policy *p = (kv_policy *)1;
    kv_error_clear(&err);
    int rc = kv_policy_load(NULL, file, NULL, 0, NULL, &p, &err);
    cr_assert_eq(rc, KV_EINPUT, "loading %s: rc %d, msg: %s", file, rc, err.msg);
    cr_assert_eq(err.code, KV_EINPUT);
    cr_assert_null(p, "a failed load must leave *out NULL");
    return err.msg;
}

/* Loading succeeds; then encode for request 42, layer 2, head 1 must fail with KV_EINPUT. */
static const char *encode_fails(const char *file, const kv_policy_limits *limits)
{
    static kv_error err;
    kv_policy *p = NULL;
    kv_error_clear(&err);
    cr_assert_eq(kv_policy_load(NULL, file, NULL, 0, limits, &p, &err), KV_OK, "loading %s: %s", file, err.msg);
    kv_encoding e;
    int rc = kv_policy_encoding(p, &llama8b, &req42, 2, 1, &e, &err);
    cr_assert_eq(rc, KV_EINPUT, "encode with %s: rc %d, msg: %s", file, rc, err.msg);
    /* The policy stays usable for the error report and is destroyed cleanly. */
    kv_policy_destroy(p);
    return err.msg;
}

#define expect_has(msg, what) cr_expect(strstr((msg), (what)) != NULL, "expected \"%s\" in:\n%s", (what), (msg))
#define expect_starts(msg, what) \
    cr_expect(strncmp((msg), (what), strlen(what)) == 0, "expected to start with \"%s\":\n%s", (what), (msg))

Test(load, missing_file)
{
    const char *m = load_fails(FIX "does_not_exist.lua");
    expect_starts(m, FIX "does_not_exist.lua: policy 'does_not_exist': cannot open");
}

Test(load, syntax_error)
{
    const char *m = load_fails(FIX "syntax_error.lua");
    expect_starts(m, FIX "syntax_error.lua:5:");
    expect_has(m, "'then' expected");
    expect_has(m, "syntax error while loading policy 'syntax_error'");
}

Test(load, runtime_error_at_top_level)
{
    const char *m = load_fails(FIX "load_error.lua");
    expect_starts(m, FIX "load_error.lua:3: attempt to index a nil value");
    expect_has(m, "while loading policy 'load_error'");
    expect_has(m, "stack traceback:");
    expect_has(m, "load_error.lua:3: in main chunk");
}

Test(load, endless_loop_at_top_level, .timeout = 30)
{
    const char *m = load_fails(FIX "load_loop.lua");
    expect_starts(m, FIX "load_loop.lua:2: policy 'load_loop' used up its instruction budget");
    expect_has(m, "endless loop");
}

Test(load, not_a_table)
{
    expect_has(load_fails(FIX "not_a_table.lua"), "must end with `return { ... }`");
    const char *m = load_fails(FIX "no_return.lua");
    expect_has(m, "must end with `return { ... }`");
    expect_has(m, "returned nothing");
}

Test(load, unknown_field_suggests)
{
    const char *m = load_fails(FIX "unknown_field.lua");
    expect_starts(m, FIX "unknown_field.lua:4: policy 'unknown_field': 'encdoe' is not a policy field; did you "
                        "mean 'encode'?");
}

Test(load, hook_must_be_a_function)
{
    expect_has(load_fails(FIX "hook_not_function.lua"), "speculate must be a function, got number");
}

Test(load, param_default_must_be_scalar)
{
    expect_has(load_fails(FIX "bad_param.lua"), "params.weights is table");
}

Test(load, binary_file_is_refused)
{
    char *dir = kvt_tempdir();
    cr_assert_not_null(dir);
    char *path = kvt_write(dir, "compiled.lua", "\x1bLua\x54");
    const char *m = load_fails(path);
    expect_has(m, "precompiled (binary) Lua chunk");
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

Test(load, os_and_require_are_absent)
{
    const char *m = load_fails(FIX "os_access.lua");
    expect_starts(m, FIX "os_access.lua:2: attempt to index a nil value (global 'os')");
    m = load_fails(FIX "require_access.lua");
    expect_starts(m, FIX "require_access.lua:2: attempt to call a nil value (global 'require')");
}

Test(load, memory_cap_at_load)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "big.lua", "local t = {}\nfor i = 1, 1e6 do t[i] = i end\nreturn {}\n");
    kv_policy_limits lim = {0, 2u << 20};
    kv_policy *p = NULL;
    kv_error err;
    cr_assert_eq(kv_policy_load(NULL, path, NULL, 0, &lim, &p, &err), KV_EINPUT);
    expect_has(err.msg, "big.lua:2: policy 'big' exceeded its memory cap of 2 MiB while loading");
    free(path);
    kvt_rmtree(dir);
    free(dir);
}

Test(hook, runtime_error_names_file_line_hook_and_request)
{
    const char *m = encode_fails(FIX "runtime_error.lua", NULL);
    expect_starts(m, FIX "runtime_error.lua:6: attempt to index a nil value (local 'cfg')");
    expect_has(m, "in hook 'encode' of policy 'runtime_error' (defined at " FIX "runtime_error.lua:10)");
    expect_has(m, "request 42, layer 2, head 1");
    expect_has(m, "stack traceback:");
    expect_has(m, "runtime_error.lua:6: in upvalue 'helper'");
    expect_has(m, "runtime_error.lua:11: in function");
}

Test(hook, error_call)
{
    const char *m = encode_fails(FIX "error_call.lua", NULL);
    expect_starts(m, FIX "error_call.lua:4: this policy refuses layer 2");
    expect_has(m, "in hook 'encode'");
}

Test(hook, endless_loop_is_stopped, .timeout = 30)
{
    const char *m = encode_fails(FIX "infinite_loop.lua", NULL);
    cr_expect(strncmp(m, FIX "infinite_loop.lua:5:", strlen(FIX "infinite_loop.lua:5:")) == 0 ||
                  strncmp(m, FIX "infinite_loop.lua:6:", strlen(FIX "infinite_loop.lua:6:")) == 0,
              "got: %s", m);
    expect_has(m, "policy 'infinite_loop' used up its instruction budget (1000000 per call) in hook 'encode'");
    expect_has(m, "request 42, layer 2, head 1");
    expect_has(m, "stack traceback:");
}

Test(hook, pcall_cannot_swallow_the_budget, .timeout = 30)
{
    kv_policy_limits lim = {20000, 0};
    const char *m = encode_fails(FIX "pcall_loop.lua", &lim);
    expect_has(m, "used up its instruction budget (20000 per call)");
}

Test(hook, endless_close_handler, .timeout = 30)
{
    expect_has(encode_fails(FIX "close_loop.lua", NULL), "instruction budget");
}

Test(hook, memory_bomb, .timeout = 30)
{
    /* The doubling string passes the string cap (1 MiB) first... */
    const char *m = encode_fails(FIX "memory_bomb.lua", NULL);
    expect_starts(m, FIX "memory_bomb.lua:6: policy 'memory_bomb' tried to make a string of 2 MiB, over its limit "
                        "of 1 MiB per string (policy_limits.string_kib), in hook 'encode' (defined at " FIX
                        "memory_bomb.lua:3), request 42, layer 2, head 1");
    /* ...and the memory cap when strings may be as large as the heap. */
    kv_policy_limits lim = {.string_bytes = 32u << 20};
    m = encode_fails(FIX "memory_bomb.lua", &lim);
    expect_starts(m, FIX "memory_bomb.lua:6: policy 'memory_bomb' exceeded its memory cap of 32 MiB in hook "
                        "'encode' (defined at " FIX "memory_bomb.lua:3), request 42, layer 2, head 1");
}

Test(hook, swallowed_memory_errors_leave_a_usable_policy, .timeout = 30)
{
    /* The policy catches its own memory errors with pcall and answers; that is allowed. */
    kv_policy_limits lim = {0, 4u << 20};
    kv_policy *p = NULL;
    kv_error err;
    cr_assert_eq(kv_policy_load(NULL, FIX "table_bomb.lua", NULL, 0, &lim, &p, &err), KV_OK, "%s", err.msg);
    kv_encoding e;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kv_policy_encoding(p, &llama8b, &req42, i, 0, &e, &err), KV_OK, "%s", err.msg);
    kv_policy_stats st;
    kv_policy_get_stats(p, &st);
    cr_expect_leq(st.memory_peak_bytes, 4u << 20);
    kv_policy_destroy(p);
}

Test(hook, string_rep_bomb, .timeout = 30)
{
    const char *m = encode_fails(FIX "rep_bomb.lua", NULL);
    expect_starts(m, FIX "rep_bomb.lua:4: policy 'rep_bomb' exceeded its memory cap of 32 MiB in hook 'encode'");
}

Test(hook, backtracking_pattern_is_stopped, .timeout = 30)
{
    /* The bound of the matcher's work is charged before it runs: 3 nested '-' on 1e5 bytes is refused at once. */
    const char *m = encode_fails(FIX "pattern_bomb.lua", NULL);
    expect_starts(m, FIX "pattern_bomb.lua:5: policy 'pattern_bomb' hit its instruction budget (1000000 per call, "
                        "policy_limits.instructions): string.find('.-.-.-x') on a string of 100000 bytes could take "
                        "up to ");
    expect_has(m, "(refused before running) in hook 'encode'");
}

Test(hook, unbounded_table_shifts_are_refused, .timeout = 30)
{
    expect_starts(encode_fails(FIX "shift_bomb.lua", NULL),
                  FIX "shift_bomb.lua:5: table.insert shifting 999999999999999 elements is not available");
    expect_starts(encode_fails(FIX "move_bomb.lua", NULL),
                  FIX "move_bomb.lua:4: table.move of more than 1048576 elements is not available");
}

Test(hook, io_is_absent)
{
    const char *m = encode_fails(FIX "io_access.lua", NULL);
    expect_starts(m, FIX "io_access.lua:4: attempt to index a nil value (global 'io')");
    expect_has(m, "request 42");
}

Test(hook, dofile_is_absent)
{
    expect_starts(encode_fails(FIX "dofile_access.lua", NULL),
                  FIX "dofile_access.lua:4: attempt to call a nil value (global 'dofile')");
}

Test(hook, binary_chunks_cannot_be_loaded)
{
    const char *m = encode_fails(FIX "binary_load.lua", NULL);
    expect_starts(m, FIX "binary_load.lua:6:");
    expect_has(m, "attempt to load a binary chunk (mode is 't')");
}

Test(hook, params_are_read_only)
{
    const char *m = encode_fails(FIX "readonly_params.lua", NULL);
    expect_starts(m, FIX "readonly_params.lua:5: ctx.params is read-only (tried to set 'bits')");
}

Test(hook, ctx_typo_suggests)
{
    const char *m = encode_fails(FIX "bad_ctx_field.lua", NULL);
    expect_starts(m, FIX "bad_ctx_field.lua:4: ctx has no field 'layr' in hook 'encode'; did you mean 'layer'?");
}

Test(answer, wrong_type)
{
    const char *m = encode_fails(FIX "bad_return_type.lua", NULL);
    expect_starts(m, FIX "bad_return_type.lua:3: hook 'encode' of policy 'bad_return_type' returned 42; expected");
    expect_has(m, "(request 42, layer 2, head 1)");
}

Test(answer, nothing)
{
    expect_has(encode_fails(FIX "nil_return.lua", NULL), "returned nothing (nil)");
}

Test(answer, bits_out_of_range)
{
    const char *m = encode_fails(FIX "bits_out_of_range.lua", NULL);
    expect_starts(m, FIX "bits_out_of_range.lua:3: hook 'encode' of policy 'bits_out_of_range' returned key.bits "
                        "= 17; expected an integer from 1 to 16 (request 42, layer 2, head 1)");
}

Test(answer, anchor_out_of_range)
{
    expect_has(encode_fails(FIX "anchor_out_of_range.lua", NULL),
               "returned key.anchor_bits = 8; expected an integer from 0 to 7");
}

Test(answer, unknown_field_suggests)
{
    expect_has(encode_fails(FIX "bad_field.lua", NULL),
               "returned a field 'anchr_bits' in key that kvsim does not know; did you mean 'anchor_bits'?");
}

Test(answer, group_size)
{
    expect_has(encode_fails(FIX "bad_group.lua", NULL), "key.group_size = 0; expected an integer from 1 to");
}

Test(answer, bf16_takes_no_bits)
{
    expect_has(encode_fails(FIX "bad_bf16.lua", NULL), "key has kind = \"bf16\" and bits");
}

Test(answer, diffkv_thresholds_and_window)
{
    expect_has(encode_fails(FIX "bad_alpha.lua", NULL), "diffkv.alpha_low = 1 is above diffkv.alpha_high = 0.5");
    expect_has(encode_fails(FIX "negative_alpha.lua", NULL), "diffkv.alpha_high = -1; expected a finite number >= 0");
    expect_has(encode_fails(FIX "bad_window.lua", NULL), "diffkv.window = -3; expected an integer from 0 to");
}

Test(answer, transfer_order_suggests)
{
    kv_policy *p = kvt_policy_load(FIX "bad_transfer.lua", NULL, 0);
    kv_transfer_plan tp;
    kv_error err;
    cr_assert_eq(kv_policy_transfer(p, &req42, &tp, &err), KV_EINPUT);
    expect_starts(err.msg, FIX "bad_transfer.lua:3: hook 'transfer' of policy 'bad_transfer' returned order = "
                              "\"anchr_first\"; not a valid choice; did you mean 'anchor_first'?");
    expect_has(err.msg, "(request 42)");
    kv_policy_destroy(p);
}

Test(answer, speculate_type)
{
    kv_policy *p = kvt_policy_load(FIX "bad_speculate.lua", NULL, 0);
    int k;
    kv_error err;
    cr_assert_eq(kv_policy_speculation(p, &req42, &k, &err), KV_EINPUT);
    expect_has(err.msg, "returned \"8\"; expected an integer from 0 to 4096");
    kv_policy_destroy(p);
}

Test(answer, node_out_of_range)
{
    kv_policy *p = kvt_policy_load(FIX "bad_node.lua", NULL, 0);
    kv_policy_node nodes[] = {{0, 0, 0, 1e9, 0}, {1, 0, 0, 1e9, 0}};
    int n;
    kv_error err;
    cr_assert_eq(kv_policy_prefill_node(p, &req42, nodes, 2, &n, &err), KV_EINPUT);
    expect_has(err.msg, "returned 2; expected the index of one of the 2 prefill nodes (indices 0..1)");
    expect_has(err.msg, "(request 42, 2 prefill nodes)");
    kv_policy_destroy(p);
}

Test(answer, admit_type)
{
    kv_policy *p = kvt_policy_load(FIX "bad_admit.lua", NULL, 0);
    kv_policy_node node = {3, 0, 0, 1e9, 0};
    bool ok;
    kv_error err;
    cr_assert_eq(kv_policy_admit(p, &req42, &node, 1e6, &ok, &err), KV_EINPUT);
    expect_has(err.msg, "returned 1; expected true (admit) or false (wait) (request 42, node 3");
    kv_policy_destroy(p);
}

Test(limits, tiny_cap_fails_cleanly)
{
    kv_policy_limits lim = {0, 4096};
    kv_policy *p = NULL;
    kv_error err;
    cr_assert_eq(kv_policy_load(NULL, "policies/bf16.lua", NULL, 0, &lim, &p, &err), KV_EINPUT);
    expect_has(err.msg, "memory cap of 4 KiB");
}
