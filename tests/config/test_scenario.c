/* test_scenario.c — every kind of bad scenario gives one clear message (file:line:col, key), exit 2, no output. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/config/scenario.h"
#include "tests/support.h"

/* A valid base; each case replaces or appends lines. */
static const char *base =
    "name: t\n"
    "model: llama-3-8b\n"
    "network: {model: ideal}\n"
    "workload:\n"
    "  requests: 3\n"
    "  rate_per_s: 1\n"
    "policies: [bf16]\n";

/* Writes text as s.yaml in a fresh folder and runs `kvsim validate` on it. */
static int validate_text(const char *text, char **out, char **dir)
{
    *dir = kvt_tempdir();
    char *path = kvt_write(*dir, "s.yaml", text);
    char args[4200];
    snprintf(args, sizeof args, "validate %s", path);
    int rc = kvt_kvsim(args, out);
    free(path);
    return rc;
}

static void expect_bad(const char *text, const char *fragment1, const char *fragment2)
{
    char *out = NULL, *dir = NULL;
    int rc = validate_text(text, &out, &dir);
    cr_expect_eq(rc, 2, "exit code %d for:\n%s\noutput: %s", rc, text, out);
    cr_expect(strstr(out, fragment1) != NULL, "expected '%s' in: %s", fragment1, out);
    if (fragment2)
        cr_expect(strstr(out, fragment2) != NULL, "expected '%s' in: %s", fragment2, out);
    cr_expect(strstr(out, "Sanitizer") == NULL, "sanitizer report: %s", out);
    kvt_rmtree(dir);
    free(dir);
    free(out);
}

Test(scenario, base_is_valid)
{
    char *out = NULL, *dir = NULL;
    int rc = validate_text(base, &out, &dir);
    cr_assert_eq(rc, 0, "output: %s", out);
    cr_assert(strstr(out, "ok:"), "output: %s", out);
    kvt_rmtree(dir);
    free(dir);
    free(out);
}

Test(scenario, yaml_syntax_error_has_position)
{
    expect_bad("name: t\nmodel: [llama\nseed: 1\n", "s.yaml:", "YAML syntax error");
}

Test(scenario, unknown_key_did_you_mean)
{
    char text[2048];
    snprintf(text, sizeof text, "%s%s", base, "sede: 4\n");
    expect_bad(text, "s.yaml:8:1: unknown key 'sede'", "did you mean 'seed'?");
}

Test(scenario, unknown_nested_key_did_you_mean)
{
    expect_bad("name: t\nmodel: llama-3-8b\nnetwork: {model: ideal, nic_bandwith_gbps: 4}\n"
               "workload: {requests: 1}\npolicies: [bf16]\n",
               "unknown key 'network.nic_bandwith_gbps'", "did you mean 'nic_bandwidth_gbps'?");
}

Test(scenario, wrong_type)
{
    expect_bad("name: t\nmodel: llama-3-8b\ncluster: {decode: {nodes: many}}\npolicies: [bf16]\n",
               "s.yaml:3:27: cluster.decode.nodes: expected a finite number, got 'many'", NULL);
}

Test(scenario, section_must_be_mapping)
{
    expect_bad("name: t\nmodel: llama-3-8b\ncluster: 3\n", "s.yaml:3:10: cluster: expected a mapping", NULL);
}

Test(scenario, negative_number)
{
    expect_bad("name: t\nmodel: llama-3-8b\nnetwork: {nic_bandwidth_gbps: -5}\n",
               "s.yaml:3:31: network.nic_bandwidth_gbps: must be greater than 0", NULL);
}

Test(scenario, nan_number)
{
    expect_bad("name: t\nmodel: llama-3-8b\nworkload: {rate_per_s: .nan}\n",
               "workload.rate_per_s: expected a finite number, got '.nan'", "s.yaml:3:");
}

Test(scenario, out_of_range_integer)
{
    expect_bad("name: t\nmodel: llama-3-8b\ncluster: {prefill: {tp: 0}}\n",
               "s.yaml:3:25: cluster.prefill.tp: 0 is out of range", NULL);
}

Test(scenario, missing_required_model)
{
    expect_bad("name: t\npolicies: [bf16]\n", "missing required key 'model'", NULL);
}

Test(scenario, missing_scenario_file)
{
    char *out = NULL;
    int rc = kvt_kvsim("validate /nonexistent/kvsim/none.yaml", &out);
    cr_expect_eq(rc, 2);
    cr_expect(strstr(out, "/nonexistent/kvsim/none.yaml: cannot open"), "got: %s", out);
    free(out);
}

Test(scenario, missing_model_card)
{
    expect_bad("name: t\nmodel: llama-9-trillion\n", "s.yaml:2:8: no model card named 'llama-9-trillion'", NULL);
}

Test(scenario, missing_trace_file)
{
    char text[2048];
    snprintf(text, sizeof text, "%s", "name: t\nmodel: llama-3-8b\n"
                                      "workload: {trace: {format: azure, path: no-such-trace.csv}}\n"
                                      "policies: [bf16]\n");
    expect_bad(text, "workload.trace.path: file 'no-such-trace.csv' not found", "s.yaml:3:");
}

Test(scenario, empty_trace)
{
    char *dir = kvt_tempdir();
    char *trace = kvt_write(dir, "empty.csv", "");
    char text[4096];
    snprintf(text, sizeof text,
             "name: t\nmodel: llama-3-8b\nnetwork: {model: ideal}\n"
             "workload: {trace: {format: azure, path: %s}}\npolicies: [bf16]\n", trace);
    expect_bad(text, "empty.csv", NULL);
    kvt_rmtree(dir);
    free(dir);
    free(trace);
}

Test(scenario, unsorted_trace)
{
    char *dir = kvt_tempdir();
    char *trace = kvt_write(dir, "t.csv",
                            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                            "2023-11-16 18:15:46.6805900,100,10\n"
                            "2023-11-16 18:15:45.0000000,100,10\n");
    char text[4096];
    snprintf(text, sizeof text,
             "name: t\nmodel: llama-3-8b\nnetwork: {model: ideal}\n"
             "workload: {trace: {format: azure, path: %s}}\npolicies: [bf16]\n", trace);
    expect_bad(text, "t.csv:3:", NULL);
    kvt_rmtree(dir);
    free(dir);
    free(trace);
}

Test(scenario, enum_value)
{
    expect_bad("name: t\nmodel: llama-3-8b\nnetwork: {model: carrier-pigeon}\n",
               "network.model: 'carrier-pigeon' is not one of simgrid|ideal", "s.yaml:3:");
}

Test(scenario, duplicate_key)
{
    expect_bad("name: t\nmodel: llama-3-8b\nseed: 1\nseed: 2\n", "s.yaml:4:1: duplicate key 'seed'", NULL);
}

Test(scenario, unknown_policy_file)
{
    expect_bad("name: t\nmodel: llama-3-8b\npolicies: [int3000]\n", "int3000", "not found");
}

Test(scenario, policy_settings_for_unlisted_policy)
{
    expect_bad("name: t\nmodel: llama-3-8b\npolicies: [int4]\npolicy: {int8: {group_size: 64}}\n",
               "policy.int8: 'int8' is not in policies", "did you mean 'int4'?");
}

Test(scenario, set_override_applies_and_is_checked)
{
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "s.yaml", base);
    char args[4200], *out = NULL;
    snprintf(args, sizeof args, "validate %s --set workload.requests=7 --set policies=[bf16,int8]", path);
    cr_expect_eq(kvt_kvsim(args, &out), 0, "%s", out);
    cr_expect(strstr(out, "7 requests") && strstr(out, "bf16 int8"), "got: %s", out);
    free(out);
    snprintf(args, sizeof args, "validate %s --set workload.reqests=7", path);
    cr_expect_eq(kvt_kvsim(args, &out), 2, "%s", out);
    cr_expect(strstr(out, "--set workload.reqests") && strstr(out, "did you mean 'requests'?"), "got: %s", out);
    free(out);
    snprintf(args, sizeof args, "validate %s --set seed", path);
    cr_expect_eq(kvt_kvsim(args, &out), 2, "%s", out);
    free(out);
    kvt_rmtree(dir);
    free(dir);
    free(path);
}

Test(scenario, bad_cli_flags)
{
    char *out = NULL;
    cr_expect_eq(kvt_kvsim("run", &out), 2);
    free(out);
    cr_expect_eq(kvt_kvsim("run scenarios/quickstart.yaml --bogus", &out), 2);
    cr_expect(strstr(out, "unknown or incomplete option '--bogus'"), "got: %s", out);
    free(out);
    cr_expect_eq(kvt_kvsim("run scenarios/quickstart.yaml --seed -3", &out), 2);
    free(out);
}

Test(scenario, failed_run_leaves_no_output)
{
    /* The weights of a 70B model do not fit one H100: the run fails before writing anything. */
    char *dir = kvt_tempdir();
    char *path = kvt_write(dir, "s.yaml",
                           "name: t\nmodel: llama-3-70b\nnetwork: {model: ideal}\nworkload: {requests: 2}\n"
                           "policies: [bf16]\n");
    char args[4200], *out = NULL;
    snprintf(args, sizeof args, "run %s --out %s/out", path, dir);
    cr_expect_eq(kvt_kvsim(args, &out), 2, "%s", out);
    cr_expect(strstr(out, "cluster.decode") && strstr(out, "raise cluster.decode.tp"), "got: %s", out);
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/out/results.json", dir);
    struct stat st;
    cr_expect(stat(probe, &st) != 0, "results.json exists after a failed run");
    free(out);
    kvt_rmtree(dir);
    free(dir);
    free(path);
}


Test(scenario, network_topology_errors_at_validation)
{
    expect_bad("name: t\nmodel: llama-3-8b\nnetwork: {topology: torus, torus_dims: [3]}\n"
               "cluster: {prefill: {nodes: 2}, decode: {nodes: 2}}\n",
               "network.torus_dims: the torus is too small for the hosts", NULL);
    expect_bad("name: t\nmodel: llama-3-8b\nnetwork: {topology: platform, platform_file: missing.xml}\n",
               "network.platform_file: file 'missing.xml' not found", "s.yaml:3:");
    expect_bad("name: t\nmodel: llama-3-8b\nnetwork: {topology: hypercube}\n",
               "network.topology: 'hypercube' is not one of", NULL);
    expect_bad("name: t\nmodel: llama-3-8b\nnetwork: {nic_bandwidth_gbps: 0}\n",
               "network.nic_bandwidth_gbps: must be greater than 0", NULL);
}

Test(scenario, every_shipped_scenario_validates_all)
{
    FILE *p = popen("find scenarios -name '*.yaml' -not -path '*/models/*' -not -path '*/devices/*' "
                    "-not -path '*/sweeps/*' | sort", "r");
    cr_assert(p);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        char args[1200], *out = NULL;
        snprintf(args, sizeof args, "validate %s", line);
        cr_expect_eq(kvt_kvsim(args, &out), 0, "%s: %s", line, out);
        free(out);
        n++;
    }
    pclose(p);
    cr_expect(n >= 4, "only %d scenarios found", n);
}
