//! The async API on tokio, multi-thread and current-thread: mailboxes as streams, requests
//! in flight by the thousand, async sends that wait for room (and what dropping one
//! means), event streams with any number of subscribers.

mod common;

use std::time::Duration;

use batchwire::{Address, Event, Mailbox, Node};
use common::{mesh, start};
use futures_util::StreamExt;
use futures_util::future::join_all;

/// Answer every request on `mb` with its payload reversed, until the node shuts down.
async fn serve(mut mb: Mailbox) {
    while let Some(e) = mb.next().await {
        let mut p = e.payload.to_vec();
        p.reverse();
        e.reply_async(p).await.unwrap();
    }
}

async fn many_requests(a: &Node, n: usize) {
    let to = Address::new("b", "echo").unwrap();
    let calls = (0..n).map(|i| {
        let q = format!("q{i}");
        let to = to.clone();
        async move {
            let r = a
                .request_async(&to, q.clone(), Duration::from_secs(30))
                .await
                .unwrap();
            assert_eq!(r.payload, q.chars().rev().collect::<String>().as_bytes());
        }
    });
    join_all(calls).await;
    let s = a.stats().requests;
    assert_eq!((s.answered, s.pending), (n as u64, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_requests_in_flight_on_a_multi_thread_runtime() {
    let nodes = start(mesh(&["a", "b"]));
    let server = tokio::spawn(serve(nodes[1].mailbox("echo").unwrap()));
    many_requests(&nodes[0], 5000).await;
    let typed: u64 = nodes[0]
        .request_value_async(
            &Address::new("b", "echo").unwrap(),
            &7u64,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    // postcard's 7 is one byte; reversed it is the same.
    assert_eq!(typed, 7);
    drop(nodes);
    server.await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn service_and_callers_share_one_thread_on_a_current_thread_runtime() {
    let nodes = start(mesh(&["a", "b"]));
    let server = tokio::spawn(serve(nodes[1].mailbox("echo").unwrap()));
    many_requests(&nodes[0], 2000).await;
    // A request that times out, on the node's own timer (no runtime timer involved).
    let _silent = nodes[1].mailbox("silent").unwrap();
    let r = nodes[0]
        .request_async(
            &Address::new("b", "silent").unwrap(),
            "?",
            Duration::from_millis(50),
        )
        .await;
    assert!(matches!(r, Err(batchwire::Error::Timeout)), "{r:?}");
    drop(nodes);
    server.await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn an_async_send_waits_for_room_and_a_dropped_one_never_sent_its_message() {
    let mut cfgs = mesh(&["a", "b"]);
    // b admits 64 KiB from a into "slow" at a time (credit).
    cfgs[1] = cfgs[1].clone().mailbox_bytes(64 << 10);
    let nodes = start(cfgs);
    let (a, b) = (&nodes[0], &nodes[1]);
    let slow = b.mailbox("slow").unwrap();
    let to = Address::new("b", "slow").unwrap();
    let msg = |i: u32| {
        let mut v = i.to_le_bytes().to_vec();
        v.resize(8 << 10, 0);
        v
    };
    // Nobody reads: sends are accepted until the credit is used up, then one waits (and
    // the runtime's only thread stays free: the timeout fires).
    let mut accepted = Vec::new();
    let mut dropped = None;
    for i in 0..1000u32 {
        match tokio::time::timeout(Duration::from_millis(200), a.send_async(&to, msg(i))).await {
            Ok(r) => {
                r.unwrap();
                accepted.push(i);
            }
            Err(_) => {
                dropped = Some(i);
                break;
            }
        }
    }
    let dropped = dropped.expect("the credit ran out");
    assert!(accepted.len() >= 4, "{}", accepted.len());
    // A reader drains b; the next sends go through once it makes room.
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        while got.len() < 1000 {
            match slow.recv_timeout(Duration::from_secs(2)) {
                Ok(e) => got.push(u32::from_le_bytes(e.payload[..4].try_into().unwrap())),
                Err(_) => break,
            }
        }
        got
    });
    for i in dropped + 1..dropped + 51 {
        a.send_async(&to, msg(i)).await.unwrap();
        accepted.push(i);
    }
    let got = tokio::task::spawn_blocking(move || reader.join().unwrap())
        .await
        .unwrap();
    assert_eq!(
        got, accepted,
        "exactly what was accepted, in order; not {dropped}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn every_event_stream_gets_every_event_and_a_slow_one_is_told_what_it_missed() {
    let mut cfgs = mesh(&["a"]);
    cfgs[0] = cfgs[0].clone().events_capacity(2);
    let a = Node::start(cfgs.pop().unwrap()).unwrap();
    let mut s1 = a.event_stream();
    let mut s2 = a.event_stream();
    let std_rx = a.events();
    let nowhere = Address::new("a", "nobody").unwrap();
    // Ten undeliverable sends: ten events; each queue holds two.
    for _ in 0..10 {
        a.send_async(&nowhere, "x").await.unwrap();
    }
    for s in [&mut s1, &mut s2] {
        for _ in 0..2 {
            assert!(matches!(s.next().await, Some(Event::Undeliverable { .. })));
        }
    }
    assert!(matches!(std_rx.try_recv(), Ok(Event::Undeliverable { .. })));
    a.send(&nowhere, "y").unwrap();
    for s in [&mut s1, &mut s2] {
        assert!(matches!(
            s.next().await,
            Some(Event::EventsDropped { count: 8 })
        ));
        assert!(matches!(s.next().await, Some(Event::Undeliverable { .. })));
    }
    drop(s2);
    drop(a);
    // After the shutdown the stream ends.
    while let Some(e) = s1.next().await {
        assert!(!matches!(e, Event::Undeliverable { .. }), "{e:?}");
    }
}
