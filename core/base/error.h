/* error.h — an error status with a message, passed down by callers, filled by callees. */
#ifndef KV_ERROR_H
#define KV_ERROR_H

#include <stdarg.h>

/* Error codes double as kvsim's exit codes. */
enum {
    KV_OK = 0,      /* success */
    KV_EFAIL = 1,   /* the run failed (device error, I/O error, internal) */
    KV_EINPUT = 2,  /* bad input: scenario, policy, trace, model file, CLI flag */
};

typedef struct kv_error {
    int code;       /* KV_OK, KV_EFAIL or KV_EINPUT */
    char msg[1024]; /* "file:line:col: key: what is wrong", NUL-terminated */
    char key[128];  /* the dotted input key the error concerns ("network.nic_latency_us"), or "" if none is
                       known: a layer that sees only its own config (net/) names the key here and the caller
                       that read the input resolves it to file:line:col */
} kv_error;

/* Sets *err (if err is not NULL; its key is cleared) and returns code, so callers can write
   `return kv_error_set(err, KV_EINPUT, "...")`. */
int kv_error_set(kv_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kv_error_setv(kv_error *err, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* kv_error_set that also records the dotted input key the error concerns (kv_error.key). */
int kv_error_set_key(kv_error *err, int code, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records on an error already set the dotted input key it concerns (kv_error.key); returns its code. */
int kv_error_keyed(kv_error *err, const char *key);

/* Prefixes the existing message with more context ("while loading X: ..."). */
int kv_error_prefix(kv_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears *err to KV_OK with an empty message. */
void kv_error_clear(kv_error *err);

#endif
