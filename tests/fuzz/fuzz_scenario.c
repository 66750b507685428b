/* fuzz_scenario.c — libFuzzer harness of the scenario loader (core/config/scenario.c, the
 * YAML tree of core/config/ytree.c, the schema binding of core/config/schema.c, the model and
 * device cards of core/config/cards.c). The input is a scenario file; lines after a line
 * "#%set" are --set overrides (a YAML comment, so a plain scenario is unchanged).
 *
 * Beyond "no crash, no UB, no leak" it checks the loader's promises: a failure is
 * KV_EINPUT with a message that names the file or the override and no partial result.
 */
#include <string.h>

#include "core/base/alloc.h"
#include "core/config/scenario.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_OVERRIDES 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char marker[] = "\n#%set\n";
    size_t yaml_len = size;
    const uint8_t *set = NULL;
    for (size_t i = 0; i + sizeof marker - 1 <= size; i++)
        if (memcmp(data + i, marker, sizeof marker - 1) == 0) {
            yaml_len = i + 1;
            set = data + i + sizeof marker - 1;
            break;
        }
    const char *path = kvf_write_input("scenario.yaml", data, yaml_len);

    char *overrides[MAX_OVERRIDES];
    int n_overrides = 0;
    if (set) {
        const uint8_t *end = data + size;
        while (set < end && n_overrides < MAX_OVERRIDES) {
            const uint8_t *nl = memchr(set, '\n', (size_t)(end - set));
            size_t len = nl ? (size_t)(nl - set) : (size_t)(end - set);
            overrides[n_overrides++] = kv_strndup((const char *)set, len);
            set += len + (nl != NULL);
        }
    }

    kv_scenario *s = (kv_scenario *)&s;
    kv_error err = {0};
    int rc = kv_scenario_load(path, (const char *const *)overrides, n_overrides, &s, &err);
    if (rc) {
        KVF_CHECK(rc == KV_EINPUT && err.code == KV_EINPUT && err.msg[0], "rc %d code %d: %s", rc, err.code,
                  err.msg);
        KVF_CHECK(s == NULL, "partial result");
    } else {
        KVF_CHECK(s != NULL, "success without a scenario");
        kv_scenario_destroy(s);
    }
    for (int i = 0; i < n_overrides; i++)
        kv_free(overrides[i]);
    return 0;
}
