//! Finding the end of a short word (a key) eight bytes at a time.
//!
//! Keys are 10-250 bytes, usually 15-40. A byte loop pays a load, two compares and a
//! branch per byte, and a vectorised search (memchr) costs more to set up than a short
//! key takes to scan; a 64-bit word tests eight bytes in a handful of operations (the
//! classic "has a zero byte" bit trick on `word ^ pattern`).

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// A mask with the high bit set in the lowest byte of `word` equal to `byte` (and maybe in
/// bytes above it: the trick's borrow can mark those, never a lower one), zero if none.
#[inline(always)]
fn bytes_equal(word: u64, byte: u8) -> u64 {
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// The first index at or after `from` holding `a` or `b`, `None` when neither is in
/// `bytes[from..]`.
#[inline]
pub(crate) fn find_either(bytes: &[u8], from: usize, a: u8, b: u8) -> Option<usize> {
    let mut at = from;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let found = bytes_equal(word, a) | bytes_equal(word, b);
        if found != 0 {
            // The lowest marked byte is a true match (see `bytes_equal`).
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = bytes.get(at..)?;
    tail.iter().position(|&x| x == a || x == b).map(|i| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_a_byte_loop_finds() {
        let naive = |bytes: &[u8], from: usize, a: u8, b: u8| {
            (from..bytes.len()).find(|&i| bytes[i] == a || bytes[i] == b)
        };
        // Every position of a match (and none) in lines of every length up to 40, with
        // bytes that differ from the target by one bit and 0x80-ish bytes around it.
        let filler = [b'k', b'!', 0x21, 0xa0, 0x80, 0xff, 0x00, 0x01];
        for len in 0..40usize {
            for target in (0..=len).map(Some).chain([None]) {
                for (f, &fill) in filler.iter().enumerate() {
                    let mut bytes: Vec<u8> = (0..len).map(|i| filler[(i + f) % 8] ^ fill).collect();
                    bytes
                        .iter_mut()
                        .filter(|b| **b == b' ' || **b == b'\n')
                        .for_each(|b| *b = b'x');
                    if let Some(t) = target.filter(|&t| t < len) {
                        bytes[t] = if t % 2 == 0 { b' ' } else { b'\n' };
                        if t + 1 < len {
                            bytes[t + 1] = b' ';
                        }
                    }
                    for from in 0..=len {
                        assert_eq!(
                            find_either(&bytes, from, b' ', b'\n'),
                            naive(&bytes, from, b' ', b'\n'),
                            "{bytes:?} from {from}"
                        );
                    }
                }
            }
        }
        assert_eq!(find_either(b"abc", 5, b' ', b'\n'), None);
    }
}
