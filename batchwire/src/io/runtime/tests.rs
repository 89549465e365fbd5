use super::all_to;

#[test]
fn send_all_names_are_the_mailboxes_asked_for_whatever_came_before() {
    let long = "l".repeat(200);
    for s in ["a", "b", "a", "", long.as_str(), "ab", "a", long.as_str()] {
        assert_eq!(all_to(s).unwrap().as_str(), s);
    }
    assert!(all_to(&"x".repeat(256)).is_none(), "longer than 255 bytes");
    assert_eq!(
        all_to("a").unwrap().as_str(),
        "a",
        "a refused name is not kept"
    );
    // Each thread has its own.
    std::thread::spawn(|| assert_eq!(all_to("other").unwrap().as_str(), "other"))
        .join()
        .unwrap();
    assert_eq!(all_to("a").unwrap().as_str(), "a");
}
