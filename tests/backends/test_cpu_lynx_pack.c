/* test_cpu_lynx_pack.c — the fused CPU encode (cpu:0) of wide codes, 9 to 16
 * bits, plain and split into anchor + residual (anchors 1, 4, w/2, w − 1),
 * bit for bit against the reference (cpu:1): the AVX-512 batches of 16 token
 * groups pack even widths from registers (emit16_even, #22) and odd ones by
 * pext; rows that groups do not tile (a short last group per row) take the
 * per-group path. Group sizes 16, 32, 48 and 128, group counts that end a
 * batch early, values with NaN/±Inf/±0/huge/tiny and constant runs, exact
 * rounding ties, constant groups and ±FLT_MAX extremes. Every output plane
 * starts filled with 0xA5 and has guard bytes past its end that must stay
 * 0xA5. The native test is skipped, visibly, on a CPU without AVX-512. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/numerics.h"
#include "tests/kernels_util.h"

enum { GUARD = 64 }; /* bytes past each plane's end that must stay 0xA5 */



/* Encodes rows x cols (groups of G) with b bits and anchor a (0: none) on be
   and ref; expects equal planes and metadata and untouched guard bytes.
   Returns 1 when everything matched. */
static int check(kv_backend *be, kv_backend *ref, uint32_t rows, uint32_t cols, uint32_t G, unsigned b, unsigned a,
                 int mode, uint64_t seed)
{
    kv_quant_layout l = {rows, cols, G, KV_GROUP_TOKEN};
    size_t n = (size_t)rows * cols, groups = kv_layout_groups(&l);
    size_t bytes[4] = {kv_layout_packed_bytes(&l, a ? a : b), a ? kv_layout_packed_bytes(&l, b - a) : 0, groups * 2,
                       groups * 2};
    float *x = malloc(n * sizeof *x);
    kv_rng rng;
    kv_rng_seed(&rng, seed);
    kvt_codec_values(&rng, x, n, G, b, mode);
    unsigned char *out[2][4];
    kv_backend *bes[2] = {be, ref};
    for (int d = 0; d < 2; d++) {
        kv_buffer *bx = kvt_put(bes[d], x, n * sizeof *x), *buf[4];
        for (int k = 0; k < 4; k++)
            buf[k] = kvt_fill(bes[d], bytes[k] + GUARD, 0xA5);
        kv_encode_args e = {l, b, a, {bx, 0}, {buf[0], 0}, {a ? buf[1] : NULL, 0}, {buf[2], 0}, {buf[3], 0}};
        kv_error err = {0};
        cr_assert_eq(kv_backend_encode(bes[d], &e, &err), KV_OK, "%s", err.msg);
        for (int k = 0; k < 4; k++) {
            out[d][k] = kvt_get(bes[d], buf[k], bytes[k] + GUARD);
            kv_buffer_free(bes[d], buf[k]);
        }
        kv_buffer_free(bes[d], bx);
    }
    static const char *part[4] = {"anchor (or code) plane", "residual plane", "scale", "zero"};
    int ok = 1;
    for (int k = 0; k < 4; k++) {
        long at = kvt_first_diff(out[0][k], out[1][k], bytes[k]);
        cr_expect(at < 0, "%u x %u, G %u, b %u, a %u, %s: %s differs from the reference at byte %ld of %zu", rows,
                  cols, G, b, a, kvt_mode_name(mode), part[k], at, bytes[k]);
        size_t g = 0;
        while (g < GUARD && out[0][k][bytes[k] + g] == 0xA5)
            g++;
        cr_expect(g == GUARD, "%u x %u, G %u, b %u, a %u, %s: %s written past its end (guard byte %zu)", rows, cols,
                  G, b, a, kvt_mode_name(mode), part[k], g);
        ok &= at < 0 && g == GUARD;
    }
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 4; k++)
            free(out[d][k]);
    free(x);
    return ok;
}

/* Widths 9..16 x anchors {0, 1, 4, w/2, w − 1} x G {16, 32, 48, 128} x
   shapes (17 groups, one per row: a batch of 16 and a batch of 1; 3 rows of
   2 groups; 5 rows of G + 8 values: a short last group per row, the
   per-group path) x modes. */
static void run_matrix(void)
{
    kv_backend *be = kvt_open("cpu", 0), *ref = kvt_open_reference();
    static const uint32_t Gs[] = {16, 32, 48, 128};
    int cases = 0, bad = 0;
    for (unsigned w = 9; w <= 16; w++) {
        unsigned anchors[5] = {0, 1, 4, w / 2, w - 1};
        for (int ai = 0; ai < 5; ai++) {
            int dup = 0;
            for (int aj = 0; aj < ai; aj++)
                dup |= anchors[aj] == anchors[ai];
            if (dup)
                continue;
            for (size_t gi = 0; gi < sizeof Gs / sizeof Gs[0]; gi++) {
                uint32_t G = Gs[gi];
                const uint32_t shapes[3][2] = {{17, G}, {3, 2 * G}, {5, G + 8}};
                for (int si = 0; si < 3; si++)
                    for (int mode = 0; mode < KVT_N_MODES; mode++, cases++)
                        bad += !check(be, ref, shapes[si][0], shapes[si][1], G, w, anchors[ai], mode,
                                      2200 + (uint64_t)cases);
            }
        }
    }
    cr_log_info("%d encode cases, %d differ", cases, bad);
    cr_assert_gt(cases, 1000);
    kv_backend_close(be);
    kv_backend_close(ref);
}

Test(cpu_lynx_pack, wide_codes_bit_exact_native)
{
    kv_backend *be = kvt_open("cpu", 0);
    kv_backend_props props;
    kv_backend_get_props(be, &props);
    kv_backend_close(be);
    if (!strstr(props.device, "avx512")) {
        fprintf(stderr, "skipped: no AVX-512 (cpu:0 is %s)\n", props.device);
        cr_skip_test("no AVX-512");
    }
    run_matrix();
}

Test(cpu_lynx_pack, wide_codes_bit_exact_generic)
{
    setenv("KVSIM_CPU_ISA", "generic", 1); /* each Criterion test runs in its own process */
    run_matrix();
}
