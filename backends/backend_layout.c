/* backend_layout.c — layout arithmetic of quantized tensors: groups, group lengths and offsets, plane bytes. */
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"

/* ---- Layout arithmetic ---------------------------------------------------------- */

static size_t ceil_div(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

size_t kv_layout_groups(const kv_quant_layout *l)
{
    if (l->rows == 0 || l->cols == 0 || l->group_size == 0)
        return 0;
    if (l->grouping == KV_GROUP_TOKEN)
        return (size_t)l->rows * ceil_div(l->cols, l->group_size);
    return ceil_div(l->rows, l->group_size) * l->cols;
}

uint32_t kv_layout_group_len(const kv_quant_layout *l, size_t group)
{
    if (l->grouping == KV_GROUP_TOKEN) {
        size_t per_row = ceil_div(l->cols, l->group_size);
        size_t first = (group % per_row) * l->group_size;
        size_t left = l->cols - first;
        return (uint32_t)(left < l->group_size ? left : l->group_size);
    }
    size_t first = (group / l->cols) * l->group_size;
    size_t left = l->rows - first;
    return (uint32_t)(left < l->group_size ? left : l->group_size);
}

/* Bytes of `groups` groups of n codes at b bits, each byte-aligned. */
static size_t group_bytes(size_t groups, size_t n, unsigned bits)
{
    return groups * ceil_div(n * bits, 8);
}

size_t kv_layout_packed_bytes(const kv_quant_layout *l, unsigned bits)
{
    if (kv_layout_groups(l) == 0)
        return 0;
    size_t g = l->group_size;
    if (l->grouping == KV_GROUP_TOKEN) {
        size_t full = l->cols / g, last = l->cols % g;
        return (size_t)l->rows * (group_bytes(full, g, bits) + (last ? group_bytes(1, last, bits) : 0));
    }
    size_t full = l->rows / g, last = l->rows % g;
    return (size_t)l->cols * (group_bytes(full, g, bits) + (last ? group_bytes(1, last, bits) : 0));
}

size_t kv_layout_meta_bytes(const kv_quant_layout *l)
{
    return kv_layout_groups(l) * 4;
}

/* Only the last group of a row (TOKEN) or the last block of rows (CHANNEL) can
   be short, so every group before it in its row or block has the full size. */
size_t kv_layout_group_offset(const kv_quant_layout *l, unsigned bits, size_t group)
{
    size_t g = l->group_size;
    size_t full = group_bytes(1, g, bits);
    if (l->grouping == KV_GROUP_TOKEN) {
        size_t per_row = ceil_div(l->cols, g);
        size_t last = l->cols % g;
        size_t row_bytes = (l->cols / g) * full + (last ? group_bytes(1, last, bits) : 0);
        return (group / per_row) * row_bytes + (group % per_row) * full;
    }
    size_t block = group / l->cols, col = group % l->cols;
    return block * l->cols * full + col * group_bytes(1, kv_layout_group_len(l, group), bits);
}
