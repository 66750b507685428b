/* test_net_child_key.c — errors the SimGrid child finds (platform files, host names, priority classes)
 * carry their dotted key in kv_error.key, sent in the child's reply (sg_proto.h), and read
 * "<source>: <key>: <what>" (or "<source>: network: <what>" without a key); docs/network.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/net_support.h"
#include "tests/support.h"

/* Creates cfg, expects KV_EINPUT from the child with err.key == key and the message starting with
   `head` and holding `word`. */
static void expect_child_error(const kv_net_config *cfg, const char *key, const char *head, const char *word)
{
    nett_rec r = {0};
    kv_net *net = NULL;
    kv_error err;
    kv_error_clear(&err);
    int rc = kv_net_create(cfg, nett_done, &r, &net, &err);
    if (rc != KV_OK && strstr(err.msg, "not built"))
        cr_skip_test("skipped: SimGrid is not built into this kvsim");
    cr_assert_eq(rc, KV_EINPUT, "want bad input, got %d: %s", rc, err.msg);
    cr_assert_null(net);
    cr_expect_str_eq(err.key, key, "key of: %s", err.msg);
    cr_expect(strncmp(err.msg, head, strlen(head)) == 0, "'%s' does not start with '%s'", err.msg, head);
    cr_expect(strstr(err.msg, word), "'%s' not in: %s", word, err.msg);
    cr_expect_null(strstr(err.msg + strlen(head), head), "the key is written once: %s", err.msg);
}

static const char small_platform[] = "<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM "
                                     "\"https://simgrid.org/simgrid.dtd\">\n<platform version=\"4.1\">"
                                     "<zone id=\"z\" routing=\"Full\"><host id=\"a\" speed=\"1f\"/>"
                                     "<host id=\"b\" speed=\"1f\"/></zone></platform>\n";

Test(net_child_key, platform_errors_name_their_key)
{
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 4, 100.0, 1e-6);
    cfg.topology = KV_TOPO_PLATFORM;
    char *dir = kvt_tempdir();
    char *broken = kvt_write(dir, "broken.xml", "<platform version=\"4.1\"><zone id=\"z\"");
    cfg.platform_file = broken;
    expect_child_error(&cfg, "network.platform_file", "test.yaml: network.platform_file: ", "broken.xml");
    char *small = kvt_write(dir, "small.xml", small_platform);
    cfg.platform_file = small;
    expect_child_error(&cfg, "", "test.yaml: network: ", "has 2 hosts, the scenario needs 4");
    const char *names[4] = {"a", "b", "c", "d"};
    cfg.host_names = names;
    expect_child_error(&cfg, "network.host_names", "test.yaml: network.host_names: ", "no host 'c'");
    free(broken);
    free(small);
    kvt_rmtree(dir);
    free(dir);
}

Test(net_child_key, priority_errors_name_their_key)
{
    kv_net_config cfg = nett_star(KV_NET_SIMGRID, 4, 100.0, 1e-6);
    cfg.n_options = 1;
    cfg.option_key[0] = "network/optim";
    cfg.option_value[0] = "Full";
    cfg.priority = KV_PRIO_STRICT;
    expect_child_error(&cfg, "network.priority", "test.yaml: network.priority: ", "Lazy");
}
