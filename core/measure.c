/* measure.c — kernel efficiencies for the timing model. */
#include "core/measure.h"

#include <stdio.h>
#include <string.h>

int kv_measure_costs(const kv_scenario *s, kv_kernel_costs *costs, kv_error *err)
{
    memset(costs, 0, sizeof *costs);
    snprintf(costs->source, sizeof costs->source, "model (%s roofline)", s->decode_device.name);
    if (strcmp(s->timing_source, "measured") == 0) {
        char w[512];
        return kv_error_set(err, KV_EINPUT, "%s: timing.source: measured is wired in with the kernels (issue 3)",
                            kv_scenario_where(s, "timing.source", w, sizeof w));
    }
    return KV_OK;
}
