//! [`SharedLog`]: an [`EventLog`] behind a mutex, waking readers outside it.

use std::{
    sync::{Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use crate::{EventLog, Limits, LogError, Waker};

/// An [`EventLog`] shared between a producer and readers on other threads
/// (put it in an `Arc`). Wakers always run after the mutex is released.
#[derive(Debug, Default)]
pub struct SharedLog {
    inner: Mutex<EventLog>,
}

impl SharedLog {
    /// An empty, open log with the default [`Limits`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty, open log with these limits ([`EventLog::with_limits`]).
    pub fn with_limits(limits: Limits) -> Result<Self, LogError> {
        Ok(Self {
            inner: Mutex::new(EventLog::with_limits(limits)?),
        })
    }

    /// [`EventLog::append`], then wakes the waiting readers.
    pub fn append(&self, event: &str, data: &[u8]) -> Result<u64, LogError> {
        let (id, wakers) = self.lock().append(event, data)?;
        wakers.wake_all();
        Ok(id)
    }

    /// [`EventLog::append_text`], then wakes the waiting readers.
    pub fn append_text(
        &self,
        event: &str,
        head: &[u8],
        text: &str,
        tail: &[u8],
    ) -> Result<u64, LogError> {
        let (id, wakers) = self.lock().append_text(event, head, text, tail)?;
        wakers.wake_all();
        Ok(id)
    }

    /// [`EventLog::close`], then wakes the waiting readers.
    pub fn close(&self, now: Duration) {
        let wakers = self.lock().close(now);
        wakers.wake_all();
    }

    /// [`EventLog::expire`], then wakes the waiting readers.
    pub fn expire(&self) {
        let wakers = self.lock().expire();
        wakers.wake_all();
    }

    /// [`EventLog::expire_if_due`] under the lock.
    pub fn expire_if_due(&self, now: Duration) -> bool {
        self.lock().expire_if_due(now)
    }

    /// [`EventLog::wait_after`] under the lock.
    pub fn wait_after(&self, after: u64, waker: Waker) -> Result<(), Waker> {
        self.lock().wait_after(after, waker)
    }

    /// Runs `read` with the log locked, e.g. to copy out `read_after`.
    pub fn read<R>(&self, read: impl FnOnce(&EventLog) -> R) -> R {
        read(&self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, EventLog> {
        // Every mutation validates before it writes, so a panic elsewhere while
        // the lock was held cannot have left the log half-updated.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
