//! Shared text built without a temporary allocation.
//!
//! The engine names things with `Arc<str>` (canonical scopes, derived keys) so that events,
//! the index and the ledger share one copy. Building such a name in a `String` and converting
//! it costs two allocations and a free per name; building it in this thread's scratch buffer
//! and copying it once into the `Arc` costs one. On the per-call path that is several
//! allocations per transaction (docs/performance.md).

use std::cell::RefCell;
use std::sync::Arc;

/// A scratch buffer that grew beyond this is released rather than kept for the thread.
const KEEP_BYTES: usize = 4096;

thread_local! {
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `build` on an empty buffer of at least `capacity` bytes and returns what it wrote as
/// an `Arc<str>`, with `build`'s own result. If `build` fails, its error is returned and
/// nothing is allocated for the text. Re-entrant (a nested call gets a buffer of its own).
pub(crate) fn shared<T, E>(
    capacity: usize,
    build: impl FnOnce(&mut String) -> Result<T, E>,
) -> Result<(Arc<str>, T), E> {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => {
            s.clear();
            s.reserve(capacity);
            let r = build(&mut s);
            let out = r.map(|t| (Arc::from(s.as_str()), t));
            if s.capacity() > KEEP_BYTES {
                *s = String::new();
            }
            out
        }
        Err(_) => {
            let mut s = String::with_capacity(capacity);
            let t = build(&mut s)?;
            Ok((Arc::from(s), t))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_nested_failing_and_large_texts() {
        let (a, n) = shared(4, |s| {
            s.push_str("outer:");
            // A nested build while the scratch buffer is in use gets its own buffer.
            let (inner, ()) = shared::<(), ()>(0, |t| {
                t.push_str("inner");
                Ok(())
            })
            .unwrap();
            s.push_str(&inner);
            Ok::<_, ()>(7)
        })
        .unwrap();
        assert_eq!((&*a, n), ("outer:inner", 7));
        // A failed build returns its error, and the next build starts empty.
        assert_eq!(
            shared::<(), _>(0, |s| {
                s.push_str("half");
                Err("no")
            }),
            Err("no")
        );
        let big = "x".repeat(KEEP_BYTES * 2);
        let (b, ()) = shared::<(), ()>(0, |s| {
            s.push_str(&big);
            Ok(())
        })
        .unwrap();
        assert_eq!(&*b, big.as_str());
        let (c, ()) = shared::<(), ()>(0, |s| {
            s.push('y');
            Ok(())
        })
        .unwrap();
        assert_eq!(&*c, "y");
    }
}
