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
use crate::umac::{NhLanes, BLOCKS, CHUNK};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Message word `i` (little-endian) of a byte array, as the `i32` the intrinsics take.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn le<const B: usize>(m: &[u8; B], i: usize) -> i32 {
    i32::from_le_bytes([m[4 * i], m[4 * i + 1], m[4 * i + 2], m[4 * i + 3]])
}

/// AVX2 step: adds the NH products of block pair `2q + h` (blocks `4q + 2h` and
/// `4q + 2h + 1` of the chunk, bytes `m`) to the 4-lane sums `v[it]`, per iteration.
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_pair {
    ($lanes:expr, $m:expr, $q:expr, $h:expr, $v:expr) => {{
        let m: &[u8; 64] = $m;
        let (q, h): (usize, usize) = ($q, $h);
        let mlo = _mm256_setr_epi32(
            le(m, 0),
            le(m, 1),
            le(m, 2),
            le(m, 3),
            le(m, 8),
            le(m, 9),
            le(m, 10),
            le(m, 11),
        );
        let mhi = _mm256_setr_epi32(
            le(m, 4),
            le(m, 5),
            le(m, 6),
            le(m, 7),
            le(m, 12),
            le(m, 13),
            le(m, 14),
            le(m, 15),
        );
        for (a, l) in $v.iter_mut().zip($lanes.w.iter()) {
            // Pair p's lanes: words 32q + 8h .. +8 (words 0-3 of both blocks) and
            // 32q + 16 + 8h .. +8 (words 4-7); q < 8 keeps both inside the 256 words.
            let (Some(klo), Some(khi)) = (
                l.get(32 * q + 8 * h..).and_then(|k| k.first_chunk::<8>()),
                l.get(32 * q + 16 + 8 * h..)
                    .and_then(|k| k.first_chunk::<8>()),
            ) else {
                continue;
            };
            let klo = _mm256_setr_epi32(
                klo[0] as i32,
                klo[1] as i32,
                klo[2] as i32,
                klo[3] as i32,
                klo[4] as i32,
                klo[5] as i32,
                klo[6] as i32,
                klo[7] as i32,
            );
            let khi = _mm256_setr_epi32(
                khi[0] as i32,
                khi[1] as i32,
                khi[2] as i32,
                khi[3] as i32,
                khi[4] as i32,
                khi[5] as i32,
                khi[6] as i32,
                khi[7] as i32,
            );
            let x = _mm256_add_epi32(mlo, klo);
            let y = _mm256_add_epi32(mhi, khi);
            let even = _mm256_mul_epu32(x, y);
            let odd = _mm256_mul_epu32(_mm256_srli_epi64::<32>(x), _mm256_srli_epi64::<32>(y));
            *a = _mm256_add_epi64(*a, _mm256_add_epi64(even, odd));
        }
    }};
}

/// AVX-512 step: adds the NH products of block quad `q` (blocks `4q..4q+4`, bytes `m`) to the
/// 8-lane sums `v[it]`, per iteration.
#[cfg(target_arch = "x86_64")]
macro_rules! avx512_quad {
    ($lanes:expr, $m:expr, $q:expr, $v:expr) => {{
        let m: &[u8; 128] = $m;
        let a = _mm512_setr_epi32(
            le(m, 0),
            le(m, 1),
            le(m, 2),
            le(m, 3),
            le(m, 4),
            le(m, 5),
            le(m, 6),
            le(m, 7),
            le(m, 8),
            le(m, 9),
            le(m, 10),
            le(m, 11),
            le(m, 12),
            le(m, 13),
            le(m, 14),
            le(m, 15),
        );
        let b = _mm512_setr_epi32(
            le(m, 16),
            le(m, 17),
            le(m, 18),
            le(m, 19),
            le(m, 20),
            le(m, 21),
            le(m, 22),
            le(m, 23),
            le(m, 24),
            le(m, 25),
            le(m, 26),
            le(m, 27),
            le(m, 28),
            le(m, 29),
            le(m, 30),
            le(m, 31),
        );
        // Words 0-3 of each block, then words 4-7 of each block (indices >= 16 pick from b).
        let ilo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        let ihi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
        let mlo = _mm512_permutex2var_epi32(a, ilo, b);
        let mhi = _mm512_permutex2var_epi32(a, ihi, b);
        for (acc, l) in $v.iter_mut().zip($lanes.w.iter()) {
            // Quad q's lanes: words 32q .. 32q + 32; q < 8 keeps them inside the 256 words.
            let Some(k) = l.get(32 * $q..).and_then(|k| k.first_chunk::<32>()) else {
                continue;
            };
            let klo = _mm512_setr_epi32(
                k[0] as i32,
                k[1] as i32,
                k[2] as i32,
                k[3] as i32,
                k[4] as i32,
                k[5] as i32,
                k[6] as i32,
                k[7] as i32,
                k[8] as i32,
                k[9] as i32,
                k[10] as i32,
                k[11] as i32,
                k[12] as i32,
                k[13] as i32,
                k[14] as i32,
                k[15] as i32,
            );
            let khi = _mm512_setr_epi32(
                k[16] as i32,
                k[17] as i32,
                k[18] as i32,
                k[19] as i32,
                k[20] as i32,
                k[21] as i32,
                k[22] as i32,
                k[23] as i32,
                k[24] as i32,
                k[25] as i32,
                k[26] as i32,
                k[27] as i32,
                k[28] as i32,
                k[29] as i32,
                k[30] as i32,
                k[31] as i32,
            );
            let x = _mm512_add_epi32(mlo, klo);
            let y = _mm512_add_epi32(mhi, khi);
            let even = _mm512_mul_epu32(x, y);
            let odd = _mm512_mul_epu32(_mm512_srli_epi64::<32>(x), _mm512_srli_epi64::<32>(y));
            *acc = _mm512_add_epi64(*acc, _mm512_add_epi64(even, odd));
        }
    }};
}

/// Wrapping sum of the four 64-bit lanes of `s`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn hsum256(s: __m256i) -> u64 {
    [
        _mm256_extract_epi64::<0>(s) as u64,
        _mm256_extract_epi64::<1>(s) as u64,
        _mm256_extract_epi64::<2>(s) as u64,
        _mm256_extract_epi64::<3>(s) as u64,
    ]
    .iter()
    .fold(0u64, |t, &l| t.wrapping_add(l))
}

/// AVX2 NH (without the length term) of each full chunk in `chunks`, into `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn avx2_chunks<const N: usize>(
    lanes: &NhLanes,
    chunks: &[[u8; CHUNK]],
    out: &mut [[u64; N]],
) {
    for (c, o) in chunks.iter().zip(out.iter_mut()) {
        let mut v = [_mm256_setzero_si256(); N];
        // By quads, so that the lane offsets within a quad are constants.
        for (q, m) in c.as_chunks::<128>().0.iter().enumerate() {
            if let [m0, m1] = m.as_chunks::<64>().0 {
                avx2_pair!(lanes, m0, q, 0, v);
                avx2_pair!(lanes, m1, q, 1, v);
            }
        }
        for (o, s) in o.iter_mut().zip(v) {
            *o = hsum256(s);
        }
    }
}

/// AVX-512 NH (without the length term) of each full chunk in `chunks`, into `out`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
pub(crate) fn avx512_chunks<const N: usize>(
    lanes: &NhLanes,
    chunks: &[[u8; CHUNK]],
    out: &mut [[u64; N]],
) {
    for (c, o) in chunks.iter().zip(out.iter_mut()) {
        let mut v = [_mm512_setzero_si512(); N];
        for (q, m) in c.as_chunks::<128>().0.iter().enumerate() {
            avx512_quad!(lanes, m, q, v);
        }
        for (o, s) in o.iter_mut().zip(v) {
            *o = _mm512_reduce_add_epi64(s) as u64;
        }
    }
}

/// AVX2 NH sums of the leading whole block pairs of `data` (whole 32-byte blocks of a last
/// chunk, fewer than 32), added to `acc`. Returns how many blocks it covered (even).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) fn avx2_blocks<const N: usize>(
    lanes: &NhLanes,
    data: &[u8],
    acc: &mut [u64; N],
) -> usize {
    let pairs = data.as_chunks::<64>().0;
    let pairs = pairs.get(..BLOCKS / 2).unwrap_or(pairs);
    let mut v = [_mm256_setzero_si256(); N];
    for (p, m) in pairs.iter().enumerate() {
        avx2_pair!(lanes, m, p / 2, p % 2, v);
    }
    for (a, s) in acc.iter_mut().zip(v) {
        *a = a.wrapping_add(hsum256(s));
    }
    2 * pairs.len()
}

/// AVX-512 NH sums of the leading whole blocks of `data` (whole 32-byte blocks of a last
/// chunk, fewer than 32) in groups of four, then one pair with AVX2, added to `acc`. Returns
/// how many blocks it covered (even).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
pub(crate) fn avx512_blocks<const N: usize>(
    lanes: &NhLanes,
    data: &[u8],
    acc: &mut [u64; N],
) -> usize {
    let quads = data.as_chunks::<128>().0;
    let quads = quads.get(..BLOCKS / 4).unwrap_or(quads);
    let mut v = [_mm512_setzero_si512(); N];
    for (q, m) in quads.iter().enumerate() {
        avx512_quad!(lanes, m, q, v);
    }
    for (a, s) in acc.iter_mut().zip(v) {
        *a = a.wrapping_add(_mm512_reduce_add_epi64(s) as u64);
    }
    let done = 4 * quads.len();
    // At most one more pair: fewer than four whole blocks remain.
    if let Some(m) = data
        .get(32 * done..)
        .and_then(|rest| rest.first_chunk::<64>())
    {
        let mut v = [_mm256_setzero_si256(); N];
        avx2_pair!(lanes, m, done / 4, (done / 2) % 2, v);
        for (a, s) in acc.iter_mut().zip(v) {
            *a = a.wrapping_add(hsum256(s));
        }
        return done + 2;
    }
    done
}
