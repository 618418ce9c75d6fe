//! A minimal binary-protocol client for the tests that drive memroute with binary GETs
//! (included with `#[path]`, as the dnsmasq helper is).
// Each test file that includes it uses part of it.
#![allow(dead_code)]
use memroute_tests::Conn;

const REQUEST_MAGIC: u8 = 0x80;
const RESPONSE_MAGIC: u8 = 0x81;
const GET: u8 = 0x00;
pub const GETK: u8 = 0x0c;
pub const SASL_LIST_MECHS: u8 = 0x20;
pub const SASL_AUTH: u8 = 0x21;
const HEADER_LEN: usize = 24;

/// A binary GET of `key`.
pub fn get_request(key: &str) -> Vec<u8> {
    request(GET, key)
}

/// A request of `opcode` (a get-like one: no extras, no value) for `key`.
pub fn request(opcode: u8, key: &str) -> Vec<u8> {
    let mut frame = vec![REQUEST_MAGIC, opcode];
    frame.extend_from_slice(&(key.len() as u16).to_be_bytes());
    // No extras, raw data type, vbucket 0.
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(&(key.len() as u32).to_be_bytes());
    // Opaque and CAS.
    frame.extend_from_slice(&[0; 12]);
    frame.extend_from_slice(key.as_bytes());
    frame
}

/// A request of `opcode` with `key` and `value` (no extras, opaque and CAS 0).
pub fn frame(opcode: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut frame = vec![REQUEST_MAGIC, opcode];
    frame.extend_from_slice(&(key.len() as u16).to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(&((key.len() + value.len()) as u32).to_be_bytes());
    frame.extend_from_slice(&[0; 12]);
    frame.extend_from_slice(key);
    frame.extend_from_slice(value);
    frame
}

/// Reads one response: its status and its value (the body after extras and key).
pub fn read_response(conn: &mut Conn) -> (u16, Vec<u8>) {
    let header = conn.read_for(HEADER_LEN);
    assert_eq!(header[0], RESPONSE_MAGIC, "response magic: {header:?}");
    let status = u16::from_be_bytes([header[6], header[7]]);
    let skip = usize::from(u16::from_be_bytes([header[2], header[3]])) + usize::from(header[4]);
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let body = conn.read_for(body);
    (status, body[skip..].to_vec())
}

/// One response, whole.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub opcode: u8,
    pub status: u16,
    pub extras: Vec<u8>,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// Reads one response, its body split into extras, key and value.
pub fn read_whole_response(conn: &mut Conn) -> Response {
    let header = conn.read_for(HEADER_LEN);
    assert_eq!(header[0], RESPONSE_MAGIC, "response magic: {header:?}");
    let key_len = usize::from(u16::from_be_bytes([header[2], header[3]]));
    let extras_len = usize::from(header[4]);
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let mut body = conn.read_for(body);
    let value = body.split_off(extras_len + key_len);
    let key = body.split_off(extras_len);
    Response {
        opcode: header[1],
        status: u16::from_be_bytes([header[6], header[7]]),
        extras: body,
        key,
        value,
    }
}

/// A GET of `key` answered before it returns: the value, or `None` for any other status.
pub fn get(conn: &mut Conn, key: &str) -> Option<Vec<u8>> {
    conn.send(&get_request(key));
    let (status, value) = read_response(conn);
    (status == 0).then_some(value)
}
