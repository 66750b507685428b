/* measure.h — kernel costs for the timing model: measured on a backend, or from a calibration file. */
#ifndef KV_MEASURE_H
#define KV_MEASURE_H

#include "core/engine.h"
#include "core/scenario.h"

/* Fills costs per the scenario's timing section: "model" leaves the device
   profile's efficiencies; "measured" runs the encode and decode kernels on
   timing.backend at the scenario's real tensor sizes; timing.calibration reads
   efficiencies from a `kvsim bench kernels --json` file. */
int kv_measure_costs(const kv_scenario *s, kv_kernel_costs *costs, kv_error *err);

#endif
