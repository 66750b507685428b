/* error.c — error status helpers. */
#include "core/base/error.h"

#include <stdio.h>
#include <string.h>

int kv_error_setv(kv_error *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        err->key[0] = '\0';
    }
    return code;
}

int kv_error_set(kv_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kv_error_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int kv_error_set_key(kv_error *err, int code, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kv_error_setv(err, code, fmt, ap);
    va_end(ap);
    if (err && key)
        snprintf(err->key, sizeof err->key, "%s", key);
    return code;
}

int kv_error_prefix(kv_error *err, const char *fmt, ...)
{
    if (!err)
        return KV_EFAIL;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s%s", prefix, old);
    return err->code;
}

void kv_error_clear(kv_error *err)
{
    if (err) {
        err->code = KV_OK;
        err->msg[0] = '\0';
        err->key[0] = '\0';
    }
}

int kv_error_keyed(kv_error *err, const char *key)
{
    if (!err)
        return KV_EFAIL;
    snprintf(err->key, sizeof err->key, "%s", key ? key : "");
    return err->code;
}
