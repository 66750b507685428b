/* reading.h — a one-line reading of the comparison table, computed from its rows.
 *
 * Names, against the bf16 row (else the least compressed one), the policy whose
 * first token comes soonest (speculative when it speculates), the lowest p99
 * TTFT, the smallest KV on the wire and the lowest mean end-to-end latency,
 * each as a ratio to the baseline, then the delta perplexity (±95%) of each
 * policy named, where its accuracy was measured, and the compressed policy
 * that loses the least accuracy when it is not one of them. Nothing is printed for fewer
 * than two rows or when a latency figure is missing.
 */
#ifndef KV_READING_H
#define KV_READING_H

#include <stdio.h>

#include "core/report/report.h"

void kv_report_reading(FILE *out, const kv_policy_outcome *o, size_t n);

#endif
