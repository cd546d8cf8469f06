//! One LSGC pair-key exchange in memory: a KDC with two principals, the leader's request,
//! the KDC's answer, and the secret σ both sides end up with. Cheap; prints sizes and
//! whether both sides agree, never a key.
//!
//! ```sh
//! cargo run -p cohort-kdc --example pair_keys
//! ```

use cohort_crypto::CryptoProvider;
use cohort_kdc::{member_shared_key, Kdc, PairKeyRequest, PrincipalKey, PrincipalName, Registry};
use rand_core::{OsRng, RngCore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = CryptoProvider::default_provider();
    let leader = PrincipalName::new("leader")?;
    let alice = PrincipalName::new("alice")?;
    let k_leader = PrincipalKey::generate(&mut OsRng);
    let k_alice = PrincipalKey::generate(&mut OsRng);
    let mut registry = Registry::new();
    registry.insert(leader, k_leader.clone());
    registry.insert(alice, k_alice.clone());
    let mut kdc = Kdc::new(provider, registry);

    let mut nonce = [0u8; 16];
    OsRng.fill_bytes(&mut nonce);
    let request = PairKeyRequest::new(&provider, leader, &k_leader, alice, nonce)?;
    let handled = kdc.handle("127.0.0.1:7000".parse()?, request.bytes());
    let response = handled.reply.ok_or("the KDC did not answer")?;
    let at_leader = request.open_response(&response)?;
    let at_alice = member_shared_key(&provider, &k_alice, &leader);

    println!(
        "request {} bytes, response {} bytes",
        request.bytes().len(),
        response.len()
    );
    println!("kdc: {}", handled.outcome);
    println!("leader and alice share sigma: {}", at_leader == at_alice);
    Ok(())
}
