//! The extension's own threads and the interpreter's exit.
//!
//! The binding runs engine work on threads of its own (the tokio runtime's workers and its
//! blocking pool): asyncio callers' operations, callbacks for asyncio callers, and background
//! work such as compensations of transactions whose lease expired. Those threads enter the
//! interpreter to call Python. CPython does not wait for such threads at exit: once
//! `Py_FinalizeEx` runs, a thread that was inside the interpreter with the GIL released (a
//! socket write, `time.sleep`, a lock) and wants it back is ended with `pthread_exit`, whose
//! forced unwind runs PyO3's guard and calls `PyGILState_Release` without the GIL: `Fatal
//! Python error: PyGILState_Release: thread state ... must be current when releasing`, exit
//! status 134. (This was issue 13 item 1: the thread resolving an asyncio future releases the
//! GIL inside `call_soon_threadsafe`, the main thread runs on to the end of the program.)
//!
//! The rule: every entry of one of our threads into the interpreter goes through [`attach`],
//! which counts it. An `atexit` handler ([`at_exit`], registered when the module loads, so it
//! runs before finalisation starts) closes the gate and waits, with the GIL released, until no
//! thread of ours is inside (at most [`exit_wait`]). A thread of ours that wants to enter
//! after that parks for good instead: the process is ending, and what it was doing is left
//! exactly as a crash at that point would leave it (the ledger's recovery finishes it on the
//! next start of a durable engine).
//!
//! Threads that called into the extension from Python (the sync API runs callbacks inline on
//! the caller's thread) are the interpreter's own and are not counted: the interpreter joins
//! its non-daemon threads before `atexit`.

use std::cell::Cell;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use pyo3::prelude::*;

struct Gate {
    closed: bool,
    inside: usize,
}

static GATE: Mutex<Gate> = Mutex::new(Gate { closed: false, inside: 0 });
static LEFT: Condvar = Condvar::new();

thread_local! {
    /// Set on the binding's runtime threads (`on_thread_start`).
    static OURS: Cell<bool> = const { Cell::new(false) };
    /// How deep this thread is inside counted entries (a nested entry is never refused:
    /// refusing it would park a thread that holds the GIL).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as one of the binding's runtime threads.
pub(crate) fn mark_runtime_thread() {
    OURS.with(|c| c.set(true));
}

struct Leave;

impl Drop for Leave {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        let mut g = GATE.lock();
        g.inside -= 1;
        if g.inside == 0 {
            LEFT.notify_all();
        }
    }
}

/// Runs `f` attached to the interpreter; the only way the binding enters it (clippy's
/// `disallowed-methods` refuses `Python::attach` elsewhere). See the module docs.
#[allow(clippy::disallowed_methods)]
pub(crate) fn attach<F, R>(f: F) -> R
where
    F: for<'py> FnOnce(Python<'py>) -> R,
{
    if !OURS.with(Cell::get) {
        return Python::attach(f);
    }
    let nested = DEPTH.with(|d| d.get() > 0);
    {
        let mut g = GATE.lock();
        if g.closed && !nested {
            drop(g);
            park_for_good();
        }
        g.inside += 1;
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    let _leave = Leave;
    Python::attach(f)
}

fn park_for_good() -> ! {
    loop {
        std::thread::park();
    }
}

/// How long interpreter exit waits for callbacks in progress on the binding's threads:
/// `TIDEGATE_EXIT_WAIT` seconds, default 10.
pub(crate) fn exit_wait() -> Duration {
    std::env::var("TIDEGATE_EXIT_WAIT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .unwrap_or(Duration::from_secs(10))
}

/// Whether interpreter exit has begun (the gate is closed).
pub(crate) fn exiting() -> bool {
    GATE.lock().closed
}

/// The `atexit` handler: closes the gate and waits (GIL released) until no thread of ours is
/// inside the interpreter, at most [`exit_wait`]. Returns how many were still inside.
pub(crate) fn at_exit(py: Python<'_>) -> usize {
    let deadline = Instant::now() + exit_wait();
    let left = py.detach(|| {
        let mut g = GATE.lock();
        g.closed = true;
        while g.inside > 0 {
            if LEFT.wait_until(&mut g, deadline).timed_out() {
                break;
            }
        }
        g.inside
    });
    if left > 0 {
        eprintln!(
            "tidegate: {left} callback(s) still running on the engine's threads {:.1} s after interpreter exit began \
             (TIDEGATE_EXIT_WAIT); the interpreter may abort if one of them resumes",
            exit_wait().as_secs_f64()
        );
    }
    left
}
