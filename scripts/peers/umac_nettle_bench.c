/* umac_nettle_bench.c: times Nettle's umac32 and umac64 (libnettle, nettle-dev) the way
 * `cohort gears bench` times its gears, so scripts/peers/umac-nettle.sh can print ratios.
 *
 * Usage: umac_nettle_bench MILLIS SIZE...
 * For each algorithm and size: find an iteration count taking about MILLIS/5 ms, then time
 * five runs of that many full tags (set nonce, update, digest) and keep the best. Prints one
 * line per measurement: "nettle <alg> <size> <bytes_per_second>".
 * The message is 0xa5 bytes and the key fixed: the bench measures speed, not secrecy. */
#include <nettle/umac.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Defeats dead-code elimination of the digests. */
static volatile uint8_t sink;

static void tag32(void *ctx, const uint8_t *msg, size_t len, uint64_t seq)
{
  uint8_t nonce[8], digest[UMAC32_DIGEST_SIZE];
  for (int i = 0; i < 8; i++)
    nonce[i] = (uint8_t)(seq >> (56 - 8 * i));
  umac32_set_nonce(ctx, sizeof nonce, nonce);
  umac32_update(ctx, len, msg);
  umac32_digest(ctx, sizeof digest, digest);
  sink ^= digest[0];
}

static void tag64(void *ctx, const uint8_t *msg, size_t len, uint64_t seq)
{
  uint8_t nonce[8], digest[UMAC64_DIGEST_SIZE];
  for (int i = 0; i < 8; i++)
    nonce[i] = (uint8_t)(seq >> (56 - 8 * i));
  umac64_set_nonce(ctx, sizeof nonce, nonce);
  umac64_update(ctx, len, msg);
  umac64_digest(ctx, sizeof digest, digest);
  sink ^= digest[0];
}

static double measure(void (*tag)(void *, const uint8_t *, size_t, uint64_t), void *ctx,
                      const uint8_t *msg, size_t len, double budget)
{
  uint64_t seq = 0, iters = 1;
  for (;;) {
    double start = now();
    for (uint64_t i = 0; i < iters; i++)
      tag(ctx, msg, len, ++seq);
    if (now() - start >= budget / 5 || iters >= (1u << 30))
      break;
    iters *= 2;
  }
  double best = 1e30;
  for (int r = 0; r < 5; r++) {
    double start = now();
    for (uint64_t i = 0; i < iters; i++)
      tag(ctx, msg, len, ++seq);
    double t = now() - start;
    if (t < best)
      best = t;
  }
  return (double)len * (double)iters / (best > 1e-12 ? best : 1e-12);
}

int main(int argc, char **argv)
{
  if (argc < 3) {
    fprintf(stderr, "usage: %s MILLIS SIZE...\n", argv[0]);
    return 2;
  }
  double budget = atof(argv[1]) / 1000.0;
  uint8_t key[16];
  memset(key, 0x42, sizeof key);
  struct umac32_ctx c32;
  struct umac64_ctx c64;
  umac32_set_key(&c32, key);
  umac64_set_key(&c64, key);
  for (int a = 2; a < argc; a++) {
    size_t len = strtoul(argv[a], NULL, 10);
    uint8_t *msg = malloc(len ? len : 1);
    if (!msg)
      return 1;
    memset(msg, 0xa5, len);
    printf("nettle umac32 %zu %.0f\n", len, measure(tag32, &c32, msg, len, budget));
    printf("nettle umac64 %zu %.0f\n", len, measure(tag64, &c64, msg, len, budget));
    fflush(stdout);
    free(msg);
  }
  return 0;
}
