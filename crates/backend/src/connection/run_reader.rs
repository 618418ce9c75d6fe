use bytes::{Buf, Bytes, BytesMut};
use memroute_protocol::{parse_retrieval_blocks, retrieval_error, Limits, ReplyParse};

use super::in_flight::{InFlight, Link};

/// The keys of a key-journal entry (space-separated key text), in order.
pub(super) fn journal_keys(text: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    memchr::memchr_iter(b' ', text)
        .chain(std::iter::once(text.len()))
        .filter_map(move |end| {
            let key = &text[start..end];
            start = end + 1;
            (!key.is_empty()).then_some(key)
        })
}

/// The reader's way through the reply to a run of coalesced gets: one `get` on the wire
/// for several requests (`Shared::queue`), whose blocks are handed to each request as soon
/// as its keys are settled, so a run of large values is never held whole (memory, and the
/// first request's latency, stay what they were with one command per request).
///
/// memcached answers a `get` with a `VALUE` block for each key it has, in the order the
/// keys were asked, then `END`. Walking a request's keys (its text in the key journal)
/// against the blocks framed so far, each key either owns the next block or missed; a key
/// is settled once the block after the last one matched has arrived (or `END`). A request
/// gets its blocks and an `END` of its own (copied; the run's last one takes the bytes as
/// they are, with the run's `END`). A reply that does not fit the walk (a block for a key
/// nobody asked, blocks out of order: blocks left when the last request is settled) is a
/// server out of step: an error, and the connection is reset; the requests answered before
/// it got blocks of the keys they asked. An error line where blocks were expected answers
/// every request of the run still waiting.
#[derive(Default)]
pub(super) struct RunReader {
    /// Requests of the run under way not answered yet (0: none under way).
    pub(super) left: u32,
    /// Where each block framed but not handed out yet ends, in the read buffer.
    block_ends: Vec<usize>,
    /// Where requests' blocks are copied, each with its own `END`: reclaimed in place once
    /// earlier copies are gone, so steady traffic allocates nothing here.
    copies: BytesMut,
}

impl RunReader {
    /// Hands out what the bytes in `buffer` settle. `head_legs` is the front request's
    /// `RunPart::legs` (a run starts when it is more than 1). `Ok(true)`: the run is done
    /// (the next request is at the front); `Ok(false)`: more bytes are needed.
    pub(super) fn read(
        &mut self,
        buffer: &mut BytesMut,
        head_legs: u32,
        limits: &Limits,
        link: &Link,
        mut answer: impl FnMut(InFlight, Bytes, u32),
    ) -> Result<bool, ()> {
        if self.left == 0 {
            self.left = head_legs;
            self.block_ends.clear();
        }
        let from = self.block_ends.last().copied().unwrap_or(0);
        let ends = &mut self.block_ends;
        let mut complete =
            match parse_retrieval_blocks(buffer, from, limits, &mut |end| ends.push(end)) {
                Ok((ReplyParse::Complete(len), _)) => Some(len),
                Ok((ReplyParse::Incomplete, _)) => None,
                Err(_) => return Err(()),
            };
        if let Some(len) = complete.filter(|_| self.block_ends.is_empty()) {
            if retrieval_error(&buffer[..len]).is_some() {
                self.answer_error_line(buffer, len, link, answer)?;
                return Ok(true);
            }
        }
        while self.left > 0 {
            let Some(Settled {
                pos,
                blocks,
                text_len,
            }) = self.settle_front(buffer, link, complete.is_some())?
            else {
                return Ok(false);
            };
            let reply = if self.left == 1 {
                // The last request: its blocks and the run's END, once all are there and
                // nothing is left over.
                let Some(len) = complete else {
                    return Ok(false);
                };
                if blocks != self.block_ends.len() || buffer.get(pos..len) != Some(b"END\r\n") {
                    return Err(());
                }
                self.block_ends.clear();
                buffer.split_to(len).freeze()
            } else if blocks == 0 {
                Bytes::from_static(b"END\r\n")
            } else {
                let reply = self.copy_blocks(buffer, pos, blocks);
                complete = complete.map(|len| len - pos);
                reply
            };
            link.run_keys.borrow_mut().advance(text_len);
            let request = next_request(link).ok_or(())?;
            answer(request, reply, blocks as u32);
            self.left -= 1;
        }
        Ok(true)
    }

    /// An error line (`buffer[..len]`) where blocks were expected: it answers every
    /// request of the run still waiting.
    #[inline]
    fn answer_error_line(
        &mut self,
        buffer: &mut BytesMut,
        len: usize,
        link: &Link,
        mut answer: impl FnMut(InFlight, Bytes, u32),
    ) -> Result<(), ()> {
        let error = buffer.split_to(len).freeze();
        while self.left > 0 {
            let keys = link.in_flight.borrow().front().map(|r| r.run.keys);
            link.run_keys
                .borrow_mut()
                .advance(keys.unwrap_or(0) as usize);
            let request = next_request(link).ok_or(())?;
            answer(request, error.clone(), 0);
            self.left -= 1;
        }
        Ok(())
    }

    /// Settles the front request's keys against the blocks framed so far: `None` while a
    /// key may still own a block not framed yet (`complete`: the run's `END` is there, so
    /// every key left missed).
    #[inline]
    fn settle_front(
        &self,
        buffer: &BytesMut,
        link: &Link,
        complete: bool,
    ) -> Result<Option<Settled>, ()> {
        let journal = link.run_keys.borrow();
        let in_flight = link.in_flight.borrow();
        let text_len = in_flight.front().ok_or(())?.run.keys as usize;
        let text = journal.get(..text_len).ok_or(())?;
        let (mut pos, mut blocks) = (0, 0usize);
        for key in journal_keys(text) {
            match self.block_ends.get(blocks) {
                Some(&end) => {
                    if memroute_protocol::framed_block_is_for(buffer, pos, key) {
                        pos = end;
                        blocks += 1;
                    }
                }
                None if complete => {}
                None => return Ok(None),
            }
        }
        Ok(Some(Settled {
            pos,
            blocks,
            text_len,
        }))
    }

    /// A request's `blocks` blocks (`buffer[..pos]`), taken off the buffer and copied with
    /// an `END` of their own.
    #[inline]
    fn copy_blocks(&mut self, buffer: &mut BytesMut, pos: usize, blocks: usize) -> Bytes {
        let copies = &mut self.copies;
        let len = pos + 5;
        // Small copies share 16 KiB blocks; large values share blocks of at least
        // 256 KiB, as large replies share the read buffer's (grown by doubling):
        // a block that size is its own mapping, given back to the system when its
        // last reply goes, where 100 KiB copies one by one would fragment the heap
        // and stay (tests/reply_budget.rs measures it).
        let block = match len > 16 * 1024 {
            true => len.max(256 * 1024),
            false => 16 * 1024,
        };
        if copies.capacity() - copies.len() < len && !copies.try_reclaim(block) {
            copies.reserve(block);
        }
        copies.extend_from_slice(&buffer[..pos]);
        copies.extend_from_slice(b"END\r\n");
        buffer.advance(pos);
        self.block_ends.drain(..blocks);
        for end in &mut self.block_ends {
            *end -= pos;
        }
        copies.split().freeze()
    }
}

/// The front request's keys settled against the framed blocks.
struct Settled {
    /// Where its last block ends in the buffer (0: it has none).
    pos: usize,
    /// How many of the framed blocks are its.
    blocks: usize,
    /// The length of its keys' text in the key journal.
    text_len: usize,
}

/// The request at the front, popped in a borrow of its own: answering wakes a session,
/// never re-enters.
#[inline]
fn next_request(link: &Link) -> Option<InFlight> {
    link.in_flight.borrow_mut().pop_front()
}
