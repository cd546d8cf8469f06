//! The partial MAC of ACSA section 3.3.
//!
//! The header (everything in the packet before the body) is always covered. Of the body,
//! viewed as 64-bit words (a short last word is zero-padded), only words chosen by a
//! pseudorandom walk are covered: the first landing is drawn from the walk's equilibrium
//! distribution (see [`first_landing`]), and each step then moves forward by a distance
//! drawn uniformly from `[1, 2L]`, where `L` is the inverse of the selection rate
//! rounded up to a power of two. The walk comes from a per-packet secondary key, an AES-128
//! keystream under the gear's selection key and the packet's sequence number (ACSA 2.4), so
//! neither the adversary nor a replay of another packet's walk tells which words count.
//! Block `i` of the keystream is `AES(seq ‖ i)` (both big-endian u64). Block 0 (its two
//! 64-bit halves, read little-endian) places the first landing; every half of every later
//! block gives `floor(64 / log2(2L))` steps, lowest bits first.
//!
//! `tag` runs the walk fused with the gathering of the chosen words (`gather_walk`, one
//! copy per step width); `chosen_words` runs the plain walk. A test holds both equal to the
//! walk and gather as first written, kept frozen in the tests.
//!
//! The covered bytes (header, body length, chosen words in order) are then authenticated with
//! UMAC-64 under the gear's own UMAC key and the sequence number as nonce: NH is the fast
//! inner function and UMAC's AES pad the strong outer function, as in ACSA's prototype.
//!
//! # Strength
//! Every word, the first ones included, is chosen with probability `p = 2 / (2L + 1)` (one
//! over the mean step). A change to `w` words that lie several `L` apart escapes with
//! probability about `(1 - p)^w` (ACSA equation 4); the exact figure for any set of positions is computed by
//! [`escape_probability`], which the tests compare with measured rates. Changes to covered
//! data are caught as by UMAC-64 (about 2^-60 per attempt).

use crate::umac::Umac;
use cohort_crypto::{BlockCipher, CryptoError, CryptoProvider};

/// Tag length: UMAC-64.
const TAG_LEN: usize = 8;

thread_local! {
    /// Reused buffer for the covered bytes, so tagging does not allocate per packet.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
/// Most keystream blocks encrypted per call to the block cipher.
const MAX_BATCH: usize = 8;

/// A partial MAC key for one selection rate.
pub struct PartialMac {
    umac: Umac,
    select: Box<dyn BlockCipher>,
    /// log2(2L): bits of keystream per step.
    step_bits: u32,
}

impl PartialMac {
    /// `key` is 32 bytes: a UMAC key then a selection key. `l` is a power of two in 2..=256.
    pub fn new(provider: &CryptoProvider, key: &[u8], l: u32) -> Result<Self, CryptoError> {
        if key.len() != 32 || !l.is_power_of_two() || !(2..=256).contains(&l) {
            return Err(CryptoError::InvalidInput);
        }
        Ok(PartialMac {
            umac: Umac::new(provider, &key[..16], TAG_LEN)?,
            select: provider.aes_block.aes128(&key[16..])?,
            step_bits: (2 * l).trailing_zeros(),
        })
    }

    /// Tags `data` (header then body from `body_start`) for packet `seq` into `out` (8 bytes).
    pub fn tag(
        &self,
        seq: u64,
        data: &[u8],
        body_start: usize,
        out: &mut [u8],
    ) -> Result<(), CryptoError> {
        let (header, body) = data
            .split_at_checked(body_start)
            .ok_or(CryptoError::InvalidInput)?;
        SCRATCH.with(|scratch| {
            // A per-thread buffer: gathering must not allocate per packet. If it is somehow
            // in use (it is not re-entered today), fall back to a fresh one.
            let mut fresh = Vec::new();
            let mut borrowed = scratch.try_borrow_mut();
            let covered: &mut Vec<u8> = match borrowed.as_deref_mut() {
                Ok(v) => v,
                Err(_) => &mut fresh,
            };
            let len = self.gather(seq, header, body, covered);
            self.umac.tag(&seq.to_be_bytes(), &covered[..len], out)
        })
    }

    /// Writes the covered bytes (header, body length as u64 little-endian, the chosen words
    /// in order, the last one zero-padded) to the front of `covered` and returns their
    /// length. Bytes of `covered` past that length are left over from earlier packets: the
    /// buffer only grows, so that the walk never checks capacity per word.
    fn gather(&self, seq: u64, header: &[u8], body: &[u8], covered: &mut Vec<u8>) -> usize {
        let prefix = header.len() + 8;
        if covered.len() < prefix {
            covered.resize(prefix, 0);
        }
        covered[..header.len()].copy_from_slice(header);
        covered[header.len()..prefix].copy_from_slice(&(body.len() as u64).to_le_bytes());
        let mut sink = WordSink {
            buf: covered,
            prefix,
            count: 0,
        };
        // One copy of the walk per step width, so that every shift and the steps per
        // keystream block are constants and the inner loop unrolls.
        match self.step_bits {
            2 => self.gather_walk::<2>(seq, body, &mut sink),
            3 => self.gather_walk::<3>(seq, body, &mut sink),
            4 => self.gather_walk::<4>(seq, body, &mut sink),
            5 => self.gather_walk::<5>(seq, body, &mut sink),
            6 => self.gather_walk::<6>(seq, body, &mut sink),
            7 => self.gather_walk::<7>(seq, body, &mut sink),
            8 => self.gather_walk::<8>(seq, body, &mut sink),
            _ => self.gather_walk::<9>(seq, body, &mut sink),
        }
        prefix + 8 * sink.count
    }

    /// The walk of [`walk`](Self::walk) with `BITS` = log2(2L) fixed, appending each chosen
    /// body word to `sink` as it goes. Same keystream, same steps, same order: only the
    /// bookkeeping differs (one capacity check per keystream block, the body's bounds check
    /// doubling as the end of the walk).
    fn gather_walk<const BITS: u32>(&self, seq: u64, body: &[u8], sink: &mut WordSink<'_>) {
        let mask = (1u64 << BITS) - 1;
        let steps_per_half = (64 / BITS) as usize;
        let (full, tail) = body.as_chunks::<8>();
        // The zero-padded short last word, if the body has one; it is word `full.len()`,
        // so the walk ends right after choosing it.
        let padded_tail = (!tail.is_empty()).then(|| {
            let mut last = [0u8; 8];
            last[..tail.len()].copy_from_slice(tail);
            last
        });
        let words = full.len() + usize::from(padded_tail.is_some());
        let mut stream = Keystream::new(&*self.select, seq, blocks_needed(BITS, words));
        let block0 = stream.next_block();
        let first = first_landing(half_u64(&block0, 0), half_u64(&block0, 1), 1 << (BITS - 1));
        // Takes the word at `chosen` into `dst[slot]`: `Ok` while the walk goes on;
        // `Err(words written to dst)` at its end, the first index past the full words
        // (after taking the padded tail if that index is the tail's).
        let take = |dst: &mut [[u8; 8]], slot: usize, chosen: usize| match full.get(chosen) {
            Some(word) => {
                dst[slot] = *word;
                Ok(())
            }
            None => match padded_tail {
                Some(last) if chosen == full.len() => {
                    dst[slot] = last;
                    Err(slot + 1)
                }
                _ => Err(slot),
            },
        };
        if let Err(written) = take(sink.reserve_block(), 0, first) {
            sink.count += written;
            return;
        }
        sink.count += 1;
        // `next` is the index of the word after the last chosen one.
        let mut next = first + 1;
        loop {
            let block = stream.next_block();
            let dst = sink.reserve_block();
            for h in 0..2 {
                let mut reservoir = half_u64(&block, h);
                for j in 0..steps_per_half {
                    let chosen = next + (reservoir & mask) as usize; // step - 1 in [0, 2L)
                    reservoir >>= BITS;
                    if let Err(written) = take(dst, h * steps_per_half + j, chosen) {
                        sink.count += written;
                        return;
                    }
                    next = chosen + 1;
                }
            }
            sink.count += 2 * steps_per_half;
        }
    }

    /// Calls `visit` with the index of every chosen word below `words`, in order: the plain
    /// form of the walk, for [`chosen_words`](Self::chosen_words). [`tag`](Self::tag) runs
    /// the same walk fused with the gathering (`gather_walk`); the tests hold them equal.
    fn walk(&self, seq: u64, words: usize, visitor: &mut impl Visit) {
        let bits = self.step_bits;
        let mask = (1u64 << bits) - 1;
        // Each 64-bit half of a keystream block gives floor(64 / bits) steps, low bits first.
        let steps_per_half = 64 / bits;
        let mut stream = Keystream::new(&*self.select, seq, blocks_needed(bits, words));
        // The first block places the first landing (see `first_landing`); the steps start
        // with the second block.
        let block0 = stream.next_block();
        let first = first_landing(half_u64(&block0, 0), half_u64(&block0, 1), 1 << (bits - 1));
        if first >= words {
            return;
        }
        visitor.visit(first);
        // `next` is the index of the word after the last chosen one.
        let mut next = first + 1;
        loop {
            let block = stream.next_block();
            for h in 0..2 {
                let mut reservoir = half_u64(&block, h);
                for _ in 0..steps_per_half {
                    let step = (reservoir & mask) as usize; // in [0, 2L - 1]: step - 1
                    reservoir >>= bits;
                    let chosen = next + step;
                    if chosen >= words {
                        return;
                    }
                    visitor.visit(chosen);
                    next = chosen + 1;
                }
            }
        }
    }

    /// The chosen word indices for packet `seq` and a body of `words` words (for tests and
    /// for tools that show the walk).
    pub fn chosen_words(&self, seq: u64, words: usize) -> Vec<usize> {
        let mut out = Vec::new();
        self.walk(seq, words, &mut out);
        out
    }
}

/// Receives the walk's chosen word indices. A trait rather than a closure so that the
/// gather is forced inline into the walk's loop (it is the hot path).
trait Visit {
    fn visit(&mut self, index: usize);
}

impl Visit for Vec<usize> {
    fn visit(&mut self, index: usize) {
        self.push(index);
    }
}

/// Most words one keystream block can choose: 2 halves of 32 two-bit steps (L = 2).
const MAX_STEPS_PER_BLOCK: usize = 64;

/// Where the walk writes chosen words: `buf` after its `prefix` (header and length), `count`
/// words so far.
struct WordSink<'a> {
    buf: &'a mut Vec<u8>,
    prefix: usize,
    count: usize,
}

impl WordSink<'_> {
    /// Room for one keystream block's words after the `count` written: exactly
    /// [`MAX_STEPS_PER_BLOCK`] slots, so that the walk's writes need no further checks.
    #[inline(always)]
    fn reserve_block(&mut self) -> &mut [[u8; 8]] {
        let start = self.prefix + 8 * self.count;
        let end = start + 8 * MAX_STEPS_PER_BLOCK;
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        self.buf[start..end].as_chunks_mut::<8>().0
    }
}

/// The walk's keystream: block `i` is `AES(seq ‖ i)`, encrypted in batches.
struct Keystream<'a> {
    cipher: &'a dyn BlockCipher,
    seq: u64,
    /// Index of the first block in `blocks`.
    counter: u64,
    blocks: [[u8; 16]; MAX_BATCH],
    /// Blocks made in the current batch, and how many of them were used.
    made: usize,
    used: usize,
    /// Size of the next batch.
    next_batch: usize,
}

impl<'a> Keystream<'a> {
    /// Blocks after the first batch are made this many at a time (rare for short walks,
    /// the rule for long ones).
    const REFILL: usize = MAX_BATCH;

    /// An empty keystream; the first [`next_block`](Self::next_block) makes a batch of
    /// `first_batch` blocks (at most [`MAX_BATCH`]). Returned as a literal so that the
    /// caller's stack slot is written in place (moving it cost a `memcpy` per tag).
    fn new(cipher: &'a dyn BlockCipher, seq: u64, first_batch: usize) -> Self {
        Keystream {
            cipher,
            seq,
            counter: 0,
            blocks: [[0u8; 16]; MAX_BATCH],
            made: 0,
            used: 0,
            next_batch: first_batch,
        }
    }

    /// Replaces the batch with the next `n` blocks (1 to [`MAX_BATCH`]).
    fn fill(&mut self, n: usize) {
        let n = n.clamp(1, MAX_BATCH);
        self.counter += self.made as u64;
        for (i, block) in self.blocks[..n].iter_mut().enumerate() {
            block[..8].copy_from_slice(&self.seq.to_be_bytes());
            block[8..].copy_from_slice(&(self.counter + i as u64).to_be_bytes());
        }
        self.cipher.encrypt_blocks(&mut self.blocks[..n]);
        self.made = n;
        self.used = 0;
    }

    /// The next keystream block.
    #[inline(always)]
    fn next_block(&mut self) -> [u8; 16] {
        if self.used >= self.made {
            self.fill(self.next_batch);
            self.next_batch = Self::REFILL;
        }
        let block = self.blocks[self.used];
        self.used += 1;
        block
    }
}

/// Keystream blocks a walk with `bits` per step over `words` words needs with high
/// probability: the first landing's block and steps for the expected count plus an eighth
/// and 8 (at least 3.4 standard deviations of the count, which are about 0.58 times its
/// square root). A longer walk makes more in small batches. Inlined with a constant `bits`,
/// the divisions become multiplications.
#[inline(always)]
fn blocks_needed(bits: u32, words: usize) -> usize {
    let expected = words * 2 / ((1usize << bits) + 1);
    let steps_per_block = 2 * (64 / bits) as usize;
    1 + (expected + expected / 8 + 8).div_ceil(steps_per_block)
}

/// Half `h` (0 or 1) of a keystream block, read little-endian.
fn half_u64(block: &[u8; 16], h: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&block[h * 8..h * 8 + 8]);
    u64::from_le_bytes(b)
}

/// Where the walk lands first, from 128 uniform bits: word `k` in `[0, 2L)` with
/// probability `(2L - k) / (L (2L + 1))`, the equilibrium distribution of a walk with steps
/// uniform in `[1, 2L]`. Started this way, the walk covers *every* word, the first ones
/// included, with the same probability `2 / (2L + 1)`; a walk started just before word 0
/// would cover word 0 with only `1 / (2L)`.
///
/// That distribution is the smaller of two distinct values drawn from `[0, 2L]`: of the
/// `L (2L + 1)` unordered pairs, `2L - k` have `k` as their smaller value. The pair is
/// `u` and `u + d` (mod `2L + 1`), `u` uniform in `[0, 2L]` and `d` in `[1, 2L]`, each from
/// 64 bits by multiply-high, so the distribution is off by at most `2 (2L + 1) / 2^64`,
/// below 2^-54.
pub fn first_landing(x0: u64, x1: u64, l: usize) -> usize {
    let m = 2 * l as u64 + 1;
    let below = |x: u64, n: u64| ((u128::from(x) * u128::from(n)) >> 64) as u64;
    let u = below(x0, m);
    let d = 1 + below(x1, m - 1);
    let v = if u + d >= m { u + d - m } else { u + d };
    u.min(v) as usize
}

/// The exact probability that none of the words at `positions` is chosen by the walk of a
/// partial MAC with parameter `l` (steps uniform in `[1, 2l]`, first landing as in
/// [`first_landing`]), ignoring the first landing's bias of at most 2^-54.
///
/// Dynamic programming: `land[i]`, the probability that the walk lands on word `i` without
/// having landed on any position before, is the first-landing probability of `i` plus
/// `sum over k in [1, 2l] of land[i - k] / (2l)`. At a position that sum is the probability
/// that the walk's first landing on a position is there; the walk escapes when that never
/// happens. Positions may come in any order and repeat.
pub fn escape_probability(positions: &[usize], l: u32) -> f64 {
    let mut sorted = positions.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let (Some(&last), true) = (sorted.last(), l >= 1) else {
        return 1.0;
    };
    let span = 2 * l as usize;
    let norm = f64::from(l) * (span as f64 + 1.0);
    let mut land = vec![0.0f64; last + 1];
    let mut window = 0.0; // sum of land over the previous `span` words
    let mut hit = 0.0;
    let mut forbidden = sorted.iter().peekable();
    for i in 0..=last {
        let first = if i < span {
            (span - i) as f64 / norm
        } else {
            0.0
        };
        let mut here = first + window / span as f64;
        if forbidden.peek() == Some(&&i) {
            forbidden.next();
            hit += here;
            here = 0.0;
        }
        land[i] = here;
        window += here;
        if i >= span {
            window -= land[i - span];
        }
    }
    (1.0 - hit).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(l: u32) -> PartialMac {
        PartialMac::new(&CryptoProvider::default_provider(), &[9u8; 32], l).unwrap()
    }

    #[test]
    fn walk_steps_stay_in_range_and_rate_matches() {
        for l in [2u32, 4, 8, 16, 32, 64, 128, 256] {
            let pm = key(l);
            let words = 1 << 16;
            let chosen = pm.chosen_words(42, words);
            let mut prev: isize = -1;
            for &c in &chosen {
                let step = c as isize - prev;
                assert!((1..=2 * l as isize).contains(&step), "l={l} step={step}");
                prev = c as isize;
            }
            let rate = chosen.len() as f64 / words as f64;
            let p = 2.0 / (2.0 * f64::from(l) + 1.0);
            // Steps are i.i.d. with variance about (2L)^2/12; the count has relative standard
            // deviation about 0.58 / sqrt(count). Allow 6 sigma.
            let sigma = p * 0.58 / (chosen.len() as f64).sqrt();
            assert!(
                (rate - p).abs() < 6.0 * sigma + 1e-9,
                "l={l}: rate {rate} vs p {p}"
            );
        }
    }

    #[test]
    fn first_landing_follows_the_equilibrium_distribution() {
        // x -> the value multiply-high gives exactly i out of n.
        let exact = |i: u64, n: u64| (u128::from(i) << 64).div_ceil(u128::from(n)) as u64;
        for l in [1usize, 2, 4, 64, 256] {
            let span = 2 * l;
            let m = span as u64 + 1;
            let mut counts = vec![0u64; span];
            for u in 0..m {
                for d in 0..m - 1 {
                    counts[first_landing(exact(u, m), exact(d, m - 1), l)] += 1;
                }
            }
            // Every ordered pair once: row k gets both orders of its 2L - k unordered pairs.
            for (k, &c) in counts.iter().enumerate() {
                assert_eq!(c, 2 * (span - k) as u64, "l={l} k={k}");
            }
            assert!(first_landing(u64::MAX, u64::MAX, l) < span);
        }
    }

    #[test]
    fn walk_depends_on_sequence_number() {
        let pm = key(4);
        assert_ne!(pm.chosen_words(1, 1000), pm.chosen_words(2, 1000));
        assert_eq!(pm.chosen_words(1, 1000), pm.chosen_words(1, 1000));
    }

    #[test]
    fn exact_escape_probability_matches_simple_cases() {
        // Every single word, the first included, is chosen with probability 2 / (2l + 1).
        for l in [1u32, 2, 8, 64] {
            let p = 2.0 / (2.0 * f64::from(l) + 1.0);
            for word in [0usize, 1, 2, 2 * l as usize - 1, 1000] {
                let e = escape_probability(&[word], l);
                assert!((e - (1.0 - p)).abs() < 1e-9, "l={l} word={word}: {e}");
            }
        }
        assert_eq!(escape_probability(&[], 8), 1.0);
        // Order and repeats do not matter.
        assert_eq!(
            escape_probability(&[9, 3, 3], 2),
            escape_probability(&[3, 9], 2)
        );
    }

    /// The walk and gather as they were before the fused `gather_walk` (commit a8fc096),
    /// kept frozen here as the reference the new code must match bit for bit.
    mod reference {
        use super::super::{first_landing, half_u64, PartialMac};

        /// The old `tag`: the covered bytes gathered into a `Vec` word by word.
        pub fn tag(pm: &PartialMac, seq: u64, data: &[u8], body_start: usize) -> [u8; 8] {
            let (header, body) = data.split_at(body_start);
            let words = body.len().div_ceil(8);
            let full_words = body.len() / 8;
            let mut covered = Vec::new();
            covered.extend_from_slice(header);
            covered.extend_from_slice(&(body.len() as u64).to_le_bytes());
            for index in chosen(pm, seq, words) {
                if index < full_words {
                    covered.extend_from_slice(&body[index * 8..index * 8 + 8]);
                } else {
                    let mut last = [0u8; 8];
                    let tail = &body[index * 8..];
                    last[..tail.len()].copy_from_slice(tail);
                    covered.extend_from_slice(&last);
                }
            }
            let mut out = [0u8; 8];
            pm.umac.tag(&seq.to_be_bytes(), &covered, &mut out).unwrap();
            out
        }

        /// The old `walk`: keystream in batches of at most 8 blocks, steps in a loop.
        pub fn chosen(pm: &PartialMac, seq: u64, words: usize) -> Vec<usize> {
            const MAX_BATCH: usize = 8;
            let mut out = Vec::new();
            let bits = pm.step_bits;
            let mask = (1u64 << bits) - 1;
            let steps_per_half = 64 / bits;
            let steps_per_block = 2 * steps_per_half;
            let expected_steps = words * 2 / ((1usize << bits) + 1);
            let need = (expected_steps + 8) / steps_per_block as usize + 2;
            let mut batch = need.min(MAX_BATCH);
            let mut blocks = [[0u8; 16]; MAX_BATCH];
            let mut counter = 0u64;
            let fill = |blocks: &mut [[u8; 16]], counter: &mut u64| {
                for (i, block) in blocks.iter_mut().enumerate() {
                    block[..8].copy_from_slice(&seq.to_be_bytes());
                    block[8..].copy_from_slice(&(*counter + i as u64).to_be_bytes());
                }
                *counter += blocks.len() as u64;
                pm.select.encrypt_blocks(blocks);
            };
            fill(&mut blocks[..batch], &mut counter);
            let first = first_landing(
                half_u64(&blocks[0], 0),
                half_u64(&blocks[0], 1),
                1 << (bits - 1),
            );
            if first >= words {
                return out;
            }
            out.push(first);
            let mut next = first + 1;
            let mut skip_first_block = true;
            loop {
                for block in &blocks[..batch] {
                    if std::mem::take(&mut skip_first_block) {
                        continue;
                    }
                    for h in 0..2 {
                        let mut reservoir = half_u64(block, h);
                        for _ in 0..steps_per_half {
                            let step = (reservoir & mask) as usize;
                            reservoir >>= bits;
                            let chosen = next + step;
                            if chosen >= words {
                                return out;
                            }
                            out.push(chosen);
                            next = chosen + 1;
                        }
                    }
                }
                batch = MAX_BATCH;
                fill(&mut blocks[..batch], &mut counter);
            }
        }
    }

    /// Body lengths that stress the edges: empty, one byte, around a word, around a
    /// keystream block's worth of steps, and long enough to need refills.
    fn edge_lengths(l: u32) -> Vec<usize> {
        let spb = 8 * 2 * (64 / (2 * l).trailing_zeros()) as usize; // bytes per block at step 1
        let mut v = vec![
            0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1023, 1024, 1025, 1500,
        ];
        v.extend([
            spb - 1,
            spb,
            spb + 1,
            8 * 2 * l as usize + 3,
            8192,
            65_535,
            65_536,
        ]);
        v
    }

    #[test]
    fn fused_walk_matches_the_old_walk_and_gather() {
        use rand_chacha::rand_core::{RngCore, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(18);
        let provider = CryptoProvider::default_provider();
        let mut cases = 0;
        for l in [2u32, 4, 8, 16, 32, 64, 128, 256] {
            for round in 0..6 {
                let mut k = [0u8; 32];
                rng.fill_bytes(&mut k);
                let pm = PartialMac::new(&provider, &k, l).unwrap();
                let mut lengths = edge_lengths(l);
                lengths.extend((0..8).map(|_| rng.next_u32() as usize % 70_000));
                for body_len in lengths {
                    let header_len = [0usize, 1, 16, 29][(round + body_len) % 4];
                    let mut data = vec![0u8; header_len + body_len];
                    rng.fill_bytes(&mut data);
                    let seq = rng.next_u64();
                    let mut tag = [0u8; 8];
                    pm.tag(seq, &data, header_len, &mut tag).unwrap();
                    assert_eq!(
                        tag,
                        reference::tag(&pm, seq, &data, header_len),
                        "l={l} header={header_len} body={body_len} seq={seq}"
                    );
                    let words = body_len.div_ceil(8);
                    assert_eq!(
                        pm.chosen_words(seq, words),
                        reference::chosen(&pm, seq, words),
                        "l={l} words={words} seq={seq}"
                    );
                    cases += 1;
                }
            }
        }
        // The scratch buffer is reused across packets of every size: a long packet
        // followed by short ones must not leave stale words in the covered bytes.
        let pm = key(2);
        let long = vec![0x5au8; 40_000];
        let short = vec![0x33u8; 100];
        let mut t = [0u8; 8];
        for seq in 0..4 {
            pm.tag(seq, &long, 16, &mut t).unwrap();
            assert_eq!(t, reference::tag(&pm, seq, &long, 16));
            pm.tag(seq, &short, 16, &mut t).unwrap();
            assert_eq!(t, reference::tag(&pm, seq, &short, 16));
        }
        assert!(cases > 8 * 6 * 20);
    }

    #[test]
    fn header_is_always_covered_and_tail_word_counts() {
        let pm = key(256);
        let mut data = vec![0u8; 4000];
        data[..10].copy_from_slice(b"header....");
        let mut t1 = [0u8; 8];
        pm.tag(5, &data, 10, &mut t1).unwrap();
        for byte in 0..10 {
            let mut d = data.clone();
            d[byte] ^= 1;
            let mut t2 = [0u8; 8];
            pm.tag(5, &d, 10, &mut t2).unwrap();
            assert_ne!(t1, t2, "header byte {byte} must be covered");
        }
        // Length changes are covered even when no word is chosen.
        let mut t3 = [0u8; 8];
        pm.tag(5, &data[..3999], 10, &mut t3).unwrap();
        assert_ne!(t1, t3);
        assert!(pm.tag(5, &data, 5000, &mut t3).is_err());
    }
}
