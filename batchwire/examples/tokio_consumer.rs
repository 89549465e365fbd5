//! An async consumer on tokio: the mailbox as a `Stream`, async sends that wait for room
//! without blocking a worker thread, async requests, and the event stream.
//!
//!     cargo run --example tokio_consumer

use std::time::Duration;

use batchwire::{Address, Event, Node, NodeConfig};
use futures_util::StreamExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let free = || std::net::TcpListener::bind("127.0.0.1:0")?.local_addr();
    let (a_addr, b_addr) = (free()?, free()?);
    let secret = b"example-secret";
    let a = Node::start(NodeConfig::new("a", a_addr, secret).peer("b", b_addr))?;
    let b = Node::start(NodeConfig::new("b", b_addr, secret).peer("a", a_addr))?;
    let mut events = a.event_stream();

    // The consumer: a task reading b's mailbox as a stream. Requests get a reply; other
    // messages are counted.
    let mut inbox = b.mailbox("inbox")?;
    let consumer = tokio::spawn(async move {
        let mut plain = 0;
        while let Some(e) = inbox.next().await {
            if e.is_request() {
                let n = e.payload.len().to_string();
                e.reply_async(n).await.expect("reply");
            } else {
                plain += 1;
                if plain == 10_000 {
                    println!("consumer: 10000 messages in");
                }
            }
        }
        plain
    });

    // Wait for the connection through the event stream.
    while let Some(ev) = events.next().await {
        if let Event::PeerUp { peer, .. } = ev {
            println!("event: {peer} is up");
            break;
        }
    }

    let to = Address::new("b", "inbox")?;
    for i in 0..10_000u32 {
        // Waits (without blocking the thread) when the queue toward b or the mailbox's
        // credit is full; the consumer task runs meanwhile on the same thread.
        a.send_async(&to, i.to_le_bytes().to_vec()).await?;
    }
    let reply = a
        .request_async(&to, "how long is this?", Duration::from_secs(5))
        .await?;
    println!("reply: {}", String::from_utf8_lossy(&reply.payload));

    drop(b); // shuts b down; the consumer's stream ends
    println!("consumer saw {} plain messages", consumer.await?);
    Ok(())
}
