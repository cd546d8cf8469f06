//! RFC 4418 test vectors (with verified erratum 3507), parsed from `vectors/umac-rfc4418.txt`.
//!
//! Every row is checked: the 32-, 64- and 96-bit tags of the first table and the full 128-bit
//! tags of the second, including the `'a' * 2^25` row that reaches POLY-128.
//!
//! Every NH implementation is checked on its own ([`NhPath`]): the default one, then the
//! portable fallback, AVX2 and AVX-512 forced. A path this CPU cannot run is reported with a
//! SKIPPED message on stderr (so the README's test command passes on any CPU), or fails its
//! test when `COHORT_NH_REQUIRE_ALL=1` is set.

use cohort_crypto::CryptoProvider;
use cohort_gears::umac::{NhPath, Umac};

const VECTORS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../vectors/umac-rfc4418.txt"
));

/// The quoted string after `label` on its line, e.g. `Key   K = "abcdefghijklmnop"`.
fn quoted_after(text: &str, label: &str) -> Vec<u8> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no line starting with {label:?}"));
    let start = line.find('"').expect("opening quote") + 1;
    let end = start + line[start..].find('"').expect("closing quote");
    line.as_bytes()[start..end].to_vec()
}

/// A message description: `<empty>`, or `'s' * n` with `n` decimal or `2^e`.
fn parse_message(tokens: &[&str]) -> Option<(Vec<u8>, usize)> {
    if tokens.first() == Some(&"<empty>") {
        return Some((Vec::new(), 1));
    }
    if tokens.len() < 3 || tokens[1] != "*" {
        return None;
    }
    let s = tokens[0].strip_prefix('\'')?.strip_suffix('\'')?;
    let n: usize = match tokens[2].split_once('^') {
        Some((base, exp)) => base.parse::<usize>().ok()?.pow(exp.parse().ok()?),
        None => tokens[2].parse().ok()?,
    };
    Some((s.repeat(n).into_bytes(), 3))
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.len().is_multiple_of(2) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// One expected tag: message description, message, tag.
struct Case {
    what: String,
    message: Vec<u8>,
    tag: Vec<u8>,
}

/// All table rows: lines that start with a message description followed by hex tags.
fn parse_cases(text: &str) -> (usize, Vec<Case>) {
    let mut rows = 0;
    let mut cases = Vec::new();
    for line in text.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if !matches!(tokens.first(), Some(t) if t.starts_with('\'') || *t == "<empty>") {
            continue;
        }
        let Some((message, used)) = parse_message(&tokens) else {
            continue;
        };
        let tags: Vec<&str> = tokens[used..]
            .iter()
            .copied()
            .take_while(|t| is_hex(t))
            .collect();
        if tags.is_empty() {
            continue;
        }
        rows += 1;
        let what = tokens[..used].join(" ");
        for tag in tags {
            cases.push(Case {
                what: what.clone(),
                message: message.clone(),
                tag: unhex(tag),
            });
        }
    }
    (rows, cases)
}

/// Whether `path` can be tested here; prints SKIPPED (or, with `COHORT_NH_REQUIRE_ALL=1`,
/// panics) when this CPU cannot run it, so a missing path is always reported.
fn can_test(path: NhPath) -> bool {
    if path.is_supported() {
        return true;
    }
    let msg = format!(
        "this CPU cannot run the {} NH path: its RFC 4418 vectors are NOT tested here",
        path.name()
    );
    if std::env::var_os("COHORT_NH_REQUIRE_ALL").is_some_and(|v| v == "1") {
        panic!("{msg} (COHORT_NH_REQUIRE_ALL=1)");
    }
    eprintln!("SKIPPED: {msg}");
    false
}

#[test]
fn rfc4418_vectors() {
    check_vectors(None);
}

#[test]
fn rfc4418_vectors_portable() {
    check_vectors(Some(NhPath::Portable));
}

#[test]
fn rfc4418_vectors_avx2() {
    if can_test(NhPath::Avx2) {
        check_vectors(Some(NhPath::Avx2));
    }
}

#[test]
fn rfc4418_vectors_avx512() {
    if can_test(NhPath::Avx512) {
        check_vectors(Some(NhPath::Avx512));
    }
}

/// Checks every vector with NH forced to `path` (the key's default when `None`).
fn check_vectors(path: Option<NhPath>) {
    let key = quoted_after(VECTORS, "Key");
    let nonce = quoted_after(VECTORS, "Nonce");
    assert_eq!(key, b"abcdefghijklmnop");
    assert_eq!(nonce, b"bcdefghi");

    let (rows, cases) = parse_cases(VECTORS);
    // 8 messages in the 32/64/96-bit table and again in the 128-bit table.
    assert_eq!(rows, 16, "table rows parsed");
    assert_eq!(cases.len(), 32, "tags parsed (8 messages x 4 tag lengths)");

    let p = CryptoProvider::default_provider();
    let mut checked = [0usize; 17];
    for case in &cases {
        let tag_len = case.tag.len();
        let mut umac = Umac::new(&p, &key, tag_len).expect("valid key and tag length");
        if let Some(path) = path {
            umac.set_nh_path(path).expect("path supported");
            assert_eq!(umac.nh_path(), path);
        }
        let mut out = vec![0u8; tag_len];
        umac.tag(&nonce, &case.message, &mut out)
            .expect("valid nonce");
        assert_eq!(
            out,
            case.tag,
            "UMAC-{} of {} ({} bytes), NH path {}",
            tag_len * 8,
            case.what,
            case.message.len(),
            umac.nh_path().name()
        );
        checked[tag_len] += 1;
    }
    for tag_len in [4, 8, 12, 16] {
        assert_eq!(
            checked[tag_len], 8,
            "messages checked for {tag_len}-byte tags"
        );
    }
    assert!(
        cases.iter().any(|c| c.message.len() == 1 << 25),
        "the 2^25-byte row (POLY-128) must be among the checks"
    );
}
