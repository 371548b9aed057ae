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

/* The scatter form, for a read into many destinations (a vLLM block's layer planes):
 * src holds the value's bytes [0, n) (n = whole chunks, or up to the value's end); range k
 * copies src[off[k], off[k] + len[k]) to the address dst[k]. Ranges are sorted by off, do not
 * overlap and lie inside [0, n); bytes no range covers are not copied. out[i] = XXH3-64 (seed
 * seeds[i]) of chunk i as handed over: covered bytes summed in their destination right after
 * their copy, the others summed in src. *stop is checked before each chunk (a cancelled read
 * stops within one chunk). seeds == NULL: only copy (no sums). Returns the chunks done (all of
 * them unless stopped), or -1 on bad arguments. */
long kvc_scatter_sum(const unsigned char *src, size_t n, size_t chunk, const uint64_t *seeds,
                     uint64_t *out, const uint64_t *dst, const uint64_t *off, const uint64_t *len,
                     size_t count, const volatile int *stop) {
    XXH3_state_t st;
    size_t r = 0;
    long done = 0;
    if (chunk == 0)
        return -1;
    for (size_t k = 0; k < count; k++)
        if (off[k] + len[k] > n || (k && off[k] < off[k - 1] + len[k - 1]))
            return -1;
    for (size_t c = 0, i = 0; c < n; c += chunk, i++, done++) {
        size_t end = n - c > chunk ? c + chunk : n;
        if (stop != NULL && *stop)
            return done;
        if (seeds != NULL && XXH3_64bits_reset_withSeed(&st, seeds[i]) != XXH_OK)
            return -1;
        for (size_t p = c; p < end;) {
            while (r < count && off[r] + len[r] <= p)
                r++;
            int inside = r < count && off[r] <= p;
            size_t stop_at = inside ? off[r] + len[r] : (r < count ? off[r] : end);
            size_t m = stop_at < end ? stop_at - p : end - p;
            if (m > PIECE)
                m = PIECE;
            const unsigned char *summed = src + p;
            if (inside) {
                unsigned char *to = (unsigned char *)(uintptr_t)dst[r] + (p - off[r]);
                memcpy(to, src + p, m);
                summed = to;
            }
            if (seeds != NULL)
                XXH3_64bits_update(&st, summed, m);
            p += m;
        }
        if (seeds != NULL)
            out[i] = XXH3_64bits_digest(&st);
    }
    return done;
}

/* memcpy(dst[k], src[k], len[k]) for each k: a scatter list as one C loop (the baseline a
 * verified load is measured against, benchmarks/pool_load_bench.py). */
void kvc_copy_list(const uint64_t *src, const uint64_t *dst, const uint64_t *len, size_t count) {
    for (size_t k = 0; k < count; k++)
        memcpy((void *)(uintptr_t)dst[k], (const void *)(uintptr_t)src[k], len[k]);
}

/* kvc_scatter_sum over many values in one call (one load's blocks): value j's bytes are at
 * src[j] (n[j] of them), its seeds and sums from index sfirst[j], its ranges [rfirst[j],
 * rfirst[j + 1]); seeds == NULL: copy only. Returns the number of values done: all of them, fewer when *stop was set
 * (value "done" was cut short), or -1 - j when value j's ranges were refused. */
long kvc_scatter_sum_many(size_t count, const uint64_t *src, const uint64_t *n, size_t chunk,
                          const uint64_t *seeds, uint64_t *out, const uint64_t *sfirst,
                          const uint64_t *dst, const uint64_t *off, const uint64_t *len,
                          const uint64_t *rfirst, const volatile int *stop) {
    for (size_t j = 0; j < count; j++) {
        size_t chunks = chunk ? (n[j] + chunk - 1) / chunk : 0;
        long done = kvc_scatter_sum((const unsigned char *)(uintptr_t)src[j], n[j], chunk,
                                    seeds ? seeds + sfirst[j] : NULL, out + sfirst[j],
                                    dst + rfirst[j],
                                    off + rfirst[j], len + rfirst[j], rfirst[j + 1] - rfirst[j],
                                    stop);
        if (done < 0)
            return -1 - (long)j;
        if ((size_t)done < chunks)
            return (long)j;
    }
    return (long)count;
}
