/* sg_options.c — the simgrid model's input checks, before anything is forked: topology sizes, the
 * SimGrid options a scenario may pass through (their schema), the platform file, priority classes. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/alloc.h"
#include "core/base/infile.h"
#include "net/net.h"
#include "net/simgrid/sg_options.h"
#include "net/simgrid/sg_proto.h"

#define SG_MAX_FAT_TREE_SLOTS 8192
#define SG_MAX_FAT_TREE_UPLINKS 65536 /* leaves x spines */
#define SG_MAX_TORUS_SLOTS 2048
#define SG_MAX_DRAGONFLY_SLOTS 2048
#define SG_MAX_WEIGHT_RATIO 1e6

/* ---- input checks, before anything is forked ---- */

const char *kv_sg_option_value(const kv_net_config *cfg, const char *key)
{
    const char *v = NULL;
    for (int i = 0; i < cfg->n_options; i++)
        if (cfg->option_key[i] && strcmp(cfg->option_key[i], key) == 0)
            v = cfg->option_value[i];
    return v;
}

static int bad(kv_error *err, const char *src, const char *fmt, const char *key, const char *detail)
{
    char dotted[96];
    snprintf(dotted, sizeof dotted, "network.%s", key);
    return kv_error_set_key(err, KV_EINPUT, dotted, "%s: network.%s: %s%s", src, key, fmt, detail ? detail : "");
}

/* Number of host positions the topology offers, or -1 with *err set. */
static long topology_slots(const kv_net_config *cfg, const char *src, kv_error *err)
{
    char detail[160];
    switch (cfg->topology) {
    case KV_TOPO_STAR:
        return cfg->hosts;
    case KV_TOPO_FAT_TREE: {
        if (cfg->hosts_per_leaf < 1)
            return bad(err, src, "must be >= 1 for a fat-tree", "hosts_per_leaf", NULL), -1;
        if (cfg->fat_tree_leaves < 0)
            return bad(err, src, "must be >= 0 (0: as many as the hosts need)", "fat_tree_leaves", NULL), -1;
        long leaves = cfg->fat_tree_leaves > 0 ? cfg->fat_tree_leaves
                                               : (cfg->hosts + cfg->hosts_per_leaf - 1) / cfg->hosts_per_leaf;
        double sw = cfg->switch_bandwidth_gbps > 0 ? cfg->switch_bandwidth_gbps : cfg->nic_bandwidth_gbps;
        if (cfg->fat_tree_spines < 0)
            return bad(err, src, "must be >= 0 (0: from oversubscription)", "fat_tree_spines", NULL), -1;
        double ideal = cfg->hosts_per_leaf * cfg->nic_bandwidth_gbps / sw; /* spines for 1:1 */
        if (cfg->fat_tree_spines > 0) {
            if (cfg->oversubscription > 0 &&
                fabs(ideal / cfg->fat_tree_spines - cfg->oversubscription) > 1e-9 * cfg->oversubscription) {
                snprintf(detail, sizeof detail,
                         " (%d spines of %g Gb/s under %d hosts of %g Gb/s give %g:1, not %g:1)",
                         cfg->fat_tree_spines, sw, cfg->hosts_per_leaf, cfg->nic_bandwidth_gbps,
                         ideal / cfg->fat_tree_spines, cfg->oversubscription);
                return bad(err, src, "disagrees with fat_tree_spines", "oversubscription", detail), -1;
            }
        } else {
            double over = cfg->oversubscription > 0 ? cfg->oversubscription : 1.0;
            double spines = ideal / over;
            if (spines < 1 - 1e-9 || fabs(spines - floor(spines + 0.5)) > 1e-9 * spines) {
                snprintf(detail, sizeof detail,
                         " (%d hosts x %g Gb/s / (%g x %g Gb/s uplinks) = %g spines; set fat_tree_spines)",
                         cfg->hosts_per_leaf, cfg->nic_bandwidth_gbps, over, sw, spines);
                return bad(err, src, "does not give a whole number of spine switches", "oversubscription",
                           detail), -1;
            }
        }
        if (leaves * cfg->hosts_per_leaf < cfg->hosts) {
            snprintf(detail, sizeof detail, " (%ld leaves x %d hosts < %d hosts)", leaves, cfg->hosts_per_leaf,
                     cfg->hosts);
            return bad(err, src, "the fat-tree is too small for the hosts", "fat_tree_leaves", detail), -1;
        }
        if (leaves > SG_MAX_FAT_TREE_SLOTS / cfg->hosts_per_leaf) {
            snprintf(detail, sizeof detail, " (%ld leaves x %d hosts per leaf)", leaves, cfg->hosts_per_leaf);
            return bad(err, src, "a fat-tree has at most 8192 host positions", "fat_tree_leaves", detail), -1;
        }
        long spines = cfg->fat_tree_spines > 0 ? cfg->fat_tree_spines
                      : (long)floor(ideal / (cfg->oversubscription > 0 ? cfg->oversubscription : 1.0) + 0.5);
        if (spines > SG_MAX_FAT_TREE_UPLINKS / leaves) {
            snprintf(detail, sizeof detail, " (%ld leaves x %ld spines)", leaves, spines);
            return bad(err, src, "a fat-tree has at most 65536 leaf-spine links", "fat_tree_spines", detail), -1;
        }
        return leaves * cfg->hosts_per_leaf;
    }
    case KV_TOPO_TORUS: {
        long n = 1;
        int used = 0;
        for (int i = 0; i < 3; i++) {
            if (cfg->torus_dims[i] < 0)
                return bad(err, src, "dimensions must be >= 0 (0: unused)", "torus_dims", NULL), -1;
            if (cfg->torus_dims[i] > 0) {
                used++;
                if (n > SG_MAX_TORUS_SLOTS / cfg->torus_dims[i])
                    return bad(err, src, "a torus has at most 2048 host positions (the product of its dimensions)",
                               "torus_dims", NULL), -1;
                n *= cfg->torus_dims[i];
            }
        }
        if (used == 0)
            return bad(err, src, "a torus needs at least one dimension > 0", "torus_dims", NULL), -1;
        if (n < cfg->hosts) {
            snprintf(detail, sizeof detail, " (%ld positions < %d hosts)", n, cfg->hosts);
            return bad(err, src, "the torus is too small for the hosts", "torus_dims", detail), -1;
        }
        return n;
    }
    case KV_TOPO_DRAGONFLY: {
        const int v[4] = {cfg->dragonfly_groups, cfg->dragonfly_chassis, cfg->dragonfly_routers,
                          cfg->dragonfly_nodes};
        const char *k[4] = {"dragonfly_groups", "dragonfly_chassis", "dragonfly_routers", "dragonfly_nodes"};
        long n = 1;
        for (int i = 0; i < 4; i++) {
            if (v[i] < 1)
                return bad(err, src, "must be >= 1 for a dragonfly", k[i], NULL), -1;
            if (n > SG_MAX_DRAGONFLY_SLOTS / v[i])
                return bad(err, src, "a dragonfly has at most 2048 host positions (groups x chassis x routers x "
                           "nodes)", k[i], NULL), -1;
            n *= v[i];
        }
        if (cfg->dragonfly_groups > cfg->dragonfly_routers)
            return bad(err, src, "must be <= dragonfly_routers (SimGrid links group g to router g of each group)",
                       "dragonfly_groups", NULL), -1;
        if (n < cfg->hosts) {
            snprintf(detail, sizeof detail, " (%ld positions < %d hosts)", n, cfg->hosts);
            return bad(err, src, "the dragonfly is too small for the hosts", "dragonfly_nodes", detail), -1;
        }
        return n;
    }
    case KV_TOPO_PLATFORM: {
        if (!cfg->platform_file || !cfg->platform_file[0])
            return bad(err, src, "a platform topology needs a SimGrid XML file", "platform_file", NULL), -1;
        /* A regular file of at most 16 MiB (infile.h): SimGrid would block on a FIFO or read /dev/zero forever. */
        kv_error why = {0};
        int fd = kv_input_open(cfg->platform_file, "platform", KV_INPUT_MAX_TEXT, NULL, &why);
        if (fd < 0) {
            const char *reason = strstr(why.msg, "cannot open platform: ");
            snprintf(detail, sizeof detail, "'%s': %s", cfg->platform_file,
                     reason ? reason + strlen("cannot open platform: ") : why.msg);
            return bad(err, src, "cannot read ", "platform_file", detail), -1;
        }
        close(fd);
        return cfg->hosts;
    }
    }
    char n[32];
    snprintf(n, sizeof n, "%d", (int)cfg->topology);
    return bad(err, src, "unknown topology ", "topology", n), -1;
}

/* The SimGrid options a scenario may set (network.simgrid), with what each accepts.
   SimGrid itself takes any number for its numeric options, and some values make it
   abort, spin forever or give absurd times (docs/network.md lists what was measured). */
typedef enum sg_opt_kind {
    SG_OPT_NUMBER, /* a finite number in [lo, hi] (> lo when lo_open) */
    SG_OPT_WHOLE,  /* a whole number in [lo, hi] */
    SG_OPT_BOOL,   /* 0/1, yes/no, on/off, true/false */
    SG_OPT_WORD,   /* one of `words` */
    SG_OPT_FREE,   /* passed as written */
} sg_opt_kind;

typedef struct sg_option {
    const char *key;   /* SimGrid's configuration item */
    sg_opt_kind kind;
    double lo, hi;     /* SG_OPT_NUMBER, SG_OPT_WHOLE: accepted range, in the option's unit */
    int lo_open;       /* 1: lo itself is refused */
    const char *words; /* SG_OPT_WORD: accepted values, ", "-separated */
    const char *unit;  /* shown in range errors */
} sg_option;

static const sg_option sg_options[] = {
    {"network/model", SG_OPT_WORD, 0, 0, 0, "CM02, LV08, SMPI, IB", NULL},
    {"network/optim", SG_OPT_WORD, 0, 0, 0, "Lazy, Full", NULL},
    {"network/solver", SG_OPT_WORD, 0, 0, 0, "maxmin, fairbottleneck, bmf", NULL},
    {"network/crosstraffic", SG_OPT_BOOL, 0, 0, 0, NULL, NULL},
    {"network/maxmin-selective-update", SG_OPT_BOOL, 0, 0, 0, NULL, NULL},
    {"network/TCP-gamma", SG_OPT_NUMBER, 0, 1e12, 1, NULL, "bytes"},
    {"network/latency-factor", SG_OPT_NUMBER, 1e-3, 1e3, 0, NULL, "(a correction factor)"},
    {"network/bandwidth-factor", SG_OPT_NUMBER, 1e-3, 1e3, 0, NULL, "(a correction factor)"},
    {"network/weight-S", SG_OPT_NUMBER, 0, 1e9, 0, NULL, "bytes"},
    {"network/loopback-bw", SG_OPT_NUMBER, 1, 1e15, 0, NULL, "bytes/s"},
    {"network/loopback-lat", SG_OPT_NUMBER, 0, 1, 0, NULL, "s"},
    {"maxmin/precision", SG_OPT_NUMBER, 0, 1e-2, 1, NULL, "bytes/s"},
    {"surf/precision", SG_OPT_NUMBER, 0, 1e-3, 1, NULL, "s"},
    {"bmf/precision", SG_OPT_NUMBER, 0, 1e-2, 1, NULL, ""},
    {"bmf/max-iterations", SG_OPT_WHOLE, 1, 1e7, 0, NULL, ""},
    {"log", SG_OPT_FREE, 0, 0, 0, NULL, NULL},
};
#define SG_N_OPTIONS (sizeof sg_options / sizeof sg_options[0])

/* "file:line:col: network.simgrid.KEY" for option i, into buf. */
const char *kv_sg_option_where(const kv_net_config *cfg, int i, char *buf, size_t size)
{
    const char *src = cfg->source ? cfg->source : "network";
    const char *file = cfg->option_file[i];
    if (!file)
        snprintf(buf, size, "%s: network.simgrid.%s", src, cfg->option_key[i]);
    else if (strncmp(file, "--set", 5) == 0)
        snprintf(buf, size, "%s: network.simgrid.%s (from %s)", src, cfg->option_key[i], file);
    else
        snprintf(buf, size, "%s:%d:%d: network.simgrid.%s", file, cfg->option_line[i], cfg->option_col[i],
                 cfg->option_key[i]);
    return buf;
}

static int is_word(const char *words, const char *v)
{
    size_t n = strlen(v);
    for (const char *w = words; n > 0 && *w;) {
        size_t k = strcspn(w, ",");
        if (k == n && strncmp(w, v, n) == 0)
            return 1;
        w += k;
        while (*w == ',' || *w == ' ')
            w++;
    }
    return 0;
}

/* Checks SimGrid option key = v against sg_options; `where` prefixes the messages. */
static int check_option_value(const char *key, const char *v, const char *where, kv_error *err)
{
    const sg_option *o = NULL;
    for (size_t k = 0; k < SG_N_OPTIONS && !o; k++)
        if (strcmp(sg_options[k].key, key) == 0)
            o = &sg_options[k];
    if (!o) {
        char known[600] = "";
        for (size_t k = 0; k < SG_N_OPTIONS; k++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "", sg_options[k].key);
        return kv_error_set(err, KV_EINPUT, "%s: not a SimGrid option kvsim passes through (it takes: %s)",
                            where, known);
    }
    switch (o->kind) {
    case SG_OPT_FREE:
        return KV_OK;
    case SG_OPT_WORD:
        if (is_word(o->words, v))
            return KV_OK;
        return kv_error_set(err, KV_EINPUT, "%s: unknown value '%s' (%s)", where, v, o->words);
    case SG_OPT_BOOL: {
        static const char *const yes_no = "0, 1, no, yes, off, on, false, true";
        if (is_word(yes_no, v))
            return KV_OK;
        return kv_error_set(err, KV_EINPUT, "%s: expected a boolean (%s), got '%s'",
                            where, yes_no, v);
    }
    case SG_OPT_NUMBER:
    case SG_OPT_WHOLE: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        int ok = end != v && *end == 0 && errno != ERANGE && isfinite(x) && !strpbrk(v, "xXnN");
        if (ok && o->kind == SG_OPT_WHOLE)
            ok = x == floor(x);
        if (!ok)
            return kv_error_set(err, KV_EINPUT, "%s: expected a finite %snumber, got '%s'",
                                where, o->kind == SG_OPT_WHOLE ? "whole " : "", v);
        if (x < o->lo || (o->lo_open && x == o->lo) || x > o->hi)
            return kv_error_set(err, KV_EINPUT, "%s: must be %s %g and <= %g %s, got %s",
                                where, o->lo_open ? ">" : ">=", o->lo, o->hi, o->unit,
                                v);
        return KV_OK;
    }
    }
    return KV_OK;
}

static int check_option(const kv_net_config *cfg, int i, kv_error *err)
{
    char w[700];
    int rc = check_option_value(cfg->option_key[i], cfg->option_value[i], kv_sg_option_where(cfg, i, w, sizeof w), err);
    if (rc && err)
        snprintf(err->key, sizeof err->key, "network.simgrid.%s", cfg->option_key[i]);
    return rc;
}

static int check_options(const kv_net_config *cfg, const char *src, kv_error *err)
{
    if (cfg->n_options < 0 || cfg->n_options > KV_NET_MAX_OPTIONS)
        return kv_error_set_key(err, KV_EINPUT, "network.simgrid",
                                "%s: network.simgrid: at most %d options", src, KV_NET_MAX_OPTIONS);
    for (int i = 0; i < cfg->n_options; i++) {
        if (!cfg->option_key[i] || !cfg->option_key[i][0] || !cfg->option_value[i])
            return kv_error_set_key(err, KV_EINPUT, "network.simgrid",
                                    "%s: network.simgrid: option %d has no name or value", src, i);
        int rc = check_option(cfg, i, err);
        if (rc != KV_OK)
            return rc;
    }
    if (!(cfg->watchdog_s >= 0) || cfg->watchdog_s > 86400)
        return kv_error_set_key(err, KV_EINPUT, "network.watchdog_s",
                                "%s: network.watchdog_s: must be > 0 and <= 86400 s (0: %g), got %g", src,
                                KV_NET_WATCHDOG_DEFAULT_S, cfg->watchdog_s);
    if (cfg->prefill_hosts < 0 || cfg->prefill_hosts >= cfg->hosts)
        return kv_error_set(err, KV_EINPUT, "%s: network: %d sending hosts of %d leave none to receive", src,
                            cfg->prefill_hosts, cfg->hosts);
    const char *model = kv_sg_option_value(cfg, "network/model");
    if (cfg->priority != KV_PRIO_NONE) {
        if (model && strcmp(model, "IB") == 0)
            return kv_error_set_key(err, KV_EINPUT, "network.priority",
                                "%s: network.priority: priority classes need network/model CM02, LV08 or SMPI, "
                                "not %s", src, model);
        const char *optim = kv_sg_option_value(cfg, "network/optim");
        if (optim && strcmp(optim, "Lazy") != 0)
            return kv_error_set_key(err, KV_EINPUT, "network.priority",
                                "%s: network.priority: priority classes need network/optim:Lazy, not %s", src, optim);
        const char *solver = kv_sg_option_value(cfg, "network/solver");
        if (solver && strcmp(solver, "maxmin") != 0)
            return kv_error_set_key(err, KV_EINPUT, "network.priority",
                                "%s: network.priority: priority classes need network/solver:maxmin, not %s", src,
                                solver);
    }
    return KV_OK;
}

/* ---- the platform file, before SimGrid reads it ---- */

#define SG_XML_MAX_BYTES (256L << 20) /* platform files kvsim reads */
#define SG_XML_MAX_ATTRS 16

/* One start tag of an XML file: its name, attributes (pointers into a scratch copy) and line. */
typedef struct sg_xml_tag {
    char name[32];
    int line;
    int closing;                 /* </name> */
    int self_closing;            /* <name .../> */
    int n;
    char key[SG_XML_MAX_ATTRS][32];
    char val[SG_XML_MAX_ATTRS][512];
} sg_xml_tag;

/* Reads the next tag from text at *pos (comments, declarations and processing
   instructions skipped); 0 at the end. *line counts newlines. */
static int xml_next_tag(const char *text, size_t *pos, int *line, sg_xml_tag *tag)
{
    size_t i = *pos;
    for (;;) {
        while (text[i] && text[i] != '<') {
            if (text[i] == '\n')
                ++*line;
            i++;
        }
        if (!text[i])
            return 0;
        const char *skip_to = NULL;
        if (strncmp(text + i, "<!--", 4) == 0)
            skip_to = "-->";
        else if (strncmp(text + i, "<![CDATA[", 9) == 0)
            skip_to = "]]>";
        else if (text[i + 1] == '?')
            skip_to = "?>";
        else if (text[i + 1] == '!')
            skip_to = ">";
        if (!skip_to)
            break;
        const char *end = strstr(text + i, skip_to);
        size_t stop = end ? (size_t)(end - text) + strlen(skip_to) : strlen(text);
        for (; i < stop; i++)
            if (text[i] == '\n')
                ++*line;
    }
    memset(tag, 0, sizeof *tag);
    tag->line = *line;
    i++;
    if (text[i] == '/') {
        tag->closing = 1;
        i++;
    }
    size_t k = 0;
    while (text[i] && !strchr(" \t\r\n/>", text[i])) {
        if (k + 1 < sizeof tag->name)
            tag->name[k++] = text[i];
        i++;
    }
    for (;;) {
        while (text[i] && strchr(" \t\r\n", text[i])) {
            if (text[i] == '\n')
                ++*line;
            i++;
        }
        if (!text[i])
            break;
        if (text[i] == '>') {
            i++;
            break;
        }
        if (text[i] == '/') {
            tag->self_closing = 1;
            i++;
            continue;
        }
        char key[32] = "";
        k = 0;
        while (text[i] && !strchr(" \t\r\n=/>", text[i])) {
            if (k + 1 < sizeof key)
                key[k++] = text[i];
            i++;
        }
        while (text[i] && strchr(" \t\r\n", text[i])) {
            if (text[i] == '\n')
                ++*line;
            i++;
        }
        if (text[i] != '=') {
            if (k == 0 && text[i])
                i++; /* stray character */
            continue;
        }
        i++;
        while (text[i] && strchr(" \t\r\n", text[i])) {
            if (text[i] == '\n')
                ++*line;
            i++;
        }
        char quote = text[i];
        if (quote != '"' && quote != '\'')
            continue;
        i++;
        char val[512] = "";
        k = 0;
        while (text[i] && text[i] != quote) {
            if (text[i] == '\n')
                ++*line;
            if (k + 1 < sizeof val)
                val[k++] = text[i];
            i++;
        }
        if (text[i])
            i++;
        if (tag->n < SG_XML_MAX_ATTRS) {
            snprintf(tag->key[tag->n], sizeof tag->key[0], "%s", key);
            snprintf(tag->val[tag->n], sizeof tag->val[0], "%s", val);
            tag->n++;
        }
    }
    *pos = i;
    return 1;
}

static const char *xml_attr(const sg_xml_tag *tag, const char *key)
{
    for (int i = 0; i < tag->n; i++)
        if (strcmp(tag->key[i], key) == 0)
            return tag->val[i];
    return NULL;
}

/* The platform file's text (free it), or NULL with *err set. */
static char *xml_read(const char *path, const char *src, kv_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        kv_error_set_key(err, KV_EINPUT, "network.platform_file",
                         "%s: network.platform_file: cannot read '%s': %s", src, path, strerror(errno));
        return NULL;
    }
    char *text = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap)
            kv_grow((void **)&text, 1, &cap, n + 65536 + 1);
        size_t got = fread(text + n, 1, 65536, f);
        n += got;
        if (got == 0 || (long)n > SG_XML_MAX_BYTES)
            break;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed || (long)n > SG_XML_MAX_BYTES) {
        kv_free(text);
        kv_error_set_key(err, KV_EINPUT, "network.platform_file", "%s: network.platform_file: '%s': %s", src, path,
                     failed ? "read error" : "larger than 256 MiB");
        return NULL;
    }
    text[n] = 0;
    return text;
}

/* SimGrid applies a platform's <config><prop id= value=/></config> while it loads the file,
   after kvsim's own settings: the same table as network.simgrid applies to them. */
static int check_platform_file(const kv_net_config *cfg, const char *src, kv_error *err)
{
    char *text = xml_read(cfg->platform_file, src, err);
    if (!text)
        return KV_EINPUT;
    size_t pos = 0;
    int line = 1, in_config = 0, rc = KV_OK;
    sg_xml_tag *tag = kv_calloc(1, sizeof *tag);
    while (rc == KV_OK && xml_next_tag(text, &pos, &line, tag)) {
        if (strcmp(tag->name, "config") == 0) {
            in_config = !tag->closing && !tag->self_closing;
            continue;
        }
        if (!in_config || tag->closing || strcmp(tag->name, "prop") != 0)
            continue;
        const char *id = xml_attr(tag, "id"), *value = xml_attr(tag, "value");
        char where[1200];
        snprintf(where, sizeof where, "%s:%d: <config> prop '%s' (network.platform_file of %s)", cfg->platform_file,
                 tag->line, id ? id : "", src);
        if (!id || !value)
            rc = kv_error_set(err, KV_EINPUT, "%s: needs id and value", where);
        else
            rc = check_option_value(id, value, where, err);
    }
    kv_free(tag);
    kv_free(text);
    return rc;
}

int kv_sg_platform_line(const char *path, const char *link)
{
    kv_error err;
    char *text = xml_read(path, "", &err);
    if (!text)
        return 0;
    size_t pos = 0, best_len = 0;
    int line = 1, best = 0;
    sg_xml_tag *tag = kv_calloc(1, sizeof *tag);
    while (xml_next_tag(text, &pos, &line, tag)) {
        const char *id = xml_attr(tag, "id");
        if (tag->closing || !id || !id[0])
            continue;
        if (strcmp(tag->name, "link") == 0 && strcmp(id, link) == 0) {
            best = tag->line;
            break;
        }
        /* Links a <cluster> (or <backbone>...) makes carry its id as a prefix. */
        size_t n = strlen(id);
        if (strcmp(tag->name, "link") != 0 && n > best_len && strncmp(link, id, n) == 0) {
            best = tag->line;
            best_len = n;
        }
    }
    kv_free(tag);
    kv_free(text);
    return best;
}

int kv_sg_check_config(const kv_net_config *cfg, kv_error *err)
{
    /* hosts, nic_bandwidth_gbps and nic_latency_us are checked by kv_net_create (net.c) for every model */
    const char *src = cfg->source ? cfg->source : "network";
    if (!(cfg->switch_bandwidth_gbps >= 0) || !isfinite(cfg->switch_bandwidth_gbps))
        return kv_error_set_key(err, KV_EINPUT, "network.switch_bandwidth_gbps",
                            "%s: network.switch_bandwidth_gbps: must be a positive number (0: as fast as the NICs)",
                            src);
    if (!(cfg->switch_latency_s >= 0) || !isfinite(cfg->switch_latency_s))
        return kv_error_set_key(err, KV_EINPUT, "network.switch_latency_us",
                                "%s: network.switch_latency_us: must be >= 0", src);
    if (!(cfg->oversubscription >= 0) || !isfinite(cfg->oversubscription))
        return kv_error_set_key(err, KV_EINPUT, "network.oversubscription",
                                "%s: network.oversubscription: must be a positive ratio (0: 1:1)", src);
    long slots = topology_slots(cfg, src, err);
    if (slots < 0)
        return KV_EINPUT;
    if (cfg->topology == KV_TOPO_PLATFORM && check_platform_file(cfg, src, err) != KV_OK)
        return KV_EINPUT;
    if (cfg->host_slot && cfg->topology != KV_TOPO_PLATFORM) {
        unsigned char *seen = kv_calloc((size_t)slots, 1);
        for (int i = 0; i < cfg->hosts; i++) {
            int s = cfg->host_slot[i];
            if (s < 0 || s >= slots || seen[s]) {
                kv_free(seen);
                return kv_error_set_key(err, KV_EINPUT, "network.host_slot",
                                    "%s: network.host_slot[%d]: %d is %s (the topology has %ld positions)", src, i,
                                    s, s < 0 || s >= slots ? "out of range" : "taken twice", slots);
            }
            seen[s] = 1;
        }
        kv_free(seen);
    }
    if (cfg->host_names && cfg->topology == KV_TOPO_PLATFORM) {
        for (int i = 0; i < cfg->hosts; i++) {
            if (!cfg->host_names[i] || !cfg->host_names[i][0])
                return kv_error_set_key(err, KV_EINPUT, "network.host_names",
                                        "%s: network.host_names[%d]: empty", src, i);
            for (int j = 0; j < i; j++)
                if (strcmp(cfg->host_names[i], cfg->host_names[j]) == 0)
                    return kv_error_set_key(err, KV_EINPUT, "network.host_names",
                                            "%s: network.host_names[%d]: '%s' is taken twice", src, i,
                                            cfg->host_names[i]);
        }
    }
    if (cfg->priority < KV_PRIO_NONE || cfg->priority > KV_PRIO_WEIGHTED)
        return kv_error_set_key(err, KV_EINPUT, "network.priority",
                                "%s: network.priority: unknown mode %d (none, strict, weighted)", src,
                                (int)cfg->priority);
    if (cfg->priority == KV_PRIO_WEIGHTED) {
        double lo = INFINITY, hi = 0;
        for (int c = 0; c < KV_NET_MAX_CLASSES; c++) {
            double w = cfg->class_weight[c];
            if (!(w >= 0) || !isfinite(w))
                return kv_error_set_key(err, KV_EINPUT, "network.class_weights",
                                        "%s: network.class_weights[%d]: must be > 0 (0: 1)", src, c);
            w = w > 0 ? w : 1.0;
            lo = w < lo ? w : lo;
            hi = w > hi ? w : hi;
        }
        if (hi / lo > SG_MAX_WEIGHT_RATIO)
            return kv_error_set_key(err, KV_EINPUT, "network.class_weights",
                                "%s: network.class_weights: largest / smallest must be <= 1e6 (SimGrid's solver "
                                "precision), got %g", src, hi / lo);
    }
    return check_options(cfg, src, err);
}
