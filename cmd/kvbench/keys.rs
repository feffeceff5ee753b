//! Key generation as etcd's benchmark does it: a number in `[0, key-space-size)` (random or
//! sequential) encoded into a fixed `--key-size`-byte key, so the key space is exactly the
//! requested size whatever the key size.

use rand::Rng;

use crate::KeyArgs;

#[derive(Debug, Clone)]
pub struct KeyGen {
    size: usize,
    space: u64,
    sequential: bool,
}

impl KeyGen {
    pub fn new(a: &KeyArgs) -> anyhow::Result<Self> {
        anyhow::ensure!(a.key_size > 0, "--key-size must be positive");
        anyhow::ensure!(a.key_space_size > 0, "--key-space-size must be positive");
        // Fewer key bytes than needed to tell the key space apart would silently shrink it.
        let needed = (64 - (a.key_space_size - 1).leading_zeros()).div_ceil(8) as usize;
        anyhow::ensure!(
            a.key_size >= needed,
            "--key-size {} is too small for --key-space-size {}",
            a.key_size,
            a.key_space_size
        );
        Ok(KeyGen {
            size: a.key_size,
            space: a.key_space_size,
            sequential: a.sequential_keys,
        })
    }

    /// The key for the `i`-th request.
    pub fn key(&self, i: u64) -> Vec<u8> {
        self.keys(i, 1).pop().expect("one key")
    }

    /// `count` distinct consecutive keys (mod the key space) for the `i`-th request: a
    /// transaction may not put the same key twice.
    pub fn keys(&self, i: u64, count: u64) -> Vec<Vec<u8>> {
        let first = if self.sequential {
            i.wrapping_mul(count) % self.space
        } else {
            rand::thread_rng().gen_range(0..self.space)
        };
        (0..count)
            .map(|j| self.encode((first + j) % self.space))
            .collect()
    }

    pub fn space(&self) -> u64 {
        self.space
    }

    fn encode(&self, n: u64) -> Vec<u8> {
        let mut k = vec![0u8; self.size];
        let be = n.to_be_bytes();
        let take = self.size.min(8);
        k[self.size - take..].copy_from_slice(&be[8 - take..]);
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(size: usize, space: u64, seq: bool) -> KeyArgs {
        KeyArgs {
            key_size: size,
            val_size: 8,
            key_space_size: space,
            sequential_keys: seq,
        }
    }

    #[test]
    fn sequential_keys_wrap_and_have_the_requested_size() {
        let g = KeyGen::new(&args(8, 3, true)).unwrap();
        assert_eq!(g.key(0), vec![0; 8]);
        assert_eq!(g.key(4), vec![0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(KeyGen::new(&args(16, 1, false)).unwrap().key(9).len(), 16);
        let g = KeyGen::new(&args(8, 10, false)).unwrap();
        let ks = g.keys(0, 10);
        let set: std::collections::BTreeSet<_> = ks.iter().collect();
        assert_eq!(set.len(), 10);
    }

    #[test]
    fn too_small_keys_are_refused() {
        assert!(KeyGen::new(&args(1, 257, false)).is_err());
        assert!(KeyGen::new(&args(1, 256, false)).is_ok());
    }
}
