/* fuzz_trace.c — libFuzzer harness of the trace readers (core/workload/trace.c). Built three
 * times, once per format (KV_FUZZ_FORMAT = KV_TRACE_AZURE, _MOONCAKE, _BURSTGPT):
 * fuzz_trace_azure, fuzz_trace_mooncake, fuzz_trace_burstgpt. The input is the file.
 *
 * Beyond "no crash, no UB, no leak" it checks the reader's promises: a failure is
 * KV_EINPUT with a message starting with the path and no partial result; a success
 * has ids in order, times from 0 that never go back, at least 1 token each way; a
 * row cap gives a prefix of the uncapped list; time_scale scales the times.
 */
#include <math.h>
#include <string.h>

#include "core/base/alloc.h"
#include "core/workload/trace.h"
#include "tests/fuzz/fuzz_util.h"

#ifndef KV_FUZZ_FORMAT
#error "define KV_FUZZ_FORMAT (KV_TRACE_AZURE, KV_TRACE_MOONCAKE or KV_TRACE_BURSTGPT)"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = kvf_write_input(KV_FUZZ_FORMAT == KV_TRACE_MOONCAKE ? "trace.jsonl" : "trace.csv", data, size);
    kv_request_spec *rows = (kv_request_spec *)&rows, *capped = (kv_request_spec *)&capped;
    size_t n = 99, n_capped = 99;
    kv_error err = {0};
    int rc = kv_trace_read(KV_FUZZ_FORMAT, path, 0, 1.0, &rows, &n, &err);
    if (rc != KV_OK) {
        KVF_CHECK(rc == KV_EINPUT && err.code == KV_EINPUT, "rc %d code %d: %s", rc, err.code, err.msg);
        KVF_CHECK(strncmp(err.msg, path, strlen(path)) == 0 && err.msg[strlen(path)] == ':', "message '%s'",
                  err.msg);
        KVF_CHECK(rows == NULL && n == 0, "partial result (%zu rows) with an error", n);
        return 0;
    }
    KVF_CHECK(rows != NULL && n > 0, "success without rows");
    KVF_CHECK(rows[0].arrival_s == 0.0, "first arrival %g", rows[0].arrival_s);
    for (size_t i = 0; i < n; i++) {
        KVF_CHECK(rows[i].id == i, "row %zu has id %llu", i, (unsigned long long)rows[i].id);
        KVF_CHECK(rows[i].prompt_tokens >= 1 && rows[i].output_tokens >= 1, "row %zu tokens %d %d", i,
                  rows[i].prompt_tokens, rows[i].output_tokens);
        KVF_CHECK(isfinite(rows[i].arrival_s) && rows[i].arrival_s >= 0.0, "row %zu arrival %g", i,
                  rows[i].arrival_s);
        KVF_CHECK(i == 0 || rows[i].arrival_s >= rows[i - 1].arrival_s, "row %zu goes back in time", i);
    }
    rc = kv_trace_read(KV_FUZZ_FORMAT, path, 2, 0.5, &capped, &n_capped, &err);
    KVF_CHECK(rc == KV_OK, "the capped read failed where the whole read did not: %s", err.msg);
    KVF_CHECK(n_capped == (n < 2 ? n : 2), "capped read gave %zu rows of %zu", n_capped, n);
    for (size_t i = 0; i < n_capped; i++)
        KVF_CHECK(capped[i].prompt_tokens == rows[i].prompt_tokens &&
                      capped[i].output_tokens == rows[i].output_tokens &&
                      capped[i].arrival_s == rows[i].arrival_s * 0.5,
                  "capped row %zu differs", i);
    kv_free(capped);
    kv_free(rows);
    return 0;
}
