/*
 * hello.c — libpollux from C: connect by transport ID, write a pattern
 * through a queue pair, read it back, compare; then the same through a
 * bdev channel over the same transport ID and over a malloc bdev made
 * from an SPDK JSON method; and two threads sharing one controller, each
 * with its own queue pair. Checks that misuse is refused (a buffer in
 * flight cannot be freed or, for a bdev, submitted twice).
 *
 *   cc -o hello hello.c -I crates/capi/include -L target/debug -lpollux -lpthread
 *   ./hello 'trtype:soft backend:ram size:16MiB'
 *
 * Prints "hello: verified N bytes ..." and exits 0 when every check
 * passes; exits 1 with the failing step otherwise.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pollux.h"

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "hello: FAILED %s:%d: ", __FILE__, __LINE__);  \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, " (last error: %s)\n", pollux_last_error());   \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

struct done {
    int calls;
    int status;
};

static void on_done(void *arg, const struct pollux_cpl *cpl)
{
    struct done *d = arg;
    d->calls++;
    d->status = cpl->status;
}

static void pattern(uint8_t *p, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)((i * 31u + seed) ^ (i >> 9));
}

/* Polls the queue pair until `d` has its callback. */
static void wait_qp(struct pollux_qpair *qp, struct done *d)
{
    while (d->calls == 0) {
        int n = pollux_qpair_poll(qp, 0);
        CHECK(n >= 0, "poll: %s", pollux_strerror(n));
    }
    CHECK(d->calls == 1 && d->status == 0, "completion status %d", d->status);
}

static void wait_ch(struct pollux_channel *ch, struct done *d)
{
    while (d->calls == 0) {
        int n = pollux_channel_poll(ch, 0);
        CHECK(n >= 0, "channel poll: %s", pollux_strerror(n));
    }
    CHECK(d->calls == 1 && d->status == 0, "bdev completion status %d", d->status);
}

static size_t qpair_part(const char *trid)
{
    struct pollux_ctrl *ctrl = pollux_connect(trid);
    CHECK(ctrl, "connect %s: errno %d", trid, pollux_last_errno());
    struct pollux_ctrl_info info;
    CHECK(pollux_ctrl_get_info(ctrl, &info) == 0, "ctrl info");
    printf("hello: %s controller, model '%s', serial '%s', %u namespace(s), %u I/O queues\n",
           info.trtype, info.model, info.serial, info.ns_count, info.io_queues);
    CHECK(pollux_ns_count(ctrl) >= 1, "no namespace");
    struct pollux_ns_info ns;
    CHECK(pollux_ns_get(ctrl, 0, &ns) == 0, "ns 0");
    CHECK(pollux_ns_get(ctrl, 1000, &ns) == -ENOENT, "ns index 1000 must be -ENOENT");
    CHECK(pollux_ns_get(ctrl, 0, &ns) == 0, "ns 0");
    printf("hello: namespace %u: %" PRIu64 " blocks of %u bytes\n", ns.nsid, ns.num_blocks,
           ns.block_size);

    struct pollux_qpair *qp = pollux_qpair_alloc(ctrl, 32);
    CHECK(qp, "qpair");
    const uint32_t nlb = 8;
    const size_t len = (size_t)nlb * ns.block_size;
    struct pollux_buf *wbuf = pollux_buf_alloc(ctrl, len);
    struct pollux_buf *rbuf = pollux_buf_alloc(ctrl, 2 * len);
    CHECK(wbuf && rbuf, "buffers");
    CHECK(pollux_buf_len(wbuf) >= len, "buffer length");
    pattern(pollux_buf_ptr(wbuf), len, 7);

    /* A controller with live queue pairs cannot be detached. */
    CHECK(pollux_detach(ctrl) == -EBUSY, "detach with a live queue pair must be -EBUSY");

    struct done w = {0}, r = {0}, f = {0};
    CHECK(pollux_qpair_write(qp, ns.nsid, 16, nlb, wbuf, 0, on_done, &w) == 0, "write");
    /* In flight: freeing the buffer is refused. */
    CHECK(pollux_buf_free(wbuf) == -EBUSY, "free of a buffer in flight must be -EBUSY");
    CHECK(pollux_qpair_outstanding(qp) == 1, "one outstanding");
    CHECK(pollux_qpair_free(qp) == -EBUSY, "free of a busy qpair must be -EBUSY");
    wait_qp(qp, &w);
    CHECK(pollux_qpair_flush(qp, ns.nsid, on_done, &f) == 0, "flush");
    wait_qp(qp, &f);
    /* Read into the second half of rbuf (a range of a buffer). */
    CHECK(pollux_qpair_read(qp, ns.nsid, 16, nlb, rbuf, len, on_done, &r) == 0, "read");
    wait_qp(qp, &r);
    CHECK(memcmp(pollux_buf_ptr(wbuf), (uint8_t *)pollux_buf_ptr(rbuf) + len, len) == 0,
          "read data differs from written data");

    /* Out of range and bad arguments are refused, with no callback. */
    struct done bad = {0};
    CHECK(pollux_qpair_read(qp, ns.nsid, ns.num_blocks, 1, rbuf, 0, on_done, &bad) == -ERANGE,
          "read past the end must be -ERANGE");
    CHECK(pollux_qpair_read(qp, ns.nsid, 0, nlb, rbuf, 2 * len - 1, on_done, &bad) == -ERANGE,
          "range past the buffer must be -ERANGE");
    CHECK(pollux_qpair_read(NULL, ns.nsid, 0, 1, rbuf, 0, on_done, &bad) == -EINVAL, "NULL qp");
    CHECK(pollux_qpair_read(qp, 999, 0, 1, rbuf, 0, on_done, &bad) == -ENOENT, "bad nsid");
    CHECK(bad.calls == 0, "a refused request has no callback");

    /* Raw command: Read (opcode 2) of the same blocks into rbuf's first half. */
    uint8_t sqe[64] = {0};
    memset(pollux_buf_ptr(rbuf), 0, len);
    sqe[0] = 0x02;
    memcpy(&sqe[4], &ns.nsid, 4);
    uint64_t slba = 16;
    memcpy(&sqe[40], &slba, 8);
    uint32_t cdw12 = nlb - 1;
    memcpy(&sqe[48], &cdw12, 4);
    struct done raw = {0};
    CHECK(pollux_qpair_submit_raw(qp, sqe, rbuf, 0, len, on_done, &raw) == 0, "raw read");
    wait_qp(qp, &raw);
    CHECK(memcmp(pollux_buf_ptr(wbuf), pollux_buf_ptr(rbuf), len) == 0, "raw read data differs");

    CHECK(pollux_buf_free(wbuf) == 0 && pollux_buf_free(rbuf) == 0, "buffers free");
    CHECK(pollux_qpair_free(qp) == 0, "qpair free");
    CHECK(pollux_detach(ctrl) == 0, "detach");
    return 2 * len;
}

/* One thread's work on a shared controller: its own queue pair and
 * buffer, its own blocks. */
struct worker {
    struct pollux_ctrl *ctrl;
    uint32_t nsid, block_size;
    uint64_t lba;
    size_t verified;
};

static void *worker_main(void *p)
{
    struct worker *w = p;
    const uint32_t nlb = 8;
    const size_t len = (size_t)nlb * w->block_size;
    struct pollux_qpair *qp = pollux_qpair_alloc(w->ctrl, 8);
    struct pollux_buf *buf = pollux_buf_alloc(w->ctrl, 2 * len);
    CHECK(qp && buf, "worker qpair and buffer");
    uint8_t *mem = pollux_buf_ptr(buf);
    pattern(mem, len, (uint32_t)w->lba);
    for (int round = 0; round < 50; round++) {
        struct done wr = {0}, rd = {0};
        CHECK(pollux_qpair_write(qp, w->nsid, w->lba, nlb, buf, 0, on_done, &wr) == 0, "w");
        wait_qp(qp, &wr);
        memset(mem + len, 0, len);
        CHECK(pollux_qpair_read(qp, w->nsid, w->lba, nlb, buf, len, on_done, &rd) == 0, "r");
        wait_qp(qp, &rd);
        CHECK(memcmp(mem, mem + len, len) == 0, "thread at lba %" PRIu64 ": data differs", w->lba);
    }
    CHECK(pollux_buf_free(buf) == 0 && pollux_qpair_free(qp) == 0, "worker free");
    w->verified = len;
    return NULL;
}

static size_t threads_part(const char *trid)
{
    struct pollux_ctrl *ctrl = pollux_connect(trid);
    CHECK(ctrl, "connect %s", trid);
    struct pollux_ns_info ns;
    CHECK(pollux_ns_get(ctrl, 0, &ns) == 0, "ns 0");
    struct worker w[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        w[i] = (struct worker){ctrl, ns.nsid, ns.block_size, 64 + 64 * (uint64_t)i, 0};
        CHECK(pthread_create(&th[i], NULL, worker_main, &w[i]) == 0, "pthread_create");
    }
    size_t n = 0;
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        n += w[i].verified;
    }
    CHECK(pollux_detach(ctrl) == 0, "detach after the threads");
    printf("hello: 2 threads on one controller verified %zu bytes\n", n);
    return n;
}

static size_t bdev_part(struct pollux_bdev *bdev)
{
    struct pollux_bdev_info bi;
    CHECK(pollux_bdev_get_info(bdev, &bi) == 0, "bdev info");
    printf("hello: bdev %s: %" PRIu64 " blocks of %u bytes\n", bi.name, bi.num_blocks,
           bi.block_size);
    struct pollux_channel *ch = pollux_bdev_channel(bdev, 16);
    CHECK(ch, "channel");
    const size_t len = 4 * (size_t)bi.block_size;
    struct pollux_buf *wbuf = pollux_bdev_buf_alloc(bdev, len);
    struct pollux_buf *rbuf = pollux_bdev_buf_alloc(bdev, len);
    CHECK(wbuf && rbuf, "bdev buffers");
    pattern(pollux_buf_ptr(wbuf), len, 99);
    struct done w = {0}, r = {0}, f = {0}, again = {0};
    CHECK(pollux_channel_write(ch, 3, wbuf, on_done, &w) == 0, "bdev write");
    /* The buffer is lent whole: a second request with it is refused. */
    CHECK(pollux_channel_write(ch, 9, wbuf, on_done, &again) == -EBUSY,
          "a bdev buffer in flight must be refused");
    CHECK(pollux_buf_free(wbuf) == -EBUSY, "free of a bdev buffer in flight");
    CHECK(pollux_bdev_close(bdev) == -EBUSY, "close with a live channel");
    wait_ch(ch, &w);
    CHECK(again.calls == 0, "refused request had a callback");
    CHECK(pollux_channel_flush(ch, on_done, &f) == 0, "bdev flush");
    wait_ch(ch, &f);
    CHECK(pollux_channel_read(ch, 3, rbuf, on_done, &r) == 0, "bdev read");
    wait_ch(ch, &r);
    CHECK(memcmp(pollux_buf_ptr(wbuf), pollux_buf_ptr(rbuf), len) == 0, "bdev data differs");
    CHECK(pollux_buf_free(wbuf) == 0 && pollux_buf_free(rbuf) == 0, "bdev buffers free");
    CHECK(pollux_channel_free(ch) == 0, "channel free");
    CHECK(pollux_bdev_close(bdev) == 0, "bdev close");
    return len;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s TRID\n", argv[0]);
        return 2;
    }
    CHECK(pollux_connect("trtype:nonsense") == NULL && pollux_last_errno() == EINVAL,
          "a bad transport ID must fail with EINVAL");
    CHECK(strlen(pollux_last_error()) > 0, "an error text");
    size_t n = qpair_part(argv[1]);
    n += threads_part(argv[1]);

    struct pollux_bdev *nv = pollux_bdev_open(argv[1], 1, "Nvme0n1");
    CHECK(nv, "bdev over %s", argv[1]);
    n += bdev_part(nv);
    struct pollux_bdev *m = pollux_bdev_create(
        "{\"method\": \"bdev_malloc_create\", \"params\": "
        "{\"name\": \"Malloc0\", \"num_blocks\": 1024, \"block_size\": 512}}");
    CHECK(m, "malloc bdev");
    n += bdev_part(m);
    CHECK(pollux_bdev_create("{\"method\": \"bdev_bogus\"}") == NULL, "unknown method");
    printf("hello: verified %zu bytes over %s\n", n, argv[1]);
    return 0;
}
