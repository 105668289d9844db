//! The filesystem sink: one file per effect in a temporary directory; each application
//! appends a line, an undo removes one.

use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde_json::Value;

use super::{Sink, SinkError, SinkKind, SinkResult};

/// Files under a temporary directory (removed when the sink is dropped).
#[derive(Debug)]
pub struct FsSink {
    dir: tempfile::TempDir,
    next: Mutex<u64>,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SinkError + 'a {
    move |source| SinkError::Io { op, path: path.display().to_string(), source }
}

/// A file name for an arbitrary effect id.
fn file_name(res: &str) -> String {
    res.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect()
}

impl FsSink {
    /// A sink in a new temporary directory.
    pub fn new() -> SinkResult<FsSink> {
        let dir = tempfile::Builder::new()
            .prefix("tidegate-eval-fs-")
            .tempdir()
            .map_err(io("create the temporary directory", Path::new("$TMPDIR")))?;
        for sub in ["keys", "reserved"] {
            let p = dir.path().join(sub);
            std::fs::create_dir_all(&p).map_err(io("create", &p))?;
        }
        Ok(FsSink { dir, next: Mutex::new(0) })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn file(&self, res: &str) -> PathBuf {
        self.dir.path().join(file_name(res))
    }

    fn append(&self, res: &str, body: &Value) -> SinkResult<()> {
        let p = self.file(res);
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p).map_err(io("open", &p))?;
        writeln!(f, "{body}").map_err(io("append to", &p))
    }
}

impl Sink for FsSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Fs
    }

    fn apply(&self, res: &str, body: &Value, key: Option<&str>) -> SinkResult<()> {
        if let Some(k) = key {
            let p = self.dir.path().join("keys").join(file_name(k));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&p) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
                Err(e) => return Err(io("record key", &p)(e)),
            }
        }
        self.append(res, body)
    }

    fn undo(&self, res: &str) -> SinkResult<()> {
        let p = self.file(res);
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("read", &p)(e)),
        };
        let mut lines: Vec<&str> = text.lines().collect();
        lines.pop();
        if lines.is_empty() {
            std::fs::remove_file(&p).map_err(io("remove", &p))
        } else {
            std::fs::write(&p, lines.join("\n") + "\n").map_err(io("rewrite", &p))
        }
    }

    fn applied_key(&self, key: &str) -> SinkResult<bool> {
        Ok(self.dir.path().join("keys").join(file_name(key)).exists())
    }

    fn live(&self, res: &str) -> SinkResult<u64> {
        let p = self.file(res);
        match std::fs::read_to_string(&p) {
            Ok(t) => Ok(t.lines().count() as u64),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io("read", &p)(e)),
        }
    }

    fn reserve(&self, res: &str, body: &Value) -> SinkResult<String> {
        let id = {
            let mut n = self.next.lock();
            *n += 1;
            format!("fs-{}", *n)
        };
        let p = self.dir.path().join("reserved").join(&id);
        std::fs::write(&p, serde_json::json!({"res": res, "body": body}).to_string()).map_err(io("reserve", &p))?;
        Ok(id)
    }

    fn confirm(&self, id: &str) -> SinkResult<()> {
        let p = self.dir.path().join("reserved").join(file_name(id));
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Confirmed (or cancelled) before: confirm is idempotent per reservation.
                return if self.dir.path().join("keys").join(file_name(id)).exists() {
                    Ok(())
                } else {
                    Err(SinkError::NoReservation { sink: "filesystem", id: id.to_owned() })
                };
            }
            Err(e) => return Err(io("read reservation", &p)(e)),
        };
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let res = v["res"].as_str().unwrap_or_default().to_owned();
        self.apply(&res, &v["body"], Some(id))?;
        std::fs::remove_file(&p).map_err(io("remove reservation", &p))
    }

    fn cancel(&self, id: &str) -> SinkResult<()> {
        let p = self.dir.path().join("reserved").join(file_name(id));
        match std::fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("cancel reservation", &p)(e)),
        }
    }
}
