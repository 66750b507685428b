/* kernels_util.h — header-only helpers for the kernel tests: backend buffers
 * from host arrays and back, one attention problem on two backends compared, and test inputs with the awkward values the
 * numerics must handle (NaN, ±Inf, −0, constant groups, fp16 overflow). */
#ifndef KV_TESTS_KERNELS_UTIL_H
#define KV_TESTS_KERNELS_UTIL_H

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "backends/numerics.h"
#include "core/base/rng.h"

/* A backend buffer holding a copy of host bytes (bytes may be 0: one byte is allocated). */
static inline kv_buffer *kvt_put(kv_backend *be, const void *src, size_t bytes)
{
    kv_buffer *b = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_buffer_alloc(be, bytes ? bytes : 1, &b, &err), KV_OK, "%s", err.msg);
    if (bytes && src)
        cr_assert_eq(kv_buffer_write(be, b, 0, src, bytes, &err), KV_OK, "%s", err.msg);
    return b;
}

/* A backend buffer of `bytes` filled with `fill` (to catch bytes a kernel forgot to write). */
static inline kv_buffer *kvt_fill(kv_backend *be, size_t bytes, unsigned char fill)
{
    unsigned char *tmp = malloc(bytes ? bytes : 1);
    memset(tmp, fill, bytes ? bytes : 1);
    kv_buffer *b = kvt_put(be, tmp, bytes ? bytes : 1);
    free(tmp);
    return b;
}

/* Synchronises and reads bytes back into a fresh host array (free it). */
static inline void *kvt_get(kv_backend *be, kv_buffer *b, size_t bytes)
{
    kv_error err = {0};
    cr_assert_eq(kv_backend_synchronize(be, &err), KV_OK, "%s", err.msg);
    void *dst = malloc(bytes ? bytes : 1);
    if (bytes)
        cr_assert_eq(kv_buffer_read(be, b, 0, dst, bytes, &err), KV_OK, "%s", err.msg);
    return dst;
}

static inline kv_backend *kvt_open(const char *name, int device)
{
    kv_backend *be = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_backend_open(name, device, &be, &err), KV_OK, "%s", err.msg);
    return be;
}

/* Whether the fast CPU device picks the instruction set isa ("avx512", "avx2",
   "generic") on this machine when nothing forces one. Outside a test too. */
static inline int kvt_cpu_native_is(const char *isa)
{
    kv_backend *be = NULL;
    kv_error err = {0};
    if (getenv("KVSIM_CPU_ISA") || kv_backend_open("cpu", 0, &be, &err) != KV_OK)
        return 0;
    kv_backend_props props;
    kv_backend_get_props(be, &props);
    char want[48];
    snprintf(want, sizeof want, ", %s)", isa); /* the device reads "CPU (N threads, ISA)" */
    int is = strstr(props.device, want) != NULL;
    kv_backend_close(be);
    return is;
}

/* The oracle: the CPU reference device. */
static inline kv_backend *kvt_open_reference(void)
{
    return kvt_open("cpu", 1);
}

/* Forces cpu:0 onto its AVX2 paths (KVSIM_CPU_ISA=avx2; on an AVX2-only CPU
   that is the native choice), or skips the calling test visibly ("skipped:
   no AVX2" on stderr) where this CPU has neither AVX2 nor AVX-512. Call it
   before anything else sets KVSIM_CPU_ISA. */
static inline void kvt_force_cpu_avx2(void)
{
    if (!kvt_cpu_native_is("avx2") && !kvt_cpu_native_is("avx512")) {
        fprintf(stderr, "skipped: no AVX2\n");
        cr_skip_test("skipped: no AVX2");
    }
    setenv("KVSIM_CPU_ISA", "avx2", 1); /* each Criterion test runs in its own process */
}

/* Asserts that cpu:0 (be) runs the instruction set isa, as its device name says. */
static inline void kvt_expect_cpu_isa(kv_backend *be, const char *isa)
{
    kv_backend_props props;
    kv_backend_get_props(be, &props);
    char want[48];
    snprintf(want, sizeof want, ", %s)", isa);
    cr_assert(strstr(props.device, want) != NULL, "cpu:0 runs \"%s\", not the %s paths", props.device, isa);
}

/* Skips the calling test (visibly: "skipped: opencl: ..." on stderr) when no OpenCL device is usable. */
static inline void kvt_require_opencl(void)
{
    const kv_backend_reg *reg = kv_backend_reg_find("opencl");
    kv_error why = {0};
    if (!reg) {
        fprintf(stderr, "skipped: opencl: not built\n");
        cr_skip_test("opencl: not built");
    }
    if (reg->device_count(&why) <= 0) {
        fprintf(stderr, "skipped: opencl: %s\n", why.msg[0] ? why.msg : "no device");
        cr_skip_test("opencl: no device");
    }
}

/* opencl:0 opened with environment variable var set to value for the open (value NULL: unset). */
static inline kv_backend *kvt_open_opencl_with(const char *var, const char *value)
{
    if (value)
        setenv(var, value, 1);
    kv_backend *be = NULL;
    kv_error err = {0};
    int rc = kv_backend_open("opencl", 0, &be, &err);
    unsetenv(var);
    cr_assert_eq(rc, KV_OK, "opencl (%s %s): %s", var, value ? value : "default", err.msg);
    return be;
}

/* Test values: mostly normal(0, sd) with, when `awkward` is set, a sprinkling
   of NaN, ±Inf, ±0, huge values (fp16 overflow), tiny values (fp16
   subnormals) and runs of equal values (constant groups). */
static inline void kvt_values(kv_rng *rng, float *x, size_t n, float sd, int awkward)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(kv_rng_normal(rng) * sd);
        if (!awkward)
            continue;
        uint64_t k = kv_rng_below(rng, 200);
        switch (k) {
        case 0: x[i] = NAN; break;
        case 1: x[i] = INFINITY; break;
        case 2: x[i] = -INFINITY; break;
        case 3: x[i] = -0.0f; break;
        case 4: x[i] = 0.0f; break;
        case 5: x[i] = (float)(kv_rng_normal(rng) * 1e6); break;
        case 6: x[i] = (float)(kv_rng_normal(rng) * 1e-6); break;
        case 7: x[i] = 3.0e38f; break;
        case 8: x[i] = -3.0e38f; break;
        default: break;
        }
        if (k >= 9 && k < 30 && i > 0)
            x[i] = x[i - 1]; /* runs: constant groups */
    }
}

/* The first differing byte of two arrays, or -1. */
static inline long kvt_first_diff(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i])
            return (long)i;
    return -1;
}

/* The problem `spec` solved on be and on ref, its queries first scaled by
   kv_attn_problem_scale_q(q_stride, big, small) when q_stride > 0: *out_err gets
   the outputs' relative error, *score_err the scores' per KV head (0 without
   spec->scores). label names the case when a step fails. */
static inline void kvt_attention_errors(kv_backend *be, kv_backend *ref, const kv_attn_spec *spec, uint32_t q_stride,
                                        float big, float small, const char *label, double *out_err,
                                        double *score_err)
{
    kv_attn_problem *prob = NULL;
    kv_error err = {0};
    cr_assert_eq(kv_attn_problem_create(spec, &prob, &err), KV_OK, "%s: %s", label, err.msg);
    if (q_stride)
        kv_attn_problem_scale_q(prob, q_stride, big, small);
    size_t no = kv_attn_problem_out_floats(prob), ns = kv_attn_problem_score_floats(prob);
    float *o[2] = {malloc(no * 4 + 4), malloc(no * 4 + 4)}, *sc[2] = {malloc(ns * 4 + 4), malloc(ns * 4 + 4)};
    cr_assert(o[0] && o[1] && sc[0] && sc[1]);
    kv_backend *bes[2] = {be, ref};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(kv_attn_solve(prob, bes[i], o[i], sc[i], &err), KV_OK, "%s: %s", label, err.msg);
    *out_err = kv_attn_rel_error(o[0], o[1], (size_t)spec->n_queries * spec->n_heads, spec->head_dim);
    *score_err = spec->scores ? kv_attn_rel_error(sc[0], sc[1], spec->n_kv_heads, spec->tokens) : 0.0;
    free(o[0]), free(o[1]), free(sc[0]), free(sc[1]);
    kv_attn_problem_destroy(prob);
}

/* Attention of `n_queries` x `n_heads` query rows (head_dim each, one KV head) over one page `pg`
   whose K and V bytes are `kv`, on `be`: the output rows into o (label names the case on failure). */
static inline void kvt_attention_page(kv_backend *be, const char *label, uint32_t n_queries, uint32_t n_heads,
                                      uint32_t head_dim, uint32_t ntok, const uint8_t *kv, size_t kv_bytes,
                                      const kv_page_desc *pg, const float *q, const uint32_t *qpos,
                                      const uint32_t *pos, float *o)
{
    size_t nq = (size_t)n_queries * n_heads * head_dim;
    uint32_t hp[2] = {0, 1};
    kv_buffer *bq = kvt_put(be, q, nq * 4), *bqp = kvt_put(be, qpos, n_queries * 4),
              *bpg = kvt_put(be, pg, sizeof *pg), *bhp = kvt_put(be, hp, sizeof hp),
              *bpos = kvt_put(be, pos, ntok * 4), *bkv = kvt_put(be, kv, kv_bytes), *bo = kvt_fill(be, nq * 4, 0xa5);
    kv_attention_args a = {n_queries, n_heads, 1, head_dim, 1, 0, 0.125f, {bq, 0}, {bqp, 0}, {bpg, 0},
                           {bhp, 0}, {bpos, 0}, {bkv, 0}, {bo, 0}, {NULL, 0}};
    kv_error err = {0};
    cr_assert_eq(kv_backend_attention(be, &a, &err), KV_OK, "%s: %s", label, err.msg);
    float *got = kvt_get(be, bo, nq * 4);
    memcpy(o, got, nq * 4);
    free(got);
    kv_buffer_free(be, bq), kv_buffer_free(be, bqp), kv_buffer_free(be, bpg), kv_buffer_free(be, bhp);
    kv_buffer_free(be, bpos), kv_buffer_free(be, bkv), kv_buffer_free(be, bo);
}

/* The relative error of attention over one page (kvt_attention_page) on be against ref. The
   queries are normal(q_seed) x q_scale, token t sits at position t, and query row j at qpos[j],
   or at ntok - n_queries + j (the last tokens: masks in the last tile) when qpos is NULL. */
static inline double kvt_page_error(kv_backend *be, kv_backend *ref, const char *label, uint32_t n_queries,
                                    uint32_t n_heads, uint32_t head_dim, uint32_t ntok, const uint8_t *kv,
                                    size_t kv_bytes, const kv_page_desc *pg, uint64_t q_seed, float q_scale,
                                    const uint32_t *qpos)
{
    size_t nq = (size_t)n_queries * n_heads * head_dim;
    float *q = malloc(nq * 4), *o1 = malloc(nq * 4), *o2 = malloc(nq * 4);
    uint32_t *pos = malloc((size_t)ntok * 4), *qp = malloc((size_t)n_queries * 4);
    cr_assert(q && o1 && o2 && pos && qp);
    kv_fixture_normal(q, nq, q_seed);
    for (size_t j = 0; j < nq; j++)
        q[j] *= q_scale;
    for (uint32_t t = 0; t < ntok; t++)
        pos[t] = t;
    for (uint32_t j = 0; j < n_queries; j++)
        qp[j] = qpos ? qpos[j] : ntok - n_queries + j;
    kvt_attention_page(be, label, n_queries, n_heads, head_dim, ntok, kv, kv_bytes, pg, q, qp, pos, o1);
    kvt_attention_page(ref, label, n_queries, n_heads, head_dim, ntok, kv, kv_bytes, pg, q, qp, pos, o2);
    double e = kv_attn_rel_error(o1, o2, (size_t)n_queries * n_heads, head_dim);
    free(q), free(o1), free(o2), free(pos), free(qp);
    return e;
}

/* Codec test inputs (the CPU SIMD codec tests): kvt_values, then per mode
   the values that reach the numerics' edge cases. */
enum { KVT_MODE_AWKWARD, KVT_MODE_TIES, KVT_MODE_CONSTANT, KVT_MODE_EXTREMES, KVT_MODE_SUBNORMAL, KVT_N_MODES };
static inline const char *kvt_mode_name(int mode)
{
    static const char *const names[KVT_N_MODES] = {"awkward values", "rounding ties", "constant groups", "extremes",
                                                   "subnormal scales"};
    return mode >= 0 && mode < KVT_N_MODES ? names[mode] : "?";
}
/* n values of groups of G (token groups, consecutive) for `mode`. Ties: each
   group spans exactly [0, (2^b − 1)/16], so s = 1/16 and z = 0 are exact in
   fp16 and every value k/32 is a code or an exact half-way point. */
static inline void kvt_codec_values(kv_rng *rng, float *x, size_t n, uint32_t G, unsigned b, int mode)
{
    kvt_values(rng, x, n, 2.0f, mode == KVT_MODE_AWKWARD);
    uint32_t max = kv_code_max(b);
    for (size_t i = 0; i < n; i++) {
        size_t at = i % G;
        switch (mode) {
        case KVT_MODE_TIES:
            x[i] = at == 0 ? 0.0f : at == 1 ? (float)max / 16.0f : (float)kv_rng_below(rng, 2 * (uint64_t)max + 1) / 32.0f;
            break;
        case KVT_MODE_CONSTANT: /* group by group: a value, +Inf (code 2^b − 1) with NaN, NaN only, −0 and +0 */
            x[i] = (i / G) % 4 == 0   ? 1.25f
                   : (i / G) % 4 == 1 ? (at % 5 ? INFINITY : NAN)
                   : (i / G) % 4 == 2 ? NAN
                                      : (at % 2 ? -0.0f : 0.0f);
            break;
        case KVT_MODE_EXTREMES:
            x[i] = at % 7 == 0 ? FLT_MAX : at % 7 == 1 ? -FLT_MAX : at % 7 == 2 ? FLT_MIN : x[i];
            break;
        case KVT_MODE_SUBNORMAL: /* ranges of about 1e-5: scales below 2^-14 */
            x[i] = (float)kv_rng_below(rng, 1000) * 1e-8f - 3e-6f;
            break;
        default: break;
        }
    }
}

#endif
