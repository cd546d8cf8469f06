//! The inner-function group with bit scattering (ACSA 3.2.1 and Appendix A). Experimental:
//! ACSA calls its security heuristic, and asks whether scattering pays for its cost; the
//! benchmarks measure exactly that against UMAC-32 on the same data.
//!
//! ```text
//!  data (64-bit little-endian words, zero-padded to whole pairs)
//!    │  pairs (X, Y), mask word M = mask[(offset + i) mod len]
//!    ├── bin A ← (X & M) | (Y & !M)     marked X bits, unmarked Y bits
//!    └── bin B ← (X | M) & (Y | !M)     unmarked X bits, marked Y bits
//!  inner:  hA = UHASH-32_kA(bin A), hB = UHASH-32_kB(bin B)   (NH, RFC 4418 layers)
//!  outer:  tag = BLAKE3_{k_seq}("cohort ifg" ‖ len ‖ hA ‖ hB)[..8]
//! ```
//! * The mask is as long as the largest packet ([`MAX_PACKET_LEN`] bytes) and made once per
//!   key from an AES-128 keystream (ACSA: "one mask ... for each security association").
//! * Per packet, a secondary key from AES-128 under the per-packet key and the sequence
//!   number gives the mask offset and the outer PRF key (ACSA 2.4, 3.2.1).
//!
//! (A, B) is a bijection of (X, Y) for any mask, so any change to the data changes at least
//! one bin; the proven bound is UHASH-32's collision bound, about 2^-30, as if the mask were
//! public. Whatever scattering adds on top is the heuristic part.

use crate::gear::MAX_PACKET_LEN;
use crate::umac::Umac;
use cohort_crypto::{BlockCipher, CryptoError, CryptoProvider, KeyedHash};
use zeroize::Zeroizing;

const MASK_WORDS: usize = MAX_PACKET_LEN / 8;
const TAG_LEN: usize = 8;

/// An IFG key: the association mask, the per-packet key and two inner-function keys.
pub struct Ifg {
    mask: Zeroizing<Vec<u64>>,
    per_packet: Box<dyn BlockCipher>,
    bin_a: Umac,
    bin_b: Umac,
    outer: &'static dyn KeyedHash,
}

impl Ifg {
    /// `key` is 64 bytes: mask key, per-packet key, bin A key, bin B key (16 bytes each).
    pub fn new(provider: &CryptoProvider, key: &[u8]) -> Result<Self, CryptoError> {
        if key.len() != 64 {
            return Err(CryptoError::InvalidInput);
        }
        let mask_key = provider.aes_block.aes128(&key[..16])?;
        let mut blocks = Zeroizing::new(vec![[0u8; 16]; MAX_PACKET_LEN / 16]);
        for (i, block) in blocks.iter_mut().enumerate() {
            block[8..].copy_from_slice(&(i as u64).to_be_bytes());
        }
        mask_key.encrypt_blocks(&mut blocks);
        let mut mask = Zeroizing::new(Vec::with_capacity(MASK_WORDS));
        for block in blocks.iter() {
            mask.push(u64::from_le_bytes(word(block, 0)));
            mask.push(u64::from_le_bytes(word(block, 8)));
        }
        Ok(Ifg {
            mask,
            per_packet: provider.aes_block.aes128(&key[16..32])?,
            bin_a: Umac::new(provider, &key[32..48], 4)?,
            bin_b: Umac::new(provider, &key[48..64], 4)?,
            outer: provider.keyed_blake3,
        })
    }

    /// Tags `data` for packet `seq` into `out` (8 bytes).
    pub fn tag(&self, seq: u64, data: &[u8], out: &mut [u8]) -> Result<(), CryptoError> {
        if out.len() != TAG_LEN || data.len() > MAX_PACKET_LEN {
            return Err(CryptoError::InvalidInput);
        }
        // Secondary key for this packet: offset and outer PRF key.
        let mut secondary = Zeroizing::new([[0u8; 16]; 3]);
        for (i, block) in secondary.iter_mut().enumerate() {
            block[..8].copy_from_slice(&seq.to_be_bytes());
            block[8] = i as u8;
        }
        self.per_packet.encrypt_blocks(&mut secondary[..]);
        let offset = u64::from_le_bytes(word(&secondary[0], 0)) as usize;
        let mut outer_key = Zeroizing::new([0u8; 32]);
        outer_key[..16].copy_from_slice(&secondary[1]);
        outer_key[16..].copy_from_slice(&secondary[2]);

        let mut h_a = [0u8; 4];
        let mut h_b = [0u8; 4];
        BINS.with(|bins| {
            // Per-thread bins: scattering must not allocate per packet. If they are somehow
            // in use (they are not re-entered today), use fresh ones.
            let mut fresh = (Vec::new(), Vec::new());
            let mut borrowed = bins.try_borrow_mut();
            let (bin_a, bin_b) = match borrowed.as_deref_mut() {
                Ok(b) => b,
                Err(_) => &mut fresh,
            };
            let n = scatter_into(data, &self.mask, offset, bin_a, bin_b);
            self.bin_a.uhash(&bin_a[..n], &mut h_a);
            self.bin_b.uhash(&bin_b[..n], &mut h_b);
        });
        self.outer.hash(
            &outer_key,
            &[
                b"cohort ifg",
                &(data.len() as u64).to_le_bytes(),
                &h_a,
                &h_b,
            ],
            out,
        );
        Ok(())
    }
}

fn word(bytes: &[u8], at: usize) -> [u8; 8] {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    w
}

thread_local! {
    /// Reused bins, so tagging does not allocate per packet.
    static BINS: std::cell::RefCell<(Vec<u8>, Vec<u8>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// [`scatter`] into caller-owned bins, grown as needed and never shrunk; returns how many
/// bytes of each bin hold this message's scattered words.
pub fn scatter_into(
    data: &[u8],
    mask: &[u64],
    offset: usize,
    bin_a: &mut Vec<u8>,
    bin_b: &mut Vec<u8>,
) -> usize {
    let pairs = data.len().div_ceil(16);
    let n = pairs * 8;
    if bin_a.len() < n {
        bin_a.resize(n, 0);
    }
    if bin_b.len() < n {
        bin_b.resize(n, 0);
    }
    if mask.is_empty() {
        return 0;
    }
    let full = data.len() / 16;
    let mut m = offset % mask.len();
    let mut done = 0;
    // Whole pairs, in runs that do not wrap around the mask, so each run is a simple zip the
    // compiler can vectorize.
    while done < full {
        let run = (full - done).min(mask.len() - m);
        let src = &data[done * 16..(done + run) * 16];
        let a = &mut bin_a[done * 8..(done + run) * 8];
        let b = &mut bin_b[done * 8..(done + run) * 8];
        for (((pair, mk), wa), wb) in src
            .chunks_exact(16)
            .zip(&mask[m..m + run])
            .zip(a.chunks_exact_mut(8))
            .zip(b.chunks_exact_mut(8))
        {
            let x = u64::from_le_bytes(word(pair, 0));
            let y = u64::from_le_bytes(word(pair, 8));
            wa.copy_from_slice(&((x & mk) | (y & !mk)).to_le_bytes());
            wb.copy_from_slice(&((x | mk) & (y | !mk)).to_le_bytes());
        }
        done += run;
        m = (m + run) % mask.len();
    }
    if pairs > full {
        let mut pair = [0u8; 16];
        let rest = &data[full * 16..];
        pair[..rest.len()].copy_from_slice(rest);
        let (x, y) = (
            u64::from_le_bytes(word(&pair, 0)),
            u64::from_le_bytes(word(&pair, 8)),
        );
        let mk = mask[m];
        bin_a[full * 8..n].copy_from_slice(&((x & mk) | (y & !mk)).to_le_bytes());
        bin_b[full * 8..n].copy_from_slice(&((x | mk) & (y | !mk)).to_le_bytes());
    }
    n
}

/// ScatterBits of ACSA Appendix A: for each pair of words (X, Y) and the next mask word M
/// (starting at `offset`, wrapping around the mask), push `(X & M) | (Y & !M)` into bin A and
/// `(X | M) & (Y | !M)` into bin B. The data is zero-padded to whole 16-byte pairs.
///
/// This is the reference form, one word at a time; tagging uses [`scatter_into`], and a
/// test checks that the two agree.
pub fn scatter(data: &[u8], mask: &[u64], offset: usize) -> (Vec<u8>, Vec<u8>) {
    let pairs = data.len().div_ceil(16);
    let mut bin_a = Vec::with_capacity(pairs * 8);
    let mut bin_b = Vec::with_capacity(pairs * 8);
    let n = mask.len();
    let mut m = offset % n.max(1);
    let mut scatter_pair = |pair: &[u8; 16], bin_a: &mut Vec<u8>, bin_b: &mut Vec<u8>| {
        let x = u64::from_le_bytes(word(pair, 0));
        let y = u64::from_le_bytes(word(pair, 8));
        let mk = mask[m];
        m = if m + 1 == n { 0 } else { m + 1 };
        bin_a.extend_from_slice(&((x & mk) | (y & !mk)).to_le_bytes());
        bin_b.extend_from_slice(&((x | mk) & (y | !mk)).to_le_bytes());
    };
    let mut chunks = data.chunks_exact(16);
    for chunk in &mut chunks {
        let mut pair = [0u8; 16];
        pair.copy_from_slice(chunk);
        scatter_pair(&pair, &mut bin_a, &mut bin_b);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut pair = [0u8; 16];
        pair[..rest.len()].copy_from_slice(rest);
        scatter_pair(&pair, &mut bin_a, &mut bin_b);
    }
    (bin_a, bin_b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_follows_appendix_a_and_is_invertible() {
        let mut data = Vec::new();
        data.extend_from_slice(&0x0123_4567_89ab_cdefu64.to_le_bytes());
        data.extend_from_slice(&0xfedc_ba98_7654_3210u64.to_le_bytes());
        let mask = [0x00ff_00ff_00ff_00ffu64, 0];
        let (a, b) = scatter(&data, &mask, 0);
        let a = u64::from_le_bytes(word(&a, 0));
        let b = u64::from_le_bytes(word(&b, 0));
        assert_eq!(a, 0xfe23_ba67_76ab_32ef);
        assert_eq!(b, 0x01dc_4598_8954_cd10);
        // Recover X and Y from the bins: marked bits of X are in A, unmarked in B.
        let m = mask[0];
        let x = (a & m) | (b & !m);
        let y = (a & !m) | (b & m);
        assert_eq!(x, 0x0123_4567_89ab_cdef);
        assert_eq!(y, 0xfedc_ba98_7654_3210);
    }

    #[test]
    fn offset_wraps_and_pads() {
        let mask = [1u64, 2, 3];
        let (a, _) = scatter(&[0xffu8; 20], &mask, 5);
        assert_eq!(a.len(), 16); // 20 bytes pad to two pairs
                                 // Pair 0 uses mask[5 % 3] = 3, pair 1 wraps to mask[0] = 1.
        let a0 = u64::from_le_bytes(word(&a, 0));
        assert_eq!(a0, u64::MAX); // X = Y = all ones
        let a1 = u64::from_le_bytes(word(&a, 8));
        assert_eq!(a1, 1); // X = 0xffffffff, Y = 0: only the marked bit of X survives
    }

    #[test]
    fn fast_scatter_matches_the_reference() {
        let mask: Vec<u64> = (0..37u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let (mut a, mut b) = (vec![0xffu8; 3], Vec::new());
        for len in [0usize, 1, 15, 16, 17, 100, 592, 600, 1000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            for offset in [0usize, 5, 36, 40] {
                let (ra, rb) = scatter(&data, &mask, offset);
                let n = scatter_into(&data, &mask, offset, &mut a, &mut b);
                assert_eq!(n, ra.len(), "len {len} offset {offset}");
                assert_eq!(&a[..n], &ra[..], "len {len} offset {offset}");
                assert_eq!(&b[..n], &rb[..], "len {len} offset {offset}");
            }
        }
    }

    #[test]
    fn every_single_bit_flip_changes_the_tag() {
        let ifg = Ifg::new(&CryptoProvider::default_provider(), &[3u8; 64]).unwrap();
        let data: Vec<u8> = (0..100u8).collect();
        let mut t = [0u8; 8];
        ifg.tag(9, &data, &mut t).unwrap();
        for bit in 0..data.len() * 8 {
            let mut d = data.clone();
            d[bit / 8] ^= 1 << (bit % 8);
            let mut t2 = [0u8; 8];
            ifg.tag(9, &d, &mut t2).unwrap();
            assert_ne!(t, t2, "bit {bit}");
        }
        // Appending a zero byte changes the length, so the tag.
        let mut longer = data.clone();
        longer.push(0);
        let mut t3 = [0u8; 8];
        ifg.tag(9, &longer, &mut t3).unwrap();
        assert_ne!(t, t3);
    }
}
