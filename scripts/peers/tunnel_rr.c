/* Request/reply load for scripts/peers/tunnel-stunnel.sh: new TCP connections, each sending
 * one 100-byte request and reading one 100-byte reply, then closing.
 *
 *   tunnel_rr server PORT              reply server: epoll, one thread; answers every
 *                                      100 bytes read with 100 bytes
 *   tunnel_rr client PORT CONC SECS    CONC threads, each opening connections one after
 *                                      another for SECS seconds; prints
 *                                      "conns N conn_per_s R median_us M p99_us P errors E"
 *
 * The latency is per connection: from the start of connect() to the last byte of the
 * reply (so it includes a tunnel's handshake, which happens before the request moves).
 * Loopback only: the address is 127.0.0.1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG 100
#define MAX_SAMPLES 2000000

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static struct sockaddr_in addr_of(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

/* ---- server ---------------------------------------------------------------------------- */

struct conn { int fd; int got; };

static int serve(int port) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = addr_of(port);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4096)) { perror("listen"); return 1; }
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
    struct epoll_event evs[256];
    char buf[4096], reply[MSG];
    memset(reply, 'r', sizeof reply);
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(l, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    c = calloc(1, sizeof *c);
                    c->fd = fd;
                    struct epoll_event e = { .events = EPOLLIN, .data.ptr = c };
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                }
                continue;
            }
            for (;;) {
                ssize_t r = read(c->fd, buf, sizeof buf);
                if (r > 0) {
                    c->got += r;
                    while (c->got >= MSG) {
                        c->got -= MSG;
                        if (write(c->fd, reply, MSG) != MSG) { c->got = -1; break; }
                    }
                    if (c->got < 0) r = 0; else continue;
                }
                if (r < 0 && (errno == EAGAIN || errno == EINTR)) break;
                close(c->fd); /* closing removes it from the epoll set */
                free(c);
                break;
            }
        }
    }
}

/* ---- client ---------------------------------------------------------------------------- */

struct worker {
    int port;
    double until;
    long conns, errors;
    float *lat; /* microseconds */
    long nlat;
};

static int read_full(int fd, char *b, int n) {
    int got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r <= 0) return -1;
        got += r;
    }
    return 0;
}

static void *work(void *arg) {
    struct worker *w = arg;
    char req[MSG], rep[MSG];
    memset(req, 'q', sizeof req);
    struct sockaddr_in a = addr_of(w->port);
    int one = 1;
    while (now_s() < w->until) {
        double t0 = now_s();
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0
            && write(fd, req, MSG) == MSG && read_full(fd, rep, MSG) == 0;
        double t1 = now_s();
        close(fd);
        if (!ok) { w->errors++; continue; }
        w->conns++;
        if (w->nlat < MAX_SAMPLES) w->lat[w->nlat++] = (float)((t1 - t0) * 1e6);
    }
    return NULL;
}

static int cmp_float(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

static int client(int port, int conc, double secs) {
    pthread_t th[64];
    struct worker ws[64];
    if (conc < 1 || conc > 64) return 2;
    double start = now_s();
    for (int i = 0; i < conc; i++) {
        ws[i] = (struct worker){ .port = port, .until = start + secs };
        ws[i].lat = malloc(sizeof(float) * MAX_SAMPLES);
        pthread_create(&th[i], NULL, work, &ws[i]);
    }
    long conns = 0, errors = 0, n = 0;
    for (int i = 0; i < conc; i++) {
        pthread_join(th[i], NULL);
        conns += ws[i].conns;
        errors += ws[i].errors;
        n += ws[i].nlat;
    }
    double took = now_s() - start;
    float *all = malloc(sizeof(float) * (n ? n : 1));
    long k = 0;
    for (int i = 0; i < conc; i++)
        for (long j = 0; j < ws[i].nlat; j++) all[k++] = ws[i].lat[j];
    qsort(all, n, sizeof(float), cmp_float);
    printf("conns %ld conn_per_s %.0f median_us %.0f p99_us %.0f errors %ld\n", conns,
           conns / took, n ? all[n / 2] : 0.0, n ? all[(long)(n * 0.99)] : 0.0, errors);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "server")) return serve(atoi(argv[2]));
    if (argc == 5 && !strcmp(argv[1], "client"))
        return client(atoi(argv[2]), atoi(argv[3]), atof(argv[4]));
    fprintf(stderr, "usage: tunnel_rr server PORT | tunnel_rr client PORT CONC SECS\n");
    return 2;
}
