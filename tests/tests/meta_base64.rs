//! A key sent base64-encoded with the meta `b` flag lands on the same server as the same
//! key sent raw: memroute places meta keys by their decoded bytes.
use memroute_tests::*;

/// RFC 4648 base64, enough for test keys.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn base64_meta_keys_are_placed_by_their_decoded_bytes() {
    let servers: Vec<Memcached> = (0..4).map(|_| Memcached::start()).collect();
    let addrs: Vec<String> = servers.iter().map(Memcached::addr).collect();
    let listen = format!("127.0.0.1:{}", free_port());
    let proxy = Memroute::start(&pool_config(&listen, &addrs, "ketama", "md5", ""));
    let mut client = proxy.connect();
    let keys: Vec<String> = (0..60).map(|i| format!("b64key{i}")).collect();
    for key in &keys {
        assert_eq!(
            client.roundtrip_line(format!("set {key} 0 0 2\r\nok\r\n").as_bytes()),
            b"STORED\r\n"
        );
    }
    for key in &keys {
        let encoded = base64(key.as_bytes());
        let reply = client.roundtrip_lines(format!("mg {encoded} b v\r\n").as_bytes(), 2);
        assert_eq!(
            reply,
            b"VA 2\r\nok\r\n",
            "mg of base64 key for {key} missed: {}",
            String::from_utf8_lossy(&reply)
        );
    }
    // And the other way: stored with a base64 key, found by its raw name.
    for key in &keys {
        let encoded = base64(format!("{key}-m").as_bytes());
        assert_eq!(
            client.roundtrip_line(format!("ms {encoded} 2 b\r\nhi\r\n").as_bytes()),
            b"HD\r\n"
        );
        let raw = format!("{key}-m");
        assert_eq!(
            client.roundtrip_lines(format!("get {raw}\r\n").as_bytes(), 3),
            format!("VALUE {raw} 0 2\r\nhi\r\nEND\r\n").as_bytes()
        );
    }
}
