//! mcrouter's placement building blocks: its routing key, MurmurHash64A, the furc bit
//! tree walk, and SpookyHash V2 (32-bit form).
//!
//! Written from the published descriptions of the algorithms (Austin Appleby's
//! MurmurHash2 64A, Bob Jenkins' public-domain SpookyHash V2, and the plain-language
//! description of mcrouter's furc in `tests/golden/mcrouter/README.md`), not from mcrouter's
//! code. The golden vectors in `tests/golden/mcrouter/mcrouter-*.tsv`, generated from mcrouter's
//! own hashing code, pin every value (see `tests/mcrouter_golden.rs`).
//!
//! ```text
//!   key --routing_key--> "/region/cluster/" dropped, cut at the first "|#|"
//!       --murmur64a(seed 0xF9F198EF)--> word 0 --murmur64a(word j)--> word j+1 ...
//!       --furc: up to 32 tries of a bit-tree walk with stride 23--> index < n
//! ```

/// Seed furc always gives MurmurHash64A.
const FURC_SEED: u64 = 0xF9F1_98EF;
/// Distance between the bits furc reads; also why pools are capped at 2^23 servers.
const FURC_SHIFT: u32 = 23;
/// Tries before furc gives up and answers 0.
const FURC_TRIES: u32 = 32;
/// The largest pool mcrouter accepts for Ch3 and WeightedCh3.
pub const FURC_MAX_SERVERS: usize = 1 << FURC_SHIFT;

/// The part of `key` mcrouter hashes: an optional routing prefix `/region/cluster/` is
/// dropped (only when the key starts with `/` and has two more slashes; the names are not
/// checked), then the rest is cut at the first hash stop `|#|`.
#[inline]
pub fn routing_key(key: &[u8]) -> &[u8] {
    let rest = match crate::routing_prefix::prefix_len(key) {
        Some(len) => &key[len..],
        None => key,
    };
    match rest.windows(3).position(|w| w == b"|#|") {
        Some(stop) => &rest[..stop],
        None => rest,
    }
}

/// MurmurHash64A (MurmurHash2, 64-bit "A" variant), little-endian blocks.
pub fn murmur64a(key: &[u8], seed: u64) -> u64 {
    const M: u64 = 0xC6A4_A793_5BD1_E995;
    const R: u32 = 47;
    let mut h = seed ^ (key.len() as u64).wrapping_mul(M);
    let mut blocks = key.chunks_exact(8);
    for block in &mut blocks {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(block);
        let mut k = u64::from_le_bytes(bytes);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut bytes = [0u8; 8];
        bytes[..tail.len()].copy_from_slice(tail);
        h ^= u64::from_le_bytes(bytes);
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

/// Words of furc's bit stream kept on the stack; pools up to a few thousand servers never
/// need more, larger ones spill to the heap (rare, and only then allocates).
const STREAM_WORDS_INLINE: usize = 16;

/// furc's endless bit stream: word 0 is MurmurHash64A of the key, each later word the
/// hash of the previous word's 8 little-endian bytes. Words are computed when first read.
struct BitStream {
    inline: [u64; STREAM_WORDS_INLINE],
    spill: Vec<u64>,
    len: usize,
}

impl BitStream {
    fn new(key: &[u8]) -> BitStream {
        let mut inline = [0u64; STREAM_WORDS_INLINE];
        inline[0] = murmur64a(key, FURC_SEED);
        BitStream {
            inline,
            spill: Vec::new(),
            len: 1,
        }
    }

    fn word(&self, i: usize) -> u64 {
        if i < STREAM_WORDS_INLINE {
            self.inline[i]
        } else {
            self.spill[i - STREAM_WORDS_INLINE]
        }
    }

    #[inline]
    fn bit(&mut self, position: u32) -> u64 {
        let index = (position / 64) as usize;
        while self.len <= index {
            let next = murmur64a(&self.word(self.len - 1).to_le_bytes(), FURC_SEED);
            if self.len < STREAM_WORDS_INLINE {
                self.inline[self.len] = next;
            } else {
                self.spill.push(next);
            }
            self.len += 1;
        }
        (self.word(index) >> (position % 64)) & 1
    }
}

/// furc: a consistent hash of `key` onto `0..m` (mcrouter's Ch3). Growing a pool from m
/// to m+1 servers moves a key only to the new server m.
///
/// The walk: d is the bit length of m-1; the top bit of the answer is chosen by reading
/// stream bits at d, d-1, ... until one is set; the lower d-1 bits are read 23 positions
/// apart after it. An answer >= m starts another try further along the stream (the
/// position is never reset; d keeps its lowered value). After 32 failed tries: 0.
pub fn furc(key: &[u8], m: u32) -> u32 {
    if m <= 1 {
        return 0;
    }
    let mut stream = BitStream::new(key);
    let mut d = 32 - (m - 1).leading_zeros();
    let mut a = d;
    for _ in 0..FURC_TRIES {
        while stream.bit(a) == 0 {
            d -= 1;
            if d == 0 {
                return 0;
            }
            a = d;
        }
        a += FURC_SHIFT;
        let mut num: u32 = 1;
        for _ in 0..d - 1 {
            num = (num << 1) | stream.bit(a) as u32;
            a += FURC_SHIFT;
        }
        if num < m {
            return num;
        }
    }
    0
}

/// mcrouter's Crc32 placement: the standard CRC-32 of the routing key, its low 31 bits,
/// modulo `n` (no limit on n; 0 for n = 0).
#[inline]
pub fn crc32_index(routing_key: &[u8], n: u64) -> u64 {
    u64::from(crate::hash::crc32a(routing_key) & 0x7FFF_FFFF)
        .checked_rem(n)
        .unwrap_or(0)
}

const SPOOKY_CONST: u64 = 0xdead_beef_dead_beef;
/// Messages shorter than this take SpookyHash's short path.
const SPOOKY_BUF_SIZE: usize = 192;
const SPOOKY_BLOCK_SIZE: usize = 96;

/// SpookyHash V2 `Hash32`: the 128-bit hash with both seeds set to `seed`, low 32 bits of
/// the first word.
pub fn spooky32(message: &[u8], seed: u32) -> u32 {
    let (h1, _) = spooky128(message, u64::from(seed), u64::from(seed));
    h1 as u32
}

/// SpookyHash V2 128-bit hash.
pub fn spooky128(message: &[u8], seed1: u64, seed2: u64) -> (u64, u64) {
    if message.len() < SPOOKY_BUF_SIZE {
        return spooky_short(message, seed1, seed2);
    }
    let mut h = [0u64; 12];
    for i in (0..12).step_by(3) {
        h[i] = seed1;
        h[i + 1] = seed2;
        h[i + 2] = SPOOKY_CONST;
    }
    // State word order h0..h11 as in the reference: h0,h3,h6,h9 = seed1; h1,h4,h7,h10 =
    // seed2; h2,h5,h8,h11 = const. The loop above writes exactly that.
    let mut blocks = message.chunks_exact(SPOOKY_BLOCK_SIZE);
    for block in &mut blocks {
        let data = words::<12>(block);
        spooky_mix(&data, &mut h);
    }
    let tail = blocks.remainder();
    let mut last = [0u8; SPOOKY_BLOCK_SIZE];
    last[..tail.len()].copy_from_slice(tail);
    last[SPOOKY_BLOCK_SIZE - 1] = tail.len() as u8;
    let data = words::<12>(&last);
    for (state, word) in h.iter_mut().zip(data) {
        *state = state.wrapping_add(word);
    }
    for _ in 0..3 {
        spooky_end_partial(&mut h);
    }
    (h[0], h[1])
}

/// Little-endian u64 words of `bytes` (whose length is at least 8 * N).
fn words<const N: usize>(bytes: &[u8]) -> [u64; N] {
    let mut out = [0u64; N];
    for (word, chunk) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        *word = u64::from_le_bytes(b);
    }
    out
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

fn le_u32(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u64::from(u32::from_le_bytes(b))
}

fn spooky_short(message: &[u8], seed1: u64, seed2: u64) -> (u64, u64) {
    let length = message.len();
    let (mut a, mut b, mut c, mut d) = (seed1, seed2, SPOOKY_CONST, SPOOKY_CONST);
    let mut rest = message;
    if length > 15 {
        let mut chunks = rest.chunks_exact(32);
        for chunk in &mut chunks {
            c = c.wrapping_add(le_u64(chunk, 0));
            d = d.wrapping_add(le_u64(chunk, 8));
            short_mix(&mut a, &mut b, &mut c, &mut d);
            a = a.wrapping_add(le_u64(chunk, 16));
            b = b.wrapping_add(le_u64(chunk, 24));
        }
        rest = chunks.remainder();
        if rest.len() >= 16 {
            c = c.wrapping_add(le_u64(rest, 0));
            d = d.wrapping_add(le_u64(rest, 8));
            short_mix(&mut a, &mut b, &mut c, &mut d);
            rest = &rest[16..];
        }
    }
    d = d.wrapping_add((length as u64) << 56);
    let byte = |i: usize| u64::from(rest[i]);
    // The reference's fall-through switch on the remaining length, written out: bytes 8..
    // go into d, bytes 0..8 into c, whole words read as little-endian where they fit.
    match rest.len() {
        0 => {
            c = c.wrapping_add(SPOOKY_CONST);
            d = d.wrapping_add(SPOOKY_CONST);
        }
        n @ 1..=3 => {
            let mut v = 0;
            for i in 0..n {
                v |= byte(i) << (8 * i);
            }
            c = c.wrapping_add(v);
        }
        n @ 4..=7 => {
            let mut v = le_u32(rest, 0);
            for i in 4..n {
                v |= byte(i) << (8 * i);
            }
            c = c.wrapping_add(v);
        }
        n @ 8..=11 => {
            let mut v = 0;
            for i in 8..n {
                v |= byte(i) << (8 * (i - 8));
            }
            d = d.wrapping_add(v);
            c = c.wrapping_add(le_u64(rest, 0));
        }
        n => {
            // 12..=15
            let mut v = le_u32(rest, 8);
            for i in 12..n {
                v |= byte(i) << (8 * (i - 8));
            }
            d = d.wrapping_add(v);
            c = c.wrapping_add(le_u64(rest, 0));
        }
    }
    short_end(&mut a, &mut b, &mut c, &mut d);
    (a, b)
}

#[inline(always)]
fn short_mix(h0: &mut u64, h1: &mut u64, h2: &mut u64, h3: &mut u64) {
    macro_rules! step {
        ($x:ident, $r:expr, $y:ident, $z:ident) => {
            *$x = $x.rotate_left($r);
            *$x = $x.wrapping_add(*$y);
            *$z ^= *$x;
        };
    }
    step!(h2, 50, h3, h0);
    step!(h3, 52, h0, h1);
    step!(h0, 30, h1, h2);
    step!(h1, 41, h2, h3);
    step!(h2, 54, h3, h0);
    step!(h3, 48, h0, h1);
    step!(h0, 38, h1, h2);
    step!(h1, 37, h2, h3);
    step!(h2, 62, h3, h0);
    step!(h3, 34, h0, h1);
    step!(h0, 5, h1, h2);
    step!(h1, 36, h2, h3);
}

#[inline(always)]
fn short_end(h0: &mut u64, h1: &mut u64, h2: &mut u64, h3: &mut u64) {
    macro_rules! step {
        ($x:ident, $y:ident, $r:expr) => {
            *$x ^= *$y;
            *$y = $y.rotate_left($r);
            *$x = $x.wrapping_add(*$y);
        };
    }
    step!(h3, h2, 15);
    step!(h0, h3, 52);
    step!(h1, h0, 26);
    step!(h2, h1, 51);
    step!(h3, h2, 28);
    step!(h0, h3, 9);
    step!(h1, h0, 47);
    step!(h2, h1, 54);
    step!(h3, h2, 32);
    step!(h0, h3, 25);
    step!(h1, h0, 63);
}

/// One 96-byte block of the long path.
fn spooky_mix(data: &[u64; 12], s: &mut [u64; 12]) {
    const ROT: [u32; 12] = [11, 32, 43, 31, 17, 28, 39, 57, 55, 54, 22, 46];
    for i in 0..12 {
        s[i] = s[i].wrapping_add(data[i]);
        s[(i + 2) % 12] ^= s[(i + 10) % 12];
        s[(i + 11) % 12] ^= s[i];
        s[i] = s[i].rotate_left(ROT[i]);
        s[(i + 11) % 12] = s[(i + 11) % 12].wrapping_add(s[(i + 1) % 12]);
    }
}

fn spooky_end_partial(h: &mut [u64; 12]) {
    const ROT: [u32; 12] = [44, 15, 34, 21, 38, 33, 10, 13, 38, 53, 42, 54];
    for i in 0..12 {
        h[(i + 11) % 12] = h[(i + 11) % 12].wrapping_add(h[(i + 1) % 12]);
        h[(i + 2) % 12] ^= h[(i + 11) % 12];
        h[(i + 1) % 12] = h[(i + 1) % 12].rotate_left(ROT[i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_key_follows_mcrouters_rules() {
        let cases: &[(&str, &str)] = &[
            ("/r/c/foo", "foo"),
            ("/r/c/d/e", "d/e"),
            ("/*/*/key", "key"),
            ("/r//key", "key"),
            ("///x", "x"),
            ("/r/c/", ""),
            ("/r/c", "/r/c"),
            ("//x", "//x"),
            ("x/r/c/key", "x/r/c/key"),
            ("foo|#|bar|#|baz", "foo"),
            ("|#|foo", ""),
            ("foo||#|bar", "foo|"),
            ("foo|#bar", "foo|#bar"),
            ("/a|#|b/c/key", "key"),
            ("/region/cluster/foo:key|#|etc", "foo:key"),
        ];
        for (key, expected) in cases {
            assert_eq!(routing_key(key.as_bytes()), expected.as_bytes(), "{key}");
        }
    }

    #[test]
    fn worked_examples_from_the_description() {
        assert_eq!(murmur64a(b"sample", FURC_SEED), 0x8cc7_3127_cf81_62db);
        assert_eq!(furc(b"sample", 100), 97);
        assert_eq!(furc(b"k18", 100), 57);
        assert_eq!(furc(b"", 100), 72);
        assert_eq!(furc(b"", 8_388_608), 6_173_600);
        assert_eq!(spooky32(b"sample", 0xFACE_2014), 2_799_352_910);
    }
}
