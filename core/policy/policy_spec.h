/* policy_spec.h — one policy as a scenario names it: its Lua file and its `policy.<name>.*` parameters.
 *
 * The one place that turns a scenario's `policies` list and `policy` mapping into what the policy host
 * loads; `kvsim run`, `sweep` and `eval` all go through it (docs/policies.md, "Parameters").
 */
#ifndef KV_POLICY_SPEC_H
#define KV_POLICY_SPEC_H

#include "core/base/error.h"
#include "core/config/scenario.h"
#include "core/policy/policy.h"

typedef struct kv_policy_spec {
    char *name;               /* as listed in `policies` */
    char *file;               /* resolved path of the Lua file */
    kv_policy_param *params;  /* policy.<name>.<param>, `file` excepted, in file order */
    int n_params;
    char (*where)[512];       /* [n_params] "file:line:col" or "--set KEY" of each parameter */
} kv_policy_spec;

/* Reads policy i of s->policies: the file is policy.<name>.file, else policies/<name>.lua, resolved as
   kv_scenario_find_file resolves files. KV_EINPUT naming the key otherwise. The strings of params point
   into s, which must outlive the spec. */
int kv_policy_spec_read(const kv_scenario *s, size_t i, kv_policy_spec *out, kv_error *err);
void kv_policy_spec_free(kv_policy_spec *spec); /* zeroes it; a zeroed spec is fine */

/* Loads the spec's file with its parameters and the scenario's policy_limits. */
int kv_policy_spec_load(const kv_policy_spec *spec, const kv_scenario *s, kv_policy **out, kv_error *err);

#endif
