/* cpu_ref.c — the reference kernels: the plain loops that every backend is
 * checked against. Clarity first: each function is the formula of docs/kernels.md applied
 * element by element (backends/numerics.h), one group at a time. */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/numerics.h"

cpu_group_view cpu_group_at(const kv_quant_layout *l, size_t group)
{
    cpu_group_view v;
    v.len = kv_layout_group_len(l, group);
    if (l->grouping == KV_GROUP_TOKEN) {
        size_t per_row = (l->cols + l->group_size - 1) / l->group_size;
        size_t row = group / per_row, col = (group % per_row) * l->group_size;
        v.first = row * l->cols + col;
        v.stride = 1;
    } else {
        size_t block = group / l->cols, col = group % l->cols;
        v.first = block * l->group_size * l->cols + col;
        v.stride = l->cols;
    }
    return v;
}

void kv_cpu_ref_quantize(const kv_quant_layout *l, unsigned bits, const float *x, uint16_t *codes,
                         uint16_t *scale, uint16_t *zero, size_t g0, size_t g1)
{
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        /* min and max over the finite values only */
        float mn = 0.0f, mx = 0.0f;
        int have = 0;
        for (uint32_t i = 0; i < v.len; i++) {
            float xi = x[v.first + i * v.stride];
            if (!isfinite(xi))
                continue;
            if (!have || xi < mn)
                mn = xi;
            if (!have || xi > mx)
                mx = xi;
            have = 1;
        }
        kv_qparams p = kv_quant_params(mn, mx, have, bits);
        scale[g] = p.scale_h;
        zero[g] = p.zero_h;
        for (uint32_t i = 0; i < v.len; i++) {
            size_t at = v.first + i * v.stride;
            codes[at] = kv_quant_code(x[at], p.s, p.z, bits);
        }
    }
}

void kv_cpu_ref_dequantize(const kv_quant_layout *l, unsigned bits, unsigned anchor_bits, const uint16_t *codes,
                           const uint16_t *scale, const uint16_t *zero, float *out, size_t g0, size_t g1)
{
    unsigned width = anchor_bits ? anchor_bits : bits; /* bits held by each code */
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        float s = kv_f16_to_f32(scale[g]), z = kv_f16_to_f32(zero[g]);
        for (uint32_t i = 0; i < v.len; i++) {
            size_t at = v.first + i * v.stride;
            uint32_t q = codes[at] & kv_code_max(width);
            out[at] = anchor_bits ? kv_dequant_anchor(q, bits - anchor_bits, s, z) : kv_dequant(q, s, z);
        }
    }
}

/* Bit k of element i of a group's stream is bit (b*i + k) of the stream:
   byte (b*i + k) / 8, bit (b*i + k) % 8 within it (little-endian). */
void kv_cpu_ref_pack(const kv_quant_layout *l, unsigned bits, const uint16_t *codes, uint8_t *packed, size_t g0,
                     size_t g1)
{
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        uint8_t *out = packed + kv_layout_group_offset(l, bits, g);
        memset(out, 0, ((size_t)v.len * bits + 7) / 8);
        for (uint32_t i = 0; i < v.len; i++) {
            uint32_t q = codes[v.first + i * v.stride] & kv_code_max(bits);
            for (unsigned k = 0; k < bits; k++) {
                size_t bit = (size_t)i * bits + k;
                if ((q >> k) & 1u)
                    out[bit / 8] |= (uint8_t)(1u << (bit % 8));
            }
        }
    }
}

void kv_cpu_ref_unpack(const kv_quant_layout *l, unsigned bits, const uint8_t *packed, uint16_t *codes, size_t g0,
                       size_t g1)
{
    for (size_t g = g0; g < g1; g++) {
        cpu_group_view v = cpu_group_at(l, g);
        const uint8_t *in = packed + kv_layout_group_offset(l, bits, g);
        for (uint32_t i = 0; i < v.len; i++) {
            uint32_t q = 0;
            for (unsigned k = 0; k < bits; k++) {
                size_t bit = (size_t)i * bits + k;
                q |= (uint32_t)((in[bit / 8] >> (bit % 8)) & 1u) << k;
            }
            codes[v.first + i * v.stride] = (uint16_t)q;
        }
    }
}

void kv_cpu_ref_split(unsigned bits, unsigned anchor_bits, const uint16_t *codes, uint16_t *anchor,
                      uint16_t *residual, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++) {
        anchor[i] = kv_split_anchor(codes[i], bits, anchor_bits);
        residual[i] = kv_split_residual(codes[i], bits, anchor_bits);
    }
}

void kv_cpu_ref_merge(unsigned bits, unsigned anchor_bits, const uint16_t *anchor, const uint16_t *residual,
                      uint16_t *codes, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++)
        codes[i] = kv_merge_code(anchor[i], residual[i], bits, anchor_bits);
}

void kv_cpu_ref_bf16_round(const float *in, float *out, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++)
        out[i] = kv_bf16_to_f32(kv_bf16_from_f32(in[i]));
}
