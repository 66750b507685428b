/* test_cpu_avx2_codecs.c — the fast CPU device's AVX2 codecs (cpu_fast_avx2.c,
 * #22) bit for bit against the reference (cpu:1): encode (plain and split),
 * decode (merged and anchor-only), quantize, dequantize, pack and unpack, for
 * token and channel (KIVI) groups, every width 1..16 and anchors 1, w/2 and
 * w − 1, group sizes 8, 16, 24, 40 and 128, shapes that end an 8-group batch
 * early (9 groups: a batch of 8 and one of 1; 6 groups: one short batch),
 * rows the groups do not tile (the portable path on the same device) and
 * channel pieces of 8, 5 and 3 columns with full and short blocks, and values with NaN/±Inf/±0/huge/
 * tiny and constant runs, exact rounding ties, constant groups, ±FLT_MAX and
 * fp16-subnormal scales. Every output starts filled with 0xA5 and has guard
 * bytes past its end that must stay 0xA5. The device runs its AVX2 paths
 * natively on an AVX2 CPU and forced (KVSIM_CPU_ISA=avx2) on an AVX-512 one;
 * without AVX2 the test is skipped, visibly. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/numerics.h"
#include "tests/kernels_util.h"

enum { GUARD = 64 }; /* bytes past each output's end that must stay 0xA5 */


enum { OP_ENCODE, OP_DECODE, OP_DECODE_ANCHOR, OP_QUANTIZE, OP_DEQUANTIZE, OP_PACK, OP_UNPACK, N_OPS };
static const char *op_name[N_OPS] = {"encode", "decode", "anchor-only decode", "quantize", "dequantize", "pack",
                                     "unpack"};


/* One case: the layout, widths and host inputs every operation reads. */
typedef struct job {
    kv_quant_layout l;
    unsigned b, a;           /* bits, anchor bits (0: none) */
    const float *x;          /* [n] */
    const uint16_t *codes;   /* [n] random u16 (bits above b set) */
    unsigned char *plane[4]; /* the reference's encode: anchor (or code) plane, residual plane, scale, zero */
    size_t bytes[4];         /* their sizes */
    size_t n;                /* elements */
} job;

/* Output sizes of op. */
static int outputs(const job *j, int op, size_t out[4])
{
    memset(out, 0, 4 * sizeof *out);
    switch (op) {
    case OP_ENCODE: memcpy(out, j->bytes, 4 * sizeof *out); return 4;
    case OP_QUANTIZE: out[0] = j->n * 2; out[1] = j->bytes[2]; out[2] = j->bytes[3]; return 3;
    case OP_PACK: out[0] = kv_layout_packed_bytes(&j->l, j->b); return 1;
    case OP_UNPACK: out[0] = j->n * 2; return 1;
    default: out[0] = j->n * sizeof(float); return 1;
    }
}

/* Runs op on be; returns its outputs (bytes + GUARD each, free them). */
static int run(kv_backend *be, const job *j, int op, unsigned char *got[4])
{
    size_t out[4];
    int k_out = outputs(j, op, out);
    kv_buffer *o[4] = {0}, *in[4] = {0};
    for (int k = 0; k < k_out; k++)
        o[k] = kvt_fill(be, out[k] + GUARD, 0xA5);
    const kv_bref none = {NULL, 0};
    kv_error err = {0};
    int rc;
    unsigned a = j->a;
    switch (op) {
    case OP_ENCODE: {
        in[0] = kvt_put(be, j->x, j->n * sizeof *j->x);
        kv_encode_args e = {j->l, j->b, a, {in[0], 0}, {o[0], 0}, a ? (kv_bref){o[1], 0} : none, {o[2], 0}, {o[3], 0}};
        rc = kv_backend_encode(be, &e, &err);
        break;
    }
    case OP_DECODE:
    case OP_DECODE_ANCHOR: {
        for (int k = 0; k < 4; k++)
            in[k] = kvt_put(be, j->plane[k], j->bytes[k]);
        kv_bref residual = a && op == OP_DECODE ? (kv_bref){in[1], 0} : none;
        kv_decode_args d = {j->l, j->b, a, {in[0], 0}, residual, {in[2], 0}, {in[3], 0}, {o[0], 0}};
        rc = kv_backend_decode(be, &d, &err);
        break;
    }
    case OP_QUANTIZE: {
        in[0] = kvt_put(be, j->x, j->n * sizeof *j->x);
        kv_quantize_args q = {j->l, j->b, {in[0], 0}, {o[0], 0}, {o[1], 0}, {o[2], 0}};
        rc = kv_backend_quantize(be, &q, &err);
        break;
    }
    case OP_DEQUANTIZE: {
        in[0] = kvt_put(be, j->codes, j->n * 2);
        in[2] = kvt_put(be, j->plane[2], j->bytes[2]);
        in[3] = kvt_put(be, j->plane[3], j->bytes[3]);
        kv_dequantize_args q = {j->l, j->b, a, {in[0], 0}, {in[2], 0}, {in[3], 0}, {o[0], 0}};
        rc = kv_backend_dequantize(be, &q, &err);
        break;
    }
    case OP_PACK: {
        in[0] = kvt_put(be, j->codes, j->n * 2);
        kv_pack_args p = {j->l, j->b, {in[0], 0}, {o[0], 0}};
        rc = kv_backend_pack(be, &p, &err);
        break;
    }
    default: {
        in[0] = kvt_put(be, j->plane[0], j->bytes[0]);
        kv_pack_args p = {j->l, j->b, {o[0], 0}, {in[0], 0}};
        rc = kv_backend_unpack(be, &p, &err);
        break;
    }
    }
    cr_assert_eq(rc, KV_OK, "%s: %s", op_name[op], err.msg);
    for (int k = 0; k < k_out; k++) {
        got[k] = kvt_get(be, o[k], out[k] + GUARD);
        kv_buffer_free(be, o[k]);
    }
    for (int k = 0; k < 4; k++)
        if (in[k])
            kv_buffer_free(be, in[k]);
    return k_out;
}

/* op on both devices: equal outputs, untouched guard bytes. 1 when so. */
static int compare(kv_backend *be, kv_backend *ref, const job *j, int op, int mode)
{
    unsigned char *got[4], *want[4];
    int k_out = run(be, j, op, got);
    run(ref, j, op, want);
    size_t out[4];
    outputs(j, op, out);
    int ok = 1;
    for (int k = 0; k < k_out; k++) {
        long at = kvt_first_diff(got[k], want[k], out[k]);
        size_t g = 0;
        while (g < GUARD && got[k][out[k] + g] == 0xA5)
            g++;
        cr_expect(at < 0, "%s %u x %u, G %u, b %u, a %u, %s, %s: output %d differs from the reference at byte %ld of %zu",
                  j->l.grouping == KV_GROUP_CHANNEL ? "channel" : "token", j->l.rows, j->l.cols, j->l.group_size, j->b, j->a, kvt_mode_name(mode), op_name[op], k, at, out[k]);
        cr_expect(g == GUARD, "%s %u x %u, G %u, b %u, a %u, %s, %s: output %d written past its end (guard byte %zu)",
                  j->l.grouping == KV_GROUP_CHANNEL ? "channel" : "token", j->l.rows, j->l.cols, j->l.group_size, j->b, j->a, kvt_mode_name(mode), op_name[op], k, g);
        ok &= at < 0 && g == GUARD;
        free(got[k]);
        free(want[k]);
    }
    return ok;
}

/* Every operation of one case (the unfused ones with a == 0, where they
   apply; dequantize also with anchors). Returns the operations that differ. */
static int check(kv_backend *be, kv_backend *ref, uint32_t rows, uint32_t cols, uint32_t G, int grouping, unsigned b,
                 unsigned a, int mode, uint64_t seed, int *ops)
{
    job j = {{rows, cols, G, grouping}, b, a, NULL, NULL, {0}, {0}, (size_t)rows * cols};
    size_t groups = kv_layout_groups(&j.l);
    j.bytes[0] = kv_layout_packed_bytes(&j.l, a ? a : b);
    j.bytes[1] = a ? kv_layout_packed_bytes(&j.l, b - a) : 0;
    j.bytes[2] = j.bytes[3] = groups * 2;
    float *x = malloc(j.n * sizeof *x);
    uint16_t *codes = malloc(j.n * 2);
    kv_rng rng;
    kv_rng_seed(&rng, seed);
    kvt_codec_values(&rng, x, j.n, G, b, mode);
    if (grouping == KV_GROUP_CHANNEL) { /* the values filled column by column, so that groups get the patterns */
        float *t = malloc(j.n * sizeof *t);
        for (size_t i = 0; i < j.n; i++)
            t[i] = x[(i % cols) * rows + i / cols]; /* row i / cols, column i % cols */
        memcpy(x, t, j.n * sizeof *t);
        free(t);
    }
    for (size_t i = 0; i < j.n; i++)
        codes[i] = (uint16_t)kv_rng_below(&rng, 65536);
    j.x = x;
    j.codes = codes;
    run(ref, &j, OP_ENCODE, j.plane);
    int bad = 0;
    const int list[] = {OP_ENCODE, OP_DECODE, OP_DECODE_ANCHOR, OP_QUANTIZE, OP_DEQUANTIZE, OP_PACK, OP_UNPACK};
    for (size_t k = 0; k < sizeof list / sizeof list[0]; k++) {
        int op = list[k];
        if ((op == OP_DECODE_ANCHOR && !a) || ((op == OP_QUANTIZE || op == OP_PACK || op == OP_UNPACK) && a))
            continue;
        bad += !compare(be, ref, &j, op, mode);
        (*ops)++;
    }
    for (int k = 0; k < 4; k++)
        free(j.plane[k]);
    free(codes);
    free(x);
    return bad;
}

/* Widths 1..16 x anchors {0, 1, w/2, w − 1} x G {8, 16, 24, 40, 128} x
   token shapes (9 groups, one per row: a batch of 8 and a batch of 1; 3 rows
   of 2 groups: one batch of 6; 2 rows of G + 8 values: a short last group per
   row, the portable path) and channel shapes (13 columns: pieces of 8 and 5;
   8 columns with a short last block; 3 columns) x modes. */
static void run_matrix(void)
{
    kv_backend *be = kvt_open("cpu", 0), *ref = kvt_open_reference();
    static const uint32_t Gs[] = {8, 16, 24, 40, 128};
    int cases = 0, ops = 0, bad = 0;
    for (unsigned w = 1; w <= 16; w++) {
        unsigned anchors[4] = {0, 1, w / 2, w - 1};
        for (int ai = 0; ai < 4; ai++) {
            int skip = anchors[ai] >= w || (ai > 0 && anchors[ai] == 0);
            for (int aj = 0; aj < ai; aj++)
                skip |= anchors[aj] == anchors[ai];
            if (skip)
                continue;
            for (size_t gi = 0; gi < sizeof Gs / sizeof Gs[0]; gi++) {
                uint32_t G = Gs[gi];
                const uint32_t shapes[3][2] = {{9, G}, {3, 2 * G}, {2, G + 8}};
                for (int si = 0; si < 3; si++)
                    for (int mode = 0; mode < KVT_N_MODES; mode++, cases++)
                        bad += check(be, ref, shapes[si][0], shapes[si][1], G, KV_GROUP_TOKEN, w, anchors[ai], mode,
                                     3100 + (uint64_t)cases, &ops);
                /* channel groups (KIVI keys): 8 columns at a time, a piece of 8 and one of 5, or 3;
                   full blocks, and a short last block */
                const uint32_t cshapes[3][2] = {{2 * G, 13}, {2 * G + 3, 8}, {G, 3}};
                for (int si = 0; si < 3; si++)
                    for (int mode = 0; mode < KVT_N_MODES; mode++, cases++)
                        bad += check(be, ref, cshapes[si][0], cshapes[si][1], G, KV_GROUP_CHANNEL, w, anchors[ai],
                                     mode, 3100 + (uint64_t)cases, &ops);
            }
        }
    }
    cr_log_info("%d cases, %d operations, %d differ", cases, ops, bad);
    cr_assert_gt(ops, 10000);
    kv_backend_close(be);
    kv_backend_close(ref);
}

/* The device name, "CPU (N threads, ISA)". */
static void device_name(char *name, size_t cap)
{
    kv_backend *be = kvt_open("cpu", 0);
    kv_backend_props props;
    kv_backend_get_props(be, &props);
    snprintf(name, cap, "%s", props.device);
    kv_backend_close(be);
}

Test(cpu_avx2_codecs, bit_exact_with_reference)
{
    char name[128];
    device_name(name, sizeof name);
    if (strstr(name, ", avx512)")) {
        setenv("KVSIM_CPU_ISA", "avx2", 1); /* each Criterion test runs in its own process */
        device_name(name, sizeof name);
    }
    if (!strstr(name, ", avx2)")) {
        fprintf(stderr, "skipped: no AVX2 (cpu:0 is %s)\n", name);
        cr_skip_test("no AVX2");
    }
    run_matrix();
}
