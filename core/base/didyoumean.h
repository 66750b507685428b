/* didyoumean.h — the one "did you mean" rule: the closest known name to a typo.
 *
 * Every reader of names (scenario keys, sweep keys, accuracy keys, policy
 * fields and choices) suggests through this, so one typo gets the same hint
 * everywhere. The distance is optimal string alignment (insertions,
 * deletions, substitutions and transpositions of neighbours each cost 1:
 * "sede" is one from "seed"); a candidate is offered only within 1 edit for
 * words of up to 4 characters, 2 up to 8, and 3 beyond; ties go to the first
 * candidate in the order given. Words or candidates longer than 64 characters
 * are never matched.
 */
#ifndef KV_DIDYOUMEAN_H
#define KV_DIDYOUMEAN_H

#include <stddef.h>

/* The closest of `candidates` to `word`, or NULL if none is close enough to be
   a plausible typo. The result is one of `candidates` (borrowed). */
const char *kv_did_you_mean(const char *word, const char *const *candidates, size_t n);

#endif
