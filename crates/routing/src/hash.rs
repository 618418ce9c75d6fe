//! twemproxy's key hash functions (nutcracker 0.5.0 `src/hashkit`), plus xxh3.
use memroute_config::HashName;

/// A key hash function, as named in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashFn(pub HashName);

impl HashFn {
    /// 32-bit hash of `key`, exactly as twemproxy computes it (including its quirks,
    /// such as sign-extended bytes where the C code uses `char`).
    pub fn hash(&self, key: &[u8]) -> u32 {
        let _ = key;
        todo!("routing helper implements")
    }
}

/// twemproxy's hash_tag: when the key contains the tag's opening byte followed later by
/// the closing byte, and the part between them is non-empty, only that part is hashed.
pub fn hash_key_part(key: &[u8], tag: Option<[u8; 2]>) -> &[u8] {
    let _ = tag;
    key
}
