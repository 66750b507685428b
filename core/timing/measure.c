/* measure.c — kernel costs for the timing model: roofline, calibration file, or measured on a backend. */
#include "core/timing/measure.h"

#include <stdio.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/kernel_time.h"

/* Seconds per encoded value of one tensor encoding on be, or 0 for bf16 (a copy: no kernel to time). */
static int time_tensor(kv_backend *be, const kv_tensor_enc *t, int tokens, int head_dim, int repeats,
                       double *encode_per_value, double *decode_per_value, kv_error *err)
{
    *encode_per_value = *decode_per_value = 0;
    if (t->kind != KV_TENSOR_INT)
        return KV_OK;
    kv_quant_layout l = {(uint32_t)tokens, (uint32_t)head_dim, (uint32_t)t->group_size,
                         t->per_channel ? KV_GROUP_CHANNEL : KV_GROUP_TOKEN};
    kv_kernel_timing opts = {repeats, tokens > 4096 ? 4096.0 / tokens : 1.0};
    double enc = 0, dec = 0;
    int rc = kv_kernel_time_encode(be, &l, (unsigned)t->bits, (unsigned)t->anchor_bits, &opts, &enc, err);
    if (!rc)
        rc = kv_kernel_time_decode(be, &l, (unsigned)t->bits, (unsigned)t->anchor_bits, 0, &opts, &dec, err);
    if (rc)
        return rc;
    double values = (double)tokens * head_dim;
    *encode_per_value = enc / values;
    *decode_per_value = dec / values;
    return KV_OK;
}

static int measured(const kv_scenario *s, kv_policy *p, int prompt_tokens, kv_kernel_costs *c, kv_error *err)
{
    char w[512];
    kv_backend *be = NULL;
    int rc = kv_backend_open(s->timing.backend, 0, &be, err);
    if (rc)
        return kv_error_prefix(err, "%s: timing.backend: ", kv_scenario_where(s, "timing.backend", w, sizeof w));
    const kv_model_card *m = &s->model_card;
    kv_policy_model pm = {m->name, m->layers, m->heads, m->kv_heads, m->head_dim};
    kv_policy_request pr = {0, prompt_tokens, 1, 0};
    kv_encoding enc;
    rc = kv_policy_encoding(p, &pm, &pr, 0, 0, &enc, err);
    double ke = 0, kd = 0, ve = 0, vd = 0;
    if (!rc)
        rc = time_tensor(be, &enc.key, prompt_tokens, m->head_dim, s->timing.samples, &ke, &kd, err);
    if (!rc)
        rc = time_tensor(be, &enc.value, prompt_tokens, m->head_dim, s->timing.samples, &ve, &vd, err);
    if (!rc) {
        c->encode_s_per_value = (ke + ve) / 2;
        c->decode_s_per_value = (kd + vd) / 2;
        kv_backend_props props;
        kv_backend_get_props(be, &props);
        snprintf(c->source, sizeof c->source, "measured on %s (%s)%s", kv_backend_name(be), props.device,
                 c->encode_s_per_value > 0 ? "" : "; bf16 has no kernel: roofline");
    }
    kv_backend_close(be);
    return rc;
}

int kv_measure_costs(const kv_scenario *s, kv_policy *p, int prompt_tokens, kv_kernel_costs *c, kv_error *err)
{
    memset(c, 0, sizeof *c);
    char w[512];
    if (s->timing.source == KV_TIMING_MEASURED)
        return measured(s, p, prompt_tokens > 0 ? prompt_tokens : 1, c, err);
    if (s->timing.calibration[0]) {
        char path[4096];
        int rc = kv_scenario_find_file(s, s->timing.calibration, "timing.calibration", path, sizeof path, err);
        kv_kernel_calib *calib = NULL;
        if (!rc)
            rc = kv_kernel_calib_load(path, NULL, &calib, err);
        if (rc)
            return kv_error_prefix(err, "%s: timing.calibration: ",
                                   kv_scenario_where(s, "timing.calibration", w, sizeof w));
        c->encode_efficiency = kv_kernel_calib_efficiency(calib, "encode", 0);
        c->decode_efficiency = kv_kernel_calib_efficiency(calib, "decode", 0);
        snprintf(c->source, sizeof c->source, "model, kernel efficiencies from %s", s->timing.calibration);
        kv_kernel_calib_destroy(calib);
        return KV_OK;
    }
    snprintf(c->source, sizeof c->source, "model (%s roofline)", s->decode_device.name);
    return KV_OK;
}

static int need_key(const kv_scenario *s, const char *key, const char *value, kv_error *err)
{
    char w[512];
    if (value[0])
        return KV_OK;
    return kv_error_set(err, KV_EINPUT, "%s: timing.source: profile needs %s (see docs/timing.md)",
                        kv_scenario_where(s, "timing.source", w, sizeof w), key);
}

int kv_measure_profiles(const kv_scenario *s, kv_profile **prefill, kv_profile **decode, kv_error *err)
{
    *prefill = *decode = NULL;
    if (s->timing.source != KV_TIMING_PROFILE)
        return KV_OK;
    int rc = need_key(s, "timing.profile.file", s->timing.profile.file, err);
    if (!rc)
        rc = need_key(s, "timing.profile.model", s->timing.profile.model, err);
    if (!rc)
        rc = need_key(s, "timing.profile.prefill_hardware", s->timing.profile.prefill_hardware, err);
    char path[4096], w[512];
    if (!rc)
        rc = kv_scenario_find_file(s, s->timing.profile.file, "timing.profile.file", path, sizeof path, err);
    if (rc)
        return rc;
    const char *decode_hw =
        s->timing.profile.decode_hardware[0] ? s->timing.profile.decode_hardware : s->timing.profile.prefill_hardware;
    const char *decode_key =
        s->timing.profile.decode_hardware[0] ? "timing.profile.decode_hardware" : "timing.profile.prefill_hardware";
    char where[700];
    snprintf(where, sizeof where, "%s: timing.profile.prefill_hardware",
             kv_scenario_where(s, "timing.profile.prefill_hardware", w, sizeof w));
    rc = kv_profile_load(path, s->timing.profile.model, s->timing.profile.prefill_hardware, s->cluster.prefill.tp,
                         where, prefill, err);
    snprintf(where, sizeof where, "%s: %s", kv_scenario_where(s, decode_key, w, sizeof w), decode_key);
    if (!rc)
        rc = kv_profile_load(path, s->timing.profile.model, decode_hw, s->cluster.decode.tp, where, decode, err);
    if (rc) {
        kv_profile_destroy(*prefill);
        *prefill = NULL;
    }
    return rc;
}
