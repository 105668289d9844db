//! Interning of names and values to dense `u32` ids.
//!
//! All keys of one interner live in a single byte arena; the hash table holds only ids. This
//! keeps millions of cells, transaction ids and values compact and avoids one allocation per
//! key. Ids are dense (`0..len`) and stable for the life of the interner.

use std::hash::{BuildHasherDefault, Hasher};

/// A hash of a byte string: a multiply-rotate mix over 8-byte words, finished with the
/// 64-bit finaliser of MurmurHash3 so that the low bits used for table indexing are well mixed.
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    fmix64(h)
}

fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A fast hasher for integer keys (ids and packed id pairs) of the internal hash maps.
/// Not DoS-resistant; keys are ids we allocated, not attacker-chosen bytes.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        fmix64(self.0)
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_bytes(bytes) ^ self.0.rotate_left(7);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// `HashMap` with [`IdHasher`].
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// One table slot (16 bytes): a tag holding the key's length (capped at 31) in its top 5 bits
/// and 27 bits of its hash, `id + 1` (0: empty), and the key's first 8 bytes. Keys of up to 8
/// bytes (most ids and values) are compared without leaving the slot, so a successful lookup
/// usually costs one cache miss instead of three.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    tag: u32,
    id1: u32,
    prefix: [u8; 8],
}

const HASH_BITS: u32 = 0x07ff_ffff;

/// Entries of the recent-key cache (16 bytes each: 256 KiB).
const RECENT: usize = 1 << 14;

fn tag(key: &[u8], hash: u64) -> u32 {
    ((key.len().min(31) as u32) << 27) | (hash as u32 & HASH_BITS)
}

fn prefix(key: &[u8]) -> [u8; 8] {
    let mut p = [0u8; 8];
    let n = key.len().min(8);
    p[..n].copy_from_slice(&key[..n]);
    p
}

/// Byte-string interner with dense `u32` ids.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interner {
    /// All keys, back to back.
    arena: Vec<u8>,
    /// `ends[id]` is the end offset of key `id` in `arena` (its start is `ends[id - 1]`).
    ends: Vec<usize>,
    /// Direct-mapped cache of recently interned keys (same slot format), consulted first:
    /// traces mostly refer to recent transactions and recently written values, and this
    /// small table stays in cache while the main one does not.
    recent: Vec<Slot>,
    /// Open-addressing table with linear probing, at most 70% full (so at most 2^27 slots
    /// are addressed by the tag's hash bits; larger tables would only cluster).
    table: Vec<Slot>,
}

impl Interner {
    /// Number of distinct keys.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The key of `id`. Panics if `id` was not returned by this interner.
    pub(crate) fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.arena[start..self.ends[i]]
    }

    /// The key of `id` as text. Keys inserted with [`Interner::intern_str`] are UTF-8.
    pub(crate) fn get_str(&self, id: u32) -> &str {
        std::str::from_utf8(self.get(id)).unwrap_or("\u{fffd}")
    }

    /// Finds `key`: `Ok(id)`, or `Err(slot)` with the empty slot where it would go.
    #[inline]
    fn find(&self, key: &[u8], tag: u32) -> Result<u32, usize> {
        let mask = self.table.len() - 1;
        let mut i = (tag & HASH_BITS) as usize & mask;
        let pre = prefix(key);
        loop {
            let s = &self.table[i];
            if s.id1 == 0 {
                return Err(i);
            }
            if s.tag == tag && s.prefix == pre && (key.len() <= 8 || self.get(s.id1 - 1) == key) {
                return Ok(s.id1 - 1);
            }
            i = (i + 1) & mask;
        }
    }

    /// Id of `key`, inserting it if new.
    pub(crate) fn intern(&mut self, key: &[u8]) -> u32 {
        if (self.len() + 1) * 10 > self.table.len() * 7 {
            self.grow();
        }
        let tag = tag(key, hash_bytes(key));
        let pre = prefix(key);
        // Small tables stay in cache by themselves; the recent-key cache pays off for big ones.
        let use_recent = self.table.len() >= 4 * RECENT;
        if use_recent && self.recent.is_empty() {
            self.recent = vec![Slot::default(); RECENT];
        }
        let r = (tag as usize) & (RECENT - 1);
        if use_recent {
            let hit = self.recent[r];
            if hit.id1 != 0 && hit.tag == tag && hit.prefix == pre && (key.len() <= 8 || self.get(hit.id1 - 1) == key) {
                return hit.id1 - 1;
            }
        }
        let slot = match self.find(key, tag) {
            Ok(id) => Slot { tag, id1: id + 1, prefix: pre },
            Err(slot) => {
                let id = self.ends.len() as u32;
                self.arena.extend_from_slice(key);
                self.ends.push(self.arena.len());
                self.table[slot] = Slot { tag, id1: id + 1, prefix: pre };
                self.table[slot]
            }
        };
        if use_recent {
            self.recent[r] = slot;
        }
        slot.id1 - 1
    }

    /// Id of a text key, inserting it if new.
    pub(crate) fn intern_str(&mut self, key: &str) -> u32 {
        self.intern(key.as_bytes())
    }

    /// Id of `key` if it was interned.
    pub(crate) fn lookup(&self, key: &[u8]) -> Option<u32> {
        if self.table.is_empty() {
            return None;
        }
        self.find(key, tag(key, hash_bytes(key))).ok()
    }

    fn grow(&mut self) {
        let new_len = (self.table.len() * 2).max(16);
        let mut table = vec![Slot::default(); new_len];
        let mask = new_len - 1;
        for s in self.table.iter().filter(|s| s.id1 != 0) {
            let mut i = (s.tag & HASH_BITS) as usize & mask;
            while table[i].id1 != 0 {
                i = (i + 1) & mask;
            }
            table[i] = *s;
        }
        self.table = table;
    }

    /// Bytes held, for memory accounting.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.arena.capacity()
            + self.ends.capacity() * std::mem::size_of::<usize>()
            + (self.table.capacity() + self.recent.capacity()) * std::mem::size_of::<Slot>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_idempotent_and_dense() {
        let mut i = Interner::default();
        let keys: Vec<String> = (0..1000).map(|k| format!("cell:{k}")).collect();
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(i.intern_str(k), n as u32);
        }
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(i.intern_str(k), n as u32);
            assert_eq!(i.get_str(n as u32), k);
            assert_eq!(i.lookup(k.as_bytes()), Some(n as u32));
        }
        assert_eq!(i.lookup(b"absent"), None);
        assert_eq!(i.intern(b""), 1000);
        assert_eq!(i.get(1000), b"");
    }
}
