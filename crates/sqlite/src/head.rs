//! The high-water mark: `<dir>/ledger.head`, the last acknowledged LSN and its chain value,
//! kept outside SQLite so that losing the write-ahead log cannot erase it.
//!
//! ```text
//!  offset 0     slot A ┐ 88 bytes each:  magic "TGHEAD01" · ledger id (16) · seq (u64 LE)
//!  offset 4096  slot B ┘                 · lsn (u64 LE) · chain (32) · BLAKE3 of the above (16)
//!  size 8192
//! ```
//!
//! The writer overwrites a slot in place after a group commit is durable in SQLite and before
//! any waiter of that commit is woken; a marker thread syncs the file (`fdatasync`: it never
//! changes size) behind it. Writes between two syncs all go to the slot that does *not* hold
//! the newest synced mark, so whatever a power loss does to unsynced writes, the other slot
//! still holds a synced mark. A torn or damaged slot fails its checksum; the reader takes the
//! valid slot with the larger `seq`. The file is created whole (a temporary file, synced,
//! renamed, directory synced) before the database it guards.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tidegate_storage::wire::Chain;
use tidegate_storage::{Lsn, StoreError};

/// The file's name inside the data directory.
pub const HEAD_FILE: &str = "ledger.head";
const MAGIC: &[u8; 8] = b"TGHEAD01";
const SLOT: usize = 88;
const SLOT_STRIDE: u64 = 4096;
const FILE_LEN: u64 = 2 * SLOT_STRIDE;

/// A ledger's identity: random, chosen when the ledger is created, stored in `meta` and in
/// every mark; it also seeds the hash chain.
pub(crate) type LedgerId = [u8; 16];

/// One high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) id: LedgerId,
    pub(crate) seq: u64,
    /// Every event up to here was acknowledged as durable (or may have been).
    pub(crate) lsn: Lsn,
    /// The chain value of the event at `lsn` (the genesis value for 0).
    pub(crate) chain: Chain,
}

impl Mark {
    fn encode(&self) -> [u8; SLOT] {
        let mut b = [0u8; SLOT];
        b[0..8].copy_from_slice(MAGIC);
        b[8..24].copy_from_slice(&self.id);
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.lsn.to_le_bytes());
        b[40..72].copy_from_slice(&self.chain.0);
        let sum = blake3::hash(&b[..72]);
        b[72..88].copy_from_slice(&sum.as_bytes()[..16]);
        b
    }

    fn decode(b: &[u8]) -> Option<Mark> {
        if b.len() < SLOT || &b[0..8] != MAGIC || b[72..88] != blake3::hash(&b[..72]).as_bytes()[..16] {
            return None;
        }
        let u64_at = |i: usize| b.get(i..i + 8).and_then(|s| <[u8; 8]>::try_from(s).ok()).map(u64::from_le_bytes);
        Some(Mark {
            id: <[u8; 16]>::try_from(&b[8..24]).ok()?,
            seq: u64_at(24)?,
            lsn: u64_at(32)?,
            chain: Chain::from_slice(&b[40..72])?,
        })
    }
}

/// The path of the mark file in `dir`.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join(HEAD_FILE)
}

/// What the mark file holds.
#[derive(Debug)]
pub(crate) enum Found {
    /// No file.
    Missing,
    /// The newest valid mark; `note` says if the other slot was damaged.
    Mark { mark: Mark, note: Option<String> },
    /// A file whose slots are both unreadable.
    Damaged(String),
}

/// Reads the mark file of `dir` (no lock needed: slots are written whole or fail their
/// checksum).
pub(crate) fn read(dir: &Path) -> Result<Found, StoreError> {
    let p = path(dir);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Missing),
        Err(e) => return Err(crate::error::file("read the high-water mark", &p, e)),
    };
    let slot = |i: u64| {
        let start = usize::try_from(i * SLOT_STRIDE).unwrap_or(usize::MAX);
        bytes.get(start..).and_then(Mark::decode)
    };
    match (slot(0), slot(1)) {
        (Some(a), Some(b)) => Ok(Found::Mark { mark: if a.seq >= b.seq { a } else { b }, note: None }),
        (Some(m), None) | (None, Some(m)) => Ok(Found::Mark {
            mark: m,
            note: Some(format!(
                "one slot of {} is unreadable (a write cut short by a crash, or damage); used mark #{} (LSN {})",
                p.display(),
                m.seq,
                m.lsn
            )),
        }),
        (None, None) => Ok(Found::Damaged(format!(
            "{} ({} bytes) holds no readable high-water mark (both slots fail their checksum)",
            p.display(),
            bytes.len()
        ))),
    }
}

/// Creates (or replaces) the mark file of `dir` atomically, holding `mark`: written to a
/// temporary file, synced, renamed over the old one, and the directory synced.
pub(crate) fn create(dir: &Path, mark: &Mark) -> Result<(), StoreError> {
    let final_path = path(dir);
    let tmp = dir.join(format!("{HEAD_FILE}.tmp"));
    fn io<'a>(op: &'static str, p: &'a Path) -> impl Fn(std::io::Error) -> StoreError + 'a {
        move |e| crate::error::file(op, p, e)
    }
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io("create the high-water mark", &tmp))?;
        let mut image = vec![0u8; FILE_LEN as usize];
        let slot = (mark.seq % 2) as usize * SLOT_STRIDE as usize;
        image[slot..slot + SLOT].copy_from_slice(&mark.encode());
        f.write_all(&image).and_then(|()| f.sync_all()).map_err(io("write the high-water mark", &tmp))?;
    }
    std::fs::rename(&tmp, &final_path).map_err(io("install the high-water mark", &final_path))?;
    sync_dir(dir)
}

/// Syncs a directory, so a file created or renamed in it survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| crate::error::file("sync the data directory", dir, e))
}

/// The open mark file the writer updates after every group commit.
///
/// ```text
///  synced: slot A (seq s)      writes: slot B ← s+1, s+2, …     sync ─► synced: slot B
///                                                                writes: slot A ← …
/// ```
#[derive(Debug)]
pub(crate) struct HeadFile {
    file: File,
    path: PathBuf,
    /// The newest mark written (synced or not).
    last: Mark,
    /// The slot `last` is in.
    last_slot: u64,
    /// The slot holding the newest synced mark; writes go to the other one.
    synced_slot: u64,
}

impl HeadFile {
    /// Opens the mark file of `dir`, whose newest mark is `last`, and syncs it (a mark read
    /// after a crash of the process may still be only in the page cache).
    pub(crate) fn open(dir: &Path, last: Mark) -> Result<HeadFile, StoreError> {
        let path = path(dir);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| crate::error::file("open the high-water mark", &path, e))?;
        file.sync_data().map_err(|e| crate::error::file("sync the high-water mark", &path, e))?;
        // The slot the newest mark is in: not always `seq % 2` (see the type's doc).
        let mut slot1 = [0u8; SLOT];
        let slot = match file.read_exact_at(&mut slot1, SLOT_STRIDE) {
            Ok(()) if Mark::decode(&slot1) == Some(last) => 1,
            _ => 0,
        };
        Ok(HeadFile { file, path, last, last_slot: slot, synced_slot: slot })
    }

    /// The LSN of the newest mark written.
    pub(crate) fn lsn(&self) -> Lsn {
        self.last.lsn
    }

    /// Writes the mark that every event up to `lsn` (chain value `chain`) is durable, without
    /// syncing it, into the slot that does not hold the newest synced mark.
    pub(crate) fn write(&mut self, lsn: Lsn, chain: Chain) -> Result<(), StoreError> {
        let mark = Mark { id: self.last.id, seq: self.last.seq + 1, lsn, chain };
        let slot = 1 - self.synced_slot;
        self.file
            .write_all_at(&mark.encode(), slot * SLOT_STRIDE)
            .map_err(|e| crate::error::file("write the high-water mark", &self.path, e))?;
        self.last = mark;
        self.last_slot = slot;
        Ok(())
    }

    /// Syncs every mark written so far; returns the LSN the newest one holds.
    pub(crate) fn sync(&mut self) -> Result<Lsn, StoreError> {
        self.file.sync_data().map_err(|e| crate::error::file("sync the high-water mark", &self.path, e))?;
        self.synced_slot = self.last_slot;
        Ok(self.last.lsn)
    }

    /// Writes and syncs the mark that every event up to `lsn` (chain value `chain`) is durable.
    pub(crate) fn advance(&mut self, lsn: Lsn, chain: Chain) -> Result<(), StoreError> {
        self.write(lsn, chain)?;
        self.sync().map(|_| ())
    }
}

/// A new ledger identity: BLAKE3 of the time, the process, the directory and a counter, cut to
/// 16 bytes. Unique, not secret.
pub(crate) fn new_ledger_id(dir: &Path) -> LedgerId {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(dir.as_os_str().as_encoded_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(&h.finalize().as_bytes()[..16]);
    id
}

/// A ledger id as 32 hex digits (its form in `meta`).
pub(crate) fn id_hex(id: &LedgerId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses [`id_hex`]'s form.
pub(crate) fn parse_id(s: &str) -> Option<LedgerId> {
    let s = s.trim();
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn slots(dir: &Path) -> [Option<Mark>; 2] {
        let bytes = std::fs::read(path(dir)).unwrap();
        [Mark::decode(&bytes[..]), Mark::decode(&bytes[SLOT_STRIDE as usize..])]
    }

    /// Whatever a power loss does to the writes made since the last sync, the slot holding the
    /// newest synced mark is never among them: unsynced writes all go to the other slot.
    #[test]
    fn writes_between_syncs_never_touch_the_slot_of_the_newest_synced_mark() {
        let dir = tempfile::tempdir().unwrap();
        let genesis = Mark { id: [7; 16], seq: 0, lsn: 0, chain: Chain([0; 32]) };
        create(dir.path(), &genesis).unwrap();
        let mut head = HeadFile::open(dir.path(), genesis).unwrap();
        let mut synced = genesis;
        for round in 0..6u64 {
            let synced_slot = slots(dir.path()).iter().position(|m| *m == Some(synced)).unwrap();
            for i in 1..=(round + 1) {
                let lsn = synced.lsn + i;
                head.write(lsn, Chain([lsn as u8; 32])).unwrap();
                assert_eq!(slots(dir.path())[synced_slot], Some(synced), "round {round}: a write hit the synced slot");
                assert_eq!(head.lsn(), lsn);
            }
            assert_eq!(head.sync().unwrap(), synced.lsn + round + 1);
            synced = head.last;
            // The reader takes the newest valid slot.
            match read(dir.path()).unwrap() {
                Found::Mark { mark, note: None } => assert_eq!(mark, synced),
                other => panic!("{other:?}"),
            }
        }
        // Reopened on a file whose newest mark is not in slot `seq % 2`, writes still go to
        // the other slot.
        let mut again = HeadFile::open(dir.path(), synced).unwrap();
        let synced_slot = slots(dir.path()).iter().position(|m| *m == Some(synced)).unwrap();
        again.write(synced.lsn + 1, Chain([1; 32])).unwrap();
        assert_eq!(slots(dir.path())[synced_slot], Some(synced));
    }
}
