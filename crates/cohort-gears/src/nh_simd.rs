//! SIMD kernels for UMAC's NH (RFC 4418 section 5.2.2): AVX2 and AVX-512, in safe code.
//!
//! This module owns the vector arithmetic only. Every kernel is a *safe*
//! `#[target_feature]` function (Rust 1.86+): inside it the `std::arch` intrinsics it uses are
//! safe to call, and message and key words are brought into vectors with `_mm*_setr_epi32`
//! from fixed-size arrays (no raw-pointer loads), which LLVM turns into plain unaligned vector
//! loads. What cannot be safe is *entering* a kernel from code compiled without the feature:
//! that needs the CPU check, and lives in [`crate::nh_enter`], the crate's one `unsafe` module.
//!
//! # The layout
//! NH multiplies word `j` of each 32-byte block (message plus key, mod 2^32) with word
//! `j + 4`. A 256-bit register holds 8 words; `vpmuludq` multiplies the even 32-bit elements
//! of two registers. So for two blocks `A` and `B` the AVX2 kernel builds
//! `lo = A[0..4] ‖ B[0..4]` and `hi = A[4..8] ‖ B[4..8]` (message and key alike), adds them,
//! and sums `mul_epu32(lo, hi)` (words 0 and 2 of each half) plus
//! `mul_epu32(lo >> 32, hi >> 32)` (words 1 and 3) into 64-bit lanes. The AVX-512 kernel does
//! the same with four blocks per register. The order of the products does not matter: NH is
//! their sum mod 2^64. Each UHASH iteration `i` reuses the message vectors with the key
//! shifted by `4 * i` words (the Toeplitz construction), so a message is read once.

#[cfg(target_arch = "x86_64")]
use crate::umac::{NhKey, BLOCKS};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Message word `i` (little-endian) of a 64-byte array, as the `i32` the intrinsics take.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn le64(m: &[u8; 64], i: usize) -> i32 {
    i32::from_le_bytes([m[4 * i], m[4 * i + 1], m[4 * i + 2], m[4 * i + 3]])
}

/// Message word `i` (little-endian) of a 128-byte array.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn le128(m: &[u8; 128], i: usize) -> i32 {
    i32::from_le_bytes([m[4 * i], m[4 * i + 1], m[4 * i + 2], m[4 * i + 3]])
}

/// AVX2: adds the NH sums of the 64-byte block pairs in `pairs` to `acc`, per iteration; the
/// first pair is blocks `first_block` and `first_block + 1` of the chunk (which picks the key
/// words). `first_block + 2 * pairs.len()` must be at most 32; extra pairs are ignored.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn avx2_pairs<const N: usize>(
    key: &NhKey,
    first_block: usize,
    pairs: &[[u8; 64]],
    acc: &mut [u64; N],
) {
    let mut v = [_mm256_setzero_si256(); N];
    let count = (BLOCKS - first_block.min(BLOCKS)) / 2;
    for (p, m) in pairs.iter().take(count).enumerate() {
        let mlo = _mm256_setr_epi32(
            le64(m, 0),
            le64(m, 1),
            le64(m, 2),
            le64(m, 3),
            le64(m, 8),
            le64(m, 9),
            le64(m, 10),
            le64(m, 11),
        );
        let mhi = _mm256_setr_epi32(
            le64(m, 4),
            le64(m, 5),
            le64(m, 6),
            le64(m, 7),
            le64(m, 12),
            le64(m, 13),
            le64(m, 14),
            le64(m, 15),
        );
        let base = 8 * (first_block + 2 * p);
        for (it, a) in v.iter_mut().enumerate() {
            // In bounds: base + 4 * it + 16 <= 8 * 32 + 12 = NH_KEY_WORDS for it < 4.
            let Some(k) = key
                .w
                .get(base + 4 * it..)
                .and_then(|k| k.first_chunk::<16>())
            else {
                continue;
            };
            let k = k.map(|w| w as i32);
            let klo = _mm256_setr_epi32(k[0], k[1], k[2], k[3], k[8], k[9], k[10], k[11]);
            let khi = _mm256_setr_epi32(k[4], k[5], k[6], k[7], k[12], k[13], k[14], k[15]);
            let x = _mm256_add_epi32(mlo, klo);
            let y = _mm256_add_epi32(mhi, khi);
            let even = _mm256_mul_epu32(x, y);
            let odd = _mm256_mul_epu32(_mm256_srli_epi64::<32>(x), _mm256_srli_epi64::<32>(y));
            *a = _mm256_add_epi64(*a, _mm256_add_epi64(even, odd));
        }
    }
    for (a, s) in acc.iter_mut().zip(v) {
        let lanes = [
            _mm256_extract_epi64::<0>(s) as u64,
            _mm256_extract_epi64::<1>(s) as u64,
            _mm256_extract_epi64::<2>(s) as u64,
            _mm256_extract_epi64::<3>(s) as u64,
        ];
        *a = lanes.iter().fold(*a, |t, &l| t.wrapping_add(l));
    }
}

/// AVX-512: as [`avx2_pairs`] with groups of four blocks (128 bytes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
#[inline]
fn avx512_quads<const N: usize>(
    key: &NhKey,
    first_block: usize,
    quads: &[[u8; 128]],
    acc: &mut [u64; N],
) {
    let mut v = [_mm512_setzero_si512(); N];
    let count = (BLOCKS - first_block.min(BLOCKS)) / 4;
    for (q, m) in quads.iter().take(count).enumerate() {
        let mlo = _mm512_setr_epi32(
            le128(m, 0),
            le128(m, 1),
            le128(m, 2),
            le128(m, 3),
            le128(m, 8),
            le128(m, 9),
            le128(m, 10),
            le128(m, 11),
            le128(m, 16),
            le128(m, 17),
            le128(m, 18),
            le128(m, 19),
            le128(m, 24),
            le128(m, 25),
            le128(m, 26),
            le128(m, 27),
        );
        let mhi = _mm512_setr_epi32(
            le128(m, 4),
            le128(m, 5),
            le128(m, 6),
            le128(m, 7),
            le128(m, 12),
            le128(m, 13),
            le128(m, 14),
            le128(m, 15),
            le128(m, 20),
            le128(m, 21),
            le128(m, 22),
            le128(m, 23),
            le128(m, 28),
            le128(m, 29),
            le128(m, 30),
            le128(m, 31),
        );
        let base = 8 * (first_block + 4 * q);
        for (it, a) in v.iter_mut().enumerate() {
            // In bounds: base + 4 * it + 32 <= 8 * 28 + 12 + 32 = NH_KEY_WORDS for it < 4.
            let Some(k) = key
                .w
                .get(base + 4 * it..)
                .and_then(|k| k.first_chunk::<32>())
            else {
                continue;
            };
            let k = k.map(|w| w as i32);
            let klo = _mm512_setr_epi32(
                k[0], k[1], k[2], k[3], k[8], k[9], k[10], k[11], k[16], k[17], k[18], k[19],
                k[24], k[25], k[26], k[27],
            );
            let khi = _mm512_setr_epi32(
                k[4], k[5], k[6], k[7], k[12], k[13], k[14], k[15], k[20], k[21], k[22], k[23],
                k[28], k[29], k[30], k[31],
            );
            let x = _mm512_add_epi32(mlo, klo);
            let y = _mm512_add_epi32(mhi, khi);
            let even = _mm512_mul_epu32(x, y);
            let odd = _mm512_mul_epu32(_mm512_srli_epi64::<32>(x), _mm512_srli_epi64::<32>(y));
            *a = _mm512_add_epi64(*a, _mm512_add_epi64(even, odd));
        }
    }
    for (a, s) in acc.iter_mut().zip(v) {
        *a = a.wrapping_add(_mm512_reduce_add_epi64(s) as u64);
    }
}

/// AVX2 NH (without the length term) of each full chunk in `chunks`, into `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn avx2_chunks<const N: usize>(
    key: &NhKey,
    chunks: &[[u8; crate::umac::CHUNK]],
    out: &mut [[u64; N]],
) {
    for (c, o) in chunks.iter().zip(out.iter_mut()) {
        *o = [0; N];
        avx2_pairs::<N>(key, 0, c.as_chunks::<64>().0, o);
    }
}

/// AVX-512 NH (without the length term) of each full chunk in `chunks`, into `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
pub(crate) fn avx512_chunks<const N: usize>(
    key: &NhKey,
    chunks: &[[u8; crate::umac::CHUNK]],
    out: &mut [[u64; N]],
) {
    for (c, o) in chunks.iter().zip(out.iter_mut()) {
        *o = [0; N];
        avx512_quads::<N>(key, 0, c.as_chunks::<128>().0, o);
    }
}

/// AVX2 NH sums of the leading whole block pairs of `data` (whole 32-byte blocks, fewer than
/// 32), added to `acc`. Returns how many blocks it covered (an even number).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn avx2_blocks<const N: usize>(key: &NhKey, data: &[u8], acc: &mut [u64; N]) -> usize {
    let pairs = data.as_chunks::<64>().0;
    avx2_pairs::<N>(key, 0, pairs, acc);
    2 * pairs.len().min(BLOCKS / 2)
}

/// AVX-512 NH sums of the leading whole blocks of `data` (whole 32-byte blocks, fewer than
/// 32) in groups of four, then one pair with AVX2, added to `acc`. Returns how many blocks it
/// covered (an even number).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
pub(crate) fn avx512_blocks<const N: usize>(key: &NhKey, data: &[u8], acc: &mut [u64; N]) -> usize {
    let quads = data.as_chunks::<128>().0;
    avx512_quads::<N>(key, 0, quads, acc);
    let done = 4 * quads.len().min(BLOCKS / 4);
    let rest = data.get(32 * done..).unwrap_or(&[]);
    let pair = rest.as_chunks::<64>().0;
    let pair = pair.get(..1).unwrap_or(&[]);
    avx2_pairs::<N>(key, done, pair, acc);
    done + 2 * pair.len()
}
