//! The frame decoder never panics, whatever bytes a peer sends.

use proptest::prelude::*;
use superstep::transport::tcp::wire::{decode_stream, PROTOCOL_VERSION};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_stream(&bytes, 1 << 16);
    }

    #[test]
    fn well_framed_arbitrary_bodies_never_panic(
        body in prop::collection::vec(any::<u8>(), 0..256),
        frames in 1usize..4,
    ) {
        let mut bytes = Vec::new();
        for _ in 0..frames {
            bytes.extend_from_slice(&((body.len() + 2) as u32).to_be_bytes());
            bytes.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
            bytes.extend_from_slice(&body);
        }
        let decoded = decode_stream(&bytes, 1 << 16);
        prop_assert_eq!(decoded.len(), frames);
    }
}
