/* test_conformance.c — every backend built on this machine against the CPU
 * reference (device 1 of "cpu"): codes, metadata, packed bytes, split/merge,
 * fused encode/decode, dequantization, bf16 and compaction bit for bit;
 * attention within relative 1e-5. The fast CPU device (cpu:0) is tested like
 * any other backend. Backends without a usable device are printed as
 * "skipped: <backend>: <reason>". */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_fixture.h"
#include "backends/numerics.h"
#include "tests/kernels_util.h"

/* ---- The backends under test --------------------------------------------------- */

typedef struct target {
    char name[32];
    int device;
    char isa[8]; /* cpu only: "" for what the CPU picks, else forced by KVSIM_CPU_ISA (generic, avx2) */
    char divide[2]; /* cpu only: "" for what the CPU picks, else forced by KVSIM_CPU_DIVIDE (0, 1) */
} target;

static target targets[24];
static size_t n_targets;
static int targets_built;

/* Every registered backend's device 0 (the fast CPU device included). Prints
   the backends that have no device, once. */
static size_t build_targets(void)
{
    if (targets_built)
        return n_targets;
    targets_built = 1;
    for (size_t i = 0; i < kv_backend_reg_count() && n_targets < 16; i++) {
        const kv_backend_reg *reg = kv_backend_reg_get(i);
        kv_error why = {0};
        int count = reg->device_count(&why);
        if (count <= 0) {
            fprintf(stderr, "skipped: %s: %s\n", reg->name, why.msg[0] ? why.msg : "no device");
            continue;
        }
        snprintf(targets[n_targets].name, sizeof targets[n_targets].name, "%s", reg->name);
        targets[n_targets].device = 0;
        const target native = targets[n_targets++];
        if (strcmp(reg->name, "cpu") == 0) { /* and the narrower paths, which this machine does not pick */
            targets[n_targets] = targets[n_targets - 1];
            snprintf(targets[n_targets].isa, sizeof targets[n_targets].isa, "generic");
            n_targets++;
            if (getenv("KVSIM_CPU_ISA"))
                fprintf(stderr, "skipped: cpu (avx2 paths): KVSIM_CPU_ISA is set for the whole run\n");
            else if (kvt_cpu_native_is("avx512")) {
                targets[n_targets] = targets[n_targets - 1];
                snprintf(targets[n_targets].isa, sizeof targets[n_targets].isa, "avx2");
                n_targets++;
                /* the AVX-512 encode's other way to its quotients (division or reciprocal) */
                if (getenv("KVSIM_CPU_DIVIDE")) {
                    fprintf(stderr, "skipped: cpu (other quotients): KVSIM_CPU_DIVIDE is set for the whole run\n");
                } else {
                    targets[n_targets] = native;
                    snprintf(targets[n_targets].divide, sizeof targets[n_targets].divide, "%d",
                             kvt_cpu_native_is("quotients by division, avx512") ? 0 : 1);
                    n_targets++;
                }
            } else if (!kvt_cpu_native_is("avx2"))
                fprintf(stderr, "skipped: cpu (avx2 paths): this CPU has no AVX2\n");
        }
    }
    fprintf(stderr, "conformance: %zu backend(s) under test against the CPU reference (built: %s)\n", n_targets,
            kv_backend_reg_names());
    return n_targets;
}

#define BACKEND_TEST(test)                                                                                    \
    ParameterizedTestParameters(conformance, test)                                                            \
    {                                                                                                          \
        size_t n = build_targets();                                                                            \
        return cr_make_param_array(target, targets, n);                                                        \
    }                                                                                                          \
    ParameterizedTest(target *tg, conformance, test)

/* A backend under test and the reference, opened together. */
typedef struct pair {
    kv_backend *be, *ref;
    const char *name;
} pair;

static pair open_pair(const target *tg)
{
    static char label[48];
    if (tg->divide[0])
        snprintf(label, sizeof label, "%s (quotients by %s)", tg->name,
                 tg->divide[0] == '1' ? "division" : "reciprocal");
    else
        snprintf(label, sizeof label, "%s (%s paths)", tg->name, tg->isa);
    if (tg->isa[0])
        setenv("KVSIM_CPU_ISA", tg->isa, 1); /* each Criterion test runs in its own process */
    if (tg->divide[0])
        setenv("KVSIM_CPU_DIVIDE", tg->divide, 1);
    pair p = {kvt_open(tg->name, tg->device), kvt_open_reference(), tg->isa[0] || tg->divide[0] ? label : tg->name};
    kv_backend_props props;
    kv_backend_get_props(p.be, &props);
    cr_log_info("backend under test: %s (%s)", p.name, props.device);
    return p;
}

static void close_pair(pair *p)
{
    kv_backend_close(p->be);
    kv_backend_close(p->ref);
}

/* Byte-for-byte comparison with the first difference in the message. */
static void expect_same(const void *got, const void *want, size_t bytes, const char *what, const char *backend,
                        const char *ctx)
{
    const unsigned char *g = got, *w = want;
    for (size_t i = 0; i < bytes; i++)
        if (g[i] != w[i])
            cr_assert_fail("%s: %s differs from the reference at byte %zu of %zu (got 0x%02x, want 0x%02x) [%s]", backend,
                    what, i, bytes, g[i], w[i], ctx);
}

/* ---- Shapes ------------------------------------------------------------------- */

typedef struct shape {
    uint32_t rows, cols, group;
} shape;

/* Odd head_dims, group sizes that do not divide, empty matrices, G = 1, G
   larger than the dimension; channel groups longer than the AVX-512 encode's
   64-row tile ({130, 40, 100}: 100 rows, then 30). */
static const shape shapes[] = {
    {0, 8, 4},   {4, 0, 4},   {1, 1, 1},    {3, 5, 2},     {7, 33, 8},   {16, 128, 32},  {17, 127, 32},
    {5, 64, 64}, {9, 96, 40}, {64, 16, 16}, {33, 13, 7},   {2, 200, 128}, {31, 8, 300}, {12, 130, 17},
    {130, 40, 100},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static kv_quant_layout layout_of(const shape *s, kv_grouping g)
{
    kv_quant_layout l = {s->rows, s->cols, s->group, g};
    return l;
}

/* Runs quantize on a backend, returns codes, scale, zero (host copies, free them). */
static void run_quantize(kv_backend *be, const kv_quant_layout *l, unsigned bits, const float *x, uint16_t **codes,
                         uint16_t **scale, uint16_t **zero)
{
    size_t n = (size_t)l->rows * l->cols, groups = kv_layout_groups(l);
    kv_buffer *bx = kvt_put(be, x, n * 4), *bc = kvt_fill(be, n * 2, 0xa5), *bs = kvt_fill(be, groups * 2, 0xa5),
              *bz = kvt_fill(be, groups * 2, 0xa5);
    kv_quantize_args a = {*l, bits, {bx, 0}, {bc, 0}, {bs, 0}, {bz, 0}};
    kv_error err = {0};
    cr_assert_eq(kv_backend_quantize(be, &a, &err), KV_OK, "%s", err.msg);
    *codes = kvt_get(be, bc, n * 2);
    *scale = kvt_get(be, bs, groups * 2);
    *zero = kvt_get(be, bz, groups * 2);
    kv_buffer_free(be, bx);
    kv_buffer_free(be, bc);
    kv_buffer_free(be, bs);
    kv_buffer_free(be, bz);
}

BACKEND_TEST(quantize_bit_exact)
{
    pair p = open_pair(tg);
    kv_rng rng;
    kv_rng_seed(&rng, 11);
    for (size_t si = 0; si < N_SHAPES; si++)
        for (int grouping = 0; grouping < 2; grouping++)
            for (unsigned bits = 1; bits <= 16; bits++) {
                kv_quant_layout l = layout_of(&shapes[si], (kv_grouping)grouping);
                size_t n = (size_t)l.rows * l.cols, groups = kv_layout_groups(&l);
                float *x = malloc((n ? n : 1) * 4);
                kvt_values(&rng, x, n, (float)(0.01 + 10.0 * kv_rng_uniform(&rng)), bits % 3 != 0);
                uint16_t *c1, *s1, *z1, *c2, *s2, *z2;
                run_quantize(p.be, &l, bits, x, &c1, &s1, &z1);
                run_quantize(p.ref, &l, bits, x, &c2, &s2, &z2);
                char ctx[96];
                snprintf(ctx, sizeof ctx, "%ux%u G=%u %s b=%u", l.rows, l.cols, l.group_size,
                         grouping ? "channel" : "token", bits);
                expect_same(s1, s2, groups * 2, "scale", p.name, ctx);
                expect_same(z1, z2, groups * 2, "zero", p.name, ctx);
                expect_same(c1, c2, n * 2, "codes", p.name, ctx);
                free(x), free(c1), free(s1), free(z1), free(c2), free(s2), free(z2);
            }
    close_pair(&p);
}

/* Pack and unpack of random codes (with bits above b set, which must be masked). */
BACKEND_TEST(pack_unpack_bit_exact)
{
    pair p = open_pair(tg);
    kv_rng rng;
    kv_rng_seed(&rng, 12);
    kv_error err = {0};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (int grouping = 0; grouping < 2; grouping++)
            for (unsigned bits = 1; bits <= 16; bits++) {
                kv_quant_layout l = layout_of(&shapes[si], (kv_grouping)grouping);
                size_t n = (size_t)l.rows * l.cols, pb = kv_layout_packed_bytes(&l, bits);
                uint16_t *codes = malloc((n ? n : 1) * 2);
                for (size_t i = 0; i < n; i++)
                    codes[i] = (uint16_t)kv_rng_u64(&rng);
                char ctx[96];
                snprintf(ctx, sizeof ctx, "%ux%u G=%u %s b=%u", l.rows, l.cols, l.group_size,
                         grouping ? "channel" : "token", bits);
                void *packed[2], *unpacked[2];
                kv_backend *bes[2] = {p.be, p.ref};
                for (int k = 0; k < 2; k++) {
                    kv_buffer *bc = kvt_put(bes[k], codes, n * 2), *bp = kvt_fill(bes[k], pb, 0xa5);
                    kv_buffer *bu = kvt_fill(bes[k], n * 2, 0xa5);
                    kv_pack_args a = {l, bits, {bc, 0}, {bp, 0}};
                    cr_assert_eq(kv_backend_pack(bes[k], &a, &err), KV_OK, "%s", err.msg);
                    kv_pack_args u = {l, bits, {bu, 0}, {bp, 0}};
                    cr_assert_eq(kv_backend_unpack(bes[k], &u, &err), KV_OK, "%s", err.msg);
                    packed[k] = kvt_get(bes[k], bp, pb);
                    unpacked[k] = kvt_get(bes[k], bu, n * 2);
                    kv_buffer_free(bes[k], bc);
                    kv_buffer_free(bes[k], bp);
                    kv_buffer_free(bes[k], bu);
                }
                expect_same(packed[0], packed[1], pb, "packed bytes", p.name, ctx);
                expect_same(unpacked[0], unpacked[1], n * 2, "unpacked codes", p.name, ctx);
                /* and the round trip gives the masked codes back */
                const uint16_t *u = unpacked[1];
                for (size_t i = 0; i < n; i++)
                    cr_assert_eq(u[i], codes[i] & ((1u << bits) - 1u), "[%s] element %zu", ctx, i);
                free(codes), free(packed[0]), free(packed[1]), free(unpacked[0]), free(unpacked[1]);
            }
    close_pair(&p);
}

BACKEND_TEST(split_merge_bit_exact)
{
    pair p = open_pair(tg);
    kv_rng rng;
    kv_rng_seed(&rng, 13);
    kv_error err = {0};
    size_t counts[] = {0, 1, 7, 1000, 4097};
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (unsigned bits = 2; bits <= 16; bits++)
            for (unsigned a = 1; a < bits; a++) {
                size_t n = counts[ci];
                uint16_t *codes = malloc((n ? n : 1) * 2);
                for (size_t i = 0; i < n; i++)
                    codes[i] = (uint16_t)kv_rng_u64(&rng); /* bits above b must be ignored */
                void *out[2][3];
                kv_backend *bes[2] = {p.be, p.ref};
                for (int k = 0; k < 2; k++) {
                    kv_buffer *bc = kvt_put(bes[k], codes, n * 2), *ba = kvt_fill(bes[k], n * 2, 0xa5),
                              *br = kvt_fill(bes[k], n * 2, 0xa5), *bm = kvt_fill(bes[k], n * 2, 0xa5);
                    kv_split_args s = {n, bits, a, {bc, 0}, {ba, 0}, {br, 0}};
                    cr_assert_eq(kv_backend_split(bes[k], &s, &err), KV_OK, "%s", err.msg);
                    kv_split_args m = {n, bits, a, {bm, 0}, {ba, 0}, {br, 0}};
                    cr_assert_eq(kv_backend_merge(bes[k], &m, &err), KV_OK, "%s", err.msg);
                    out[k][0] = kvt_get(bes[k], ba, n * 2);
                    out[k][1] = kvt_get(bes[k], br, n * 2);
                    out[k][2] = kvt_get(bes[k], bm, n * 2);
                    kv_buffer_free(bes[k], bc), kv_buffer_free(bes[k], ba), kv_buffer_free(bes[k], br),
                        kv_buffer_free(bes[k], bm);
                }
                char ctx[64];
                snprintf(ctx, sizeof ctx, "n=%zu b=%u a=%u", n, bits, a);
                expect_same(out[0][0], out[1][0], n * 2, "anchor", p.name, ctx);
                expect_same(out[0][1], out[1][1], n * 2, "residual", p.name, ctx);
                expect_same(out[0][2], out[1][2], n * 2, "merged", p.name, ctx);
                const uint16_t *merged = out[1][2];
                for (size_t i = 0; i < n; i++)
                    cr_assert_eq(merged[i], codes[i] & ((1u << bits) - 1u), "[%s] merge(split(q)) != q", ctx);
                free(codes);
                for (int k = 0; k < 2; k++)
                    for (int j = 0; j < 3; j++)
                        free(out[k][j]);
            }
    close_pair(&p);
}

/* The fused encode (quantize + split + pack) and every decode form: full,
   merged from anchor + residual, and anchor-only (midpoint); then the plain
   dequantize kernel on the same codes. */
typedef struct encoded {
    void *anchor, *residual, *scale, *zero;
    void *full, *anchor_only; /* decoded f32 */
} encoded;

static encoded run_encode_decode(kv_backend *be, const kv_quant_layout *l, unsigned bits, unsigned a,
                                 const float *x)
{
    size_t n = (size_t)l->rows * l->cols, groups = kv_layout_groups(l);
    unsigned aw = a ? a : bits;
    size_t pa = kv_layout_packed_bytes(l, aw), pr = a ? kv_layout_packed_bytes(l, bits - a) : 0;
    kv_buffer *bx = kvt_put(be, x, n * 4), *ba = kvt_fill(be, pa, 0xa5), *br = a ? kvt_fill(be, pr, 0xa5) : NULL;
    kv_buffer *bs = kvt_fill(be, groups * 2, 0xa5), *bz = kvt_fill(be, groups * 2, 0xa5);
    kv_buffer *bo = kvt_fill(be, n * 4, 0xa5), *bo2 = kvt_fill(be, n * 4, 0xa5);
    kv_error err = {0};
    kv_encode_args e = {*l, bits, a, {bx, 0}, {ba, 0}, {br, 0}, {bs, 0}, {bz, 0}};
    cr_assert_eq(kv_backend_encode(be, &e, &err), KV_OK, "%s", err.msg);
    kv_decode_args d = {*l, bits, a, {ba, 0}, {br, 0}, {bs, 0}, {bz, 0}, {bo, 0}};
    cr_assert_eq(kv_backend_decode(be, &d, &err), KV_OK, "%s", err.msg);
    encoded r = {kvt_get(be, ba, pa), a ? kvt_get(be, br, pr) : NULL, kvt_get(be, bs, groups * 2),
                 kvt_get(be, bz, groups * 2), kvt_get(be, bo, n * 4), NULL};
    if (a) {
        kv_decode_args d2 = {*l, bits, a, {ba, 0}, {NULL, 0}, {bs, 0}, {bz, 0}, {bo2, 0}};
        cr_assert_eq(kv_backend_decode(be, &d2, &err), KV_OK, "%s", err.msg);
        r.anchor_only = kvt_get(be, bo2, n * 4);
    }
    kv_buffer_free(be, bx), kv_buffer_free(be, ba), kv_buffer_free(be, br), kv_buffer_free(be, bs);
    kv_buffer_free(be, bz), kv_buffer_free(be, bo), kv_buffer_free(be, bo2);
    return r;
}

static void free_encoded(encoded *e)
{
    free(e->anchor), free(e->residual), free(e->scale), free(e->zero), free(e->full), free(e->anchor_only);
}

/* Quotients that are exact half-integers, where a reciprocal multiply would
   round the other way: s = 3, x = 3k + 1.5, so (x − z) / s = k + 0.5 exactly
   (ties to even), while x · fl(1/3) lands an ulp off; and odd scales. */
BACKEND_TEST(quantize_half_integer_quotients)
{
    pair p = open_pair(tg);
    const float scales[] = {3.0f, 7.0f, 0.1f, 1.0f / 3.0f, 5.5f};
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++)
        for (unsigned bits = 2; bits <= 12; bits += 2) {
            kv_quant_layout l = {64, 64, 32, KV_GROUP_TOKEN};
            size_t n = 64 * 64, groups = kv_layout_groups(&l);
            float *x = malloc(n * 4), s = kv_f16_to_f32(kv_f16_from_f32(scales[si])), top = (float)((1u << bits) - 1);
            for (size_t i = 0; i < n; i++) {
                size_t k = i % 32;
                /* each group spans [0, top·s] (so the stored scale is s) and holds half-integer multiples */
                x[i] = k == 0 ? 0.0f : k == 31 ? top * s : s * ((float)((i * 7 + k) % (1u << bits)) + 0.5f);
            }
            uint16_t *c1, *s1, *z1, *c2, *s2, *z2;
            run_quantize(p.be, &l, bits, x, &c1, &s1, &z1);
            run_quantize(p.ref, &l, bits, x, &c2, &s2, &z2);
            char ctx[64];
            snprintf(ctx, sizeof ctx, "s=%g b=%u", (double)s, bits);
            expect_same(s1, s2, groups * 2, "scale", p.name, ctx);
            expect_same(c1, c2, n * 2, "codes", p.name, ctx);
            encoded e1 = run_encode_decode(p.be, &l, bits, 0, x), e2 = run_encode_decode(p.ref, &l, bits, 0, x);
            expect_same(e1.anchor, e2.anchor, kv_layout_packed_bytes(&l, bits), "packed plane", p.name, ctx);
            free_encoded(&e1);
            free_encoded(&e2);
            free(x), free(c1), free(s1), free(z1), free(c2), free(s2), free(z2);
        }
    close_pair(&p);
}

/* Constant and non-finite groups: every value equal (scale 0), all NaN, all
   +Inf, ±0 mixtures, and huge values whose metadata saturates. */
BACKEND_TEST(quantize_constant_and_nonfinite_groups)
{
    pair p = open_pair(tg);
    const float fills[][4] = {{1.5f, 1.5f, 1.5f, 1.5f},        {NAN, NAN, NAN, NAN},
                              {INFINITY, 2.0f, 2.0f, -INFINITY}, {-0.0f, 0.0f, -0.0f, 0.0f},
                              {-1e6f, 3e38f, 7.0f, NAN},        {65520.0f, 65504.0f, -65520.0f, 1e-8f}};
    for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++)
        for (int grouping = 0; grouping < 2; grouping++)
            for (unsigned bits = 1; bits <= 16; bits += 3) {
                kv_quant_layout l = {32, 64, 16, (kv_grouping)grouping};
                size_t n = 32 * 64, groups = kv_layout_groups(&l);
                float *x = malloc(n * 4);
                for (size_t i = 0; i < n; i++) /* whole groups share one pattern value in token layout */
                    x[i] = fills[f][grouping ? ((i / 64) / 16 + i % 64) % 4 : (i % 64) / 16];
                uint16_t *c1, *s1, *z1, *c2, *s2, *z2;
                run_quantize(p.be, &l, bits, x, &c1, &s1, &z1);
                run_quantize(p.ref, &l, bits, x, &c2, &s2, &z2);
                char ctx[64];
                snprintf(ctx, sizeof ctx, "fill %zu %s b=%u", f, grouping ? "channel" : "token", bits);
                expect_same(s1, s2, groups * 2, "scale", p.name, ctx);
                expect_same(z1, z2, groups * 2, "zero", p.name, ctx);
                expect_same(c1, c2, n * 2, "codes", p.name, ctx);
                encoded e1 = run_encode_decode(p.be, &l, bits, bits > 1 ? 1 : 0, x);
                encoded e2 = run_encode_decode(p.ref, &l, bits, bits > 1 ? 1 : 0, x);
                expect_same(e1.anchor, e2.anchor, kv_layout_packed_bytes(&l, bits > 1 ? 1 : bits), "anchor plane",
                            p.name, ctx);
                expect_same(e1.full, e2.full, n * 4, "decoded values", p.name, ctx);
                free_encoded(&e1);
                free_encoded(&e2);
                free(x), free(c1), free(s1), free(z1), free(c2), free(s2), free(z2);
            }
    close_pair(&p);
}

BACKEND_TEST(encode_decode_bit_exact)
{
    pair p = open_pair(tg);
    kv_rng rng;
    kv_rng_seed(&rng, 14);
    for (size_t si = 0; si < N_SHAPES; si++)
        for (int grouping = 0; grouping < 2; grouping++)
            for (unsigned bits = 1; bits <= 16; bits++)
                for (unsigned a = 0; a < bits; a += (bits > 8 ? 3 : 1)) {
                    kv_quant_layout l = layout_of(&shapes[si], (kv_grouping)grouping);
                    size_t n = (size_t)l.rows * l.cols, groups = kv_layout_groups(&l);
                    float *x = malloc((n ? n : 1) * 4);
                    kvt_values(&rng, x, n, 2.0f, (bits + a) % 2);
                    encoded e1 = run_encode_decode(p.be, &l, bits, a, x);
                    encoded e2 = run_encode_decode(p.ref, &l, bits, a, x);
                    char ctx[96];
                    snprintf(ctx, sizeof ctx, "%ux%u G=%u %s b=%u a=%u", l.rows, l.cols, l.group_size,
                             grouping ? "channel" : "token", bits, a);
                    expect_same(e1.scale, e2.scale, groups * 2, "scale", p.name, ctx);
                    expect_same(e1.zero, e2.zero, groups * 2, "zero", p.name, ctx);
                    expect_same(e1.anchor, e2.anchor, kv_layout_packed_bytes(&l, a ? a : bits),
                                a ? "anchor plane" : "packed plane", p.name, ctx);
                    if (a)
                        expect_same(e1.residual, e2.residual, kv_layout_packed_bytes(&l, bits - a),
                                    "residual plane", p.name, ctx);
                    expect_same(e1.full, e2.full, n * 4, "decoded values", p.name, ctx);
                    if (a)
                        expect_same(e1.anchor_only, e2.anchor_only, n * 4, "anchor-only values", p.name, ctx);
                    free_encoded(&e1);
                    free_encoded(&e2);
                    free(x);
                }
    close_pair(&p);
}

/* dequantize of arbitrary codes (bits above the width must be ignored) with
   arbitrary finite metadata, full and anchor-only. */
BACKEND_TEST(dequantize_bit_exact)
{
    pair p = open_pair(tg);
    kv_rng rng;
    kv_rng_seed(&rng, 15);
    kv_error err = {0};
    for (size_t si = 0; si < N_SHAPES; si++)
        for (unsigned bits = 1; bits <= 16; bits++)
            for (unsigned a = 0; a < bits; a += 2) {
                kv_quant_layout l = layout_of(&shapes[si], (kv_grouping)(bits % 2));
                size_t n = (size_t)l.rows * l.cols, groups = kv_layout_groups(&l);
                uint16_t *codes = malloc((n ? n : 1) * 2), *meta = malloc((groups ? groups : 1) * 4);
                for (size_t i = 0; i < n; i++)
                    codes[i] = (uint16_t)kv_rng_u64(&rng);
                for (size_t i = 0; i < 2 * groups; i++) {
                    uint16_t h;
                    do
                        h = (uint16_t)kv_rng_u64(&rng);
                    while ((h & 0x7c00u) == 0x7c00u); /* finite metadata */
                    meta[i] = h;
                }
                void *out[2];
                kv_backend *bes[2] = {p.be, p.ref};
                for (int k = 0; k < 2; k++) {
                    kv_buffer *bc = kvt_put(bes[k], codes, n * 2), *bm = kvt_put(bes[k], meta, groups * 4);
                    kv_buffer *bo = kvt_fill(bes[k], n * 4, 0xa5);
                    kv_dequantize_args d = {l, bits, a, {bc, 0}, {bm, 0}, {bm, groups * 2}, {bo, 0}};
                    cr_assert_eq(kv_backend_dequantize(bes[k], &d, &err), KV_OK, "%s", err.msg);
                    out[k] = kvt_get(bes[k], bo, n * 4);
                    kv_buffer_free(bes[k], bc), kv_buffer_free(bes[k], bm), kv_buffer_free(bes[k], bo);
                }
                char ctx[64];
                snprintf(ctx, sizeof ctx, "%ux%u G=%u b=%u a=%u", l.rows, l.cols, l.group_size, bits, a);
                expect_same(out[0], out[1], n * 4, "dequantized values", p.name, ctx);
                free(codes), free(meta), free(out[0]), free(out[1]);
            }
    close_pair(&p);
}

BACKEND_TEST(bf16_bit_exact)
{
    pair p = open_pair(tg);
    kv_rng rng;
    kv_rng_seed(&rng, 16);
    kv_error err = {0};
    size_t n = 100000;
    float *x = malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)kv_rng_u64(&rng); /* every bit pattern: NaNs, subnormals, Inf */
        if (i % 3 == 0)
            u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
        memcpy(&x[i], &u, 4);
    }
    void *out[2];
    kv_backend *bes[2] = {p.be, p.ref};
    for (int k = 0; k < 2; k++) {
        kv_buffer *bi = kvt_put(bes[k], x, n * 4), *bo = kvt_fill(bes[k], n * 4, 0xa5);
        kv_bf16_args a = {n, {bi, 0}, {bo, 0}};
        cr_assert_eq(kv_backend_bf16_round(bes[k], &a, &err), KV_OK, "%s", err.msg);
        out[k] = kvt_get(bes[k], bo, n * 4);
        kv_buffer_free(bes[k], bi), kv_buffer_free(bes[k], bo);
    }
    expect_same(out[0], out[1], n * 4, "bf16 values", p.name, "random bit patterns");
    free(x), free(out[0]), free(out[1]);
    close_pair(&p);
}

/* A long random run of allocations and releases on both backends: offsets,
   pages, the free list and the state must agree after every step. */
BACKEND_TEST(compaction_bit_exact)
{
    pair p = open_pair(tg);
    kv_rng rng;
    kv_rng_seed(&rng, 17);
    kv_error err = {0};
    uint32_t capacity = 1000, n = 48;
    uint32_t *free_list = malloc(capacity * 4);
    for (uint32_t i = 0; i < capacity; i++)
        free_list[i] = i * 7 + 3;
    uint32_t state[4] = {0, 0, capacity, 0};
    kv_backend *bes[2] = {p.be, p.ref};
    kv_buffer *fl[2], *st[2], *dm[2], *of[2], *pg[2];
    for (int k = 0; k < 2; k++) {
        fl[k] = kvt_put(bes[k], free_list, capacity * 4);
        st[k] = kvt_put(bes[k], state, 16);
        dm[k] = kvt_fill(bes[k], n * 4, 0);
        of[k] = kvt_fill(bes[k], n * 4, 0);
        pg[k] = kvt_fill(bes[k], capacity * 4 * 2, 0);
    }
    /* allocations outstanding, to release later: (demand vector, pages) */
    for (int step = 0; step < 300; step++) {
        uint32_t demand[48];
        int release = step % 2 == 1;
        uint32_t cap_each = release ? 5 : 12;
        for (uint32_t i = 0; i < n; i++)
            demand[i] = (uint32_t)kv_rng_below(&rng, cap_each + 1) * (kv_rng_below(&rng, 4) != 0);
        if (step % 37 == 0)
            memset(demand, 0, sizeof demand);
        void *res[2][4];
        uint32_t total = 0;
        for (uint32_t i = 0; i < n; i++)
            total += demand[i];
        for (int k = 0; k < 2; k++) {
            cr_assert_eq(kv_buffer_write(bes[k], dm[k], 0, demand, n * 4, &err), KV_OK, "%s", err.msg);
            if (release) { /* give back pages that were handed out: some of the last allocation */
                uint32_t *pages = kvt_get(bes[k], pg[k], capacity * 4);
                cr_assert_eq(kv_buffer_write(bes[k], pg[k], capacity * 4, pages, capacity * 4, &err), KV_OK);
                free(pages);
            }
            kv_compact_args a = {n, capacity, {dm[k], 0}, {of[k], 0}, {pg[k], release ? capacity * 4 : 0},
                                 {fl[k], 0}, {st[k], 0}};
            int rc = release ? kv_backend_compact_release(bes[k], &a, &err) : kv_backend_compact_alloc(bes[k], &a, &err);
            cr_assert_eq(rc, KV_OK, "%s", err.msg);
            res[k][0] = kvt_get(bes[k], of[k], n * 4);
            res[k][1] = kvt_get(bes[k], pg[k], capacity * 4 * 2);
            res[k][2] = kvt_get(bes[k], fl[k], capacity * 4);
            res[k][3] = kvt_get(bes[k], st[k], 16);
        }
        char ctx[64];
        snprintf(ctx, sizeof ctx, "step %d (%s, %u pages)", step, release ? "release" : "alloc", total);
        expect_same(res[0][0], res[1][0], n * 4, "offsets", p.name, ctx);
        expect_same(res[0][1], res[1][1], capacity * 8, "pages", p.name, ctx);
        expect_same(res[0][2], res[1][2], capacity * 4, "free list", p.name, ctx);
        expect_same(res[0][3], res[1][3], 16, "state", p.name, ctx);
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 4; j++)
                free(res[k][j]);
    }
    for (int k = 0; k < 2; k++) {
        kv_buffer_free(bes[k], fl[k]), kv_buffer_free(bes[k], st[k]), kv_buffer_free(bes[k], dm[k]);
        kv_buffer_free(bes[k], of[k]), kv_buffer_free(bes[k], pg[k]);
    }
    free(free_list);
    close_pair(&p);
}

/* ---- Attention ------------------------------------------------------------------ */

#define F32 {KV_STORE_F32, 0, 0, 0, 0}
#define BF16 {KV_STORE_BF16, 0, 0, 0, 0}
#define Q(bits, g) {KV_STORE_QUANT, bits, 0, KV_GROUP_TOKEN, g}
#define QC(bits, g) {KV_STORE_QUANT, bits, 0, KV_GROUP_CHANNEL, g}
#define QA(bits, a, g) {KV_STORE_QUANT, bits, a, KV_GROUP_TOKEN, g}

typedef struct attn_case {
    const char *name;
    uint32_t n_queries, n_heads, n_kv_heads, head_dim, tokens, page_tokens;
    kv_store_format k[4], v[4];
    uint32_t n_formats;
    int scores, empty_pages;
} attn_case;

static const attn_case attn_cases[] = {
    {"decode f32 gqa4", 1, 8, 2, 64, 100, 16, {F32}, {F32}, 1, 1, 0},
    {"decode bf16", 1, 4, 4, 32, 77, 32, {BF16}, {BF16}, 1, 0, 0},
    {"decode int8 g32", 1, 8, 2, 128, 300, 64, {Q(8, 32)}, {Q(8, 32)}, 1, 1, 0},
    {"decode int4 g32", 1, 8, 2, 128, 257, 32, {Q(4, 32)}, {Q(4, 32)}, 1, 0, 0},
    {"decode kivi2 channel keys", 1, 4, 1, 64, 130, 32, {QC(2, 32)}, {Q(2, 32)}, 1, 1, 0},
    {"decode diffkv mix (K8V4 / K4V2 / bf16)", 1, 8, 2, 64, 200, 16,
     {Q(8, 64), Q(4, 64), BF16}, {Q(4, 64), Q(2, 64), BF16}, 3, 1, 0},
    {"decode lynx anchor-only pages", 1, 4, 2, 64, 96, 16, {QA(8, 4, 32), Q(8, 32)}, {QA(16, 4, 64), Q(16, 64)},
     2, 1, 0},
    {"odd head_dim 33, groups that do not divide", 1, 6, 3, 33, 45, 7, {Q(5, 10), QC(3, 4)}, {Q(7, 16), F32}, 2,
     1, 1},
    {"verify k=4 causal", 4, 8, 2, 64, 120, 16, {Q(8, 32), Q(4, 32)}, {Q(4, 32), Q(2, 32)}, 2, 1, 0},
    {"prefill causal", 48, 4, 1, 32, 48, 16, {Q(8, 16)}, {Q(8, 16)}, 1, 1, 1},
    {"mha no gqa, b=16 and b=1", 2, 3, 3, 16, 40, 8, {Q(16, 8), Q(1, 4)}, {Q(1, 16), Q(16, 3)}, 2, 1, 0},
    {"2-bit and 2-bit-anchor pages, head_dim 128, G 32", 2, 8, 2, 128, 70, 16, {Q(2, 32), QA(4, 2, 32), Q(4, 32)},
     {QA(6, 2, 32), Q(2, 32), Q(2, 128)}, 3, 1, 0},
};
#define N_ATTN (sizeof attn_cases / sizeof attn_cases[0])

BACKEND_TEST(attention_within_1e5)
{
    pair p = open_pair(tg);
    for (size_t ci = 0; ci < N_ATTN; ci++) {
        const attn_case *c = &attn_cases[ci];
        kv_attn_spec spec = {c->n_queries, c->n_heads, c->n_kv_heads, c->head_dim, c->tokens, c->page_tokens,
                             c->k, c->v, c->n_formats, c->scores, c->empty_pages, 100 + ci};
        double e, es;
        kvt_attention_errors(p.be, p.ref, &spec, 0, 0, 0, c->name, &e, &es);
        cr_expect(e <= 1e-5, "%s: attention output differs from the reference by %.3g relative [%s]", p.name, e,
                  c->name);
        cr_expect(es <= 1e-5, "%s: scores differ from the reference by %.3g relative [%s]", p.name, es, c->name);
    }
    close_pair(&p);
}
