//! The in-memory buffer sink.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;
use serde_json::Value;

use super::{Sink, SinkError, SinkKind, SinkResult};

/// An in-memory buffer: a map from effect to live applications.
#[derive(Debug, Default)]
pub struct BufferSink {
    inner: Mutex<BufferInner>,
}

#[derive(Debug, Default)]
struct BufferInner {
    live: HashMap<String, u64>,
    keys: HashSet<String>,
    reserved: HashMap<String, (String, bool)>,
    next: u64,
}

impl BufferSink {
    /// An empty buffer.
    pub fn new() -> BufferSink {
        BufferSink::default()
    }
}

impl Sink for BufferSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Buffer
    }

    fn apply(&self, res: &str, _body: &Value, key: Option<&str>) -> SinkResult<()> {
        let mut g = self.inner.lock();
        if let Some(k) = key
            && !g.keys.insert(k.to_owned())
        {
            return Ok(());
        }
        *g.live.entry(res.to_owned()).or_default() += 1;
        Ok(())
    }

    fn undo(&self, res: &str) -> SinkResult<()> {
        if let Some(n) = self.inner.lock().live.get_mut(res) {
            *n = n.saturating_sub(1);
        }
        Ok(())
    }

    fn applied_key(&self, key: &str) -> SinkResult<bool> {
        Ok(self.inner.lock().keys.contains(key))
    }

    fn live(&self, res: &str) -> SinkResult<u64> {
        Ok(self.inner.lock().live.get(res).copied().unwrap_or(0))
    }

    fn reserve(&self, res: &str, _body: &Value) -> SinkResult<String> {
        let mut g = self.inner.lock();
        g.next += 1;
        let id = format!("buf-{}", g.next);
        g.reserved.insert(id.clone(), (res.to_owned(), false));
        Ok(id)
    }

    fn confirm(&self, id: &str) -> SinkResult<()> {
        let mut g = self.inner.lock();
        let Some((res, done)) = g.reserved.get_mut(id) else {
            return Err(SinkError::NoReservation { sink: "buffer", id: id.to_owned() });
        };
        if !*done {
            *done = true;
            let res = res.clone();
            *g.live.entry(res).or_default() += 1;
        }
        Ok(())
    }

    fn cancel(&self, id: &str) -> SinkResult<()> {
        let mut g = self.inner.lock();
        if g.reserved.get(id).is_some_and(|(_, done)| !*done) {
            g.reserved.remove(id);
        }
        Ok(())
    }
}
