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
/// Keystream blocks encrypted per call to the block cipher.
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
        let words = body.len().div_ceil(8);
        let full_words = body.len() / 8;
        SCRATCH.with(|scratch| {
            // A per-thread buffer: gathering must not allocate per packet. If it is somehow
            // in use (it is not re-entered today), fall back to a fresh one.
            let mut fresh = Vec::new();
            let mut borrowed = scratch.try_borrow_mut();
            let covered: &mut Vec<u8> = match borrowed.as_deref_mut() {
                Ok(v) => v,
                Err(_) => &mut fresh,
            };
            covered.clear();
            covered.reserve(header.len() + 8 + (self.expected_steps(words) + 16) * 8);
            covered.extend_from_slice(header);
            covered.extend_from_slice(&(body.len() as u64).to_le_bytes());
            let mut gather = Gather {
                body,
                full_words,
                covered,
            };
            self.walk(seq, words, &mut gather);
            self.umac.tag(&seq.to_be_bytes(), gather.covered, out)
        })
    }

    /// About how many words the walk chooses from `words` (the mean step is L + 1/2).
    fn expected_steps(&self, words: usize) -> usize {
        words * 2 / ((1usize << self.step_bits) + 1)
    }

    /// Calls `visit` with the index of every chosen word below `words`, in order.
    #[inline]
    fn walk(&self, seq: u64, words: usize, visitor: &mut impl Visit) {
        let bits = self.step_bits;
        let mask = (1u64 << bits) - 1;
        // Each 64-bit half of a keystream block gives floor(64 / bits) steps, low bits first.
        let steps_per_half = 64 / bits;
        let steps_per_block = 2 * steps_per_half;
        // Encrypt only as many keystream blocks as the walk will probably need, then more
        // in batches if it runs long.
        let need = (self.expected_steps(words) + 8) / steps_per_block as usize + 2;
        let mut batch = need.min(MAX_BATCH);
        let mut blocks = [[0u8; 16]; MAX_BATCH];
        let mut counter = 0u64;
        let fill = |blocks: &mut [[u8; 16]], counter: &mut u64| {
            for (i, block) in blocks.iter_mut().enumerate() {
                block[..8].copy_from_slice(&seq.to_be_bytes());
                block[8..].copy_from_slice(&(*counter + i as u64).to_be_bytes());
            }
            *counter += blocks.len() as u64;
            self.select.encrypt_blocks(blocks);
        };
        fill(&mut blocks[..batch], &mut counter);
        // The first block places the first landing (see `first_landing`); the steps start
        // with the second block.
        let first = first_landing(
            half_u64(&blocks[0], 0),
            half_u64(&blocks[0], 1),
            1 << (bits - 1),
        );
        if first >= words {
            return;
        }
        visitor.visit(first);
        // `next` is the index of the word after the last chosen one.
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
            batch = MAX_BATCH;
            fill(&mut blocks[..batch], &mut counter);
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

/// Appends each chosen body word (the last one zero-padded) to the covered bytes.
struct Gather<'a> {
    body: &'a [u8],
    full_words: usize,
    covered: &'a mut Vec<u8>,
}

impl Visit for Gather<'_> {
    #[inline(always)]
    fn visit(&mut self, index: usize) {
        if index < self.full_words {
            self.covered
                .extend_from_slice(&self.body[index * 8..index * 8 + 8]);
        } else {
            let mut last = [0u8; 8];
            let tail = &self.body[index * 8..];
            last[..tail.len()].copy_from_slice(tail);
            self.covered.extend_from_slice(&last);
        }
    }
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
