//! A control byte, then datagrams, into a member of a formed two-member group, which then
//! runs two virtual seconds with its peer (the control byte can switch the group to the null
//! gear and have the harness seal each datagram as the peer's, so the fuzzer reaches the
//! protocol's handlers): it must never panic, and under AES-GCM it never delivers a message
//! no member sent, nor breaks up the group.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cohort_group::fuzzing::member_datagram(data);
});
