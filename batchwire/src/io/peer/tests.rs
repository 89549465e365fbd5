use super::*;
use batchwire_core::frame;
use batchwire_core::session::SessionConfig;
use bytes::BytesMut;

#[test]
fn undeliverable_notices_are_summed_and_bounded() {
    let p = testing::peer(SessionConfig::default());
    let from = Name::from_static("x");
    for i in 0..1000 {
        let to = Name::new(&format!("nobody-{i}")).unwrap();
        p.report_undeliverable(&to, &from, 2);
        p.report_undeliverable(&to, &from, 1);
    }
    let mut total = 0u64;
    let mut frames = 0;
    let mut out = Vec::new();
    while p.has_notices() {
        out.clear();
        p.take_notices(&mut out);
        let mut buf = BytesMut::from(&out[..]);
        while let Ok(Some(Frame::Undeliverable(u))) = frame::decode(&mut buf, 1 << 16) {
            total += u.count as u64;
            frames += 1;
        }
    }
    assert_eq!(total, 3000, "every message counted");
    assert_eq!(frames, NOTICE_PAIRS + 1, "64 pairs and one summary");
}
