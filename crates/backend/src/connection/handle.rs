//! The sending side of a connection: what sessions hold.
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use memroute_protocol::{ReplyKind, RequestBytes};

use crate::reply::{reply_slot, ReplyReceiver};
use crate::{BackendError, ServerHealth};

use super::outgoing::Shared;
use super::settings::down_error;

/// The sending side of a connection, cloned into every session of the worker (it is not
/// `Send`: a connection belongs to its worker thread).
pub struct BackendHandle {
    pub(super) shared: Rc<Shared>,
    pub(super) address: Arc<str>,
    pub(super) health: Arc<ServerHealth>,
}

impl Clone for BackendHandle {
    fn clone(&self) -> BackendHandle {
        self.shared.handles.set(self.shared.handles.get() + 1);
        BackendHandle {
            shared: self.shared.clone(),
            address: self.address.clone(),
            health: self.health.clone(),
        }
    }
}

impl Drop for BackendHandle {
    fn drop(&mut self) {
        let handles = self.shared.handles.get().saturating_sub(1);
        self.shared.handles.set(handles);
        if handles == 0 {
            self.shared.wake.notify();
        }
    }
}

impl std::fmt::Debug for BackendHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendHandle")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl BackendHandle {
    /// Queues a request (a frame, possibly in two pieces: a `noreply` token cut out); its
    /// reply (or the reason there is none) arrives on the receiver.
    pub fn send(&self, parts: RequestBytes, kind: ReplyKind) -> ReplyReceiver {
        let mut request = self.writer();
        for piece in parts.pieces() {
            request.append(piece);
        }
        request.finish(kind)
    }

    /// Queues a request whose bytes `write` appends to the connection's outgoing buffer
    /// (nothing else may be sent on this handle from inside `write`).
    pub fn send_with(&self, kind: ReplyKind, write: impl FnOnce(&mut BytesMut)) -> ReplyReceiver {
        let mut request = self.writer();
        if let Some(outgoing) = request.outgoing() {
            write(&mut outgoing.borrow_mut());
        }
        request.finish(kind)
    }

    /// Starts a request written piece by piece straight into the connection's outgoing
    /// buffer (a multi-get appends its keys as it routes them). Until it is finished or
    /// dropped nothing else may be sent on this handle; the writer will not take a
    /// request half written. Sending again meanwhile fails that other request (with
    /// `Closed`: a bug in the caller, never interleaved bytes on the wire).
    pub fn writer(&self) -> RequestWriter<'_> {
        let refused = match () {
            _ if self.health.is_down() => Some(self.down_error()),
            _ if self.shared.open.get() => Some(BackendError::Closed {
                server: self.address.clone(),
            }),
            _ => self.shared.not_connected.borrow().as_ref().map(|reason| {
                BackendError::NotConnected {
                    server: self.address.clone(),
                    reason: reason.clone(),
                }
            }),
        };
        let start = match refused {
            Some(_) => 0,
            None => {
                self.shared.open.set(true);
                self.shared.outgoing.borrow().len()
            }
        };
        RequestWriter {
            shared: &self.shared,
            refused,
            start,
            keys: 0,
            finished: false,
        }
    }

    /// Which connection this is (its handles share it): requests collapsed onto one
    /// another must share a connection, whose order memcached keeps.
    pub fn id(&self) -> usize {
        Rc::as_ptr(&self.shared) as usize
    }

    pub fn address(&self) -> &Arc<str> {
        &self.address
    }

    pub fn health(&self) -> &Arc<ServerHealth> {
        &self.health
    }

    pub(super) fn down_error(&self) -> BackendError {
        down_error(&self.address, &self.health)
    }
}

/// One request being appended to a connection's outgoing buffer; see
/// [`BackendHandle::writer`]. Dropped unfinished, its bytes are taken back out.
pub struct RequestWriter<'a> {
    shared: &'a Shared,
    /// Why the request fails at once (server down, no connection): appends are dropped
    /// and `finish` returns this error.
    refused: Option<BackendError>,
    /// Where this request's bytes start in the outgoing buffer.
    start: usize,
    /// Keys appended with `append_key`/`append_word` (a multi-get's), so a coalesced
    /// command's key count needs no scan of its line.
    keys: u32,
    finished: bool,
}

impl std::fmt::Debug for RequestWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestWriter")
            .field("refused", &self.refused)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl RequestWriter<'_> {
    /// Appends bytes of the request.
    #[inline]
    pub fn append(&mut self, bytes: &[u8]) {
        if self.refused.is_none() {
            self.shared.outgoing.borrow_mut().extend_from_slice(bytes);
        }
    }

    /// Appends a retrieval's first key (after its verb and space), counting it.
    #[inline]
    pub fn append_key(&mut self, key: &[u8]) {
        self.keys += 1;
        self.append(key);
    }

    /// Appends a space and `word` (a multi-get's next key, counted): one borrow, one
    /// reserve.
    #[inline]
    pub fn append_word(&mut self, word: &[u8]) {
        self.keys += 1;
        if self.refused.is_none() {
            let mut outgoing = self.shared.outgoing.borrow_mut();
            outgoing.reserve(1 + word.len());
            outgoing.put_u8(b' ');
            outgoing.extend_from_slice(word);
        }
    }

    /// How many bytes of the request are written so far (0 when it is refused).
    pub fn len(&self) -> usize {
        match self.refused {
            Some(_) => 0,
            None => self.shared.outgoing.borrow().len() - self.start,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The outgoing buffer, for writing into directly; `None` when the request is refused.
    pub(super) fn outgoing(&mut self) -> Option<&RefCell<BytesMut>> {
        match self.refused {
            Some(_) => None,
            None => Some(&self.shared.outgoing),
        }
    }

    /// Queues the request as written; its reply comes on the receiver.
    pub fn finish(mut self, kind: ReplyKind) -> ReplyReceiver {
        self.finished = true;
        if let Some(error) = self.refused.take() {
            return ReplyReceiver::ready(Err(error));
        }
        let (reply, receiver) = reply_slot();
        self.shared.queue(kind, reply, self.start, self.keys);
        self.shared.open.set(false);
        // Only the first request of a batch finds the task's waker; the rest set a flag.
        self.shared.wake.notify();
        receiver
    }
}

impl Drop for RequestWriter<'_> {
    fn drop(&mut self) {
        if !self.finished && self.refused.is_none() {
            self.shared.outgoing.borrow_mut().truncate(self.start);
            self.shared.open.set(false);
        }
    }
}
