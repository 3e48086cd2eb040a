//! `CancelToken` and the helper that runs blocking work with the GIL released
//! while still noticing Ctrl-C.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::cancel::Cancel;

#[pyclass(module = "checkpointd._native", frozen)]
pub struct CancelToken {
    pub inner: Cancel,
}

#[pymethods]
impl CancelToken {
    #[new]
    fn new() -> Self {
        CancelToken {
            inner: Cancel::new(),
        }
    }

    fn cancel(&self) {
        self.inner.cancel();
    }

    #[getter]
    fn cancelled(&self) -> bool {
        self.inner.is_cancelled()
    }
}

/// How often the waiting thread takes the GIL back to look for signals.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Run `job` on a worker thread with the GIL released. Every [`SIGNAL_POLL`]
/// the caller re-checks Python signals; on KeyboardInterrupt (or any signal
/// handler error) it cancels `cancel`, waits for the job to stop, and raises.
pub fn run_released<T, F>(py: Python<'_>, cancel: &Cancel, job: F) -> PyResult<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("checkpointd-native".into())
        .spawn(move || {
            let _ = tx.send(job());
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a native worker: {e}")))?;
    let mut rx = Some(rx);
    loop {
        // The receiver is moved in and back out: it is Send but not Sync.
        let (receiver, got) = py.allow_threads(move || {
            let receiver = rx.take().expect("receiver present");
            let got = receiver.recv_timeout(SIGNAL_POLL);
            (receiver, got)
        });
        rx = Some(receiver);
        match got {
            Ok(value) => {
                let _ = py.allow_threads(|| handle.join());
                return Ok(value);
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(signal) = py.check_signals() {
                    cancel.cancel();
                    let _ = py.allow_threads(|| handle.join());
                    return Err(signal);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = py.allow_threads(|| handle.join());
                return Err(PyRuntimeError::new_err("the native worker panicked"));
            }
        }
    }
}
