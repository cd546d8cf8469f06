//! UMAC (RFC 4418): a fast nonce-based MAC built from a universal hash and AES-128.
//!
//! The tag is `UHASH(K, M) xor PDF(K, N)` (RFC 4418 section 4). Every piece follows the RFC:
//!
//! * **KDF** (section 3.2): AES-128 in counter mode; block `i` (from 1) of the output for
//!   `index` is `AES(K, uint2str(index, 8) || uint2str(i, 8))`.
//! * **PDF** (section 3.3): `AES(KDF(K, 0, 16), nonce || zeroes)`. For 4- and 8-byte tags the
//!   low bits of the nonce select which 4- or 8-byte slice of the AES output is the pad (the
//!   RFC's pad cache; here it is computed directly, without a cache).
//! * **UHASH** (section 5.1): `tag_len / 4` iterations, each a three-layer hash:
//!   * **L1-HASH** (section 5.2.1): NH (section 5.2.2) over 1024-byte chunks, the last one
//!     zero-padded to a positive multiple of 32 bytes; message words are read little-endian,
//!     key words big-endian; the chunk's bit length is added to each NH value. Iteration `i`
//!     uses the NH key shifted by `16 * (i - 1)` bytes (the Toeplitz construction).
//!   * **L2-HASH** (section 5.3.1; POLY in 5.3.2): skipped for messages of at most 1024 bytes
//!     (the L1 value is prefixed with eight zero bytes); otherwise POLY over the prime
//!     `2^64 - 59` for the first `2^17` bytes of L1 output (`2^24` message bytes), then POLY
//!     over `2^128 - 159` for the rest (with the `0x80` end marker), each with its masked key
//!     (`k64`, `k128`) and the "marker" treatment of words too large for the prime.
//!   * **L3-HASH** (section 5.4): inner product of eight 16-bit words with keys mod
//!     `2^36 - 5`, truncated to 32 bits, xor a 4-byte key.
//!
//! NH has three implementations ([`NhPath`]), chosen per key at run time: AVX-512 or AVX2
//! kernels (module `nh_simd`, entered through `nh_enter`, the crate's one `unsafe` module) and
//! the portable code described next, which is the fallback on every other CPU.
//!
//! The portable code is safe Rust. NH over a full 1024-byte chunk is written as two
//! simple loops (add the key into 64-byte-aligned stack buffers, then a dot product of 32-bit
//! halves) that LLVM vectorizes with `pmuludq` even for the baseline x86-64 target (SSE2);
//! all iterations share one pass over the message. `tag` and `uhash` do not allocate. Key
//! material is wiped on drop; the per-call stack buffers (message words plus key words) are
//! not wiped, as that would cost about a tenth of the throughput.
//!
//! Security notes from the RFC: a nonce must never repeat under one key, and a key is meant
//! for one tag length (section 6.5): a 32-bit prefix of a 64-bit tag only has 32-bit security.

use cohort_crypto::{BlockCipher, CryptoError, CryptoProvider};
use std::fmt;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// UMAC-128 has the most iterations: four.
const MAX_ITERS: usize = 4;
/// L1-HASH chunk length in bytes (also the NH key length).
pub(crate) const CHUNK: usize = 1024;
/// NH key words: 256 for one iteration plus 4 more for each further iteration.
const NH_KEY_WORDS: usize = CHUNK / 4 + 4 * (MAX_ITERS - 1);
/// Number of 32-byte NH blocks in a chunk.
pub(crate) const BLOCKS: usize = CHUNK / 32;
/// Pairs of 32-bit products NH sums over one chunk (two products per `u64` of scratch).
const PAIRS: usize = CHUNK / 16;
/// Bit length of a full chunk, the `Len` term L1-HASH adds to its NH value.
const CHUNK_BITS: u64 = (CHUNK as u64) * 8;
/// L1 outputs (8 bytes each) hashed under POLY-64 before switching to POLY-128: `2^17` bytes.
const POLY64_WORDS: u64 = 1 << 14;

/// `2^36 - 5`, the L3-HASH prime.
const P36: u64 = (1 << 36) - 5;
/// `2^64 - 59`, the POLY-64 prime.
const P64: u64 = u64::MAX - 58;
/// `2^128 - 159`, the POLY-128 prime.
const P128: u128 = u128::MAX - 158;
/// POLY-64 words at or above `2^64 - 2^32` are encoded with the marker.
const MAXWORD64: u64 = 0xFFFF_FFFF_0000_0000;
/// POLY-128 words at or above `2^128 - 2^96` are encoded with the marker.
const MAXWORD128: u128 = 0xFFFF_FFFF_0000_0000_0000_0000_0000_0000;
/// Key mask for POLY-64 (L2-HASH, section 5.3.1).
const MASK64: u64 = 0x01FF_FFFF_01FF_FFFF;
/// Key mask for POLY-128 (L2-HASH, section 5.3.1).
const MASK128: u128 = 0x01FF_FFFF_01FF_FFFF_01FF_FFFF_01FF_FFFF;

/// AES blocks of the longest KDF output we need: the L1 key, `1024 + 3 * 16` bytes.
const KDF_MAX_BLOCKS: usize = (CHUNK + 16 * (MAX_ITERS - 1)) / 16;

/// The NH key as native words, aligned so that vector loads of it never split cache lines.
#[derive(Zeroize)]
#[repr(C, align(64))]
pub(crate) struct NhKey {
    /// Key word `K_(j+1)` at index `j`.
    pub(crate) w: [u32; NH_KEY_WORDS],
}

/// The NH key rearranged for the SIMD kernels, one copy per iteration (the key shifted by
/// `4 * i` words), so that every key vector is one aligned load. For the four blocks
/// `4q..4q+4` of a chunk, words `32q..32q+16` hold words 0-3 of each block in turn and words
/// `32q+16..32q+32` hold words 4-7 of each block (see `nh_simd`).
#[derive(Zeroize)]
#[repr(C, align(64))]
pub(crate) struct NhLanes {
    /// Per iteration, the rearranged 256 key words.
    pub(crate) w: [[u32; CHUNK / 4]; MAX_ITERS],
}

impl NhLanes {
    /// Fills these lanes from `key`, in place (no copy of key material on the stack).
    fn fill_from(&mut self, key: &NhKey) {
        for (it, l) in self.w.iter_mut().enumerate() {
            let k = &key.w[4 * it..4 * it + CHUNK / 4];
            for b in 0..BLOCKS {
                let (q, j) = (b / 4, b % 4);
                for e in 0..4 {
                    l[32 * q + 4 * j + e] = k[8 * b + e];
                    l[32 * q + 16 + 4 * j + e] = k[8 * b + 4 + e];
                }
            }
        }
    }
}

/// All UHASH key material, derived once by [`Umac::new`]; wiped on drop.
#[derive(Zeroize, ZeroizeOnDrop)]
struct Keys {
    /// L1 (NH) key words `K_1, K_2, ...`; iteration `i` (from 0) starts at word `4 * i`.
    nh: NhKey,
    /// The same, rearranged for the SIMD kernels.
    lanes: NhLanes,
    /// Masked POLY-64 key per iteration.
    k64: [u64; MAX_ITERS],
    /// Masked POLY-128 key per iteration.
    k128: [u128; MAX_ITERS],
    /// L3 keys `k_1..k_8` per iteration, already reduced mod `2^36 - 5`.
    l3: [[u64; 8]; MAX_ITERS],
    /// L3 output key `K2` per iteration.
    l3k2: [u32; MAX_ITERS],
}

/// A UMAC key for one tag length (RFC 4418): UMAC-32, -64, -96 or -128.
///
/// Holds the derived UHASH keys (wiped on drop) and the AES-128 key of the pad function.
/// `Debug` shows only the tag length.
pub struct Umac {
    keys: Box<Keys>,
    pdf: Box<dyn BlockCipher>,
    tag_len: usize,
    nh: NhImpl,
}

impl ZeroizeOnDrop for Umac {}

impl fmt::Debug for Umac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Umac")
            .field("tag_len", &self.tag_len)
            .finish_non_exhaustive()
    }
}

/// RFC 4418 section 3.2 KDF: fills `out` with the first `out.len()` bytes of the key stream
/// for `index`.
fn kdf(aes: &dyn BlockCipher, index: u64, out: &mut [u8]) {
    let n = out.len().div_ceil(16);
    let mut blocks = [[0u8; 16]; KDF_MAX_BLOCKS];
    let blocks_n = &mut blocks[..n];
    for (i, block) in (1u64..).zip(blocks_n.iter_mut()) {
        block[..8].copy_from_slice(&index.to_be_bytes());
        block[8..].copy_from_slice(&i.to_be_bytes());
    }
    aes.encrypt_blocks(blocks_n);
    for (dst, src) in out.chunks_mut(16).zip(blocks_n.iter()) {
        dst.copy_from_slice(&src[..dst.len()]);
    }
    blocks.zeroize();
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

impl Umac {
    /// Derives a UMAC key from a 16-byte AES-128 key `key` for tags of `tag_len` bytes.
    ///
    /// `tag_len` must be 4, 8, 12 or 16 (UMAC-32/64/96/128). Errors with
    /// [`CryptoError::InvalidInput`] on any other tag length or a key that is not 16 bytes.
    pub fn new(provider: &CryptoProvider, key: &[u8], tag_len: usize) -> Result<Umac, CryptoError> {
        if key.len() != 16 || !matches!(tag_len, 4 | 8 | 12 | 16) {
            return Err(CryptoError::InvalidInput);
        }
        let iters = tag_len / 4;
        let aes = provider.aes_block.aes128(key)?;

        let mut keys = Box::new(Keys {
            nh: NhKey {
                w: [0; NH_KEY_WORDS],
            },
            lanes: NhLanes {
                w: [[0; CHUNK / 4]; MAX_ITERS],
            },
            k64: [0; MAX_ITERS],
            k128: [0; MAX_ITERS],
            l3: [[0; 8]; MAX_ITERS],
            l3k2: [0; MAX_ITERS],
        });
        let mut buf = [0u8; KDF_MAX_BLOCKS * 16];

        // L1Key = KDF(K, 1, 1024 + (iters - 1) * 16), read as big-endian words.
        let l1 = &mut buf[..CHUNK + 16 * (iters - 1)];
        kdf(aes.as_ref(), 1, l1);
        for (w, b) in keys.nh.w.iter_mut().zip(l1.chunks_exact(4)) {
            *w = be_u32(b);
        }
        let Keys { nh, lanes, .. } = &mut *keys;
        lanes.fill_from(nh);

        // L2Key = KDF(K, 2, iters * 24): 8 bytes of k64 then 16 of k128 per iteration.
        let l2 = &mut buf[..24 * iters];
        kdf(aes.as_ref(), 2, l2);
        for (i, k) in l2.chunks_exact(24).enumerate() {
            keys.k64[i] = be_u64(&k[..8]) & MASK64;
            keys.k128[i] =
                ((u128::from(be_u64(&k[8..16])) << 64) | u128::from(be_u64(&k[16..]))) & MASK128;
        }

        // L3Key1 = KDF(K, 3, iters * 64): eight 8-byte keys mod 2^36 - 5 per iteration.
        let l3 = &mut buf[..64 * iters];
        kdf(aes.as_ref(), 3, l3);
        for (i, k) in l3.chunks_exact(64).enumerate() {
            for (dst, src) in keys.l3[i].iter_mut().zip(k.chunks_exact(8)) {
                *dst = be_u64(src) % P36;
            }
        }

        // L3Key2 = KDF(K, 4, iters * 4).
        let l3k2 = &mut buf[..4 * iters];
        kdf(aes.as_ref(), 4, l3k2);
        for (dst, src) in keys.l3k2.iter_mut().zip(l3k2.chunks_exact(4)) {
            *dst = be_u32(src);
        }

        // The pad function's key: KDF(K, 0, 16).
        let pdf_key = &mut buf[..16];
        kdf(aes.as_ref(), 0, pdf_key);
        let pdf = provider.aes_block.aes128(pdf_key);
        buf.zeroize();

        Ok(Umac {
            keys,
            pdf: pdf?,
            tag_len,
            nh: NhImpl::new(NhPath::default_path()),
        })
    }

    /// The tag length in bytes: 4, 8, 12 or 16.
    pub fn tag_len(&self) -> usize {
        self.tag_len
    }

    /// The NH implementation this key uses (see [`NhPath`]).
    pub fn nh_path(&self) -> NhPath {
        self.nh.path()
    }

    /// Switches this key to the NH implementation `path`, for tests and benchmarks that must
    /// exercise one implementation. Every path computes the same tags. Errors with
    /// [`CryptoError::InvalidInput`] when this CPU cannot run `path` (see
    /// [`NhPath::is_supported`]); the key is then unchanged.
    pub fn set_nh_path(&mut self, path: NhPath) -> Result<(), CryptoError> {
        if !path.is_supported() {
            return Err(CryptoError::InvalidInput);
        }
        self.nh = NhImpl::new(path);
        Ok(())
    }

    /// RFC 4418 UMAC: writes `UHASH(message) xor PDF(nonce)` into `out`.
    ///
    /// `nonce` must be 1 to 16 bytes and must never repeat under one key; `out` must be exactly
    /// [`tag_len`](Self::tag_len) bytes. Otherwise errors with [`CryptoError::InvalidInput`].
    pub fn tag(&self, nonce: &[u8], message: &[u8], out: &mut [u8]) -> Result<(), CryptoError> {
        if nonce.is_empty() || nonce.len() > 16 || out.len() != self.tag_len {
            return Err(CryptoError::InvalidInput);
        }
        let mut hash = self.uhash_u128(message);
        let mut pad = self.pdf(nonce);
        out.copy_from_slice(&(hash ^ pad).to_be_bytes()[..self.tag_len]);
        hash.zeroize();
        pad.zeroize();
        Ok(())
    }

    /// UHASH alone (RFC 4418 section 5.1): the `tag_len`-byte universal hash of `message`,
    /// for constructions that add their own outer PRF. It is not a MAC by itself.
    ///
    /// Writes the first `min(out.len(), tag_len)` bytes of the hash; bytes of `out` past
    /// `tag_len` are left untouched.
    pub fn uhash(&self, message: &[u8], out: &mut [u8]) {
        let n = out.len().min(self.tag_len);
        out[..n].copy_from_slice(&self.uhash_u128(message).to_be_bytes()[..n]);
    }

    /// PDF (section 3.3) for a 1..=16-byte `nonce` (checked by the caller): the pad in the
    /// first (most significant) `tag_len` bytes of the result, zeroes after.
    fn pdf(&self, nonce: &[u8]) -> u128 {
        let mut block = [[0u8; 16]];
        for (dst, src) in block[0].iter_mut().zip(nonce) {
            *dst = *src;
        }
        // For 4- and 8-byte tags, index = str2uint(Nonce) mod (16 / taglen): the low two bits
        // or the low bit of the last nonce byte. They are cleared in the AES input, and select
        // which slice of the AES output is the pad.
        let last = nonce.len() - 1;
        let index = match self.tag_len {
            4 => block[0][last] & 3,
            8 => block[0][last] & 1,
            _ => 0,
        };
        block[0][last] ^= index;
        self.pdf.encrypt_blocks(&mut block);
        let t = u128::from_be_bytes(block[0]);
        block[0].zeroize();
        let skip_bits = 8 * u32::from(index) * self.tag_len as u32; // at most 96
        let keep_bits = 8 * self.tag_len as u32; // 32..=128
        (t << skip_bits) & (u128::MAX << (128 - keep_bits))
    }

    /// UHASH of `message`, its `tag_len` bytes in the most significant bytes of the result.
    fn uhash_u128(&self, message: &[u8]) -> u128 {
        let (k, nh) = (&self.keys, self.nh);
        match self.tag_len / 4 {
            1 => words_to_u128(&uhash_words::<1>(k, message, nh)),
            2 => words_to_u128(&uhash_words::<2>(k, message, nh)),
            3 => words_to_u128(&uhash_words::<3>(k, message, nh)),
            _ => words_to_u128(&uhash_words::<4>(k, message, nh)),
        }
    }
}

/// Big-endian concatenation of `words`, left-aligned in a `u128`.
fn words_to_u128<const N: usize>(words: &[u32; N]) -> u128 {
    words
        .iter()
        .enumerate()
        .fold(0, |acc, (i, &w)| acc | (u128::from(w) << (96 - 32 * i)))
}

/// Full chunks handed to the NH implementation per call. Measured on a Xeon with AVX-512
/// (umac-32 at 8 KiB, GB/s): 1 chunk 38-41, 2 chunks 46-47, 8 chunks 41-44. One chunk pays the
/// call into the kernel per KiB; many chunks leave the serial POLY steps of the whole batch to
/// run after the NH work instead of overlapping it.
const BATCH: usize = 2;

/// UHASH (section 5.1) for `N` iterations: one 32-bit L3 value per iteration.
#[inline(always)]
fn uhash_words<const N: usize>(keys: &Keys, msg: &[u8], nh: NhImpl) -> [u32; N] {
    let mut out = [0u32; N];
    if msg.len() <= CHUNK {
        // A single L1 value: L2-HASH is skipped and B = zeroes(8) || A.
        let a = l1_single::<N>(&keys.nh, &keys.lanes, msg, nh);
        for (i, o) in out.iter_mut().enumerate() {
            *o = l3_hash(&keys.l3[i], keys.l3k2[i], 0, a[i]);
        }
        return out;
    }
    let mut l2 = [L2State::new(); N];
    let mut scratch = NhScratch::new();
    let (chunks, rem) = msg.as_chunks::<CHUNK>();
    for batch in chunks.chunks(BATCH) {
        let mut h = [[0u64; N]; BATCH];
        nh.chunks::<N>(&keys.nh, &keys.lanes, batch, &mut h, &mut scratch);
        for hv in h.iter().take(batch.len()) {
            for i in 0..N {
                l2[i].absorb(hv[i].wrapping_add(CHUNK_BITS), keys.k64[i], keys.k128[i]);
            }
        }
    }
    if !rem.is_empty() {
        let h = nh.tail::<N>(&keys.nh, &keys.lanes, rem, Some(&mut scratch));
        let bits = (rem.len() as u64) * 8;
        for i in 0..N {
            l2[i].absorb(h[i].wrapping_add(bits), keys.k64[i], keys.k128[i]);
        }
    }
    for (i, o) in out.iter_mut().enumerate() {
        let (hi, lo) = l2[i].finish(keys.k128[i]);
        *o = l3_hash(&keys.l3[i], keys.l3k2[i], hi, lo);
    }
    out
}

/// L1-HASH of a message of at most one chunk: NH plus the bit length, per iteration.
#[inline(always)]
fn l1_single<const N: usize>(key: &NhKey, lanes: &NhLanes, msg: &[u8], nh: NhImpl) -> [u64; N] {
    let mut h = match <&[u8; CHUNK]>::try_from(msg) {
        Ok(chunk) => {
            let mut h = [[0u64; N]; 1];
            nh.chunks::<N>(
                key,
                lanes,
                std::slice::from_ref(chunk),
                &mut h,
                &mut NhScratch::new(),
            );
            h[0]
        }
        Err(_) => nh.tail::<N>(key, lanes, msg, None),
    };
    let bits = (msg.len() as u64) * 8;
    for v in h.iter_mut() {
        *v = v.wrapping_add(bits);
    }
    h
}

/// The NH implementations (RFC 4418 section 5.2.2). All compute the same values; they differ
/// in speed and in the CPU features they need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NhPath {
    /// Portable Rust (LLVM vectorizes it for the baseline target, SSE2 on x86-64).
    Portable,
    /// 256-bit vectors (x86-64 with AVX2): two 32-byte blocks per step.
    Avx2,
    /// 512-bit vectors (x86-64 with AVX-512F): four 32-byte blocks per step.
    Avx512,
}

impl NhPath {
    /// Every path, slowest first.
    pub const ALL: [NhPath; 3] = [NhPath::Portable, NhPath::Avx2, NhPath::Avx512];

    /// The lowercase name: `portable`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            NhPath::Portable => "portable",
            NhPath::Avx2 => "avx2",
            NhPath::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the path (checked at run time).
    pub fn is_supported(self) -> bool {
        NhImpl::try_new(self).is_some()
    }

    /// The fastest path this CPU supports.
    pub fn detect() -> NhPath {
        NhPath::ALL
            .into_iter()
            .rev()
            .find(|p| p.is_supported())
            .unwrap_or(NhPath::Portable)
    }

    /// The path [`Umac::new`] gives new keys: [`detect`](Self::detect)'s, unless the
    /// environment variable `COHORT_UMAC_NH` names a path (`portable`, `avx2`, `avx512`). A
    /// named path this CPU lacks gives the fastest supported one below it, so
    /// `COHORT_UMAC_NH=portable` forces the fallback on any machine. Read once per process.
    pub fn default_path() -> NhPath {
        static DEFAULT: std::sync::OnceLock<NhPath> = std::sync::OnceLock::new();
        *DEFAULT.get_or_init(|| {
            let wanted = std::env::var("COHORT_UMAC_NH").ok().and_then(|v| {
                NhPath::ALL
                    .into_iter()
                    .find(|p| p.name() == v.trim().to_ascii_lowercase())
            });
            match wanted {
                Some(w) => NhPath::ALL
                    .into_iter()
                    .rev()
                    .find(|p| *p <= w && p.is_supported())
                    .unwrap_or(NhPath::Portable),
                None => NhPath::detect(),
            }
        })
    }
}

impl PartialOrd for NhPath {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for NhPath {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (*self as u8).cmp(&(*other as u8))
    }
}

/// A runnable NH path: the SIMD variants carry the token that proves the CPU has the
/// features (see [`crate::nh_enter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NhImpl {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2(crate::nh_enter::Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(crate::nh_enter::Avx512),
}

impl NhImpl {
    /// `path` if this CPU can run it.
    fn try_new(path: NhPath) -> Option<NhImpl> {
        match path {
            NhPath::Portable => Some(NhImpl::Portable),
            #[cfg(target_arch = "x86_64")]
            NhPath::Avx2 => crate::nh_enter::Avx2::detect().map(NhImpl::Avx2),
            #[cfg(target_arch = "x86_64")]
            NhPath::Avx512 => crate::nh_enter::Avx512::detect().map(NhImpl::Avx512),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// `path` if supported, else the portable code.
    fn new(path: NhPath) -> NhImpl {
        NhImpl::try_new(path).unwrap_or(NhImpl::Portable)
    }

    fn path(self) -> NhPath {
        match self {
            NhImpl::Portable => NhPath::Portable,
            #[cfg(target_arch = "x86_64")]
            NhImpl::Avx2(_) => NhPath::Avx2,
            #[cfg(target_arch = "x86_64")]
            NhImpl::Avx512(_) => NhPath::Avx512,
        }
    }

    /// NH (no length term) of each full chunk into `out[..chunks.len()]`.
    #[inline(always)]
    fn chunks<const N: usize>(
        self,
        key: &NhKey,
        lanes: &NhLanes,
        chunks: &[[u8; CHUNK]],
        out: &mut [[u64; N]],
        scratch: &mut NhScratch,
    ) {
        match self {
            NhImpl::Portable => {
                for (c, o) in chunks.iter().zip(out.iter_mut()) {
                    *o = nh_chunk::<N>(key, c, scratch);
                }
            }
            #[cfg(target_arch = "x86_64")]
            NhImpl::Avx2(t) => t.chunks::<N>(lanes, chunks, out),
            #[cfg(target_arch = "x86_64")]
            NhImpl::Avx512(t) => t.chunks::<N>(lanes, chunks, out),
        }
    }

    /// NH (no length term) of a last chunk shorter than 1024 bytes, as [`nh_tail`].
    #[inline(always)]
    fn tail<const N: usize>(
        self,
        key: &NhKey,
        lanes: &NhLanes,
        data: &[u8],
        scratch: Option<&mut NhScratch>,
    ) -> [u64; N] {
        let mut acc = [0u64; N];
        let done = match self {
            NhImpl::Portable => return nh_tail::<N>(key, data, scratch),
            #[cfg(target_arch = "x86_64")]
            NhImpl::Avx2(t) => t.blocks::<N>(lanes, data, &mut acc),
            #[cfg(target_arch = "x86_64")]
            NhImpl::Avx512(t) => t.blocks::<N>(lanes, data, &mut acc),
        };
        // The blocks the kernel left (at most one whole block), then the zero-padded rest.
        let full = data.len() / 32;
        for b in done..full.min(BLOCKS) {
            nh_block::<N>(key, b, &data[32 * b..32 * b + 32], &mut acc);
        }
        let rem = &data[32 * full..];
        if !rem.is_empty() || data.is_empty() {
            let mut last = [0u8; 32];
            last[..rem.len()].copy_from_slice(rem);
            nh_block::<N>(key, full.min(BLOCKS - 1), &last, &mut acc);
        }
        acc
    }
}

/// Per-call buffers for the vectorized NH. For block `b` (32 bytes) and half `t` (0 or 1),
/// `l[2b + t]` packs the two 32-bit sums `M[8b + 2t + e] + K[8b + 2t + e + 4i]` (`e` = 0 in the
/// low half, 1 in the high half, both mod 2^32) for iteration `i`, and `r[2b + t]` the same
/// for the words four later, so that NH is `sum(lo(l) * lo(r) + hi(l) * hi(r))`.
#[repr(C, align(64))]
struct NhScratch {
    l: [u64; PAIRS],
    r: [u64; PAIRS],
}

impl NhScratch {
    fn new() -> Self {
        NhScratch {
            l: [0; PAIRS],
            r: [0; PAIRS],
        }
    }
}

/// NH (section 5.2.2) of one full 1024-byte chunk for each of `N` iterations, without the
/// length term. The message is read once from memory; each iteration re-reads the chunk from
/// the L1 cache.
///
/// Per iteration, two loops that LLVM vectorizes well with only SSE2: the key addition
/// (32-bit adds into the aligned scratch buffers), then a dot product of 32-bit halves
/// (`pmuludq`, no shuffles). Not inlined on purpose: as a parameter, `key`'s 64-byte alignment
/// is known to the optimizer, which then folds the key loads into the additions.
#[inline(never)]
fn nh_chunk<const N: usize>(key: &NhKey, chunk: &[u8; CHUNK], s: &mut NhScratch) -> [u64; N] {
    let word = |p: usize| u32::from_le_bytes([chunk[p], chunk[p + 1], chunk[p + 2], chunk[p + 3]]);
    let mut out = [0u64; N];
    for (it, o) in out.iter_mut().enumerate() {
        // Iteration `it` uses the key from word 4 * it (16 bytes further per iteration).
        let k = &key.w[4 * it..4 * it + CHUNK / 4];
        for b in 0..BLOCKS {
            for t in 0..2 {
                let p = 32 * b + 8 * t;
                let w = 8 * b + 2 * t;
                let l = [
                    word(p).wrapping_add(k[w]),
                    word(p + 4).wrapping_add(k[w + 1]),
                ];
                let r = [
                    word(p + 16).wrapping_add(k[w + 4]),
                    word(p + 20).wrapping_add(k[w + 5]),
                ];
                s.l[2 * b + t] = u64::from(l[0]) | (u64::from(l[1]) << 32);
                s.r[2 * b + t] = u64::from(r[0]) | (u64::from(r[1]) << 32);
            }
        }
        *o = dot_halves(&s.l, &s.r);
    }
    out
}

/// `sum(lo(l[i]) * lo(r[i]) + hi(l[i]) * hi(r[i])) mod 2^64` over 32-bit halves.
#[inline(always)]
fn dot_halves(l: &[u64], r: &[u64]) -> u64 {
    const LO: u64 = 0xFFFF_FFFF;
    let mut sum = 0u64;
    for (&a, &b) in l.iter().zip(r.iter()) {
        sum = sum
            .wrapping_add((a & LO) * (b & LO))
            .wrapping_add((a >> 32) * (b >> 32));
    }
    sum
}

/// NH of `data`, a whole number of 32-byte blocks but less than a chunk, for each of `N`
/// iterations: the same two loops as [`nh_chunk`] with a variable trip count.
#[inline(never)]
fn nh_blocks<const N: usize>(key: &NhKey, data: &[u8], s: &mut NhScratch) -> [u64; N] {
    let pairs = (data.len() / 16).min(PAIRS);
    let mut out = [0u64; N];
    for (it, o) in out.iter_mut().enumerate() {
        let k = &key.w[4 * it..4 * it + CHUNK / 4];
        let dst = s.l.chunks_exact_mut(2).zip(s.r.chunks_exact_mut(2));
        for ((block, kb), (l, r)) in data.chunks_exact(32).zip(k.chunks_exact(8)).zip(dst) {
            let word =
                |p: usize| u32::from_le_bytes([block[p], block[p + 1], block[p + 2], block[p + 3]]);
            for t in 0..2 {
                let (p, w) = (8 * t, 2 * t);
                let x = [
                    word(p).wrapping_add(kb[w]),
                    word(p + 4).wrapping_add(kb[w + 1]),
                ];
                let y = [
                    word(p + 16).wrapping_add(kb[w + 4]),
                    word(p + 20).wrapping_add(kb[w + 5]),
                ];
                l[t] = u64::from(x[0]) | (u64::from(x[1]) << 32);
                r[t] = u64::from(y[0]) | (u64::from(y[1]) << 32);
            }
        }
        *o = dot_halves(&s.l[..pairs], &s.r[..pairs]);
    }
    out
}

/// From this many whole 32-byte blocks on, a last chunk goes through the scratch buffers
/// rather than one block at a time (measured crossover points: with one iteration the
/// block-wise code is itself vectorized, so it stays competitive longer).
const fn vector_tail_blocks(iterations: usize) -> usize {
    if iterations == 1 {
        24
    } else {
        8
    }
}

/// NH of a last chunk shorter than 1024 bytes (possibly empty), zero-padded to a positive
/// multiple of 32 bytes, for each of `N` iterations; without the length term. Uses `scratch`
/// if given, else makes its own when it needs one.
#[inline(always)]
fn nh_tail<const N: usize>(key: &NhKey, data: &[u8], scratch: Option<&mut NhScratch>) -> [u64; N] {
    let full = data.len() / 32;
    let rem = &data[32 * full..];
    let mut acc = if full >= vector_tail_blocks(N) {
        let whole = &data[..32 * full];
        match scratch {
            Some(s) => nh_blocks::<N>(key, whole, s),
            None => nh_blocks::<N>(key, whole, &mut NhScratch::new()),
        }
    } else {
        let mut acc = [0u64; N];
        for (b, block) in (0..BLOCKS).zip(data.chunks_exact(32)) {
            nh_block::<N>(key, b, block, &mut acc);
        }
        acc
    };
    if !rem.is_empty() || data.is_empty() {
        let mut last = [0u8; 32];
        last[..rem.len()].copy_from_slice(rem);
        // `full < 32` as `data` is shorter than a chunk; the `min` tells the optimizer so.
        nh_block::<N>(key, full.min(BLOCKS - 1), &last, &mut acc);
    }
    acc
}

/// Adds the NH terms of 32-byte block number `b` (< 32) of a chunk to `acc`, per iteration.
#[inline(always)]
fn nh_block<const N: usize>(key: &NhKey, b: usize, block: &[u8], acc: &mut [u64; N]) {
    let mut m = [0u32; 8];
    for (j, w) in m.iter_mut().enumerate() {
        *w = u32::from_le_bytes([
            block[4 * j],
            block[4 * j + 1],
            block[4 * j + 2],
            block[4 * j + 3],
        ]);
    }
    for (it, a) in acc.iter_mut().enumerate() {
        let k = &key.w[8 * b + 4 * it..8 * b + 4 * it + 8];
        for j in 0..4 {
            let x = u64::from(m[j].wrapping_add(k[j]));
            let y = u64::from(m[j + 4].wrapping_add(k[j + 4]));
            *a = a.wrapping_add(x * y);
        }
    }
}

/// L2-HASH state (section 5.3.1) of one iteration, fed one L1 value (8 bytes) at a time.
#[derive(Clone, Copy)]
struct L2State {
    /// POLY-64 accumulator over the first `2^14` L1 values.
    y64: u64,
    /// POLY-128 accumulator, used once more than `2^14` L1 values came.
    y128: u128,
    /// L1 values absorbed so far.
    count: u64,
    /// First half of a 16-byte POLY-128 word still waiting for its second half.
    pending: Option<u64>,
}

impl L2State {
    fn new() -> Self {
        L2State {
            y64: 1,
            y128: 1,
            count: 0,
            pending: None,
        }
    }

    fn absorb(&mut self, word: u64, k64: u64, k128: u128) {
        if self.count < POLY64_WORDS {
            self.y64 = poly64_step(k64, self.y64, word);
        } else {
            if self.count == POLY64_WORDS {
                // POLY(128, ..., uint2str(y, 16) || M_2) starts with the POLY-64 result.
                self.y128 = poly128_step(k128, 1, u128::from(self.y64));
            }
            match self.pending.take() {
                None => self.pending = Some(word),
                Some(hi) => {
                    let w = (u128::from(hi) << 64) | u128::from(word);
                    self.y128 = poly128_step(k128, self.y128, w);
                }
            }
        }
        self.count += 1;
    }

    /// The 16-byte L2-HASH output as (high, low) 64-bit halves.
    fn finish(&self, k128: u128) -> (u64, u64) {
        if self.count <= POLY64_WORDS {
            return (0, self.y64);
        }
        // M_2 || 0x80, zero-padded to a multiple of 16 bytes.
        let last = match self.pending {
            Some(hi) => (u128::from(hi) << 64) | (0x80u128 << 56),
            None => 0x80u128 << 120,
        };
        let y = poly128_step(k128, self.y128, last);
        ((y >> 64) as u64, y as u64)
    }
}

/// One POLY-64 step (section 5.3.2): `y = k * y + m mod p64`, with the marker encoding for
/// `m >= 2^64 - 2^32`.
fn poly64_step(k: u64, y: u64, m: u64) -> u64 {
    if m >= MAXWORD64 {
        let y = mul_add_mod_p64(k, y, P64 - 1);
        mul_add_mod_p64(k, y, m - (0u64.wrapping_sub(P64)))
    } else {
        mul_add_mod_p64(k, y, m)
    }
}

/// `(k * y + m) mod (2^64 - 59)` for any 64-bit inputs.
fn mul_add_mod_p64(k: u64, y: u64, m: u64) -> u64 {
    const C: u128 = 59; // 2^64 mod p64
    let t = u128::from(k) * u128::from(y) + u128::from(m);
    let t = (t >> 64) * C + (t & u128::from(u64::MAX)); // < 2^71
    let t = (t >> 64) * C + (t & u128::from(u64::MAX)); // < 2^64 + 2^13
    let (lo, hi) = (t as u64, (t >> 64) as u64);
    // hi is 0 or 1: 2^64 = 59 (mod p), and lo < 2^13 when hi is 1.
    let r = lo + hi * 59;
    if r >= P64 {
        r - P64
    } else {
        r
    }
}

/// One POLY-128 step (section 5.3.2): `y = k * y + m mod p128`, with the marker encoding for
/// `m >= 2^128 - 2^96`.
fn poly128_step(k: u128, y: u128, m: u128) -> u128 {
    if m >= MAXWORD128 {
        let y = mul_add_mod_p128(k, y, P128 - 1);
        mul_add_mod_p128(k, y, m - (0u128.wrapping_sub(P128)))
    } else {
        mul_add_mod_p128(k, y, m)
    }
}

/// The 256-bit product `a * b` as (high, low) halves.
fn mul_wide_u128(a: u128, b: u128) -> (u128, u128) {
    let (a0, a1) = (a & u128::from(u64::MAX), a >> 64);
    let (b0, b1) = (b & u128::from(u64::MAX), b >> 64);
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let (mid, c1) = p01.overflowing_add(p10);
    let (mid, c2) = mid.overflowing_add(p00 >> 64);
    let lo = (mid << 64) | (p00 & u128::from(u64::MAX));
    let carries = u128::from(c1) + u128::from(c2);
    let hi = p11 + (mid >> 64) + (carries << 64);
    (hi, lo)
}

/// `(k * y + m) mod (2^128 - 159)` for any 128-bit inputs.
fn mul_add_mod_p128(k: u128, y: u128, m: u128) -> u128 {
    const C: u128 = 159; // 2^128 mod p128
    let (hi, lo) = mul_wide_u128(k, y);
    let (lo, c) = lo.overflowing_add(m);
    let hi = hi + u128::from(c); // k * y + m < 2^256
                                 // hi * 2^128 + lo = hi * 159 + lo (mod p)
    let (h2, l2) = mul_wide_u128(hi, C); // h2 < 2^8
    let (s, c) = l2.overflowing_add(lo);
    let h3 = h2 + u128::from(c);
    let (s, c) = s.overflowing_add(h3 * C);
    // On overflow s < 2^17, and 2^128 = 159 (mod p).
    let r = if c { s + C } else { s };
    if r >= P128 {
        r - P128
    } else {
        r
    }
}

/// L3-HASH (section 5.4) of the 16-byte L2 output `hi || lo`.
fn l3_hash(k: &[u64; 8], k2: u32, hi: u64, lo: u64) -> u32 {
    let mut y = 0u64;
    for i in 0..4 {
        let shift = 48 - 16 * i;
        // Each product is below 2^52, so the sum of eight fits easily.
        y += ((hi >> shift) & 0xFFFF) * k[i];
        y += ((lo >> shift) & 0xFFFF) * k[4 + i];
    }
    ((y % P36) as u32) ^ k2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> CryptoProvider {
        CryptoProvider::default_provider()
    }

    fn rfc_umac(tag_len: usize) -> Umac {
        Umac::new(&provider(), b"abcdefghijklmnop", tag_len).unwrap()
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02X}")).collect()
    }

    /// L1-HASH of `msg` for both iterations of UMAC-64, through the production NH paths.
    fn l1_values(u: &Umac, msg: &[u8]) -> Vec<[u64; 2]> {
        let mut out = Vec::new();
        let mut scratch = NhScratch::new();
        let mut chunks = msg.chunks_exact(CHUNK);
        for c in &mut chunks {
            let c: &[u8; CHUNK] = c.try_into().unwrap();
            let h = nh_chunk::<2>(&u.keys.nh, c, &mut scratch);
            out.push([h[0].wrapping_add(CHUNK_BITS), h[1].wrapping_add(CHUNK_BITS)]);
        }
        let rem = chunks.remainder();
        if !rem.is_empty() || msg.is_empty() {
            let h = nh_tail::<2>(&u.keys.nh, rem, None);
            let bits = rem.len() as u64 * 8;
            out.push([h[0].wrapping_add(bits), h[1].wrapping_add(bits)]);
        }
        out
    }

    #[test]
    fn rfc_intermediate_keys() {
        let u = rfc_umac(8);
        let nh = &u.keys.nh.w;
        // NH key words K_1..K_5 and K_256; iteration 2 starts 4 words later.
        let it1 = [0xACD79B4F, 0x6EDA0D0E, 0x1625B603, 0x84F9FC93, 0xC6DFECA2];
        let it2 = [0xC6DFECA2, 0x964A710D, 0xAD7EDE4D, 0xA1D3935E, 0x62EC8672];
        assert_eq!(nh[0..5], it1);
        assert_eq!(nh[4..9], it2);
        assert_eq!(nh[255], 0x0BF0F56C);
        assert_eq!(nh[4 + 255], 0x744C294F);
        assert_eq!(u.keys.k64[..2], [0x0094B8DD0137BEF8, 0x01036F4D000E7E72]);
        assert_eq!(
            u.keys.l3[0][4..],
            [0x056533C3A8, 0x07591E062E, 0x0C2D30F89D, 0x046786437C]
        );
        assert_eq!(
            u.keys.l3[1][4..],
            [0x0504BF4D4E, 0x0126E922FF, 0x030C0399E2, 0x04C1CB8FED]
        );
        assert_eq!(u.keys.l3k2[..2], [0x2E79F461, 0xA74C03AA]);
    }

    #[test]
    fn rfc_intermediate_hashes_abc500() {
        let u = rfc_umac(8);
        let msg = b"abc".repeat(500);
        let l1 = l1_values(&u, &msg);
        assert_eq!(l1.len(), 2);
        let l1_hex = |it: usize| format!("{:016X}{:016X}", l1[0][it], l1[1][it]);
        assert_eq!(l1_hex(0), "E6096F94EDC45CAC1BEDCD0E7FDAA906");
        assert_eq!(l1_hex(1), "2665EAD321CFAE79C82F3B90261641E5");

        let mut l2 = [L2State::new(); 2];
        for v in &l1 {
            for it in 0..2 {
                l2[it].absorb(v[it], u.keys.k64[it], u.keys.k128[it]);
            }
        }
        let b: Vec<(u64, u64)> = (0..2).map(|it| l2[it].finish(u.keys.k128[it])).collect();
        assert_eq!(
            format!("{:016X}{:016X}", b[0].0, b[0].1),
            "0000000000000000A6C537D7986FA4AA"
        );
        assert_eq!(
            format!("{:016X}{:016X}", b[1].0, b[1].1),
            "00000000000000001D79EAF247B394BF"
        );

        let c: Vec<u32> = (0..2)
            .map(|it| l3_hash(&u.keys.l3[it], u.keys.l3k2[it], b[it].0, b[it].1))
            .collect();
        assert_eq!(c, [0x05F86309, 0xDF9AD858]);

        let mut h = [0u8; 8];
        u.uhash(&msg, &mut h);
        assert_eq!(hex(&h), "05F86309DF9AD858");
        let pad = u.pdf(b"bcdefghi").to_be_bytes();
        assert_eq!(hex(&pad), "D13745D4304F18420000000000000000");
        let mut tag = [0u8; 8];
        u.tag(b"bcdefghi", &msg, &mut tag).unwrap();
        assert_eq!(hex(&tag), "D4CF26DDEFD5C01A");
    }

    #[test]
    fn bad_inputs_are_errors() {
        let p = provider();
        for len in [0usize, 1, 15, 17, 32] {
            assert_eq!(
                Umac::new(&p, &vec![0u8; len], 8).err(),
                Some(CryptoError::InvalidInput)
            );
        }
        for tag_len in [0usize, 1, 2, 3, 5, 7, 20, 32] {
            assert_eq!(
                Umac::new(&p, &[0u8; 16], tag_len).err(),
                Some(CryptoError::InvalidInput)
            );
        }
        for tag_len in [4usize, 8, 12, 16] {
            let u = rfc_umac(tag_len);
            assert_eq!(u.tag_len(), tag_len);
            let mut out = vec![0u8; tag_len];
            assert_eq!(u.tag(&[], b"m", &mut out), Err(CryptoError::InvalidInput));
            assert_eq!(
                u.tag(&[0u8; 17], b"m", &mut out),
                Err(CryptoError::InvalidInput)
            );
            assert_eq!(
                u.tag(&[0u8; 100], b"m", &mut out),
                Err(CryptoError::InvalidInput)
            );
            let mut short = vec![0u8; tag_len - 1];
            assert_eq!(
                u.tag(b"n", b"m", &mut short),
                Err(CryptoError::InvalidInput)
            );
            let mut long = vec![0u8; tag_len + 1];
            assert_eq!(u.tag(b"n", b"m", &mut long), Err(CryptoError::InvalidInput));
            for n in 1..=16 {
                assert!(u.tag(&vec![0xA5; n], b"m", &mut out).is_ok());
            }
        }
    }

    #[test]
    fn umac_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Umac>();
    }

    #[test]
    fn debug_is_redacted() {
        let s = format!("{:?}", rfc_umac(4));
        assert_eq!(s, "Umac { tag_len: 4, .. }");
    }

    #[test]
    fn uhash_output_lengths() {
        let u = rfc_umac(8);
        let mut full = [0u8; 8];
        u.uhash(b"hello", &mut full);
        let mut short = [0u8; 3];
        u.uhash(b"hello", &mut short);
        assert_eq!(short, full[..3]);
        let mut long = [0xEEu8; 10];
        u.uhash(b"hello", &mut long);
        assert_eq!(long[..8], full);
        assert_eq!(long[8..], [0xEE, 0xEE]);
    }

    #[test]
    fn pdf_index_selects_slice() {
        // For UMAC-32 the nonce's two low bits pick one of four slices of one AES block; the
        // four nonces differing only there share the block.
        let u = rfc_umac(4);
        let pads: Vec<[u8; 16]> = (0u8..4)
            .map(|last| u.pdf(&[9, 9, 0x40 | last]).to_be_bytes())
            .collect();
        let mut block = [[0u8; 16]];
        block[0][..3].copy_from_slice(&[9, 9, 0x40]);
        u.pdf.encrypt_blocks(&mut block);
        for (i, pad) in pads.iter().enumerate() {
            assert_eq!(pad[..4], block[0][4 * i..4 * i + 4]);
            assert_eq!(pad[4..], [0; 12]);
        }
        // For UMAC-64 the low bit picks one of two halves.
        let u = rfc_umac(8);
        let mut block = [[0u8; 16]];
        block[0][..3].copy_from_slice(&[9, 9, 0x42]);
        u.pdf.encrypt_blocks(&mut block);
        for last in [0x42u8, 0x43] {
            let pad = u.pdf(&[9, 9, last]).to_be_bytes();
            let i = usize::from(last & 1);
            assert_eq!(pad[..8], block[0][8 * i..8 * i + 8]);
            assert_eq!(pad[8..], [0; 8]);
        }
        // For UMAC-96/128 the whole nonce goes into AES unchanged.
        for tag_len in [12, 16] {
            let u = rfc_umac(tag_len);
            let pad = u.pdf(&[9, 9, 0x43]).to_be_bytes();
            let mut block = [[0u8; 16]];
            block[0][..3].copy_from_slice(&[9, 9, 0x43]);
            u.pdf.encrypt_blocks(&mut block);
            assert_eq!(pad[..tag_len], block[0][..tag_len]);
            assert!(pad[tag_len..].iter().all(|&b| b == 0));
        }
    }

    // ---- A literal, slow rendering of the RFC pseudo-code, for differential tests. ----

    /// NH exactly as written in section 5.2.2, on byte strings.
    fn ref_nh(k: &[u8], m: &[u8]) -> u64 {
        let t = m.len() / 4;
        let word = |s: &[u8], i: usize, le: bool| {
            let b = [s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]];
            if le {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            }
        };
        let mut y = 0u64;
        for i in 0..t / 8 {
            for j in 0..4 {
                let a = word(m, 8 * i + j, true).wrapping_add(word(k, 8 * i + j, false));
                let b = word(m, 8 * i + 4 + j, true).wrapping_add(word(k, 8 * i + 4 + j, false));
                y = y.wrapping_add(u64::from(a) * u64::from(b));
            }
        }
        y
    }

    /// `(a + b) mod p` for `a, b < p`.
    fn ref_addmod(a: u128, b: u128, p: u128) -> u128 {
        let (s, c) = a.overflowing_add(b);
        if c || s >= p {
            s.wrapping_sub(p)
        } else {
            s
        }
    }

    /// `(a * b) mod p` by double-and-add, independent of `mul_wide_u128`.
    fn ref_mulmod(a: u128, b: u128, p: u128) -> u128 {
        let mut r = 0u128;
        for bit in (0..128).rev() {
            r = ref_addmod(r, r, p);
            if (b >> bit) & 1 == 1 {
                r = ref_addmod(r, a % p, p);
            }
        }
        r
    }

    fn ref_poly(wordbytes: usize, maxword: u128, p: u128, k: u128, m: &[u8]) -> u128 {
        let offset = if wordbytes == 8 {
            (1u128 << 64) - p
        } else {
            0u128.wrapping_sub(p)
        };
        let mut y = 1u128;
        for w in m.chunks(wordbytes) {
            let v = w.iter().fold(0u128, |acc, &b| (acc << 8) | u128::from(b));
            let step = |y: u128, x: u128| ref_addmod(ref_mulmod(k, y, p), x % p, p);
            if v >= maxword {
                y = step(y, p - 1);
                y = step(y, v - offset);
            } else {
                y = step(y, v);
            }
        }
        y
    }

    /// UHASH per section 5.1, from the raw KDF outputs.
    fn ref_uhash(key: &[u8; 16], msg: &[u8], tag_len: usize) -> Vec<u8> {
        let aes = provider().aes_block.aes128(key).unwrap();
        let iters = tag_len / 4;
        let kdf_vec = |index: u64, n: usize| {
            let mut v = vec![0u8; n];
            kdf(aes.as_ref(), index, &mut v);
            v
        };
        let l1key = kdf_vec(1, 1024 + (iters - 1) * 16);
        let l2key = kdf_vec(2, iters * 24);
        let l3key1 = kdf_vec(3, iters * 64);
        let l3key2 = kdf_vec(4, iters * 4);
        let mut y = Vec::new();
        for i in 0..iters {
            let k1 = &l1key[i * 16..i * 16 + 1024];
            let k2 = &l2key[i * 24..(i + 1) * 24];
            let k31 = &l3key1[i * 64..(i + 1) * 64];
            let k32 = &l3key2[i * 4..(i + 1) * 4];
            // L1-HASH
            let mut a = Vec::new();
            let t = msg.len().div_ceil(1024).max(1);
            for j in 0..t {
                let part = &msg[(j * 1024).min(msg.len())..((j + 1) * 1024).min(msg.len())];
                let mut padded = part.to_vec();
                let plen = part.len().div_ceil(32).max(1) * 32;
                padded.resize(plen, 0);
                let v = ref_nh(k1, &padded).wrapping_add(part.len() as u64 * 8);
                a.extend_from_slice(&v.to_be_bytes());
            }
            // L2-HASH
            let b: Vec<u8> = if msg.len() <= 1024 {
                let mut b = vec![0u8; 8];
                b.extend_from_slice(&a);
                b
            } else {
                let k64 = u128::from(be_u64(&k2[..8]) & MASK64);
                let k128 = ((u128::from(be_u64(&k2[8..16])) << 64) | u128::from(be_u64(&k2[16..])))
                    & MASK128;
                let y64 = |m: &[u8]| ref_poly(8, (1u128 << 64) - (1u128 << 32), P64.into(), k64, m);
                let yy = if a.len() <= 1 << 17 {
                    y64(&a)
                } else {
                    let mut m2 = ((y64(&a[..1 << 17])).to_be_bytes()).to_vec();
                    m2.extend_from_slice(&a[1 << 17..]);
                    m2.push(0x80);
                    while m2.len() % 16 != 0 {
                        m2.push(0);
                    }
                    ref_poly(16, MAXWORD128, P128, k128, &m2)
                };
                yy.to_be_bytes().to_vec()
            };
            // L3-HASH
            let mut s = 0u128;
            for j in 0..8 {
                let m = u128::from(u16::from_be_bytes([b[2 * j], b[2 * j + 1]]));
                let k = u128::from(be_u64(&k31[8 * j..8 * j + 8])) % u128::from(P36);
                s += m * k;
            }
            let c = ((s % u128::from(P36)) as u32) ^ be_u32(k32);
            y.extend_from_slice(&c.to_be_bytes());
        }
        y
    }

    fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn matches_reference_for_many_lengths() {
        let key = *b"0123456789abcdef";
        let msg = pseudo_random(5 * 1024 + 77, 42);
        let lens: Vec<usize> = (0..70)
            .chain([95, 96, 97, 127, 128, 255, 256, 257, 500, 767, 768, 769, 800])
            .chain([991, 992, 993, 1023, 1024, 1025, 1056, 1280, 1824])
            .chain([2047, 2048, 2049, 3072, 3100, 4096 + 31, 5 * 1024 + 77])
            .collect();
        // Every NH path this CPU runs (tests/umac_vectors.rs and tests/nh_paths.rs fail loudly
        // when one is missing).
        for path in NhPath::ALL.into_iter().filter(|p| p.is_supported()) {
            for tag_len in [4, 8, 12, 16] {
                let mut u = Umac::new(&provider(), &key, tag_len).unwrap();
                u.set_nh_path(path).unwrap();
                for &n in &lens {
                    let mut h = vec![0u8; tag_len];
                    u.uhash(&msg[..n], &mut h);
                    assert_eq!(
                        h,
                        ref_uhash(&key, &msg[..n], tag_len),
                        "len {n}, tag {tag_len}, path {}",
                        path.name()
                    );
                }
            }
        }
    }

    #[test]
    fn nh_paths_agree_with_reference() {
        let u = rfc_umac(16);
        let chunk = pseudo_random(CHUNK, 7);
        let key_bytes: Vec<u8> = u.keys.nh.w.iter().flat_map(|w| w.to_be_bytes()).collect();
        let c: &[u8; CHUNK] = chunk.as_slice().try_into().unwrap();
        let fast = nh_chunk::<4>(&u.keys.nh, c, &mut NhScratch::new());
        for (it, &v) in fast.iter().enumerate() {
            assert_eq!(v, ref_nh(&key_bytes[16 * it..16 * it + CHUNK], &chunk));
        }
        // All-ones data and key words that wrap: the 32-bit sums must wrap, the 64-bit sum too.
        let ones = [0xFFu8; CHUNK];
        let fast = nh_chunk::<4>(&u.keys.nh, &ones, &mut NhScratch::new());
        for (it, &v) in fast.iter().enumerate() {
            assert_eq!(v, ref_nh(&key_bytes[16 * it..16 * it + CHUNK], &ones));
        }
    }

    #[test]
    fn poly_arithmetic_matches_reference() {
        let vals: Vec<u128> = [
            0u128,
            1,
            2,
            158,
            159,
            160,
            u128::from(u64::MAX),
            1u128 << 64,
            MAXWORD128 - 1,
            MAXWORD128,
            P128 - 1,
            P128,
            u128::MAX,
        ]
        .into_iter()
        .chain(
            pseudo_random(16 * 20, 3)
                .chunks(16)
                .map(|c| c.iter().fold(0u128, |a, &b| (a << 8) | u128::from(b))),
        )
        .collect();
        for &k in &vals {
            for &y in &vals {
                let y = y % P128;
                for &m in &vals {
                    let want = ref_addmod(ref_mulmod(k, y, P128), m % P128, P128);
                    assert_eq!(mul_add_mod_p128(k, y, m), want);
                }
                let k64 = k as u64;
                let y64 = (y as u64) % P64;
                for &m in &vals[..7] {
                    let m = m as u64;
                    let p = u128::from(P64);
                    let want =
                        ref_addmod(ref_mulmod(k64.into(), y64.into(), p), u128::from(m) % p, p);
                    assert_eq!(u128::from(mul_add_mod_p64(k64, y64, m)), want);
                }
            }
        }
    }

    #[test]
    fn l2_switches_to_poly128_after_2_pow_14_values() {
        // Drive L2State directly with pseudo-random L1 values around the 2^14 boundary, both
        // parities, and compare with the reference POLY composition.
        let u = rfc_umac(4);
        let (k64, k128) = (u.keys.k64[0], u.keys.k128[0]);
        let words = pseudo_random(8 * ((1 << 14) + 5), 11);
        let mut words: Vec<u64> = words.chunks(8).map(be_u64).collect();
        // Exercise the marker paths too.
        words[3] = u64::MAX;
        words[(1 << 14) + 1] = u64::MAX;
        words[(1 << 14) + 2] = 0xFFFF_FFFF_0000_0000;
        for n in [
            (1 << 14) - 1,
            1 << 14,
            (1 << 14) + 1,
            (1 << 14) + 2,
            (1 << 14) + 5,
        ] {
            let mut st = L2State::new();
            for &w in &words[..n] {
                st.absorb(w, k64, k128);
            }
            let (hi, lo) = st.finish(k128);
            let bytes: Vec<u8> = words[..n].iter().flat_map(|w| w.to_be_bytes()).collect();
            let y64 =
                |m: &[u8]| ref_poly(8, (1u128 << 64) - (1u128 << 32), P64.into(), k64.into(), m);
            let want = if n <= 1 << 14 {
                y64(&bytes)
            } else {
                let mut m2 = y64(&bytes[..1 << 17]).to_be_bytes().to_vec();
                m2.extend_from_slice(&bytes[1 << 17..]);
                m2.push(0x80);
                while m2.len() % 16 != 0 {
                    m2.push(0);
                }
                ref_poly(16, MAXWORD128, P128, k128, &m2)
            };
            assert_eq!((u128::from(hi) << 64) | u128::from(lo), want, "n = {n}");
        }
    }
}
