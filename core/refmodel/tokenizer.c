/* tokenizer.c — byte-level BPE: GPT-2 byte alphabet, pre-tokenizer, rank-ordered merges.
 *
 * Data structures (all built once in kv_tokenizer_create):
 *  - vocab: token text (as stored, in the byte-level alphabet) → id, an
 *    open-addressing hash table;
 *  - bytes[id]: what the token decodes to (the alphabet mapped back to bytes,
 *    or the literal text for control / user-defined tokens);
 *  - byte_token[b]: the id of the one-character token for byte b;
 *  - merges: (left id, right id) → (rank, merged id), a second hash table.
 * BPE then works on ids only: a piece starts as one id per byte and the
 * adjacent pair of lowest rank is merged until none is left (leftmost first
 * among equal ranks), using a heap so that long pieces stay O(n log n).
 */
#include "core/refmodel/tokenizer.h"

#include <string.h>

#include "core/base/alloc.h"
#include "core/refmodel/unicode.h"

enum { TOKEN_NORMAL = 1, TOKEN_UNKNOWN = 2, TOKEN_CONTROL = 3, TOKEN_USER = 4, TOKEN_UNUSED = 5, TOKEN_BYTE = 6 };

typedef enum pre_kind { PRE_GPT2 = 0, PRE_SMOLLM = 1 } pre_kind;

typedef struct merge_slot {
    uint64_t key;   /* (left << 32) | right, UINT64_MAX = empty */
    int32_t rank;   /* position in tokenizer.ggml.merges */
    int32_t merged; /* id of left+right */
} merge_slot;

struct kv_tokenizer {
    int32_t n_vocab;
    char *text_arena;       /* every token's vocabulary text, NUL-separated */
    uint32_t *text_off;     /* [n_vocab] offset of token i's text in text_arena */
    uint32_t *text_len;     /* [n_vocab] */
    char *byte_arena;       /* every token's decoded bytes */
    uint32_t *bytes_off;    /* [n_vocab] */
    uint32_t *bytes_len;    /* [n_vocab] */
    uint8_t *type;          /* [n_vocab] token type (TOKEN_*) */
    int32_t *vocab_slots;   /* hash table of ids, -1 = empty; size vocab_cap */
    size_t vocab_cap;       /* power of two */
    merge_slot *merges;     /* hash table; size merge_cap */
    size_t merge_cap;       /* power of two */
    int32_t byte_token[256];/* one-character token of each byte, -1 if none */
    int32_t *special;       /* ids of control and user-defined tokens, longest text first */
    size_t n_special;
    bool special_first[256];/* true for bytes that start some special token's text */
    int32_t bos, eos, unk;  /* -1 when absent */
    bool add_bos;
    pre_kind pre;
};

/* ---- GPT-2 byte alphabet: printable bytes map to themselves, the rest to U+0100.. ---- */

static bool byte_is_direct(int b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static uint32_t byte_to_cp(int b)
{
    if (byte_is_direct(b))
        return (uint32_t)b;
    int n = 0;
    for (int i = 0; i < b; i++)
        n += !byte_is_direct(i);
    return 256u + (uint32_t)n;
}

/* Inverse of byte_to_cp; -1 if cp is not in the alphabet. */
static int cp_to_byte(uint32_t cp, const uint32_t table[256])
{
    if (cp < 256 && byte_is_direct((int)cp))
        return (int)cp;
    for (int b = 0; b < 256; b++)
        if (table[b] == cp)
            return b;
    return -1;
}

/* ---- Hash tables --------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

static const char *token_text(const kv_tokenizer *t, int32_t id, size_t *len)
{
    *len = t->text_len[id];
    return t->text_arena + t->text_off[id];
}

static int32_t vocab_lookup(const kv_tokenizer *t, const char *s, size_t n)
{
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->vocab_slots[i];
        if (id < 0)
            return -1;
        size_t len;
        const char *txt = token_text(t, id, &len);
        if (len == n && memcmp(txt, s, n) == 0)
            return id;
    }
}

/* Inserts id unless its text is already present (first occurrence wins). */
static void vocab_insert(kv_tokenizer *t, int32_t id)
{
    size_t n, mask = t->vocab_cap - 1;
    const char *s = token_text(t, id, &n);
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t other = t->vocab_slots[i];
        if (other < 0) {
            t->vocab_slots[i] = id;
            return;
        }
        size_t len;
        const char *txt = token_text(t, other, &len);
        if (len == n && memcmp(txt, s, n) == 0)
            return;
    }
}

static const merge_slot *merge_lookup(const kv_tokenizer *t, int32_t left, int32_t right)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t mask = t->merge_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (t->merges[i].key == UINT64_MAX)
            return NULL;
        if (t->merges[i].key == key)
            return &t->merges[i];
    }
}

static void merge_insert(kv_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t merged)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t mask = t->merge_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (t->merges[i].key == key)
            return; /* a repeated merge keeps its first (lowest) rank */
        if (t->merges[i].key == UINT64_MAX) {
            t->merges[i] = (merge_slot){key, rank, merged};
            return;
        }
    }
}

/* ---- Creation ------------------------------------------------------------------------ */

static int32_t optional_id(const kv_gguf *g, const char *key, int32_t n_vocab, int *rc, kv_error *err)
{
    if (!kv_gguf_has(g, key))
        return -1;
    uint32_t v;
    if (kv_gguf_get_u32(g, key, &v, err)) {
        *rc = KV_EINPUT;
        return -1;
    }
    if (v >= (uint32_t)n_vocab) {
        *rc = kv_error_set(err, KV_EINPUT, "%s: key '%s' is %u, outside the vocabulary of %d tokens",
                           kv_gguf_name(g), key, v, n_vocab);
        return -1;
    }
    return (int32_t)v;
}

static int cmp_special(const void *a, const void *b, void *ctx);

/* qsort has no context argument in C11: sort the special ids by length with
   insertion sort (there are a handful). */
static void sort_special(kv_tokenizer *t)
{
    for (size_t i = 1; i < t->n_special; i++) {
        int32_t id = t->special[i];
        size_t j = i;
        while (j > 0 && cmp_special(&t->special[j - 1], &id, t) > 0) {
            t->special[j] = t->special[j - 1];
            j--;
        }
        t->special[j] = id;
    }
}

static int cmp_special(const void *a, const void *b, void *ctx)
{
    const kv_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->text_len[x] != t->text_len[y])
        return t->text_len[x] < t->text_len[y] ? 1 : -1; /* longest first */
    return x < y ? -1 : x > y;
}

int kv_tokenizer_create(const kv_gguf *g, kv_tokenizer **out, kv_error *err)
{
    *out = NULL;
    const char *file = kv_gguf_name(g);
    kv_gguf_str model, pre = {"default", 7};
    if (kv_gguf_get_string(g, "tokenizer.ggml.model", &model, err))
        return KV_EINPUT;
    if (!kv_gguf_str_eq(model, "gpt2"))
        return kv_error_set(err, KV_EINPUT, "%s: key 'tokenizer.ggml.model': '%.*s' is not supported (only the "
                                            "byte-level BPE 'gpt2' is)",
                            file, (int)(model.len < 40 ? model.len : 40), model.ptr);
    if (kv_gguf_has(g, "tokenizer.ggml.pre") && kv_gguf_get_string(g, "tokenizer.ggml.pre", &pre, err))
        return KV_EINPUT;
    pre_kind pk;
    if (kv_gguf_str_eq(pre, "smollm"))
        pk = PRE_SMOLLM;
    else if (kv_gguf_str_eq(pre, "gpt2") || kv_gguf_str_eq(pre, "default"))
        pk = PRE_GPT2;
    else
        return kv_error_set(err, KV_EINPUT,
                            "%s: key 'tokenizer.ggml.pre': pre-tokenizer '%.*s' is not supported (smollm, gpt2, "
                            "default are)",
                            file, (int)(pre.len < 40 ? pre.len : 40), pre.ptr);
    const kv_gguf_str *tokens, *merges;
    size_t n_tokens, n_merges;
    if (kv_gguf_get_string_array(g, "tokenizer.ggml.tokens", &tokens, &n_tokens, err) ||
        kv_gguf_get_string_array(g, "tokenizer.ggml.merges", &merges, &n_merges, err))
        return KV_EINPUT;
    if (n_tokens == 0 || n_tokens > (1u << 24))
        return kv_error_set(err, KV_EINPUT, "%s: key 'tokenizer.ggml.tokens': %zu tokens (must be 1..2^24)", file,
                            n_tokens);
    if (n_merges > (1u << 24))
        return kv_error_set(err, KV_EINPUT, "%s: key 'tokenizer.ggml.merges': %zu merges (at most 2^24)", file,
                            n_merges);
    int64_t *types = NULL;
    size_t n_types = 0;
    if (kv_gguf_has(g, "tokenizer.ggml.token_type")) {
        if (kv_gguf_get_int_array(g, "tokenizer.ggml.token_type", &types, &n_types, err))
            return KV_EINPUT;
        if (n_types != n_tokens) {
            kv_free(types);
            return kv_error_set(err, KV_EINPUT,
                                "%s: key 'tokenizer.ggml.token_type' has %zu entries for %zu tokens", file, n_types,
                                n_tokens);
        }
    }

    kv_tokenizer *t = kv_calloc(1, sizeof *t);
    t->n_vocab = (int32_t)n_tokens;
    t->pre = pk;
    size_t text_total = 0;
    for (size_t i = 0; i < n_tokens; i++)
        text_total += tokens[i].len + 1; /* the file bounds every length, so no overflow */
    if (text_total > UINT32_MAX) {
        kv_free(types);
        kv_tokenizer_destroy(t);
        return kv_error_set(err, KV_EINPUT, "%s: key 'tokenizer.ggml.tokens': texts too long", file);
    }
    t->text_arena = kv_malloc(text_total + 1);
    t->byte_arena = kv_malloc(text_total + 1); /* decoded bytes are never longer than the text */
    t->text_off = kv_malloc(n_tokens * sizeof *t->text_off);
    t->text_len = kv_malloc(n_tokens * sizeof *t->text_len);
    t->bytes_off = kv_malloc(n_tokens * sizeof *t->bytes_off);
    t->bytes_len = kv_malloc(n_tokens * sizeof *t->bytes_len);
    t->type = kv_malloc(n_tokens);
    t->special = kv_malloc(n_tokens * sizeof *t->special);

    uint32_t alphabet[256];
    for (int b = 0; b < 256; b++)
        alphabet[b] = byte_to_cp(b);
    int rc = KV_OK;
    size_t at = 0, bat = 0;
    for (size_t i = 0; i < n_tokens && rc == KV_OK; i++) {
        int64_t ty = types ? types[i] : TOKEN_NORMAL;
        t->type[i] = (ty >= 1 && ty <= 6) ? (uint8_t)ty : TOKEN_NORMAL;
        memcpy(t->text_arena + at, tokens[i].ptr, tokens[i].len);
        t->text_off[i] = (uint32_t)at;
        t->text_len[i] = (uint32_t)tokens[i].len;
        at += tokens[i].len;
        t->text_arena[at++] = '\0';
        t->bytes_off[i] = (uint32_t)bat;
        if (t->type[i] == TOKEN_NORMAL || t->type[i] == TOKEN_UNUSED) {
            const unsigned char *s = (const unsigned char *)tokens[i].ptr;
            for (size_t k = 0; k < tokens[i].len;) {
                uint32_t cp;
                k += kv_utf8_decode(s + k, tokens[i].len - k, &cp);
                int b = cp_to_byte(cp, alphabet);
                if (b < 0) {
                    rc = kv_error_set(err, KV_EINPUT,
                                      "%s: key 'tokenizer.ggml.tokens': token %zu has a character outside the "
                                      "byte-level alphabet",
                                      file, i);
                    break;
                }
                t->byte_arena[bat++] = (char)b;
            }
        } else {
            memcpy(t->byte_arena + bat, tokens[i].ptr, tokens[i].len);
            bat += tokens[i].len;
            if ((t->type[i] == TOKEN_CONTROL || t->type[i] == TOKEN_USER) && tokens[i].len > 0)
                t->special[t->n_special++] = (int32_t)i;
        }
        t->bytes_len[i] = (uint32_t)(bat - t->bytes_off[i]);
    }
    kv_free(types);
    if (rc) {
        kv_tokenizer_destroy(t);
        return rc;
    }
    sort_special(t);
    for (size_t k = 0; k < t->n_special; k++)
        t->special_first[(unsigned char)t->text_arena[t->text_off[t->special[k]]]] = true;

    t->vocab_cap = pow2_at_least(n_tokens * 2);
    t->vocab_slots = kv_malloc(t->vocab_cap * sizeof *t->vocab_slots);
    memset(t->vocab_slots, 0xff, t->vocab_cap * sizeof *t->vocab_slots);
    for (size_t i = 0; i < n_tokens; i++)
        vocab_insert(t, (int32_t)i);

    for (int b = 0; b < 256; b++) {
        char buf[4];
        size_t n = kv_utf8_encode(alphabet[b], buf);
        t->byte_token[b] = vocab_lookup(t, buf, n);
    }

    /* Merges "A B" → ids; merges whose parts or result are not tokens are
       skipped (they could never produce a token). */
    t->merge_cap = pow2_at_least(n_merges * 2 + 2);
    t->merges = kv_malloc(t->merge_cap * sizeof *t->merges);
    for (size_t i = 0; i < t->merge_cap; i++)
        t->merges[i].key = UINT64_MAX;
    char *buf = kv_malloc(1024);
    size_t buf_cap = 1024;
    for (size_t i = 0; i < n_merges; i++) {
        const char *s = merges[i].ptr;
        size_t n = merges[i].len;
        const char *sp = memchr(s, ' ', n);
        if (!sp || sp == s || sp == s + n - 1)
            continue;
        size_t la = (size_t)(sp - s), lb = n - la - 1;
        int32_t a = vocab_lookup(t, s, la), b = vocab_lookup(t, sp + 1, lb);
        if (la + lb > buf_cap) {
            buf_cap = la + lb;
            buf = kv_realloc(buf, buf_cap);
        }
        memcpy(buf, s, la);
        memcpy(buf + la, sp + 1, lb);
        int32_t ab = vocab_lookup(t, buf, la + lb);
        if (a >= 0 && b >= 0 && ab >= 0)
            merge_insert(t, a, b, (int32_t)i, ab);
    }
    kv_free(buf);

    t->bos = optional_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &rc, err);
    t->eos = optional_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &rc, err);
    t->unk = optional_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &rc, err);
    if (rc == KV_OK && kv_gguf_has(g, "tokenizer.ggml.add_bos_token"))
        rc = kv_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err);
    for (int b = 0; b < 256 && rc == KV_OK; b++)
        if (t->byte_token[b] < 0 && t->unk < 0)
            rc = kv_error_set(err, KV_EINPUT,
                              "%s: key 'tokenizer.ggml.tokens': byte 0x%02x has no token and there is no unknown "
                              "token",
                              file, b);
    if (rc) {
        kv_tokenizer_destroy(t);
        return rc;
    }
    *out = t;
    return KV_OK;
}

void kv_tokenizer_destroy(kv_tokenizer *t)
{
    if (!t)
        return;
    kv_free(t->text_arena);
    kv_free(t->byte_arena);
    kv_free(t->text_off);
    kv_free(t->text_len);
    kv_free(t->bytes_off);
    kv_free(t->bytes_len);
    kv_free(t->type);
    kv_free(t->special);
    kv_free(t->vocab_slots);
    kv_free(t->merges);
    kv_free(t);
}

int32_t kv_tokenizer_vocab_size(const kv_tokenizer *t) { return t->n_vocab; }
int32_t kv_tokenizer_bos(const kv_tokenizer *t) { return t->bos; }
int32_t kv_tokenizer_eos(const kv_tokenizer *t) { return t->eos; }
bool kv_tokenizer_add_bos(const kv_tokenizer *t) { return t->add_bos; }

int32_t kv_tokenizer_find(const kv_tokenizer *t, const char *text)
{
    return vocab_lookup(t, text, strlen(text));
}

const char *kv_tokenizer_piece(const kv_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = t->bytes_len[id];
    return t->byte_arena + t->bytes_off[id];
}

char *kv_tokenizer_decode(const kv_tokenizer *t, const int32_t *tokens, size_t n, size_t *len)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= 0 && tokens[i] < t->n_vocab)
            total += t->bytes_len[tokens[i]];
    char *s = kv_malloc(total + 1), *p = s;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *piece = kv_tokenizer_piece(t, tokens[i], &l);
        if (piece) {
            memcpy(p, piece, l);
            p += l;
        }
    }
    *p = '\0';
    if (len)
        *len = total;
    return s;
}

/* ---- Encoding ------------------------------------------------------------------------ */

typedef struct id_vec {
    int32_t *v;
    size_t n, cap;
} id_vec;

static void push(id_vec *out, int32_t id)
{
    if (out->n == out->cap)
        kv_grow((void **)&out->v, sizeof *out->v, &out->cap, out->n + 1);
    out->v[out->n++] = id;
}

/* Working memory of one BPE run, reused across pieces. */
typedef struct bpe_work {
    int32_t *id;       /* symbol ids */
    int32_t *prev, *next; /* linked list over symbols; -1 ends */
    struct heap_item {
        int32_t rank, left, right_id, left_id; /* left: symbol index */
    } *heap;
    size_t cap, heap_n, heap_cap;
} bpe_work;

static int heap_less(const struct heap_item *a, const struct heap_item *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(bpe_work *w, struct heap_item it)
{
    if (w->heap_n == w->heap_cap)
        kv_grow((void **)&w->heap, sizeof *w->heap, &w->heap_cap, w->heap_n + 1);
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = it;
}

static struct heap_item heap_pop(bpe_work *w)
{
    struct heap_item top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!heap_less(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static void try_pair(const kv_tokenizer *t, bpe_work *w, int32_t left)
{
    int32_t right = w->next[left];
    if (left < 0 || right < 0)
        return;
    const merge_slot *m = merge_lookup(t, w->id[left], w->id[right]);
    if (m)
        heap_push(w, (struct heap_item){m->rank, left, w->id[right], w->id[left]});
}

/* BPE over one pre-tokenized piece of n bytes; appends the ids to out. */
static void bpe_piece(const kv_tokenizer *t, bpe_work *w, const unsigned char *s, size_t n, id_vec *out)
{
    if (n > w->cap) {
        w->cap = n;
        w->id = kv_realloc(w->id, n * sizeof *w->id);
        w->prev = kv_realloc(w->prev, n * sizeof *w->prev);
        w->next = kv_realloc(w->next, n * sizeof *w->next);
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_token[s[i]];
        w->id[i] = id >= 0 ? id : t->unk;
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        try_pair(t, w, (int32_t)i);
    while (w->heap_n) {
        struct heap_item it = heap_pop(w);
        int32_t left = it.left, right = w->next[left];
        /* Stale entries: the left symbol was merged away (its id changed, or it
           is no longer linked) or its right neighbour changed. */
        if (w->id[left] != it.left_id || right < 0 || w->id[right] != it.right_id)
            continue;
        const merge_slot *m = merge_lookup(t, w->id[left], w->id[right]);
        if (!m || m->rank != it.rank)
            continue;
        w->id[left] = m->merged;
        w->next[left] = w->next[right];
        if (w->next[right] >= 0)
            w->prev[w->next[right]] = left;
        w->prev[right] = -2; /* dead */
        w->id[right] = -1;
        if (w->prev[left] >= 0)
            try_pair(t, w, w->prev[left]);
        try_pair(t, w, left);
    }
    for (int32_t i = 0; i >= 0; i = w->next[i])
        push(out, w->id[i]);
}

/* GPT-2 pre-tokenizer regex, by hand:
     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
   over cps[0..n) (code points with their byte offsets in off[0..n]).
   Returns the length in code points of the match at i (always >= 1). */
static size_t gpt2_match(const uint32_t *cps, size_t n, size_t i)
{
#define CP(k) ((k) < n ? cps[k] : 0xFFFFFFFEu)
#define IS_L(k) ((k) < n && kv_unicode_is_letter(cps[k]))
#define IS_N(k) ((k) < n && kv_unicode_is_number(cps[k]))
#define IS_S(k) ((k) < n && kv_unicode_is_space(cps[k]))
#define IS_O(k) ((k) < n && !IS_S(k) && !IS_L(k) && !IS_N(k))
    if (CP(i) == '\'') {
        uint32_t a = CP(i + 1), b = CP(i + 2);
        if (a == 's' || a == 't' || a == 'm' || a == 'd')
            return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return 3;
    }
    size_t j = i + (CP(i) == ' ' ? 1 : 0);
    if (IS_L(j)) {
        while (IS_L(j))
            j++;
        return j - i;
    }
    if (IS_N(j)) {
        while (IS_N(j))
            j++;
        return j - i;
    }
    if (IS_O(j)) {
        while (IS_O(j))
            j++;
        return j - i;
    }
    /* Here cps[i] is whitespace (a lone ' ' before whitespace or the end also lands here). */
    size_t k = i;
    while (IS_S(k))
        k++;
    if (k == n || k - i == 1)
        return k - i; /* \s+ up to the end, or a single space before non-space (\s+) */
    return k - i - 1; /* \s+(?!\S): leave the last space to the next piece */
#undef CP
#undef IS_L
#undef IS_N
#undef IS_S
#undef IS_O
}

typedef struct cp_buf {
    uint32_t *cps;
    size_t *off; /* byte offset of each code point, plus one past the end */
    size_t cap;
} cp_buf;

/* Pre-tokenizes and BPE-encodes a fragment with no special tokens in it. */
static void encode_fragment(const kv_tokenizer *t, const unsigned char *s, size_t len, cp_buf *cb, bpe_work *w,
                            id_vec *out)
{
    if (len + 1 > cb->cap) {
        cb->cap = len + 1;
        cb->cps = kv_realloc(cb->cps, cb->cap * sizeof *cb->cps);
        cb->off = kv_realloc(cb->off, cb->cap * sizeof *cb->off);
    }
    size_t n = 0;
    for (size_t p = 0; p < len;) {
        cb->off[n] = p;
        p += kv_utf8_decode(s + p, len - p, &cb->cps[n]);
        n++;
    }
    cb->off[n] = len;
    /* "smollm" isolates every \p{N} code point first; the GPT-2 regex then runs
       on each run between them. */
    size_t start = 0;
    while (start < n) {
        size_t end = start;
        if (t->pre == PRE_SMOLLM) {
            if (kv_unicode_is_number(cb->cps[start]))
                end = start + 1;
            else
                while (end < n && !kv_unicode_is_number(cb->cps[end]))
                    end++;
        } else {
            end = n;
        }
        for (size_t i = start; i < end;) {
            size_t m = gpt2_match(cb->cps + start, end - start, i - start);
            bpe_piece(t, w, s + cb->off[i], cb->off[i + m] - cb->off[i], out);
            i += m;
        }
        start = end;
    }
}

int kv_tokenizer_encode(const kv_tokenizer *t, const char *text, size_t len, bool parse_special, int32_t **tokens,
                        size_t *n, kv_error *err)
{
    (void)err; /* every byte string encodes */
    id_vec out = {0};
    bpe_work w = {0};
    cp_buf cb = {0};
    const unsigned char *s = (const unsigned char *)text;
    size_t frag = 0;
    for (size_t p = 0; p < len;) {
        int32_t hit = -1;
        if (t->special_first[s[p]]) {
            for (size_t k = 0; k < t->n_special; k++) {
                int32_t id = t->special[k];
                if (!parse_special && t->type[id] == TOKEN_CONTROL)
                    continue;
                size_t l = t->text_len[id];
                if (l <= len - p && memcmp(s + p, t->text_arena + t->text_off[id], l) == 0) {
                    hit = id;
                    break; /* longest first */
                }
            }
        }
        if (hit < 0) {
            p++;
            continue;
        }
        encode_fragment(t, s + frag, p - frag, &cb, &w, &out);
        push(&out, hit);
        p += t->text_len[hit];
        frag = p;
    }
    encode_fragment(t, s + frag, len - frag, &cb, &w, &out);
    kv_free(w.id);
    kv_free(w.prev);
    kv_free(w.next);
    kv_free(w.heap);
    kv_free(cb.cps);
    kv_free(cb.off);
    *tokens = out.v ? out.v : kv_malloc(sizeof(int32_t));
    *n = out.n;
    return KV_OK;
}
