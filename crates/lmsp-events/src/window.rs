//! [`Window`]: the byte store behind the ring, appended at the back and
//! released from the front.

/// Bytes addressed by logical offsets that never move: offset `n` is the n-th
/// byte ever appended. The log's slots hold logical offsets, so reclaiming
/// space (which moves bytes) never has to rewrite them.
///
/// The live bytes are one contiguous slice, so "every frame after id n" is a
/// single copy for a reader. Released bytes are reclaimed by moving the live
/// ones down to the start of the buffer, but only once at least as many bytes
/// are dead as live: each byte appended pays for at most about one byte moved,
/// the buffer stays under about twice the live bytes plus one write, and once
/// the log sits at its bounds, appends reuse memory instead of growing it.
#[derive(Debug, Default)]
pub(crate) struct Window {
    buf: Vec<u8>,
    /// The logical offset of `buf[0]`.
    base: u64,
    /// The logical offset of the oldest live byte: `base <= start <= end()`.
    start: u64,
}

impl Window {
    /// The logical offset of the oldest live byte.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// The logical offset just past the newest byte.
    pub(crate) fn end(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// How many bytes are live.
    pub(crate) fn live(&self) -> usize {
        self.index(self.end()) - self.index(self.start)
    }

    /// The bytes this window holds memory for.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The buffer to append to, with room for `need` more bytes. Writing more
    /// than `need` is allowed; it may just grow the buffer the ordinary way.
    pub(crate) fn writer(&mut self, need: usize) -> &mut Vec<u8> {
        if self.buf.len() + need > self.buf.capacity() {
            self.make_room(need);
        }
        &mut self.buf
    }

    /// Marks every byte before `offset` dead.
    pub(crate) fn release_to(&mut self, offset: u64) {
        debug_assert!(self.start <= offset && offset <= self.end());
        self.start = offset;
    }

    /// The bytes between two live logical offsets.
    pub(crate) fn slice(&self, from: u64, to: u64) -> &[u8] {
        debug_assert!(self.start <= from && from <= to && to <= self.end());
        &self.buf[self.index(from)..self.index(to)]
    }

    /// Drops every byte and frees the memory; offsets go on from the end.
    pub(crate) fn clear(&mut self) {
        let end = self.end();
        *self = Self {
            buf: Vec::new(),
            base: end,
            start: end,
        };
    }

    fn index(&self, offset: u64) -> usize {
        // Offsets between `base` and `end()` index into `buf`, so the
        // difference fits a usize.
        (offset - self.base) as usize
    }

    fn make_room(&mut self, need: usize) {
        let dead = self.index(self.start);
        let live = self.buf.len() - dead;
        if dead > 0 && dead >= live {
            self.buf.copy_within(dead.., 0);
            self.buf.truncate(live);
            self.base = self.start;
        }
        let len = self.buf.len();
        if len + need > self.buf.capacity() {
            // Twice what is live keeps growth geometric while the log fills,
            // and leaves, at its bounds, room for as many bytes as are live
            // before the next move, so moves stay amortized.
            let target = 2 * (live + need);
            self.buf.reserve_exact(target - len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(window: &mut Window, bytes: &[u8]) -> u64 {
        window.writer(bytes.len()).extend_from_slice(bytes);
        window.end()
    }

    #[test]
    fn offsets_survive_reclaiming() {
        let mut window = Window::default();
        let a = push(&mut window, b"aaaa");
        let b = push(&mut window, b"bbbb");
        window.release_to(a);
        assert_eq!(window.live(), 4);
        for _ in 0..100 {
            let end = push(&mut window, b"cc");
            window.release_to(end - 2);
            assert_eq!(window.slice(end - 2, end), b"cc");
        }
        assert!(window.base > b, "dead bytes were reclaimed");
        assert!(window.capacity() <= 2 * (2 + 2), "{}", window.capacity());
    }

    #[test]
    fn steady_state_does_not_grow() {
        let mut window = Window::default();
        let frame = [7u8; 100];
        let mut ends = std::collections::VecDeque::new();
        let mut cap = 0;
        for round in 0..10_000 {
            ends.push_back(push(&mut window, &frame));
            if ends.len() > 50 {
                ends.pop_front();
                window.release_to(window.end() - 50 * 100);
            }
            if round == 1_000 {
                cap = window.capacity();
            }
            assert_eq!(window.live(), ends.len() * 100);
        }
        assert_eq!(window.capacity(), cap, "memory is reused once full");
        assert!(cap <= 2 * (50 * 100 + 100), "{cap}");
    }

    #[test]
    fn clear_frees_and_keeps_counting() {
        let mut window = Window::default();
        let end = push(&mut window, b"abc");
        window.clear();
        assert_eq!((window.start(), window.end(), window.live()), (end, end, 0));
        assert_eq!(window.capacity(), 0);
        let next = push(&mut window, b"de");
        assert_eq!(window.slice(end, next), b"de");
    }
}
