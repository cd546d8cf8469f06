//! Hash chains: the owner's side ([`HashChain`], which discloses its elements one by one) and
//! everybody else's ([`ChainVerifier`], which checks them against the last one it accepted).
//!
//! A chain of length `n` is `h_0 = seed`, `h_i = chain_step(chain_id, i, h_{i-1})` for
//! `i = 1..=n`, and its anchor is `h_n`. The anchor is published (signed, in the handshake);
//! the owner then discloses `h_{n-1}`, `h_{n-2}`, ..., `h_0`, in that order and never out of
//! it. Whoever holds an element checks a later-disclosed one by hashing it forward.
//!
//! # Storage strategies
//!
//! The owner needs the elements in the reverse of the order in which they can be computed, so
//! it trades memory against hashes per disclosed element ([`ChainStorage`]):
//!
//! | strategy              | elements held (max) | hashes for one element (max) | on average |
//! |-----------------------|---------------------|------------------------------|------------|
//! | `Full`                | `n`                 | 0                            | 0          |
//! | `Checkpoint` (`c`)    | `⌈n/c⌉ - 1 + c`     | `c - 1`                      | under 1    |
//! | `Logarithmic`         | `⌈log2 n⌉`          | `⌈log2 n⌉` (worst case)      | `½·log2 n - 1` |
//!
//! Generation always costs `n` hashes, whatever is kept.
//!
//! *Checkpoint* (the strategy of the ALPHA implementation report) keeps `h_0, h_c, h_2c, ...`;
//! when the disclosure reaches a segment `[k·c, (k+1)·c)` it recomputes the segment from its
//! checkpoint (at most `c - 1` hashes, all paid by the segment's first element) and hands the
//! cached elements out with no further hashing. The top segment is cached during generation.
//! With `c ≈ √n` memory is about `2√n`.
//!
//! *Logarithmic* is a pebbling traversal in the style of Jakobsson's fractal hash chains, with a
//! worst-case (not amortized) bound. Think of the indices in binary: while the next index to
//! disclose is `x`, the owner holds `h_a` for each `a` obtained by clearing the low `j` bits of
//! `x` (`j >= 1`; the "ladder" down to `h_0`), so the next element is held or one hash away.
//! When the disclosure crosses a multiple of `2^t`, the ladder of the block of length `2^t`
//! below needs the elements at offsets `2^t - 2^j` (`j < t`) from the block's bottom. A pebble
//! computes them during the second half of the block above: it starts from the block's bottom
//! (already on the ladder), moves two steps per disclosed element and leaves a copy at each of
//! those offsets. At most one pebble per two bit positions moves at a time, which bounds the
//! work per element by `⌈log2 n⌉`; the ladder empties above as the new one fills below, which
//! keeps the memory at `⌈log2 n⌉` elements (checked exhaustively in the tests).
//!
//! Coppersmith–Jakobsson reach `½·log2 n` hashes in the worst case with about `1.5·log2 n`
//! elements; the traversal here is simpler and already within a factor of two.
//!
//! # Secrets
//!
//! Undisclosed elements are secret: [`HashChain`] never prints them and zeroizes what it holds
//! on drop (buffers are allocated once, at their final size, so that no reallocation leaves
//! copies behind). Disclosed elements are public, so [`ChainVerifier`] holds nothing secret.

use core::fmt;
use core::str::FromStr;

use cohort_crypto::{ct_eq, CryptoProvider};
use zeroize::Zeroize;

use crate::crypto::{chain_step, chain_walk, ChainId, Element};

/// How the owner stores its chain: memory against hashes per disclosed element.
///
/// The string form (for configuration and command lines) is `full`, `checkpoint:<interval>`
/// or `log`; see [`ChainStorage::name`] and the [`FromStr`] implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainStorage {
    /// Every element: `n` elements of memory, no hashing after generation.
    Full,
    /// Every `interval`-th element kept as a checkpoint; the segment being disclosed is
    /// recomputed from the checkpoint below it and cached: at most `⌈n/c⌉ - 1 + c` elements,
    /// at most `c - 1` hashes for one element and fewer than one per element on average.
    /// An interval of 0 is taken as 1.
    Checkpoint {
        /// Distance `c` between checkpoints.
        interval: u32,
    },
    /// Logarithmic pebbling traversal (Jakobsson's fractal hash chains): at most `⌈log2 n⌉`
    /// elements held and at most `⌈log2 n⌉` hashes for any one element (a worst-case bound,
    /// not an amortized one), about `½·log2 n - 1` on average.
    Logarithmic,
}

impl ChainStorage {
    /// The interval of [`ChainStorage::default`].
    pub const DEFAULT_INTERVAL: u32 = 64;

    /// The strategy's string form: `full`, `checkpoint:<interval>` or `log`; parses back with
    /// [`FromStr`].
    pub fn name(&self) -> String {
        match self {
            ChainStorage::Full => "full".to_string(),
            ChainStorage::Checkpoint { interval } => format!("checkpoint:{interval}"),
            ChainStorage::Logarithmic => "log".to_string(),
        }
    }
}

/// Checkpoints every 64 elements: the strategy of the ALPHA implementation report, with the
/// lowest average cost after [`ChainStorage::Full`] (under one hash per element, at most 63 for
/// one) and `n/64` elements of memory (16 KiB for a chain of 2^14).
impl Default for ChainStorage {
    fn default() -> Self {
        ChainStorage::Checkpoint {
            interval: Self::DEFAULT_INTERVAL,
        }
    }
}

impl fmt::Display for ChainStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Parses `full`, `checkpoint:<interval>` (interval at least 1) and `log` (or `logarithmic`).
impl FromStr for ChainStorage {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "full" => Ok(ChainStorage::Full),
            "log" | "logarithmic" => Ok(ChainStorage::Logarithmic),
            _ => {
                let Some(interval) = s.strip_prefix("checkpoint:") else {
                    return Err(format!(
                        "unknown chain storage {s:?}: expected full, checkpoint:<interval> or log"
                    ));
                };
                match interval.parse::<u32>() {
                    Ok(interval) if interval >= 1 => Ok(ChainStorage::Checkpoint { interval }),
                    _ => Err(format!(
                        "bad checkpoint interval {interval:?}: expected an integer from 1 to {}",
                        u32::MAX
                    )),
                }
            }
        }
    }
}

/// The owner's side of one chain: generates it from a seed, then hands out its elements in
/// disclosure order with [`HashChain::next`].
///
/// Getters report what the owner holds and what it has spent ([`HashChain::stored_elements`],
/// [`HashChain::hashes`]), for measurement. The elements are zeroized on drop and never printed.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct HashChain {
    chain_id: ChainId,
    anchor: Element,
    len: u32,
    /// Elements not yet disclosed; the next one has index `remaining - 1`.
    remaining: u32,
    storage: ChainStorage,
    store: Store,
    peak: usize,
    hashes: u64,
}

impl HashChain {
    /// Generates `h_0..h_n` from `seed` (`n` hashes), keeping what `storage` keeps.
    ///
    /// `n` should be at least 1; `n = 0` gives a chain with nothing to disclose whose anchor is
    /// the seed.
    pub fn generate(
        provider: &CryptoProvider,
        chain_id: ChainId,
        seed: Element,
        n: u32,
        storage: ChainStorage,
    ) -> HashChain {
        let mut h = seed;
        let (store, anchor) = match storage {
            ChainStorage::Full => {
                let mut all = Vec::with_capacity(n as usize);
                for i in 1..=n {
                    all.push(h);
                    h = chain_step(provider, &chain_id, i, &h);
                }
                (Store::Full(all), h)
            }
            ChainStorage::Checkpoint { interval } => {
                let interval = interval.max(1);
                // Index of the lowest element of the top segment, which generation caches.
                let top = n.saturating_sub(1) / interval * interval;
                let mut checkpoints = Vec::with_capacity((top / interval) as usize);
                let mut cache = Vec::with_capacity(interval.min(n) as usize);
                for i in 0..n {
                    if i >= top {
                        cache.push(h);
                    } else if i % interval == 0 {
                        checkpoints.push(h);
                    }
                    h = chain_step(provider, &chain_id, i + 1, &h);
                }
                let store = Store::Checkpoint {
                    interval,
                    checkpoints,
                    cache,
                };
                (store, h)
            }
            ChainStorage::Logarithmic => {
                let levels = log_levels(n);
                let keep = match n.checked_sub(1) {
                    Some(first) => log_indices(first, levels),
                    None => Vec::new(),
                };
                // One more than the bound on what is held, so that no step ever reallocates.
                let mut pebbles = Vec::with_capacity(keep.len().max(levels as usize) + 1);
                let mut wanted = keep.iter().copied().peekable();
                for i in 0..n {
                    if wanted.next_if_eq(&i).is_some() {
                        pebbles.push(Pebble { index: i, value: h });
                    }
                    h = chain_step(provider, &chain_id, i + 1, &h);
                }
                (Store::Logarithmic { levels, pebbles }, h)
            }
        };
        h.zeroize();
        let mut chain = HashChain {
            chain_id,
            anchor,
            len: n,
            remaining: n,
            storage,
            store,
            peak: 0,
            hashes: 0,
        };
        chain.peak = chain.stored_elements();
        chain
    }

    /// The chain's id, hashed into every step.
    pub fn chain_id(&self) -> ChainId {
        self.chain_id
    }

    /// The anchor `h_n`, to be published (signed) before any element is disclosed.
    pub fn anchor(&self) -> Element {
        self.anchor
    }

    /// The chain's length `n`: the anchor's index, and the number of elements it discloses.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True when every element has been disclosed (the chain must be renewed).
    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }

    /// The index the next call to [`HashChain::next`] returns (`n - 1` first), or `None` when
    /// the chain is exhausted.
    pub fn next_index(&self) -> Option<u32> {
        self.remaining.checked_sub(1)
    }

    /// The next element in disclosure order with its index (`h_{n-1}` first, `h_0` last), or
    /// `None` when the chain is exhausted. Hashes as its [`ChainStorage`] says.
    pub fn next(&mut self, provider: &CryptoProvider) -> Option<(u32, Element)> {
        let x = self.remaining.checked_sub(1)?;
        let chain_id = self.chain_id;
        let mut hashes = 0u64;
        let mut peak = 0usize;
        let element = match &mut self.store {
            Store::Full(all) => all.pop(),
            Store::Checkpoint {
                interval,
                checkpoints,
                cache,
            } => {
                if cache.is_empty() {
                    // Recompute the segment [base, x] from its checkpoint.
                    let base = x / *interval * *interval;
                    let mut h = checkpoints.pop()?;
                    cache.push(h);
                    for i in base + 1..=x {
                        h = chain_step(provider, &chain_id, i, &h);
                        cache.push(h);
                    }
                    h.zeroize();
                    hashes += u64::from(x - base);
                    peak = checkpoints.len() + cache.len();
                }
                cache.pop()
            }
            Store::Logarithmic { levels, pebbles } => {
                let levels = *levels;
                let top = *pebbles.last()?;
                let element = if top.index == x {
                    pebbles.pop();
                    top.value
                } else {
                    // x is odd and the ladder's top is h_{x-1}.
                    hashes += 1;
                    chain_step(provider, &chain_id, x, &top.value)
                };
                if x > 0 {
                    for t in 2..levels {
                        let (Some((base, from)), Some((base_after, to))) =
                            (pebble_progress(x, t), pebble_progress(x - 1, t))
                        else {
                            continue;
                        };
                        if base == base_after && to > from {
                            hashes += move_pebble(provider, &chain_id, pebbles, t, base, from, to);
                        }
                    }
                }
                Some(element)
            }
        };
        self.hashes += hashes;
        self.remaining = x;
        self.peak = self.peak.max(peak).max(self.stored_elements());
        element.map(|e| (x, e))
    }

    /// Elements not yet disclosed.
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Chain elements held in memory now, not counting the anchor.
    pub fn stored_elements(&self) -> usize {
        match &self.store {
            Store::Full(all) => all.len(),
            Store::Checkpoint {
                checkpoints, cache, ..
            } => checkpoints.len() + cache.len(),
            Store::Logarithmic { pebbles, .. } => pebbles.len(),
        }
    }

    /// The most elements [`HashChain::stored_elements`] has counted at any time since
    /// generation (including in the middle of a call to [`HashChain::next`]).
    pub fn peak_stored_elements(&self) -> usize {
        self.peak
    }

    /// Chain steps computed by [`HashChain::next`] since generation (generation itself costs
    /// `n` more).
    pub fn hashes(&self) -> u64 {
        self.hashes
    }

    /// How this chain is stored.
    pub fn storage(&self) -> ChainStorage {
        self.storage
    }
}

/// Prints the chain's shape and progress, never an element.
impl fmt::Debug for HashChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashChain")
            .field("chain_id", &Hex(&self.chain_id))
            .field("len", &self.len)
            .field("remaining", &self.remaining)
            .field("storage", &self.storage)
            .field("stored_elements", &self.stored_elements())
            .finish_non_exhaustive()
    }
}

impl Drop for HashChain {
    fn drop(&mut self) {
        match &mut self.store {
            Store::Full(all) => all.zeroize(),
            Store::Checkpoint {
                checkpoints, cache, ..
            } => {
                checkpoints.zeroize();
                cache.zeroize();
            }
            Store::Logarithmic { pebbles, .. } => pebbles.zeroize(),
        }
    }
}

/// A verifier's (or relay's) view of somebody else's chain: the most recent (lowest-index)
/// element it has checked. Elements are public once disclosed; nothing here is secret.
#[derive(Clone, Debug)]
pub struct ChainVerifier {
    chain_id: ChainId,
    anchor_index: u32,
    index: u32,
    element: Element,
    max_skip: u32,
}

/// What [`ChainVerifier::verify`] found out about a valid element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    /// Lower than any element checked before: newly disclosed (the verifier moved to it).
    Fresh,
    /// The element checked last, again.
    Repeat,
    /// An element disclosed before the one checked last (a retransmission, say).
    Old,
}

/// Why [`ChainVerifier::verify`] refused an element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChainError {
    /// More than `max_skip` steps from the element checked last; nothing was hashed.
    TooFar,
    /// Not the chain's element at that index.
    Mismatch,
}

impl fmt::Display for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChainError::TooFar => "chain element too far from the last one checked",
            ChainError::Mismatch => "chain element does not match",
        })
    }
}

impl std::error::Error for ChainError {}

impl ChainVerifier {
    /// Starts from the chain's anchor (from a signed handshake) at `anchor_index` (the chain's
    /// length). `max_skip` bounds the hashes one check may cost: 1 accepts only the very next
    /// element (no loss tolerated), 0 accepts only repeats.
    pub fn new(chain_id: ChainId, anchor: Element, anchor_index: u32, max_skip: u32) -> Self {
        ChainVerifier {
            chain_id,
            anchor_index,
            index: anchor_index,
            element: anchor,
            max_skip,
        }
    }

    /// Checks `element` claimed to be at `index`, and moves to it if it is [`Checked::Fresh`]:
    ///  - below the known index: hashed forward to the known element (at most `max_skip`
    ///    steps, else [`ChainError::TooFar`]) and compared in constant time: `Fresh`;
    ///  - at the known index: equal to the known element: `Repeat`;
    ///  - above it (disclosed earlier): the known element is hashed forward to `index` (at
    ///    most `max_skip` steps) and compared: `Old`. An index above the anchor's is no
    ///    element of the chain: [`ChainError::Mismatch`].
    ///
    /// On an error the verifier does not move.
    pub fn verify(
        &mut self,
        provider: &CryptoProvider,
        index: u32,
        element: &Element,
    ) -> Result<Checked, ChainError> {
        let checked = self.check(provider, index, element)?;
        if checked == Checked::Fresh {
            self.index = index;
            self.element = *element;
        }
        Ok(checked)
    }

    /// Like [`ChainVerifier::verify`], but never moves the verifier.
    pub fn check(
        &self,
        provider: &CryptoProvider,
        index: u32,
        element: &Element,
    ) -> Result<Checked, ChainError> {
        if index > self.anchor_index {
            return Err(ChainError::Mismatch);
        }
        // Cheap checks first: the distance bounds the hashing.
        if index.abs_diff(self.index) > self.max_skip {
            return Err(ChainError::TooFar);
        }
        let (ours, theirs, checked) = if index < self.index {
            let forward = chain_walk(provider, &self.chain_id, index, element, self.index);
            (self.element, forward, Checked::Fresh)
        } else if index == self.index {
            (self.element, *element, Checked::Repeat)
        } else {
            let forward = chain_walk(provider, &self.chain_id, self.index, &self.element, index);
            (forward, *element, Checked::Old)
        };
        if ct_eq(&ours, &theirs) {
            Ok(checked)
        } else {
            Err(ChainError::Mismatch)
        }
    }

    /// Index of the element checked last (the anchor's until something fresh is verified).
    pub fn known_index(&self) -> u32 {
        self.index
    }

    /// The element checked last.
    pub fn known_element(&self) -> Element {
        self.element
    }

    /// The chain's id.
    pub fn chain_id(&self) -> ChainId {
        self.chain_id
    }

    /// The most steps one check may hash.
    pub fn max_skip(&self) -> u32 {
        self.max_skip
    }
}

/// What each strategy holds.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
enum Store {
    /// `h_0..` up to the next index; popped from the end.
    Full(Vec<Element>),
    Checkpoint {
        interval: u32,
        /// `h_0, h_c, h_2c, ...` below the segment being disclosed.
        checkpoints: Vec<Element>,
        /// The segment being disclosed, from its checkpoint up to the next index.
        cache: Vec<Element>,
    },
    Logarithmic {
        /// Bit length of the chain's highest disclosed index (`⌈log2 n⌉`).
        levels: u32,
        /// The elements held, by increasing index: exactly [`log_indices`] of the next index.
        pebbles: Vec<Pebble>,
    },
}

/// An element held by the logarithmic traversal, with its index.
#[derive(Clone, Copy, Zeroize)]
struct Pebble {
    index: u32,
    value: Element,
}

/// The number of bit positions in the chain's indices: every index `x <= n - 1` has
/// `x < 2^levels`.
fn log_levels(n: u32) -> u32 {
    match n.checked_sub(1) {
        Some(top) => u32::BITS - top.leading_zeros(),
        None => 0,
    }
}

/// The pebble of level `t` (`2 <= t`) while `x` is the next index to disclose: `None` if bit
/// `t` of `x` is clear; else the bottom `b` of the block of length `2^(t+1)` holding `x`, and
/// how far (`0..=2^t - 2`) the pebble has moved up from `b` on its way to `b + 2^t - 2`.
///
/// The pebble works while `x` runs down the upper half of that block, preparing the ladder of
/// the lower half: it waits through the first half of the upper half and then moves two steps
/// after each disclosure, arriving just as the disclosure leaves the upper half.
fn pebble_progress(x: u32, t: u32) -> Option<(u32, u32)> {
    let x = u64::from(x);
    if (x >> t) & 1 == 0 {
        return None;
    }
    let base = x & !((1u64 << (t + 1)) - 1);
    let target = (1u64 << t) - 2;
    // While x is at or above this index the pebble has not started.
    let start = base + 3 * (1u64 << (t - 1)) - 1;
    let progress = if x >= start {
        0
    } else {
        target.min(2 * (start - x))
    };
    // Both are below x < 2^32.
    Some((base as u32, progress as u32))
}

/// Whether offset `d` from a level-`t` pebble's base is where it leaves a copy: `2^t - 2^j` for
/// some `1 <= j < t` (the ladder of the block `[b, b + 2^t)`).
fn is_ladder_offset(d: u32, t: u32) -> bool {
    let d = u64::from(d);
    let span = 1u64 << t;
    d >= span / 2 && d < span && (span - d).is_power_of_two()
}

/// The indices the logarithmic traversal holds while `x` is the next index to disclose, in
/// increasing order: the ladder (`x` with its low `j` bits cleared, `1 <= j <= levels`) and,
/// for each moving pebble, the copies it has left and where it is.
fn log_indices(x: u32, levels: u32) -> Vec<u32> {
    let mut indices = Vec::new();
    for j in 1..=levels.max(1) {
        indices.push((u64::from(x) & !((1u64 << j) - 1)) as u32);
    }
    for t in 2..levels {
        if let Some((base, progress)) = pebble_progress(x, t) {
            for j in 1..t {
                let d = (1u32 << t) - (1u32 << j);
                if d <= progress {
                    indices.push(base + d);
                }
            }
            if progress > 0 {
                indices.push(base + progress);
            }
        }
    }
    indices.sort_unstable();
    indices.dedup();
    indices
}

/// Moves the level-`t` pebble based at `base` from offset `from` to offset `to`, leaving a copy
/// at each ladder offset it passes; returns the hashes spent. Only this pebble's own copies lie
/// between `base` and it, so the vector stays sorted by updating in place.
fn move_pebble(
    provider: &CryptoProvider,
    chain_id: &ChainId,
    pebbles: &mut Vec<Pebble>,
    t: u32,
    base: u32,
    from: u32,
    to: u32,
) -> u64 {
    let Ok(mut at) = pebbles.binary_search_by_key(&(base + from), |p| p.index) else {
        debug_assert!(false, "pebble of level {t} missing at {}", base + from);
        return 0;
    };
    // The pebble's start (the base, on the ladder) and the copies it leaves stay; any other
    // place it passes is overwritten as it moves on.
    let mut keep = from == 0 || is_ladder_offset(from, t);
    let mut value = pebbles[at].value;
    for d in from + 1..=to {
        value = chain_step(provider, chain_id, base + d, &value);
        let pebble = Pebble {
            index: base + d,
            value,
        };
        if keep {
            at += 1;
            pebbles.insert(at, pebble);
        } else {
            pebbles[at] = pebble;
        }
        keep = is_ladder_offset(d, t);
    }
    value.zeroize();
    u64::from(to - from)
}

/// Hex for ids in `Debug` output.
struct Hex<'a>(&'a [u8]);

impl fmt::Debug for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ID: ChainId = *b"chain-id";
    const SEED: Element = [0x5e; 16];

    fn provider() -> CryptoProvider {
        CryptoProvider::default_provider()
    }

    /// `h_0..=h_n`, one step at a time.
    fn naive(id: &ChainId, seed: Element, n: u32) -> Vec<Element> {
        let p = provider();
        let mut all = vec![seed];
        for i in 1..=n {
            let prev = all[all.len() - 1];
            all.push(chain_step(&p, id, i, &prev));
        }
        all
    }

    fn ceil_log2(n: u32) -> u32 {
        log_levels(n)
    }

    /// Upper bounds (elements held, hashes for one element) claimed for `storage`.
    fn bounds(storage: ChainStorage, n: u32) -> (usize, u64) {
        match storage {
            ChainStorage::Full => (n as usize, 0),
            ChainStorage::Checkpoint { interval } => {
                let c = interval.max(1);
                ((n.div_ceil(c) - 1 + c.min(n)) as usize, u64::from(c - 1))
            }
            ChainStorage::Logarithmic => {
                let l = ceil_log2(n).max(1);
                (l as usize, u64::from(l))
            }
        }
    }

    /// Runs the whole chain, checking every element and every bound; returns the total hashes.
    fn run(storage: ChainStorage, n: u32, id: ChainId, seed: Element) -> u64 {
        let p = provider();
        let expected = naive(&id, seed, n);
        let mut chain = HashChain::generate(&p, id, seed, n, storage);
        let (max_stored, max_hashes) = bounds(storage, n);
        assert_eq!(chain.anchor(), expected[n as usize]);
        assert_eq!(chain.len(), n);
        assert_eq!(chain.chain_id(), id);
        assert_eq!(chain.storage(), storage);
        assert!(chain.stored_elements() <= max_stored, "{storage} n={n}");
        for i in (0..n).rev() {
            assert_eq!(chain.remaining(), i + 1);
            assert_eq!(chain.next_index(), Some(i));
            assert!(!chain.is_empty());
            let before = chain.hashes();
            assert_eq!(
                chain.next(&p),
                Some((i, expected[i as usize])),
                "{storage} n={n}"
            );
            let spent = chain.hashes() - before;
            assert!(spent <= max_hashes, "{storage} n={n} i={i}: {spent} hashes");
            assert!(
                chain.stored_elements() <= max_stored,
                "{storage} n={n} i={i}"
            );
            if let (Store::Logarithmic { levels, pebbles }, Some(x)) =
                (&chain.store, chain.next_index())
            {
                // The traversal holds exactly what it claims to.
                let held: Vec<u32> = pebbles.iter().map(|p| p.index).collect();
                assert_eq!(held, log_indices(x, *levels), "n={n} x={x}");
            }
        }
        assert_eq!(chain.next(&p), None);
        assert_eq!(chain.next(&p), None);
        assert!(chain.is_empty());
        assert_eq!(chain.remaining(), 0);
        assert_eq!(chain.next_index(), None);
        assert_eq!(chain.stored_elements(), 0);
        assert!(
            chain.peak_stored_elements() <= max_stored,
            "{storage} n={n}"
        );
        chain.hashes()
    }

    const LENGTHS: [u32; 10] = [1, 2, 3, 7, 8, 64, 100, 1000, 4096, 4097];

    #[test]
    fn full_discloses_every_element_without_hashing() {
        for n in LENGTHS {
            assert_eq!(run(ChainStorage::Full, n, ID, SEED), 0);
            let chain = HashChain::generate(&provider(), ID, SEED, n, ChainStorage::Full);
            assert_eq!(chain.peak_stored_elements(), n as usize);
        }
    }

    #[test]
    fn checkpoint_discloses_every_element_within_bounds() {
        for n in LENGTHS {
            for interval in [0, 1, 2, 3, 7, 64, 65, 1000, 5000] {
                let storage = ChainStorage::Checkpoint { interval };
                let hashes = run(storage, n, ID, SEED);
                // Each element below the top segment is recomputed at most once.
                assert!(hashes < u64::from(n), "{storage} n={n}: {hashes}");
            }
        }
        let chain = HashChain::generate(&provider(), ID, SEED, 4096, ChainStorage::default());
        assert_eq!(chain.stored_elements(), 63 + 64);
    }

    #[test]
    fn logarithmic_discloses_every_element_within_bounds() {
        for n in LENGTHS {
            let hashes = run(ChainStorage::Logarithmic, n, ID, SEED);
            // About ½·log2 n - 1 per element on average.
            let average = hashes as f64 / f64::from(n);
            assert!(average <= f64::from(ceil_log2(n)) / 2.0, "n={n}: {average}");
        }
        for n in 1..=300 {
            run(ChainStorage::Logarithmic, n, ID, SEED);
        }
    }

    #[test]
    fn logarithmic_memory_bound_holds_at_every_index() {
        // Exhaustive over every next index of chains up to 2^16: at most ⌈log2 n⌉ held, and
        // always the element to disclose or the one below it on top.
        for levels in 1..=16u32 {
            for x in 0..(1u32 << levels) {
                let held = log_indices(x, levels);
                assert!(
                    held.len() <= levels as usize,
                    "levels={levels} x={x}: {held:?}"
                );
                let top = held[held.len() - 1];
                assert!(top == x || (x % 2 == 1 && top == x - 1), "x={x}: {held:?}");
                assert_eq!(held[0], 0);
            }
        }
    }

    #[test]
    fn a_chain_of_zero_discloses_nothing() {
        for storage in [
            ChainStorage::Full,
            ChainStorage::default(),
            ChainStorage::Logarithmic,
        ] {
            let mut chain = HashChain::generate(&provider(), ID, SEED, 0, storage);
            assert_eq!(chain.anchor(), SEED);
            assert!(chain.is_empty());
            assert_eq!(chain.next_index(), None);
            assert_eq!(chain.next(&provider()), None);
        }
    }

    #[test]
    fn chains_differ_by_id_and_seed() {
        let p = provider();
        let storage = ChainStorage::Logarithmic;
        let a = HashChain::generate(&p, ID, SEED, 10, storage);
        let b = HashChain::generate(&p, *b"other-id", SEED, 10, storage);
        let c = HashChain::generate(&p, ID, [0x5f; 16], 10, storage);
        assert_ne!(a.anchor(), b.anchor());
        assert_ne!(a.anchor(), c.anchor());
    }

    #[test]
    fn debug_prints_no_element() {
        let p = provider();
        let all = naive(&ID, SEED, 100);
        for storage in [
            ChainStorage::Full,
            ChainStorage::default(),
            ChainStorage::Logarithmic,
        ] {
            let mut chain = HashChain::generate(&p, ID, SEED, 100, storage);
            chain.next(&p);
            let shown = format!("{chain:?}");
            assert!(shown.contains("636861696e2d6964"), "{shown}");
            for element in &all {
                assert!(!shown.contains(&format!("{element:?}")), "{shown}");
            }
        }
    }

    #[test]
    fn storage_names_round_trip() {
        for storage in [
            ChainStorage::Full,
            ChainStorage::Checkpoint { interval: 1 },
            ChainStorage::Checkpoint { interval: 64 },
            ChainStorage::Logarithmic,
        ] {
            assert_eq!(storage.name().parse::<ChainStorage>(), Ok(storage));
            assert_eq!(storage.to_string(), storage.name());
        }
        assert_eq!("full".parse(), Ok(ChainStorage::Full));
        assert_eq!(
            "checkpoint:64".parse(),
            Ok(ChainStorage::Checkpoint { interval: 64 })
        );
        assert_eq!("logarithmic".parse(), Ok(ChainStorage::Logarithmic));
        for bad in [
            "",
            "Full",
            "checkpoint",
            "checkpoint:",
            "checkpoint:0",
            "checkpoint:-1",
            "checkpoint:4294967296",
            "checkpoint: 8",
            "log2",
        ] {
            assert!(bad.parse::<ChainStorage>().is_err(), "{bad:?}");
        }
        assert_eq!(
            ChainStorage::default(),
            ChainStorage::Checkpoint { interval: 64 }
        );
    }

    /// A verifier at the anchor of a chain of 20, and the chain.
    fn verifier(max_skip: u32) -> (ChainVerifier, Vec<Element>) {
        let all = naive(&ID, SEED, 20);
        (ChainVerifier::new(ID, all[20], 20, max_skip), all)
    }

    #[test]
    fn verifier_accepts_fresh_repeat_and_old() {
        let p = provider();
        let (mut v, all) = verifier(1);
        assert_eq!(v.chain_id(), ID);
        assert_eq!(v.max_skip(), 1);
        assert_eq!(v.verify(&p, 20, &all[20]), Ok(Checked::Repeat));
        for i in (15..20).rev() {
            assert_eq!(v.verify(&p, i, &all[i as usize]), Ok(Checked::Fresh));
            assert_eq!((v.known_index(), v.known_element()), (i, all[i as usize]));
            assert_eq!(v.verify(&p, i, &all[i as usize]), Ok(Checked::Repeat));
        }
        // The element disclosed just before, and the anchor more steps away than allowed.
        assert_eq!(v.verify(&p, 16, &all[16]), Ok(Checked::Old));
        assert_eq!(v.verify(&p, 20, &all[20]), Err(ChainError::TooFar));
        assert_eq!(v.known_index(), 15);
        let (mut wide, _) = verifier(10);
        wide.verify(&p, 15, &all[15]).unwrap();
        assert_eq!(wide.verify(&p, 20, &all[20]), Ok(Checked::Old));
        assert_eq!(wide.check(&p, 18, &all[18]), Ok(Checked::Old));
        assert_eq!(wide.known_index(), 15);
    }

    #[test]
    fn verifier_skips_up_to_max_skip() {
        let p = provider();
        let (mut v, all) = verifier(3);
        assert_eq!(v.verify(&p, 16, &all[16]), Err(ChainError::TooFar));
        assert_eq!(v.verify(&p, 17, &all[17]), Ok(Checked::Fresh));
        assert_eq!(v.verify(&p, 13, &all[13]), Err(ChainError::TooFar));
        assert_eq!(v.known_index(), 17);
        assert_eq!(v.verify(&p, 14, &all[14]), Ok(Checked::Fresh));
        assert_eq!(v.known_index(), 14);
        let (mut none, _) = verifier(0);
        assert_eq!(none.verify(&p, 19, &all[19]), Err(ChainError::TooFar));
        assert_eq!(none.verify(&p, 20, &all[20]), Ok(Checked::Repeat));
    }

    #[test]
    fn verifier_refuses_wrong_elements_and_never_moves_on_failure() {
        let p = provider();
        let (mut v, all) = verifier(5);
        v.verify(&p, 18, &all[18]).unwrap();
        let known = (v.known_index(), v.known_element());
        let mut wrong = all[16];
        wrong[7] ^= 0x10;
        let cases: [(u32, Element, ChainError); 9] = [
            (16, wrong, ChainError::Mismatch),
            // Right elements at wrong indices.
            (16, all[15], ChainError::Mismatch),
            (16, all[17], ChainError::Mismatch),
            (17, all[16], ChainError::Mismatch),
            (18, all[17], ChainError::Mismatch),
            (19, all[18], ChainError::Mismatch),
            (19, wrong, ChainError::Mismatch),
            // Beyond the anchor, and too far below.
            (21, all[20], ChainError::Mismatch),
            (12, all[12], ChainError::TooFar),
        ];
        for (index, element, error) in cases {
            assert_eq!(v.verify(&p, index, &element), Err(error), "{index}");
            assert_eq!(v.check(&p, index, &element), Err(error), "{index}");
            assert_eq!((v.known_index(), v.known_element()), known);
        }
        // check() never moves, even on success.
        assert_eq!(v.check(&p, 15, &all[15]), Ok(Checked::Fresh));
        assert_eq!(v.known_index(), 18);
        assert_eq!(
            ChainVerifier::new(*b"other-id", all[20], 20, 5).verify(&p, 19, &all[19]),
            Err(ChainError::Mismatch)
        );
    }

    #[test]
    fn verifier_follows_a_hash_chain() {
        let p = provider();
        let mut chain = HashChain::generate(&p, ID, SEED, 50, ChainStorage::Logarithmic);
        let mut v = ChainVerifier::new(ID, chain.anchor(), chain.len(), 2);
        let mut last = None;
        while let Some((i, e)) = chain.next(&p) {
            // Drop every third element: a skip of 2 is still within bounds.
            if i % 3 != 0 {
                assert_eq!(v.verify(&p, i, &e), Ok(Checked::Fresh));
                if let Some((j, old)) = last {
                    assert_eq!(v.verify(&p, j, &old), Ok(Checked::Old));
                }
                last = Some((i, e));
            }
        }
        assert_eq!(v.known_index(), 1);
    }

    thread_local! {
        static STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// The default keyed BLAKE3, counting calls on this thread.
    struct Counting;

    impl cohort_crypto::KeyedHash for Counting {
        fn hash(&self, key: &[u8; 32], parts: &[&[u8]], out: &mut [u8]) {
            STEPS.with(|s| s.set(s.get() + 1));
            provider().keyed_blake3.hash(key, parts, out);
        }
    }

    static COUNTING: Counting = Counting;

    #[test]
    fn generation_costs_n_hashes_and_hashes_counts_every_step() {
        let p = CryptoProvider {
            keyed_blake3: &COUNTING,
            ..provider()
        };
        let steps = || STEPS.with(|s| s.get());
        for storage in [
            ChainStorage::Full,
            ChainStorage::Checkpoint { interval: 10 },
            ChainStorage::Logarithmic,
        ] {
            for n in [1, 5, 100, 1025] {
                let start = steps();
                let mut chain = HashChain::generate(&p, ID, SEED, n, storage);
                assert_eq!(steps() - start, u64::from(n), "{storage} n={n}");
                let start = steps();
                while chain.next(&p).is_some() {
                    assert_eq!(steps() - start, chain.hashes(), "{storage} n={n}");
                }
            }
        }
    }

    fn any_storage() -> impl Strategy<Value = ChainStorage> {
        prop_oneof![
            Just(ChainStorage::Full),
            (1u32..300).prop_map(|interval| ChainStorage::Checkpoint { interval }),
            Just(ChainStorage::Logarithmic),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn every_strategy_discloses_the_chain(
            storage in any_storage(),
            n in 1u32..3000,
            id in any::<ChainId>(),
            seed in any::<Element>(),
        ) {
            run(storage, n, id, seed);
        }

        #[test]
        fn verifier_matches_a_model(
            max_skip in 0u32..6,
            claims in proptest::collection::vec((0u32..40, any::<bool>()), 1..60),
        ) {
            let p = provider();
            let all = naive(&ID, SEED, 32);
            let mut v = ChainVerifier::new(ID, all[32], 32, max_skip);
            for (index, honest) in claims {
                let mut element = all[index.min(32) as usize];
                if !honest {
                    element[0] ^= 1;
                }
                let known = v.known_index();
                let expected = if index > 32 {
                    Err(ChainError::Mismatch)
                } else if index.abs_diff(known) > max_skip {
                    Err(ChainError::TooFar)
                } else if !honest {
                    Err(ChainError::Mismatch)
                } else if index < known {
                    Ok(Checked::Fresh)
                } else if index == known {
                    Ok(Checked::Repeat)
                } else {
                    Ok(Checked::Old)
                };
                prop_assert_eq!(v.verify(&p, index, &element), expected);
                let moved = expected == Ok(Checked::Fresh);
                prop_assert_eq!(v.known_index(), if moved { index } else { known });
                prop_assert_eq!(v.known_element(), all[v.known_index() as usize]);
            }
        }
    }
}
