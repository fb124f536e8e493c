//! [`HandshakeEnd`]: where a TLS 1.3 client's application data begins in the bytes it
//! sends, read from the record headers alone (their bodies are encrypted).
//!
//! A TLS 1.3 client sends its handshake records (`ClientHello`, and perhaps a
//! compatibility `ChangeCipherSpec`), then its `Finished` in the first `application_data`
//! record; its own data begins with the second `application_data` record.

/// TLS record type of a handshake record.
const HANDSHAKE: u8 = 22;
/// TLS record type of an application-data record (encrypted handshake messages too).
const APPLICATION_DATA: u8 = 23;
/// Bytes in a TLS record header: type, version (2), length (2).
const HEADER_BYTES: usize = 5;

/// Reads a client's byte stream, chunk by chunk, until its application data begins.
#[derive(Debug, Default)]
pub(super) struct HandshakeEnd {
    /// Bytes of the stream read so far (to tell its first byte).
    read: usize,
    /// The header of the record being read, while fewer than [`HEADER_BYTES`] arrived.
    header: Vec<u8>,
    /// Body bytes of the current record still to come.
    body_left: usize,
    /// `application_data` records begun so far.
    application_records: u32,
    /// Whether the point was found (and reported) already.
    found: bool,
}

impl HandshakeEnd {
    /// Reads the stream's next `bytes`; returns, once, the offset in them where the
    /// client's application data begins (0 for a stream that is not TLS, or for a record
    /// whose header began in an earlier chunk).
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        if self.found {
            return None;
        }
        let mut at = 0;
        if self.read == 0 && bytes.first().is_some_and(|&first| first != HANDSHAKE) {
            self.found = true;
            return Some(0);
        }
        self.read += bytes.len();
        while at < bytes.len() {
            if self.body_left > 0 {
                let take = self.body_left.min(bytes.len() - at);
                self.body_left -= take;
                at += take;
                continue;
            }
            let begun = at.saturating_sub(self.header.len());
            let take = (HEADER_BYTES - self.header.len()).min(bytes.len() - at);
            self.header.extend_from_slice(&bytes[at..at + take]);
            at += take;
            if self.header.len() < HEADER_BYTES {
                break;
            }
            let header = std::mem::take(&mut self.header);
            self.body_left = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if header[0] == APPLICATION_DATA {
                self.application_records += 1;
                if self.application_records == 2 {
                    self.found = true;
                    return Some(begun);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u8, body: usize) -> Vec<u8> {
        let length = u16::try_from(body).expect("a test record fits a TLS length").to_be_bytes();
        let mut bytes = vec![kind, 3, 3, length[0], length[1]];
        bytes.resize(HEADER_BYTES + body, 0xab);
        bytes
    }

    /// Where application data was found: the chunk's index and the offset in it.
    type Found = Option<(usize, usize)>;

    /// `chunks` fed in order: where application data was reported to begin, if anywhere.
    fn found(chunks: &[Vec<u8>]) -> Found {
        let mut end = HandshakeEnd::default();
        chunks.iter().enumerate().find_map(|(i, chunk)| end.feed(chunk).map(|at| (i, at)))
    }

    #[test]
    fn application_data_begins_with_the_second_application_data_record() {
        let hello = record(HANDSHAKE, 300);
        let ccs = record(20, 1);
        let finished = record(APPLICATION_DATA, 53);
        let request = record(APPLICATION_DATA, 200);
        let joined = |parts: &[&Vec<u8>]| parts.iter().flat_map(|p| p.iter().copied()).collect::<Vec<u8>>();
        let flight = joined(&[&ccs, &finished]);
        let cases: Vec<(&str, Vec<Vec<u8>>, Found)> = vec![
            ("one record per chunk", vec![hello.clone(), ccs.clone(), finished.clone(), request.clone()], Some((3, 0))),
            (
                "finished and request in one chunk",
                vec![hello.clone(), joined(&[&ccs, &finished, &request])],
                Some((1, flight.len())),
            ),
            (
                "everything in one chunk",
                vec![joined(&[&hello, &ccs, &finished, &request])],
                Some((0, hello.len() + flight.len())),
            ),
            ("handshake only", vec![hello.clone(), flight.clone()], None),
            ("no compatibility record", vec![hello.clone(), finished.clone(), request.clone()], Some((2, 0))),
            ("not TLS", vec![b"GET / HTTP/1.1\r\n".to_vec()], Some((0, 0))),
            ("empty", vec![], None),
        ];
        for (name, chunks, expected) in cases {
            assert_eq!(found(&chunks), expected, "{name}");
        }
    }

    #[test]
    fn records_split_anywhere_across_chunks_are_followed() {
        let stream: Vec<u8> =
            [record(HANDSHAKE, 300), record(APPLICATION_DATA, 53), record(APPLICATION_DATA, 200)].concat();
        let start = 300 + 53 + 2 * HEADER_BYTES;
        for size in 1..=stream.len() {
            let chunks: Vec<Vec<u8>> = stream.chunks(size).map(<[u8]>::to_vec).collect();
            let (index, at) = found(&chunks).unwrap_or_else(|| panic!("chunks of {size}: not found"));
            // A header begun in an earlier chunk is reported at the start of this one.
            let reported = index * size + at;
            assert!(reported >= start && reported < start + HEADER_BYTES, "chunks of {size}: found at {reported}");
            assert!(at == 0 || reported == start, "chunks of {size}: found at {reported}, not at {start}");
        }
    }

    #[test]
    fn the_point_is_reported_once() {
        let mut end = HandshakeEnd::default();
        assert_eq!(end.feed(b"plain"), Some(0));
        assert_eq!(end.feed(b"more"), None);
    }
}
