/* Copy bytes and sum them with XXH3-64 in one pass over memory (kvcake.core.native).
 *
 * Why C: in Python a verified copy is a copy, then a second pass that hashes the copy; the two
 * cannot be cut finer than ~1 MiB without per-call overhead, so the hash reads from L2 or memory
 * and costs 35-50% of the copy (docs/store.md, "Integrity": measured). Here each piece of
 * PIECE bytes is hashed right after it is copied, while it is in L1, and the GIL is released
 * for the whole call (ctypes does that), so the sums ride along with a memory-bound copy.
 *
 * The sums are exactly core/integrity.py's: chunk i of the value is summed with XXH3-64
 * seeded by seeds[i] (the streaming and one-shot XXH3 APIs give the same result).
 */
#define XXH_INLINE_ALL
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#define PIECE (4 * 1024)

/* dst[0:n] = src[0:n]; out[i] = XXH3-64 of dst's chunk i (chunk bytes from i*chunk, the last
 * one may be shorter) with seed seeds[i]. Returns 0, or -1 on bad arguments. */
int kvc_copy_sum(unsigned char *dst, const unsigned char *src, size_t n, size_t chunk,
                 const uint64_t *seeds, uint64_t *out) {
    XXH3_state_t st;
    if (chunk == 0)
        return -1;
    for (size_t c = 0, i = 0; c < n; c += chunk, i++) {
        size_t end = n - c > chunk ? c + chunk : n;
        if (XXH3_64bits_reset_withSeed(&st, seeds[i]) != XXH_OK)
            return -1;
        for (size_t a = c; a < end; a += PIECE) {
            size_t m = end - a > PIECE ? PIECE : end - a;
            if (dst != NULL) {
                memcpy(dst + a, src + a, m);
                XXH3_64bits_update(&st, dst + a, m);
            } else {
                XXH3_64bits_update(&st, src + a, m);
            }
        }
        out[i] = XXH3_64bits_digest(&st);
    }
    return 0;
}
