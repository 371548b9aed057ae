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
#include <errno.h>
#include <immintrin.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <xxhash.h>

#define PIECE (4 * 1024)

/* flags of kvc_copy_sum and kvc_scatter_sum:
 * KVC_STREAM: write the destination with non-temporal stores. A large copy into memory this
 *   call will not read again (a segment, a fresh buffer, KV planes bigger than the cache) then
 *   skips reading each destination line before writing it: measured ~2x glibc's memcpy at
 *   256 KiB-16 MiB into cold memory on this machine (docs/store.md, "Integrity").
 * KVC_BOUNCE: with KVC_STREAM and sums, each piece goes src -> an L1 buffer -> dst and the
 *   buffer is summed, so the sums are of the bytes handed over even if src changes meanwhile
 *   (a peer's segment); without it src is streamed, then summed (a writer's own value). */
#define KVC_STREAM 1
#define KVC_BOUNCE 2

/* memcpy with non-temporal stores for the aligned body (the caller fences once at the end). */
static inline void stream_copy(unsigned char *d, const unsigned char *s, size_t m) {
#if defined(__AVX__)
    enum { W = 32 };
#else
    enum { W = 16 };
#endif
    size_t head = (W - ((uintptr_t)d & (W - 1))) & (W - 1);
    if (head > m)
        head = m;
    memcpy(d, s, head);
    d += head, s += head, m -= head;
    for (; m >= W; m -= W, d += W, s += W) {
#if defined(__AVX__)
        _mm256_stream_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
#else
        _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
#endif
    }
    memcpy(d, s, m);
}

/* One piece of a copy: to[0:m] = from[0:m], summed into st (NULL: not summed) as flags say. */
static inline void copy_piece(unsigned char *to, const unsigned char *from, size_t m,
                              XXH3_state_t *st, int flags) {
    if (!(flags & KVC_STREAM)) {
        memcpy(to, from, m);
        if (st != NULL)
            XXH3_64bits_update(st, to, m);
        return;
    }
    if (st != NULL && (flags & KVC_BOUNCE)) {
        _Alignas(64) unsigned char bounce[PIECE];
        memcpy(bounce, from, m);
        XXH3_64bits_update(st, bounce, m);
        stream_copy(to, bounce, m);
        return;
    }
    stream_copy(to, from, m);
    /* Summed after the copy, from L1 where the copy's loads left it: the hash runs while the
     * streamed stores drain. As fast as summing first for a source in the cache, 13-30 %
     * faster for one that is not (docs/benchmarks.md, "Integrity cost", 23rd session). */
    if (st != NULL)
        XXH3_64bits_update(st, from, m);
}

/* dst[0:n] = src[0:n]; out[i] = XXH3-64 of chunk i as copied (chunk bytes from i*chunk, the
 * last one may be shorter) with seed seeds[i]. dst NULL: only sum src; seeds NULL: only copy.
 * flags: KVC_STREAM, KVC_BOUNCE. Returns 0, or -1 on bad arguments. */
int kvc_copy_sum(unsigned char *dst, const unsigned char *src, size_t n, size_t chunk,
                 const uint64_t *seeds, uint64_t *out, int flags) {
    XXH3_state_t st;
    XXH3_state_t *sp = seeds != NULL ? &st : NULL;
    if (chunk == 0 || (dst == NULL && seeds == NULL))
        return -1;
    for (size_t c = 0, i = 0; c < n; c += chunk, i++) {
        size_t end = n - c > chunk ? c + chunk : n;
        if (sp != NULL && XXH3_64bits_reset_withSeed(sp, seeds[i]) != XXH_OK)
            return -1;
        for (size_t a = c; a < end; a += PIECE) {
            size_t m = end - a > PIECE ? PIECE : end - a;
            if (dst != NULL)
                copy_piece(dst + a, src + a, m, sp, flags);
            else
                XXH3_64bits_update(sp, src + a, m);
        }
        if (sp != NULL)
            out[i] = XXH3_64bits_digest(sp);
    }
    if (flags & KVC_STREAM)
        _mm_sfence(); /* the streamed bytes are visible before the caller reports them */
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
static long scatter_sum(const unsigned char *src, size_t n, size_t chunk, const uint64_t *seeds,
                        uint64_t *out, const uint64_t *dst, const uint64_t *off,
                        const uint64_t *len, size_t count, const volatile int *stop, int flags) {
    XXH3_state_t st;
    XXH3_state_t *sp = seeds != NULL ? &st : NULL;
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
            if (inside)
                copy_piece((unsigned char *)(uintptr_t)dst[r] + (p - off[r]), src + p, m, sp,
                           flags | KVC_BOUNCE);
            else if (sp != NULL)
                XXH3_64bits_update(sp, src + p, m);
            p += m;
        }
        if (seeds != NULL)
            out[i] = XXH3_64bits_digest(&st);
    }
    return done;
}

/* memcpy(dst[k], src[k], len[k]) for each k (flags & KVC_STREAM: with non-temporal stores): a
 * scatter list as one C loop, the baseline a verified load is measured against
 * (benchmarks/pool_load_bench.py). */
void kvc_copy_list(const uint64_t *src, const uint64_t *dst, const uint64_t *len, size_t count,
                   int flags) {
    for (size_t k = 0; k < count; k++) {
        unsigned char *d = (unsigned char *)(uintptr_t)dst[k];
        const unsigned char *s = (const unsigned char *)(uintptr_t)src[k];
        if (flags & KVC_STREAM)
            stream_copy(d, s, len[k]);
        else
            memcpy(d, s, len[k]);
    }
    if (flags & KVC_STREAM)
        _mm_sfence();
}

/* kvc_scatter_sum over many values in one call (one load's blocks): value j's bytes are at
 * src[j] (n[j] of them), its seeds and sums from index sfirst[j], its ranges [rfirst[j],
 * rfirst[j + 1]); seeds == NULL: copy only; flags: KVC_STREAM (summed pieces always bounce).
 * Returns the number of values done: all of them, fewer when *stop was set
 * (value "done" was cut short), or -1 - j when value j's ranges were refused. */
long kvc_scatter_sum_many(size_t count, const uint64_t *src, const uint64_t *n, size_t chunk,
                          const uint64_t *seeds, uint64_t *out, const uint64_t *sfirst,
                          const uint64_t *dst, const uint64_t *off, const uint64_t *len,
                          const uint64_t *rfirst, const volatile int *stop, int flags) {
    long ret = (long)count;
    for (size_t j = 0; j < count; j++) {
        size_t chunks = chunk ? (n[j] + chunk - 1) / chunk : 0;
        long done = scatter_sum((const unsigned char *)(uintptr_t)src[j], n[j], chunk,
                                seeds ? seeds + sfirst[j] : NULL, out + sfirst[j], dst + rfirst[j],
                                off + rfirst[j], len + rfirst[j], rfirst[j + 1] - rfirst[j], stop,
                                flags);
        if (done < 0) {
            ret = -1 - (long)j;
            break;
        }
        if ((size_t)done < chunks) {
            ret = (long)j;
            break;
        }
    }
    if (flags & KVC_STREAM)
        _mm_sfence();
    return ret;
}

/* A network read's data section received straight into its destinations (issue 37's TCP
 * loads): the bytes of `count` values arrive in order on socket fd, value j's bytes go to its
 * ranges [rfirst[j], rfirst[j + 1]) (dst, len; in value order, together its whole span of n[j]
 * bytes) and chunk i of the span is summed (seed seeds[sfirst[j] + i], out[...]) right after
 * its bytes land, while they are in the cache; seeds NULL: no sums. The first pre_len bytes come
 * from pre (the caller's read-ahead). Every receive is MSG_DONTWAIT, waits are poll() slices
 * of at most 10 ms and *stop is checked after each: a caller that sets it sees this return
 * within ~10 ms and no byte land after (the caller holds its guard's lock around the call).
 * Returns 0, or -1 bad arguments, -2 EOF, -3 timeout (timeout_ms with no byte arriving),
 * -4 stopped, -5 - errno on a socket error. */
/* At most this much per recvmsg, so the bytes are still in L2 when they are summed: verified
 * over unverified 0.92-0.99 at 512 KiB against 0.89-0.92 at 4 MiB (docs/benchmarks.md). */
#define RECV_CALL_BYTES (512 << 10)
#define RECV_IOV 256
/* An empty socket means poll() at once, no spinning: on two cores the sender needs the CPU a
 * spinning receiver holds (TCP loads over te-read, medians of 4 rounds in alternating runs:
 * 0.81-0.85 without a spin, 0.75-0.81 with 200 retries; docs/benchmarks.md). */

/* Where the stream stands: range r has rpos bytes, value j has pos bytes (summed in st when
 * seeds is set). One cursor walks the landed bytes, so the ranges and the sums never drift. */
struct recv_cursor {
    const uint64_t *seeds, *sfirst, *n, *dst, *len;
    uint64_t *out;
    size_t chunk, count, j, pos, r, rpos;
    XXH3_state_t st;
};

/* Account for (and sum) the next m landed bytes of the stream. */
static int cursor_advance(struct recv_cursor *c, size_t m) {
    while (m > 0 && c->j < c->count) {
        size_t k = c->len[c->r] - c->rpos;
        if (k > m)
            k = m;
        if (c->seeds != NULL) {
            size_t to_chunk = c->chunk - c->pos % c->chunk;
            if (c->pos % c->chunk == 0 && c->pos < c->n[c->j] &&
                XXH3_64bits_reset_withSeed(&c->st,
                                           c->seeds[c->sfirst[c->j] + c->pos / c->chunk]) != XXH_OK)
                return -1;
            if (k > to_chunk)
                k = to_chunk;
            XXH3_64bits_update(&c->st, (const unsigned char *)(uintptr_t)c->dst[c->r] + c->rpos, k);
        }
        c->pos += k, c->rpos += k, m -= k;
        if (c->seeds != NULL && k > 0 && (c->pos % c->chunk == 0 || c->pos == c->n[c->j]))
            c->out[c->sfirst[c->j] + (c->pos - 1) / c->chunk] = XXH3_64bits_digest(&c->st);
        if (c->rpos == c->len[c->r])
            c->r++, c->rpos = 0;
        if (c->pos == c->n[c->j])
            c->j++, c->pos = 0;
    }
    return 0;
}

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int kvc_recv_sum_many(int fd, const unsigned char *pre, size_t pre_len, size_t count,
                      const uint64_t *n, size_t chunk, const uint64_t *seeds, uint64_t *out,
                      const uint64_t *sfirst, const uint64_t *dst, const uint64_t *len,
                      const uint64_t *rfirst, const volatile int *stop, long timeout_ms) {
    struct recv_cursor c;
    memset(&c, 0, sizeof c);
    c.seeds = seeds, c.out = out, c.sfirst = sfirst, c.n = n, c.dst = dst, c.len = len;
    c.chunk = chunk, c.count = count;
    size_t ranges = rfirst[count];
    long last = now_ms();
    if (chunk == 0)
        return -1;
    for (size_t j = 0, k = 0; j < count; j++) {
        uint64_t total = 0;
        for (; k < rfirst[j + 1]; k++)
            total += len[k];
        if (total != n[j])
            return -1;
    }
    while (c.r < ranges) {
        struct iovec iov[RECV_IOV];
        int cnt = 0;
        size_t want = 0;
        for (size_t q = c.r, off = c.rpos; q < ranges && cnt < RECV_IOV && want < RECV_CALL_BYTES;
             q++, off = 0) {
            size_t m = len[q] - off;
            if (m > RECV_CALL_BYTES - want)
                m = RECV_CALL_BYTES - want;
            iov[cnt].iov_base = (unsigned char *)(uintptr_t)dst[q] + off;
            iov[cnt++].iov_len = m;
            want += m;
        }
        ssize_t got;
        if (stop != NULL && *stop)
            return -4;
        if (pre_len) { /* the read-ahead first, into the same ranges */
            size_t take = pre_len < iov[0].iov_len ? pre_len : iov[0].iov_len;
            memcpy(iov[0].iov_base, pre, take);
            pre += take, pre_len -= take, got = (ssize_t)take;
        } else {
            struct msghdr msg;
            memset(&msg, 0, sizeof msg);
            msg.msg_iov = iov, msg.msg_iovlen = (size_t)cnt;
            got = recvmsg(fd, &msg, MSG_DONTWAIT);
        }
        if (stop != NULL && *stop)
            return -4; /* bytes of this last call may have landed: the caller's data is void */
        if (got == 0)
            return -2;
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return -5 - errno;
            if (now_ms() - last > timeout_ms)
                return -3;
            struct pollfd p = {fd, POLLIN, 0};
            poll(&p, 1, 10);
            continue;
        }
        last = now_ms();
        if (cursor_advance(&c, (size_t)got) != 0)
            return -1;
    }
    return 0;
}
