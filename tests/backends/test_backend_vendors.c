/* test_backend_vendors.c — the vendor backends (OpenCL, CUDA, HIP, Ascend): which
 * are built and which have a device (printed as "skipped: <backend>: <why>"),
 * the message for a backend that is not built or has no device, the OpenCL
 * division fallbacks, and the device-side scalar numerics (kv_device.h, shared
 * by the OpenCL, CUDA and HIP kernels) against backends/numerics.h.
 * The kernels themselves are checked on every backend with a device by
 * test_conformance.c. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/backend_impl.h"
#include "backends/module/kv_module.h"
#include "backends/kernel_fixture.h"
#include "backends/numerics.h"
#include "backends/kernels/kv_device.h" /* host-C dialect: the scalar helpers only */
#include "core/base/rng.h"
#include "tests/kernels_util.h"
#include "tests/support.h"

static const char *const vendors[] = {"opencl", "cuda", "hip", "ascend"};

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- Registry and messages --------------------------------------------------------- */

Test(vendors, registry_says_what_is_built)
{
    const char *names = kv_backend_reg_names();
    cr_assert(strncmp(names, "cpu", 3) == 0, "got: %s", names);
    for (size_t i = 0; i < sizeof vendors / sizeof vendors[0]; i++) {
        int built = kv_backend_reg_find(vendors[i]) != NULL;
        cr_assert_eq(built, strstr(names, vendors[i]) != NULL, "%s: registry and name list disagree", vendors[i]);
        if (!built)
            fprintf(stderr, "skipped: %s: not built (its toolkit was not found when CMake ran)\n", vendors[i]);
    }
}

/* A backend that is not built: KV_EINPUT and a message that lists the built ones. */
Test(vendors, unbuilt_backend_lists_the_built_ones)
{
    kv_backend *be = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_backend_open("metal", 0, &be, &err), KV_EINPUT);
    cr_assert_null(be);
    cr_assert(strstr(err.msg, "'metal' is not built"), "got: %s", err.msg);
    cr_assert(strstr(err.msg, kv_backend_reg_names()), "got: %s", err.msg);
    for (size_t i = 0; i < sizeof vendors / sizeof vendors[0]; i++) {
        if (kv_backend_reg_find(vendors[i]))
            continue;
        kv_error e2 = {0};
        cr_assert_eq(kv_backend_open(vendors[i], 0, &be, &e2), KV_EINPUT);
        cr_assert(strstr(e2.msg, "not built") && strstr(e2.msg, kv_backend_reg_names()), "got: %s", e2.msg);
    }
}

/* `kvsim bench kernels --backend X` for a vendor that is not built or has no
   device: exit code 2 and a message naming the built backends. */
Test(vendors, bench_rejects_unusable_backend)
{
    int tried = 0;
    for (size_t i = 0; i < sizeof vendors / sizeof vendors[0]; i++) {
        const kv_backend_reg *reg = kv_backend_reg_find(vendors[i]);
        if (reg && reg->device_count(&(kv_error){0}) > 0)
            continue;
        char args[96], *out = NULL;
        snprintf(args, sizeof args, "bench kernels --quick --repeats 1 --backend %s", vendors[i]);
        int rc = kvt_kvsim(args, &out);
        cr_assert_eq(rc, 2, "%s: exit %d: %s", vendors[i], rc, out);
        cr_assert(strstr(out, reg ? "has no usable device" : "is not built"), "%s: %s", vendors[i], out);
        cr_assert(strstr(out, kv_backend_reg_names()), "%s: %s", vendors[i], out);
        free(out);
        tried++;
    }
    if (!tried)
        cr_skip_test("every vendor backend has a device here");
}

/* One vendor: skipped (visibly) when not built or without a device — then the
   open error must be KV_EINPUT and name the built backends — otherwise a
   device that opens, reports itself and quantizes one matrix exactly. */
static void vendor_device(const char *name)
{
    const kv_backend_reg *reg = kv_backend_reg_find(name);
    if (!reg) {
        fprintf(stderr, "skipped: %s: not built (its toolkit was not found when CMake ran)\n", name);
        cr_skip_test("%s: not built", name);
    }
    kv_error why = {0};
    int count = reg->device_count(&why);
    kv_backend *be = NULL;
    if (count <= 0) {
        cr_assert(why.msg[0], "%s: device_count gave 0 without a reason", name);
        kv_error err = {0};
        cr_assert_eq(kv_backend_open(name, 0, &be, &err), KV_EINPUT);
        cr_assert(strstr(err.msg, "no usable device") && strstr(err.msg, kv_backend_reg_names()), "got: %s", err.msg);
        fprintf(stderr, "skipped: %s: %s\n", name, why.msg);
        cr_skip_test("%s: %s", name, why.msg);
    }
    kv_error err = {0};
    cr_assert_eq(kv_backend_open(name, 0, &be, &err), KV_OK, "%s", err.msg);
    kv_backend_props props;
    cr_assert_eq(kv_backend_get_props(be, &props), KV_OK);
    cr_assert(props.device[0], "%s: no device name", name);
    fprintf(stderr, "%s: %d device(s); device 0: %s\n", name, count, props.device);

    kv_quant_layout l = {5, 37, 8, KV_GROUP_TOKEN};
    float x[5 * 37];
    kv_rng rng;
    kv_rng_seed(&rng, 5);
    for (size_t i = 0; i < 5 * 37; i++)
        x[i] = (float)kv_rng_normal(&rng);
    size_t groups = kv_layout_groups(&l);
    kv_buffer *bx, *bc, *bs, *bz;
    cr_assert_eq(kv_buffer_alloc(be, sizeof x, &bx, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_alloc(be, 5 * 37 * 2, &bc, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_alloc(be, groups * 2, &bs, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_alloc(be, groups * 2, &bz, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_write(be, bx, 0, x, sizeof x, &err), KV_OK, "%s", err.msg);
    kv_quantize_args a = {l, 5, {bx, 0}, {bc, 0}, {bs, 0}, {bz, 0}};
    cr_assert_eq(kv_backend_quantize(be, &a, &err), KV_OK, "%s", err.msg);
    uint16_t codes[5 * 37], scale[32], zero[32];
    cr_assert_eq(kv_buffer_read(be, bc, 0, codes, sizeof codes, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_read(be, bs, 0, scale, groups * 2, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_read(be, bz, 0, zero, groups * 2, &err), KV_OK, "%s", err.msg);
    for (size_t g = 0; g < groups; g++) {
        size_t row = g / 5, c0 = (g % 5) * 8, n = c0 + 8 <= 37 ? 8 : 37 - c0;
        float mn = x[row * 37 + c0], mx = mn;
        for (size_t i = 1; i < n; i++) {
            float v = x[row * 37 + c0 + i];
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
        kv_qparams p = kv_quant_params(mn, mx, 1, 5);
        cr_assert_eq(scale[g], p.scale_h, "%s: group %zu scale", name, g);
        cr_assert_eq(zero[g], p.zero_h, "%s: group %zu zero", name, g);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(codes[row * 37 + c0 + i], kv_quant_code(x[row * 37 + c0 + i], p.s, p.z, 5), "%s: code", name);
    }
    kv_buffer_free(be, bx);
    kv_buffer_free(be, bc);
    kv_buffer_free(be, bs);
    kv_buffer_free(be, bz);
    kv_backend_close(be);
}

Test(vendors, opencl_device)
{
    vendor_device("opencl");
}

Test(vendors, cuda_device)
{
    vendor_device("cuda");
}

Test(vendors, hip_device)
{
    vendor_device("hip");
}

Test(vendors, ascend_device)
{
    vendor_device("ascend");
}

/* ---- OpenCL division fallbacks --------------------------------------------------------- */

/* Quantizes values whose quotients sit on rounding boundaries, on OpenCL with
   the division mode forced by KVSIM_OPENCL_DIV, and compares with numerics.h. */
static void opencl_div_mode(const char *mode)
{
    if (!kv_backend_reg_find("opencl") || kv_backend_reg_find("opencl")->device_count(&(kv_error){0}) <= 0) {
        fprintf(stderr, "skipped: opencl: not built or no device (division mode %s)\n", mode);
        cr_skip_test("opencl unavailable");
    }
    setenv("KVSIM_OPENCL_DIV", mode, 1);
    kv_backend *be = NULL;
    kv_error err = {0};
    int rc = kv_backend_open("opencl", 0, &be, &err);
    unsetenv("KVSIM_OPENCL_DIV");
    if (rc == KV_EINPUT && strstr(err.msg, "not available on this device")) {
        fprintf(stderr, "skipped: opencl: division mode %s: %s\n", mode, err.msg);
        cr_skip_test("%s", err.msg);
    }
    cr_assert_eq(rc, KV_OK, "%s", err.msg);
    enum { ROWS = 64, COLS = 64 };
    static float x[ROWS * COLS];
    kv_rng rng;
    kv_rng_seed(&rng, 21);
    for (size_t i = 0; i < ROWS * COLS; i++) /* integers and half-integers hit the ties of rint */
        x[i] = (float)((double)kv_rng_below(&rng, 4001) / 2.0 - 1000.0) * (i % 3 ? 1.0f : 0.013f);
    kv_quant_layout l = {ROWS, COLS, 16, KV_GROUP_TOKEN};
    size_t groups = kv_layout_groups(&l);
    kv_buffer *bx, *bc, *bs, *bz;
    cr_assert_eq(kv_buffer_alloc(be, sizeof x, &bx, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_alloc(be, ROWS * COLS * 2, &bc, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_alloc(be, groups * 2, &bs, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_alloc(be, groups * 2, &bz, &err), KV_OK, "%s", err.msg);
    cr_assert_eq(kv_buffer_write(be, bx, 0, x, sizeof x, &err), KV_OK, "%s", err.msg);
    static uint16_t codes[ROWS * COLS];
    uint16_t scale[ROWS * COLS / 16], zero[ROWS * COLS / 16];
    for (unsigned bits = 1; bits <= 16; bits++) {
        kv_quantize_args a = {l, bits, {bx, 0}, {bc, 0}, {bs, 0}, {bz, 0}};
        cr_assert_eq(kv_backend_quantize(be, &a, &err), KV_OK, "%s", err.msg);
        cr_assert_eq(kv_buffer_read(be, bc, 0, codes, sizeof codes, &err), KV_OK, "%s", err.msg);
        cr_assert_eq(kv_buffer_read(be, bs, 0, scale, sizeof scale, &err), KV_OK, "%s", err.msg);
        cr_assert_eq(kv_buffer_read(be, bz, 0, zero, sizeof zero, &err), KV_OK, "%s", err.msg);
        for (size_t g = 0; g < groups; g++) {
            const float *v = x + g * 16;
            float mn = v[0], mx = v[0];
            for (int i = 1; i < 16; i++) {
                mn = v[i] < mn ? v[i] : mn;
                mx = v[i] > mx ? v[i] : mx;
            }
            kv_qparams p = kv_quant_params(mn, mx, 1, bits);
            cr_assert_eq(scale[g], p.scale_h, "mode %s b=%u group %zu: scale", mode, bits, g);
            for (int i = 0; i < 16; i++)
                cr_assert_eq(codes[g * 16 + i], kv_quant_code(v[i], p.s, p.z, bits), "mode %s b=%u x=%a", mode, bits,
                             (double)v[i]);
        }
    }
    kv_buffer_free(be, bx);
    kv_buffer_free(be, bc);
    kv_buffer_free(be, bs);
    kv_buffer_free(be, bz);
    kv_backend_close(be);
}

Test(vendors, opencl_division_native)
{
    opencl_div_mode("native");
}

Test(vendors, opencl_division_double)
{
    opencl_div_mode("double");
}

Test(vendors, opencl_division_soft)
{
    opencl_div_mode("soft");
}

Test(vendors, opencl_division_mode_unknown_is_bad_input)
{
    if (!kv_backend_reg_find("opencl") || kv_backend_reg_find("opencl")->device_count(&(kv_error){0}) <= 0)
        cr_skip_test("opencl unavailable");
    setenv("KVSIM_OPENCL_DIV", "approximate", 1);
    kv_backend *be = NULL;
    kv_error err = {0};
    int rc = kv_backend_open("opencl", 0, &be, &err);
    unsetenv("KVSIM_OPENCL_DIV");
    cr_assert_eq(rc, KV_EINPUT, "%s", err.msg);
    cr_assert(strstr(err.msg, "KVSIM_OPENCL_DIV=approximate"), "got: %s", err.msg);
}

/* ---- OpenCL work-group sizes ----------------------------------------------------------- */

/* Attention and compaction use work-group-wide reductions; their results must
   not depend on the work-group size (KVSIM_OPENCL_WG_MAX caps it; 1 is also
   the shape of the single-core Ascend port). Each size against the CPU
   reference: attention within 1e-5 (including a 4K-token context, where
   fp32 accumulation error would show), compaction exact. */
static void attention_vs_reference(kv_backend *be, kv_backend *ref, const kv_attn_spec *spec, const char *what)
{
    double e, es;
    kvt_attention_errors(be, ref, spec, 0, 0, 0, what, &e, &es);
    cr_assert(e <= 1e-5, "%s: attention differs from the reference by %.3g", what, e);
    cr_assert(es <= 1e-5, "%s: scores differ from the reference by %.3g", what, es);
}

static void compaction_vs_reference(kv_backend *be, kv_backend *ref, const char *what)
{
    enum { N = 300, CAP = 2000 };
    static uint32_t demand[N], fl[CAP];
    uint32_t state[4] = {0, 0, CAP, 0};
    for (uint32_t i = 0; i < CAP; i++)
        fl[i] = i * 5 + 1;
    for (uint32_t i = 0; i < N; i++)
        demand[i] = (i * 7) % 5;
    kv_backend *bes[2] = {be, ref};
    uint32_t *got[2][3];
    kv_error err = {0};
    for (int k = 0; k < 2; k++) {
        kv_buffer *bd, *bo, *bp, *bf, *bs;
        cr_assert_eq(kv_buffer_alloc(bes[k], sizeof demand, &bd, &err), KV_OK);
        cr_assert_eq(kv_buffer_alloc(bes[k], sizeof demand, &bo, &err), KV_OK);
        cr_assert_eq(kv_buffer_alloc(bes[k], CAP * 4, &bp, &err), KV_OK);
        cr_assert_eq(kv_buffer_alloc(bes[k], sizeof fl, &bf, &err), KV_OK);
        cr_assert_eq(kv_buffer_alloc(bes[k], 16, &bs, &err), KV_OK);
        cr_assert_eq(kv_buffer_write(bes[k], bd, 0, demand, sizeof demand, &err), KV_OK);
        cr_assert_eq(kv_buffer_write(bes[k], bf, 0, fl, sizeof fl, &err), KV_OK);
        cr_assert_eq(kv_buffer_write(bes[k], bs, 0, state, 16, &err), KV_OK);
        static const uint32_t zeros[CAP];
        cr_assert_eq(kv_buffer_write(bes[k], bp, 0, zeros, sizeof zeros, &err), KV_OK);
        kv_compact_args a = {N, CAP, {bd, 0}, {bo, 0}, {bp, 0}, {bf, 0}, {bs, 0}};
        cr_assert_eq(kv_backend_compact_alloc(bes[k], &a, &err), KV_OK, "%s", err.msg);
        cr_assert_eq(kv_backend_compact_alloc(bes[k], &a, &err), KV_OK, "%s", err.msg);
        got[k][0] = malloc(sizeof demand);
        got[k][1] = malloc(CAP * 4);
        got[k][2] = malloc(16);
        cr_assert_eq(kv_buffer_read(bes[k], bo, 0, got[k][0], sizeof demand, &err), KV_OK);
        cr_assert_eq(kv_buffer_read(bes[k], bp, 0, got[k][1], CAP * 4, &err), KV_OK);
        cr_assert_eq(kv_buffer_read(bes[k], bs, 0, got[k][2], 16, &err), KV_OK);
        kv_buffer_free(bes[k], bd), kv_buffer_free(bes[k], bo), kv_buffer_free(bes[k], bp);
        kv_buffer_free(bes[k], bf), kv_buffer_free(bes[k], bs);
    }
    cr_assert(memcmp(got[0][0], got[1][0], sizeof demand) == 0, "%s: compaction offsets differ", what);
    cr_assert(memcmp(got[0][1], got[1][1], CAP * 4) == 0, "%s: compaction pages differ", what);
    cr_assert(memcmp(got[0][2], got[1][2], 16) == 0, "%s: compaction state differs", what);
    for (int k = 0; k < 2; k++)
        free(got[k][0]), free(got[k][1]), free(got[k][2]);
}

Test(vendors, opencl_work_group_sizes)
{
    if (!kv_backend_reg_find("opencl") || kv_backend_reg_find("opencl")->device_count(&(kv_error){0}) <= 0) {
        fprintf(stderr, "skipped: opencl: not built or no device (work-group sizes)\n");
        cr_skip_test("opencl unavailable");
    }
    kv_backend *ref = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_backend_open("cpu", 1, &ref, &err), KV_OK, "%s", err.msg);
    const kv_store_format i8 = {KV_STORE_QUANT, 8, 0, KV_GROUP_TOKEN, 32};
    const kv_store_format mix_k[2] = {{KV_STORE_QUANT, 8, 0, KV_GROUP_TOKEN, 32}, {KV_STORE_QUANT, 2, 0, KV_GROUP_CHANNEL, 16}};
    const kv_store_format mix_v[2] = {{KV_STORE_QUANT, 16, 4, KV_GROUP_TOKEN, 64}, {KV_STORE_BF16, 0, 0, 0, 0}};
    const char *sizes[] = {"1", "4", "16", "64"};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        setenv("KVSIM_OPENCL_WG_MAX", sizes[i], 1);
        kv_backend *be = NULL;
        int rc = kv_backend_open("opencl", 0, &be, &err);
        unsetenv("KVSIM_OPENCL_WG_MAX");
        cr_assert_eq(rc, KV_OK, "%s", err.msg);
        char what[64];
        snprintf(what, sizeof what, "work-group size <= %s", sizes[i]);
        kv_attn_spec prefill = {24, 4, 2, 64, 60, 16, mix_k, mix_v, 2, 1, 1, 7};
        attention_vs_reference(be, ref, &prefill, what);
        kv_attn_spec odd = {3, 6, 3, 33, 45, 7, mix_k, mix_v, 2, 1, 0, 8};
        attention_vs_reference(be, ref, &odd, what);
        if (i == 0 || i == 3) { /* a long context: fp32 accumulation over 4096 tokens */
            kv_attn_spec longctx = {1, 8, 2, 128, 4096, 32, &i8, &i8, 1, 1, 0, 9};
            attention_vs_reference(be, ref, &longctx, what);
        }
        compaction_vs_reference(be, ref, what);
        kv_backend_close(be);
    }
    kv_backend_close(ref);
}

/* ---- kv_device.h's scalar numerics, compiled here as C, against numerics.h ------------- */

/* The software division is correctly rounded: random operands of every class
   (including subnormals, results that underflow or overflow) against the
   host's IEEE division. NaN results need only be NaN. */
Test(vendors, soft_division_is_correctly_rounded)
{
    kv_rng rng;
    kv_rng_seed(&rng, 31);
    size_t bad = 0;
    for (size_t i = 0; i < 2000000; i++) {
        uint32_t ua = (uint32_t)kv_rng_u64(&rng), ub = (uint32_t)kv_rng_u64(&rng);
        if (i % 4 == 1) /* nearby exponents: quotients near 1, many ties of the last bit */
            ub = (ub & 0x807fffffu) | (ua & 0x7f800000u);
        if (i % 4 == 2) /* subnormal operands */
            ua &= 0x807fffffu;
        if (i % 8 == 3) /* short significands: exact quotients and halfway cases */
            ua &= 0xffff0000u, ub &= 0xfff00000u;
        float a = from_bits(ua), b = from_bits(ub);
        float want = a / b, got = kv_div_soft(a, b), dbl = (float)((double)a / (double)b);
        if (isnan(want)) {
            bad += !isnan(got) + !isnan(dbl);
            continue;
        }
        bad += to_bits(got) != to_bits(want);
        bad += to_bits(dbl) != to_bits(want);
        if (bad && bad < 4 && to_bits(got) != to_bits(want))
            cr_log_error("%a / %a: soft %a, want %a", (double)a, (double)b, (double)got, (double)want);
    }
    const float edge[][2] = {{1.0f, 3.0f}, {0.0f, 0.0f}, {1.0f, 0.0f}, {-1.0f, 0.0f}, {INFINITY, INFINITY},
                             {INFINITY, 2.0f}, {2.0f, INFINITY}, {3.4028235e38f, 1e-38f}, {1e-45f, 3.0f},
                             {1.4e-45f, 2.0f}, {3e-45f, 2.0f}, {1.1754942e-38f, 1.0000001f}, {65504.0f, 65535.0f}};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        float want = edge[i][0] / edge[i][1], got = kv_div_soft(edge[i][0], edge[i][1]);
        cr_assert(isnan(want) ? isnan(got) : to_bits(got) == to_bits(want), "%a / %a: got %a, want %a",
                  (double)edge[i][0], (double)edge[i][1], (double)got, (double)want);
    }
    cr_assert_eq(bad, 0, "%zu quotients differ", bad);
}

Test(vendors, device_fp16_bf16_match_numerics)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float a = kv_dev_f16_to_f32(h), b = kv_f16_to_f32((uint16_t)h);
        cr_assert_eq(to_bits(a), to_bits(b), "fp16 %04x", h);
        cr_assert_eq(to_bits(kv_dev_bf16_to_f32(h)), to_bits(kv_bf16_to_f32((uint16_t)h)), "bf16 %04x", h);
    }
    size_t bad = 0; /* every 61st fp32 bit pattern: all exponents, many mantissas */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 61) {
        float f = from_bits((uint32_t)u);
        bad += kv_dev_f16_from_f32(f) != kv_f16_from_f32(f);
        bad += kv_dev_f16_from_f32_sat(f) != kv_f16_from_f32_sat(f) && !isnan(f);
        bad += kv_dev_bf16_from_f32(f) != kv_bf16_from_f32(f);
    }
    cr_assert_eq(bad, 0, "%zu conversions differ", bad);
}

Test(vendors, device_quantization_matches_numerics)
{
    kv_rng rng;
    kv_rng_seed(&rng, 41);
    for (int t = 0; t < 20000; t++) {
        unsigned bits = 1 + (unsigned)kv_rng_below(&rng, 16);
        float v[3];
        for (int i = 0; i < 3; i++)
            v[i] = (float)(kv_rng_normal(&rng) * pow(10.0, (double)kv_rng_below(&rng, 12) - 6.0));
        if (t % 50 == 0)
            v[0] = -0.0f;
        float mn = fminf(v[0], v[1]), mx = fmaxf(v[0], v[1]);
        kv_qparams p = kv_quant_params(mn, mx, 1, bits);
        uint32_t meta = kv_dev_quant_meta(mn, mx, 1, bits);
        cr_assert_eq(meta & 0xffffu, p.scale_h, "scale b=%u [%a, %a]", bits, (double)mn, (double)mx);
        cr_assert_eq(meta >> 16, p.zero_h, "zero b=%u [%a, %a]", bits, (double)mn, (double)mx);
        cr_assert_eq(kv_dev_quant_code(v[2], p.s, p.z, bits), kv_quant_code(v[2], p.s, p.z, bits), "code");
        uint32_t q = kv_quant_code(v[2], p.s, p.z, bits);
        cr_assert_eq(to_bits(kv_dev_dequant(q, p.s, p.z)), to_bits(kv_dequant(q, p.s, p.z)));
        if (bits > 1) {
            unsigned a = 1 + (unsigned)kv_rng_below(&rng, bits - 1);
            uint32_t anchor = kv_split_anchor(q, bits, a);
            cr_assert_eq(to_bits(kv_dev_dequant_anchor(anchor, bits - a, p.s, p.z)),
                         to_bits(kv_dequant_anchor(anchor, bits - a, p.s, p.z)));
        }
    }
    cr_assert_eq(kv_dev_quant_meta(0, 0, 0, 4), 0u);
    cr_assert_eq(kv_dev_quant_code(INFINITY, 0.0f, 0.0f, 7), 127u);
    cr_assert_eq(kv_dev_quant_code(NAN, 1.0f, 0.0f, 7), 0u);
}

/* The layout helpers of kv_device.h agree with backend.c's. */
Test(vendors, device_layout_matches_backend)
{
    for (uint32_t rows = 1; rows < 20; rows += 3)
        for (uint32_t cols = 1; cols < 40; cols += 5)
            for (uint32_t gs = 1; gs < 45; gs += 4)
                for (int grouping = 0; grouping < 2; grouping++)
                    for (unsigned bits = 1; bits <= 16; bits += 5) {
                        kv_quant_layout l = {rows, cols, gs, (kv_grouping)grouping};
                        kv_dev_layout d = {rows, cols, gs, (kv_u32)grouping};
                        size_t groups = kv_layout_groups(&l);
                        cr_assert_eq(kv_dev_groups(d), groups);
                        for (size_t g = 0; g < groups; g++) {
                            cr_assert_eq(kv_dev_group_len(d, g), kv_layout_group_len(&l, g));
                            cr_assert_eq(kv_dev_group_offset(d, bits, g), kv_layout_group_offset(&l, bits, g));
                        }
                        cr_assert_eq(kv_dev_group_offset(d, bits, groups - 1) +
                                         kv_dev_stream_bytes(kv_dev_group_len(d, groups - 1), bits),
                                     kv_layout_packed_bytes(&l, bits));
                    }
}

/* The integer fma, rint and the float exp that the Ascend port uses instead of
   the AI Core's (undocumented) scalar math: fma and rint bit for bit against
   the host's IEEE ones, exp within 4e-7 relative on normal results. */
Test(vendors, soft_fma_rint_exp)
{
    kv_rng rng;
    kv_rng_seed(&rng, 51);
    size_t bad = 0;
    for (size_t i = 0; i < 1500000; i++) {
        uint32_t ua = (uint32_t)kv_rng_u64(&rng), ub = (uint32_t)kv_rng_u64(&rng), uc = (uint32_t)kv_rng_u64(&rng);
        if (i % 3 == 1) { /* product and addend of similar size: cancellation */
            ub = (ub & 0x807fffffu) | ((ua & 0x7f800000u) ^ 0x3f800000u);
            uc = (uc & 0x807fffffu) | (ua & 0x7f800000u);
        }
        if (i % 5 == 2) /* short significands: exact products, ties */
            ua &= 0xfffff000u, ub &= 0xfffff000u;
        if (i % 11 == 4) /* subnormal addends */
            uc &= 0x807fffffu;
        if (i % 13 == 5) { /* the dequantization pattern: code * fp16 scale + fp16 zero */
            float q = (float)(ua % 65536u);
            ua = to_bits(q);
            ub = to_bits(kv_f16_to_f32((uint16_t)(ub & 0x7bffu)));
            uc = to_bits(kv_f16_to_f32((uint16_t)(uc & 0xfbffu)));
        }
        float a = from_bits(ua), b = from_bits(ub), c = from_bits(uc);
        float want = fmaf(a, b, c), got = kv_fma_soft(a, b, c);
        bad += isnan(want) ? !isnan(got) : to_bits(got) != to_bits(want);
    }
    cr_assert_eq(bad, 0, "%zu fused multiply-adds differ", bad);
    for (uint32_t u = 0; u < 0x4b000000u; u += 101) /* every float in [0, 2^23), sampled */
        cr_assert_eq(kv_rint_soft_u32(from_bits(u)), (uint32_t)rintf(from_bits(u)), "rint %a", (double)from_bits(u));
    double worst = 0;
    for (int i = 0; i < 200000; i++) {
        float x = (float)(kv_rng_uniform(&rng) * 180.0 - 90.0), want = expf(x);
        if (want < 1.2e-38f || isinf(want))
            continue;
        double e = fabs((double)kv_exp_soft(x) - want) / want;
        worst = e > worst ? e : worst;
    }
    cr_assert(worst < 4e-7, "exp: worst relative error %.3g", worst);
    cr_assert(kv_exp_soft(-200.0f) == 0.0f && isinf(kv_exp_soft(200.0f)) && kv_exp_soft(0.0f) == 1.0f);
}

/* ---- The Ascend port, emulated on the host ----------------------------------------------- */

/* Without CANN the build makes libkvsim_ascend_emu.so: ascend_backend.cpp and
   the Ascend C dialect of the kernels compiled as host C++ against stand-in
   AscendCL/Ascend C headers (backends/ascend/emu/). It is not a backend; this
   test opens it directly and checks it against the CPU reference, which covers
   the port's host logic and its kernel dialect (one work-item per work-group,
   integer division/fma/rint, polynomial exp) — not CANN itself. */
Test(vendors, ascend_port_on_host_emulation)
{
    const char *path = KV_BINARY_DIR "/libkvsim_ascend_emu.so";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "skipped: ascend emulation: %s not built (a CANN toolkit was found instead)\n", path);
        cr_skip_test("no emulation module");
    }
    kv_module_entry_fn get = NULL;
    void *sym = dlsym(h, KV_MODULE_SYMBOL);
    memcpy(&get, &sym, sizeof get);
    cr_assert(get, "%s: no %s", path, KV_MODULE_SYMBOL);
    const kv_module_entry *e = get();
    cr_assert_eq(e->abi, KV_MODULE_ABI);
    cr_assert_eq(e->api_version, KV_BACKEND_API_VERSION);
    kv_error err = {0};
    cr_assert_eq(e->device_count(&err), 1, "%s", err.msg);
    static const kv_backend_reg emu_reg = {"ascend-emulated", NULL, NULL};
    kv_backend be = {NULL, NULL, &emu_reg, 0};
    cr_assert_eq(e->open(0, &be.iface, &be.ctx, &err), KV_OK, "%s", err.msg);
    kv_backend *ref = NULL;
    cr_assert_eq(kv_backend_open("cpu", 1, &ref, &err), KV_OK, "%s", err.msg);

    /* Quantization, packing, split and the fused encode/decode, bit for bit. */
    kv_rng rng;
    kv_rng_seed(&rng, 61);
    const kv_quant_layout layouts[] = {{7, 33, 8, KV_GROUP_TOKEN}, {33, 13, 7, KV_GROUP_CHANNEL}, {4, 128, 32, KV_GROUP_TOKEN}};
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++)
        for (unsigned bits = 2; bits <= 16; bits += 7) {
            const kv_quant_layout *l = &layouts[li];
            size_t n = (size_t)l->rows * l->cols, groups = kv_layout_groups(l);
            unsigned a = bits / 2, r = bits - a;
            size_t pa = kv_layout_packed_bytes(l, a), pr = kv_layout_packed_bytes(l, r);
            float *x = malloc(n * 4);
            for (size_t i = 0; i < n; i++)
                x[i] = i % 97 == 5 ? NAN : (float)(kv_rng_normal(&rng) * 3.0);
            void *got[2][5];
            kv_backend *bes[2] = {&be, ref};
            for (int k = 0; k < 2; k++) {
                kv_buffer *bx, *ba, *br, *bs, *bz, *bo;
                cr_assert_eq(kv_buffer_alloc(bes[k], n * 4, &bx, &err), KV_OK, "%s", err.msg);
                cr_assert_eq(kv_buffer_alloc(bes[k], pa + 1, &ba, &err), KV_OK, "%s", err.msg);
                cr_assert_eq(kv_buffer_alloc(bes[k], pr + 1, &br, &err), KV_OK, "%s", err.msg);
                cr_assert_eq(kv_buffer_alloc(bes[k], groups * 2, &bs, &err), KV_OK, "%s", err.msg);
                cr_assert_eq(kv_buffer_alloc(bes[k], groups * 2, &bz, &err), KV_OK, "%s", err.msg);
                cr_assert_eq(kv_buffer_alloc(bes[k], n * 4, &bo, &err), KV_OK, "%s", err.msg);
                cr_assert_eq(kv_buffer_write(bes[k], bx, 0, x, n * 4, &err), KV_OK, "%s", err.msg);
                kv_encode_args en = {*l, bits, a, {bx, 0}, {ba, 0}, {br, 0}, {bs, 0}, {bz, 0}};
                cr_assert_eq(kv_backend_encode(bes[k], &en, &err), KV_OK, "%s", err.msg);
                kv_decode_args de = {*l, bits, a, {ba, 0}, {br, 0}, {bs, 0}, {bz, 0}, {bo, 0}};
                cr_assert_eq(kv_backend_decode(bes[k], &de, &err), KV_OK, "%s", err.msg);
                size_t sizes[5] = {pa, pr, groups * 2, groups * 2, n * 4};
                kv_buffer *bufs[5] = {ba, br, bs, bz, bo};
                for (int j = 0; j < 5; j++) {
                    got[k][j] = malloc(sizes[j] + 1);
                    cr_assert_eq(kv_buffer_read(bes[k], bufs[j], 0, got[k][j], sizes[j], &err), KV_OK, "%s", err.msg);
                }
                for (int j = 0; j < 5; j++)
                    kv_buffer_free(bes[k], bufs[j]);
                kv_buffer_free(bes[k], bx);
            }
            const char *names[5] = {"anchor plane", "residual plane", "scale", "zero", "decoded values"};
            size_t sizes[5] = {pa, pr, groups * 2, groups * 2, n * 4};
            for (int j = 0; j < 5; j++) {
                cr_assert(memcmp(got[0][j], got[1][j], sizes[j]) == 0, "ascend emulation: %s differ (layout %zu, b=%u)",
                          names[j], li, bits);
                free(got[0][j]), free(got[1][j]);
            }
            free(x);
        }

    /* Attention (mixed formats, scores, causal) and compaction. */
    const kv_store_format mix_k[2] = {{KV_STORE_QUANT, 8, 0, KV_GROUP_TOKEN, 32}, {KV_STORE_QUANT, 2, 0, KV_GROUP_CHANNEL, 16}};
    const kv_store_format mix_v[2] = {{KV_STORE_QUANT, 16, 4, KV_GROUP_TOKEN, 64}, {KV_STORE_BF16, 0, 0, 0, 0}};
    kv_attn_spec prefill = {12, 4, 2, 64, 40, 16, mix_k, mix_v, 2, 1, 1, 17};
    attention_vs_reference(&be, ref, &prefill, "ascend emulation");
    kv_attn_spec odd = {2, 6, 3, 33, 45, 7, mix_k, mix_v, 2, 1, 0, 18};
    attention_vs_reference(&be, ref, &odd, "ascend emulation");
    compaction_vs_reference(&be, ref, "ascend emulation");

    be.iface->destroy(be.ctx);
    kv_backend_close(ref);
    dlclose(h);
}
