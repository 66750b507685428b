/* sha256.c — the SHA-256 of a file through OpenSSL's EVP interface (see sha256.h). */
#include "core/base/sha256.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

int kv_sha256_file(const char *path, char hex[65], kv_error *err)
{
    hex[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f)
        return kv_error_set(err, KV_EINPUT, "%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int rc = KV_OK;
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
        rc = kv_error_set(err, KV_EFAIL, "%s: SHA-256: libcrypto could not start a digest", path);
    unsigned char buf[1 << 16];
    size_t n;
    while (!rc && (n = fread(buf, 1, sizeof buf, f)) > 0)
        if (EVP_DigestUpdate(ctx, buf, n) != 1)
            rc = kv_error_set(err, KV_EFAIL, "%s: SHA-256: libcrypto failed", path);
    if (!rc && ferror(f))
        rc = kv_error_set(err, KV_EINPUT, "%s: read error: %s", path, strerror(errno));
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (!rc && (EVP_DigestFinal_ex(ctx, md, &len) != 1 || len != 32))
        rc = kv_error_set(err, KV_EFAIL, "%s: SHA-256: libcrypto failed", path);
    for (unsigned int i = 0; !rc && i < len; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    EVP_MD_CTX_free(ctx);
    fclose(f);
    return rc;
}
