//! Entering the SIMD NH kernels: the CPU feature check, and the crate's only `unsafe` code.
//!
//! The kernels in [`crate::nh_simd`] are safe `#[target_feature]` functions. Rust lets code
//! compiled for the baseline CPU call them only inside `unsafe`, because running AVX2 or
//! AVX-512 instructions on a CPU without them is undefined behaviour. This module holds that
//! obligation in one place: a kernel is entered only through a method of a token type
//! ([`Avx2`], [`Avx512`]), and the only way to get a token is its `detect` function, which
//! returns one only when `is_x86_feature_detected!` reports every feature the kernel is
//! compiled with. The tokens are `Copy` but have a private field, so no other module can make
//! one. That is the whole soundness argument for every `unsafe` block below: "a token exists,
//! so the CPU has the features".
//!
//! Why `unsafe` and not a crate: a maintained crate such as `pulp` or `multiversion` would
//! hide the same `unsafe` call behind its own token types, at the price of a new dependency
//! (and, for `pulp`, its own SIMD abstraction). The code here is four `unsafe` call
//! expressions with one shared argument; the lints keep it the only `unsafe` in the crate:
//! cohort-gears has its own `[lints]` table with `unsafe_code = "deny"` (the workspace's
//! `forbid` cannot be relaxed by `allow`), and this module alone carries
//! `#[allow(unsafe_code)]`.

#[cfg(target_arch = "x86_64")]
use crate::nh_simd;
#[cfg(target_arch = "x86_64")]
use crate::umac::{NhLanes, CHUNK};

/// Proof that the CPU has AVX2. Only [`Avx2::detect`] makes one.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx2(());

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    /// A token if this CPU has AVX2 (checked at run time, cached by `std`).
    pub(crate) fn detect() -> Option<Avx2> {
        std::arch::is_x86_feature_detected!("avx2").then_some(Avx2(()))
    }

    /// NH of full chunks (see [`nh_simd::avx2_chunks`]).
    #[inline]
    pub(crate) fn chunks<const N: usize>(
        self,
        key: &NhLanes,
        chunks: &[[u8; CHUNK]],
        out: &mut [[u64; N]],
    ) {
        // SAFETY: `self` exists, so `detect` saw AVX2 on this CPU; the kernel needs only AVX2.
        unsafe { nh_simd::avx2_chunks::<N>(key, chunks, out) }
    }

    /// NH of leading block pairs (see [`nh_simd::avx2_blocks`]).
    #[inline]
    pub(crate) fn blocks<const N: usize>(
        self,
        key: &NhLanes,
        data: &[u8],
        acc: &mut [u64; N],
    ) -> usize {
        // SAFETY: as in `chunks`: the token proves AVX2.
        unsafe { nh_simd::avx2_blocks::<N>(key, data, acc) }
    }
}

/// Proof that the CPU has AVX-512F and AVX2 (the AVX-512 kernels use both). Only
/// [`Avx512::detect`] makes one.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Avx512(());

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    /// A token if this CPU has AVX-512F and AVX2 (checked at run time, cached by `std`).
    pub(crate) fn detect() -> Option<Avx512> {
        (std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx2"))
        .then_some(Avx512(()))
    }

    /// NH of full chunks (see [`nh_simd::avx512_chunks`]).
    #[inline]
    pub(crate) fn chunks<const N: usize>(
        self,
        key: &NhLanes,
        chunks: &[[u8; CHUNK]],
        out: &mut [[u64; N]],
    ) {
        // SAFETY: `self` exists, so `detect` saw AVX-512F and AVX2, all the kernel enables.
        unsafe { nh_simd::avx512_chunks::<N>(key, chunks, out) }
    }

    /// NH of leading block groups (see [`nh_simd::avx512_blocks`]).
    #[inline]
    pub(crate) fn blocks<const N: usize>(
        self,
        key: &NhLanes,
        data: &[u8],
        acc: &mut [u64; N],
    ) -> usize {
        // SAFETY: as in `chunks`: the token proves AVX-512F and AVX2.
        unsafe { nh_simd::avx512_blocks::<N>(key, data, acc) }
    }
}
