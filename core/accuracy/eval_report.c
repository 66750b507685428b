/* eval_report.c — the figures derived from an evaluation's rows (with 95% intervals), its table and its JSON (see eval.h). */
#include "core/accuracy/eval.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/base/ci.h"

/* ---- Derived numbers ----------------------------------------------------------------------------- */

double kv_eval_row_ppl(const kv_eval_row *row)
{
    return row->nll_count ? exp(row->nll_sum / (double)row->nll_count) : NAN;
}

double kv_eval_row_ratio(const kv_eval_row *row, int n_layers)
{
    double bf16 = 0, stored = 0;
    for (int l = 0; l < n_layers; l++) {
        bf16 += row->layers[l].bf16_bytes;
        stored += row->layers[l].stored_bytes;
    }
    return stored > 0 ? bf16 / stored : NAN;
}

double kv_eval_row_accept(const kv_eval_row *row, int j)
{
    if (j < 1 || j > row->spec_k || row->spec_samples == 0)
        return NAN;
    return (double)row->accepted[j - 1] / (double)row->spec_samples;
}

void kv_eval_row_delta_ppl(const kv_eval_row *row, const kv_eval_row *ref, double *delta, double ci95[2])
{
    double ppl = kv_eval_row_ppl(row), ref_ppl = kv_eval_row_ppl(ref);
    *delta = ppl - ref_ppl;
    ci95[0] = ci95[1] = NAN;
    if (isnan(*delta))
        return;
    if (row == ref) {
        ci95[0] = ci95[1] = 0.0;
        return;
    }
    double m, h;
    kv_ci_mean(row->block_delta, (size_t)row->n_blocks, &m, &h);
    if (row->n_blocks < 2 || isnan(h))
        return;
    /* Centred on the exact mean difference (every token weighs the same), so the interval holds the
       estimate; the block means give only its spread. */
    double D = (row->nll_sum - ref->nll_sum) / (double)row->nll_count;
    ci95[0] = ref_ppl * expm1(D - h);
    ci95[1] = ref_ppl * expm1(D + h);
    if (ci95[0] > *delta)
        ci95[0] = *delta; /* rounding: the estimate stays inside */
    if (ci95[1] < *delta)
        ci95[1] = *delta;
}

static void share_ci(long k, long n, double *share, double ci95[2])
{
    *share = n > 0 ? (double)k / (double)n : NAN;
    kv_ci_wilson(k, n, &ci95[0], &ci95[1]);
}

/* Agreement with the reference: the reference agrees with itself by construction (no interval). */
static void agree_ci(const kv_eval_row *row, long k, long n, double *share, double ci95[2])
{
    share_ci(k, n, share, ci95);
    if (row->reference)
        ci95[0] = ci95[1] = *share;
}

void kv_eval_row_top1(const kv_eval_row *row, double *share, double ci95[2])
{
    agree_ci(row, row->top1_agree, row->top1_total, share, ci95);
}

void kv_eval_row_greedy(const kv_eval_row *row, double *share, double ci95[2])
{
    agree_ci(row, row->greedy_agree, row->greedy_total, share, ci95);
}

void kv_eval_row_needle(const kv_eval_row *row, double *recall, double ci95[2])
{
    share_ci(row->needle_hits, row->needle_total, recall, ci95);
}

void kv_eval_row_accept_ci(const kv_eval_row *row, int j, double ci95[2])
{
    ci95[0] = ci95[1] = NAN;
    if (j >= 1 && j <= row->spec_k && row->spec_samples > 0)
        kv_ci_wilson(row->accepted[j - 1], row->spec_samples, &ci95[0], &ci95[1]);
}

void kv_eval_row_accepted_share(const kv_eval_row *row, double *share, double ci95[2])
{
    *share = ci95[0] = ci95[1] = NAN;
    long S = row->spec_samples;
    int k = row->spec_k;
    if (k <= 0 || S <= 0)
        return;
    /* accepted[j - 1] speculations kept at least j tokens, so with a the tokens one keeps:
       sum a = sum_j accepted[j - 1], sum a^2 = sum_j (2j - 1) accepted[j - 1]. */
    double s1 = 0, s2 = 0;
    for (int j = 1; j <= k; j++) {
        s1 += (double)row->accepted[j - 1];
        s2 += (2.0 * j - 1) * (double)row->accepted[j - 1];
    }
    double mean = s1 / (double)S;
    *share = mean / k;
    if (S < 2) {
        ci95[0] = ci95[1] = *share;
        return;
    }
    double var = (s2 - (double)S * mean * mean) / (double)(S - 1);
    double h = kv_ci_t975((int)(S - 1)) * sqrt(var > 0 ? var : 0) / sqrt((double)S) / k;
    ci95[0] = *share - h < 0 ? 0 : *share - h;
    ci95[1] = *share + h > 1 ? 1 : *share + h;
}

double kv_eval_layer_att_err(const kv_kvstore_layer_stats *l)
{
    return l->att_ref_sq > 0 ? sqrt(l->att_err_sq / l->att_ref_sq) : NAN;
}

void kv_eval_row_tiers(const kv_eval_row *row, int n_layers, double *high, double *low, double *pruned)
{
    double t = 0, h = 0, lo = 0, p = 0;
    for (int l = 0; l < n_layers; l++) {
        t += row->layers[l].tokens;
        h += row->layers[l].tokens_high;
        lo += row->layers[l].tokens_low;
        p += row->layers[l].tokens_pruned;
    }
    t = t > 0 ? t : 1;
    *high = h / t;
    *low = lo / t;
    *pruned = p / t;
}

static double mean_att_err(const kv_eval_row *row, int n_layers)
{
    double e = 0, ref = 0;
    for (int l = 0; l < n_layers; l++) {
        e += row->layers[l].att_err_sq;
        ref += row->layers[l].att_ref_sq;
    }
    return ref > 0 ? sqrt(e / ref) : NAN;
}

/* ---- Printing ---------------------------------------------------------------------------------------- */

/* " " then v right-aligned in width with prec decimals ("+" sign if signed,
   "x" after it if ratio), or "-" for NaN. */
static void print_num(FILE *f, double v, int width, int prec, bool sign, bool ratio)
{
    char buf[64];
    if (isnan(v))
        snprintf(buf, sizeof buf, "-");
    else if (sign)
        snprintf(buf, sizeof buf, "%+.*f", prec, v);
    else
        snprintf(buf, sizeof buf, "%.*f%s", prec, v, ratio ? "x" : "");
    fprintf(f, " %*s", width, buf);
}

/* " " then "v ±h" right-aligned in width (v with prec decimals, signed if sign; h the larger side of
   [lo, hi] around v, scaled like v), "v" alone when the interval is unknown, "-" for NaN. */
static void print_ci(FILE *f, double v, const double ci95[2], double scale, int width, int prec, bool sign)
{
    char buf[64];
    if (isnan(v)) {
        snprintf(buf, sizeof buf, "-");
    } else {
        int n = snprintf(buf, sizeof buf, sign ? "%+.*f" : "%.*f", prec, v * scale);
        if (!isnan(ci95[0]) && !isnan(ci95[1]) && ci95[1] > ci95[0]) {
            double h = fmax(ci95[1] - v, v - ci95[0]) * scale;
            snprintf(buf + n, sizeof buf - (size_t)n, " \u00b1%.*f", prec, h);
        }
    }
    /* "±" is two bytes and one column. */
    int pad = width - (int)strlen(buf) + (strstr(buf, "\u00b1") ? 1 : 0);
    fprintf(f, " %*s%s", pad > 0 ? pad : 0, "", buf);
}

void kv_eval_print(FILE *f, const kv_eval_result *r)
{
    const kv_model_config *c = &r->model;
    const kv_eval_row *ref = &r->rows[r->reference_row];
    fprintf(f, "\nAccuracy on the reference model %s (%d layers, %d heads, %d KV heads, head_dim %d)\n", c->name,
            c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim);
    fprintf(f, "against %s: %d text prompt(s) (%ld scored tokens each row), %d needle prompt(s)\n\n", ref->name,
            r->prompts_text, r->text_tokens_scored, r->prompts_needle);
    fprintf(f, "%-16s %8s %9s %15s %11s %12s %7s %7s %9s\n", "policy", "KV ratio", "ppl", "delta ±95%", "top1%",
            "agree%", "prefix", "needle", "att err");
    for (int i = 0; i < r->n_rows; i++) {
        const kv_eval_row *row = &r->rows[i];
        double v, ci[2];
        fprintf(f, "%-16s", row->name);
        print_num(f, kv_eval_row_ratio(row, c->n_layers), 8, 2, false, true);
        print_num(f, kv_eval_row_ppl(row), 9, 3, false, false);
        kv_eval_row_delta_ppl(row, ref, &v, ci);
        print_ci(f, v, ci, 1.0, 15, 3, true);
        kv_eval_row_top1(row, &v, ci);
        print_ci(f, v, ci, 100.0, 11, 1, false);
        kv_eval_row_greedy(row, &v, ci);
        print_ci(f, v, ci, 100.0, 12, 1, false);
        print_num(f, row->prefix_count ? row->prefix_sum / row->prefix_count : NAN, 7, 1, false, false);
        if (row->needle_total)
            fprintf(f, " %4ld/%-2ld", row->needle_hits, row->needle_total);
        else
            fprintf(f, " %7s", "-");
        print_num(f, mean_att_err(row, c->n_layers), 9, 5, false, false);
        fprintf(f, "\n");
    }
    fprintf(f, "\nKV ratio: bf16 bytes / stored bytes (planes + fp16 metadata). ppl: teacher-forced perplexity on the\n"
               "texts after each prompt; top1%%: its argmax equals the reference's; agree%%: free-running greedy\n"
               "tokens equal to the reference's; prefix: identical greedy prefix; att err: relative L2 error of the\n"
               "attention output against the same queries over bf16 KV. ':anchor' rows decode on anchor-only KV.\n"
               "±: 95%% confidence interval (the larger side); delta: Student t over blocks of %d consecutive scored\n"
               "tokens of the paired NLL differences; shares: Wilson (docs/accuracy.md \"How steady these numbers are\").\n",
            KV_EVAL_BLOCK_TOKENS);

    for (int i = 0; i < r->n_rows; i++) {
        const kv_eval_row *row = &r->rows[i];
        if (!row->spec_k)
            continue;
        fprintf(f, "\nLynx acceptance per speculative position, %s (%ld speculations; P(first j tokens accepted)):\n",
                row->name, row->spec_samples);
        fprintf(f, "  j   ");
        for (int j = 1; j <= row->spec_k; j++)
            fprintf(f, " %5d", j);
        fprintf(f, "\n  rate");
        for (int j = 1; j <= row->spec_k; j++)
            print_num(f, kv_eval_row_accept(row, j), 5, 2, false, false);
        fprintf(f, "\n  ±95%%");
        for (int j = 1; j <= row->spec_k; j++) {
            double ci[2], v = kv_eval_row_accept(row, j);
            kv_eval_row_accept_ci(row, j, ci);
            print_num(f, isnan(v) || isnan(ci[0]) ? NAN : fmax(ci[1] - v, v - ci[0]), 5, 2, false, false);
        }
        double share, ci[2];
        kv_eval_row_accepted_share(row, &share, ci);
        fprintf(f, "\n  mean accepted tokens per speculation: %.2f of %d (95%% CI %.2f..%.2f)\n", share * row->spec_k,
                row->spec_k, ci[0] * row->spec_k, ci[1] * row->spec_k);
    }

    for (int i = 0; i < r->n_rows; i++) {
        const kv_eval_row *row = &r->rows[i];
        double low = 0, pruned = 0;
        for (int l = 0; l < c->n_layers; l++) {
            low += row->layers[l].tokens_low;
            pruned += row->layers[l].tokens_pruned;
        }
        if (low == 0 && pruned == 0)
            continue;
        fprintf(f, "\nDiffKV tiers per layer, %s (fractions of (token, KV head) pairs at the end of each prompt):\n",
                row->name);
        fprintf(f, "  layer  ratio   high    low  pruned  window\n");
        for (int l = 0; l < c->n_layers; l++) {
            const kv_kvstore_layer_stats *s = &row->layers[l];
            double t = s->tokens > 0 ? s->tokens : 1;
            fprintf(f, "  %5d ", l);
            print_num(f, s->stored_bytes > 0 ? s->bf16_bytes / s->stored_bytes : NAN, 6, 2, false, true);
            fprintf(f, " %6.3f %6.3f %7.3f %7.3f\n", s->tokens_high / t, s->tokens_low / t, s->tokens_pruned / t,
                    s->tokens_window / t);
        }
    }

    fprintf(f, "\nAttention output error per layer (relative L2 against the same queries over bf16 KV):\n  layer");
    for (int i = 0; i < r->n_rows; i++)
        if (!r->rows[i].reference)
            fprintf(f, " %11.11s", r->rows[i].name);
    fprintf(f, "\n");
    for (int l = 0; l < c->n_layers; l++) {
        fprintf(f, "  %5d", l);
        for (int i = 0; i < r->n_rows; i++)
            if (!r->rows[i].reference)
                print_num(f, kv_eval_layer_att_err(&r->rows[i].layers[l]), 11, 5, false, false);
        fprintf(f, "\n");
    }
}

/* ---- JSON ------------------------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v)
{
    if (isnan(v) || isinf(v))
        fputs("null", f);
    else
        fprintf(f, "%.9g", v);
}

/* `, "name": [lo, hi]` (null ends when unknown). */
static void json_pair(FILE *f, const char *name, const double ci95[2])
{
    fprintf(f, ", \"%s\": [", name);
    json_num(f, ci95[0]);
    fputs(", ", f);
    json_num(f, ci95[1]);
    fputc(']', f);
}

int kv_eval_write_json(const kv_eval_result *r, const char *path, kv_error *err)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return kv_error_set(err, KV_EFAIL, "cannot write '%s': %s", tmp, strerror(errno));
    const kv_model_config *c = &r->model;
    fprintf(f, "{\n  \"model\": {\"name\": ");
    json_str(f, c->name);
    fprintf(f, ", \"layers\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"vocab\": %d},\n", c->n_layers,
            c->n_heads, c->n_kv_heads, c->head_dim, c->vocab);
    fprintf(f, "  \"reference\": ");
    json_str(f, r->rows[r->reference_row].name);
    fprintf(f, ",\n  \"prompts_text\": %d,\n  \"prompts_needle\": %d,\n", r->prompts_text, r->prompts_needle);
    fprintf(f, "  \"ci95\": {\"delta_ppl\": \"Student t over blocks of %d consecutive scored tokens of the paired NLL "
               "differences\", \"block_tokens\": %d, \"shares\": \"Wilson\", \"spec_accepted_share\": \"Student t over "
               "speculations\"},\n  \"rows\": [\n",
            KV_EVAL_BLOCK_TOKENS, KV_EVAL_BLOCK_TOKENS);
    double ref_ppl = kv_eval_row_ppl(&r->rows[r->reference_row]);
    for (int i = 0; i < r->n_rows; i++) {
        const kv_eval_row *row = &r->rows[i];
        fprintf(f, "    {\"policy\": ");
        json_str(f, row->name);
        fprintf(f, ", \"anchor_view\": %s, \"reference\": %s,\n     \"kv_ratio\": ", row->anchor_view ? "true" : "false",
                row->reference ? "true" : "false");
        json_num(f, kv_eval_row_ratio(row, c->n_layers));
        fprintf(f, ", \"ppl\": ");
        json_num(f, kv_eval_row_ppl(row));
        double v, ci[2];
        fprintf(f, ", \"delta_ppl\": ");
        json_num(f, kv_eval_row_ppl(row) - ref_ppl);
        kv_eval_row_delta_ppl(row, &r->rows[r->reference_row], &v, ci);
        json_pair(f, "delta_ppl_ci95", ci);
        fprintf(f, ", \"ppl_blocks\": %d", row->n_blocks);
        kv_eval_row_top1(row, &v, ci);
        fprintf(f, ",\n     \"top1_agreement\": ");
        json_num(f, v);
        json_pair(f, "top1_agreement_ci95", ci);
        kv_eval_row_greedy(row, &v, ci);
        fprintf(f, ", \"greedy_agreement\": ");
        json_num(f, v);
        json_pair(f, "greedy_agreement_ci95", ci);
        kv_eval_row_needle(row, &v, ci);
        fprintf(f, ",\n     \"needle_recall\": ");
        json_num(f, v);
        json_pair(f, "needle_recall_ci95", ci);
        fprintf(f, ", \"greedy_prefix\": ");
        json_num(f, row->prefix_count ? row->prefix_sum / row->prefix_count : NAN);
        fprintf(f, ", \"needle_hits\": %ld, \"needle_total\": %ld, \"attention_error\": ", row->needle_hits,
                row->needle_total);
        json_num(f, mean_att_err(row, c->n_layers));
        fprintf(f, ",\n     \"spec_accept_rate\": [");
        for (int j = 1; j <= row->spec_k; j++) {
            json_num(f, kv_eval_row_accept(row, j));
            fputs(j < row->spec_k ? ", " : "", f);
        }
        fprintf(f, "], \"spec_accept_rate_ci95\": [");
        for (int j = 1; j <= row->spec_k; j++) {
            kv_eval_row_accept_ci(row, j, ci);
            fputc('[', f);
            json_num(f, ci[0]);
            fputs(", ", f);
            json_num(f, ci[1]);
            fputs(j < row->spec_k ? "], " : "]", f);
        }
        kv_eval_row_accepted_share(row, &v, ci);
        fprintf(f, "], \"spec_accepted_share\": ");
        json_num(f, v);
        json_pair(f, "spec_accepted_share_ci95", ci);
        fprintf(f, ", \"spec_samples\": %ld,\n     \"layers\": [\n", row->spec_samples);
        for (int l = 0; l < c->n_layers; l++) {
            const kv_kvstore_layer_stats *s = &row->layers[l];
            double t = s->tokens > 0 ? s->tokens : 1;
            fprintf(f, "       {\"kv_ratio\": ");
            json_num(f, s->stored_bytes > 0 ? s->bf16_bytes / s->stored_bytes : NAN);
            fprintf(f, ", \"high\": ");
            json_num(f, s->tokens_high / t);
            fprintf(f, ", \"low\": ");
            json_num(f, s->tokens_low / t);
            fprintf(f, ", \"pruned\": ");
            json_num(f, s->tokens_pruned / t);
            fprintf(f, ", \"window\": ");
            json_num(f, s->tokens_window / t);
            fprintf(f, ", \"attention_error\": ");
            json_num(f, kv_eval_layer_att_err(s));
            fprintf(f, "}%s\n", l + 1 < c->n_layers ? "," : "");
        }
        fprintf(f, "     ]}%s\n", i + 1 < r->n_rows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        remove(tmp);
        return kv_error_set(err, KV_EFAIL, "cannot write '%s'", tmp);
    }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return kv_error_set(err, KV_EFAIL, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    }
    return KV_OK;
}
