/* sha256.h — the SHA-256 of a file (OpenSSL's libcrypto EVP), for provenance records.
 *
 * Ownership: nothing is kept; hex[65] is the caller's.
 */
#ifndef KV_SHA256_H
#define KV_SHA256_H

#include "core/base/error.h"

/* The SHA-256 of the file at path as 64 lowercase hex digits into hex[65].
   KV_EINPUT when it cannot be opened or read (the message names it), KV_EFAIL
   when libcrypto fails. */
int kv_sha256_file(const char *path, char hex[65], kv_error *err);

#endif
