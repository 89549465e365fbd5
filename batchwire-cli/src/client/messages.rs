//! `batchwire send`, `request` and `listen`: messages from the command line.

use super::*;

/// A payload as text: UTF-8 as it is, anything else as hex.
fn payload_text(p: &[u8]) -> (&'static str, String) {
    match std::str::from_utf8(p) {
        Ok(s) => ("text", s.to_string()),
        Err(_) => ("hex", p.iter().map(|b| format!("{b:02x}")).collect()),
    }
}

/// What `send` heard back.
#[derive(Default)]
struct Tally {
    failed: u64,
    undeliverable: u64,
    reasons: Vec<String>,
}

impl Tally {
    /// Count the next event about `to`, waiting up to `wait` for one.
    fn take(&mut self, events: &std::sync::mpsc::Receiver<Event>, to: &Address, wait: Duration) {
        match events.recv_timeout(wait) {
            Ok(Event::SendFailed {
                peer,
                count,
                reason,
                ..
            }) if peer == to.node() => {
                self.failed += count;
                self.reasons.push(format!("{count} failed: {reason:?}"));
            }
            Ok(Event::Undeliverable {
                to: t, from, count, ..
            }) if t == *to && from == SEND_MAILBOX => {
                self.undeliverable += count;
            }
            _ => {}
        }
    }
}

/// `batchwire send`.
pub fn send(c: &Connect, to: &str, messages: Vec<String>) -> Result<(), String> {
    let to = parse_address(to)?;
    let messages: Vec<String> = if messages.is_empty() {
        // One message per line of standard input.
        std::io::stdin()
            .lines()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("reading standard input: {e}"))?
    } else {
        messages
    };
    // Sent from a mailbox of its own: what comes back (an echo, say) lands there and is
    // dropped with the client, instead of being reported undeliverable.
    let client = c.start(&[SEND_MAILBOX])?;
    let node = &client.node;
    let from = node.mailbox(SEND_MAILBOX).map_err(|e| e.to_string())?;
    client.reach(to.node())?;
    let events = node.events();
    let before = node.stats().peer(to.node()).map_or(0, |p| p.acked);
    let mut sent = 0u64;
    for m in messages {
        from.send(&to, Bytes::from(m))
            .map_err(|e| format!("send to {to}: {e} ({sent} sent before)"))?;
        sent += 1;
    }
    // Wait until the peer acknowledged every one (or the timeout), watching for failures.
    let deadline = Instant::now() + client.timeout;
    let mut t = Tally::default();
    let mut acked = 0;
    while Instant::now() < deadline {
        acked = node
            .stats()
            .peer(to.node())
            .map_or(0, |p| p.acked.saturating_sub(before));
        if acked + t.failed >= sent {
            break;
        }
        t.take(&events, &to, Duration::from_millis(5));
    }
    // A notice of "no such mailbox" comes with (or just after) the acknowledgement.
    let grace = Instant::now() + Duration::from_millis(100);
    while Instant::now() < grace {
        t.take(&events, &to, Duration::from_millis(10));
    }
    let Tally {
        failed,
        undeliverable,
        reasons,
    } = t;
    let acked = acked.min(sent);
    if c.json {
        outln!(
            "{}",
            json!({
                "to": to.to_string(),
                "sent": sent,
                "acknowledged": acked,
                "failed": failed,
                "undeliverable": undeliverable,
            })
        );
    } else {
        outln!("sent {sent} message(s) to {to}: {acked} acknowledged");
    }
    drop(events);
    // What came back (an echo, say) is not this command's business.
    while from.try_recv().is_ok() {}
    drop(from);
    client.node.shutdown();
    if undeliverable > 0 {
        return Err(format!(
            "{undeliverable} message(s) undeliverable: {} has no mailbox {:?}",
            to.node(),
            to.mailbox()
        ));
    }
    if failed > 0 {
        return Err(format!("to {to}: {}", reasons.join("; ")));
    }
    if acked < sent {
        return Err(format!(
            "{} of {sent} message(s) not acknowledged by {} within {:?}",
            sent - acked,
            to.node(),
            client.timeout
        ));
    }
    Ok(())
}

/// `batchwire request`.
pub fn request(c: &Connect, to: &str, message: &str, timeout: Duration) -> Result<(), String> {
    let to = parse_address(to)?;
    let client = c.start(&[])?;
    client.reach(to.node())?;
    let t0 = Instant::now();
    let reply = client
        .node
        .request(&to, Bytes::from(message.to_string()), timeout)
        .map_err(|e| format!("request to {to}: {e}"))?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let (kind, text) = payload_text(&reply.payload);
    if c.json {
        let mut v = json!({
            "from": reply.from.to_string(),
            "bytes": reply.payload.len(),
            "ms": (ms * 1000.0).round() / 1000.0,
        });
        v[kind] = json!(text);
        outln!("{v}");
    } else {
        outln!("{text}");
    }
    client.node.shutdown();
    Ok(())
}

/// `batchwire listen`.
pub fn listen(
    c: &Connect,
    mailbox: &str,
    count: Option<u64>,
    duration: Option<Duration>,
    reply: Option<&str>,
) -> Result<(), String> {
    let stop = crate::sys::stop_signals()?;
    let client = c.start(&[mailbox])?;
    let mb = client.node.mailbox(mailbox).map_err(|e| e.to_string())?;
    eprintln!(
        "listening on {} (address {mailbox}@{}); Ctrl-C to stop",
        client.node.local_addr(),
        client.node.name()
    );
    let until = duration.map(|d| Instant::now() + d);
    let mut n = 0u64;
    while count.is_none_or(|c| n < c)
        && until.is_none_or(|t| Instant::now() < t)
        && !stop.load(Ordering::Acquire)
    {
        let e = match mb.recv_timeout(Duration::from_millis(100)) {
            Ok(e) => e,
            Err(batchwire::RecvError::Timeout | batchwire::RecvError::Empty) => continue,
            Err(e) => return Err(format!("mailbox {mailbox}: {e}")),
        };
        n += 1;
        let (kind, text) = payload_text(&e.payload);
        if c.json {
            let mut v = json!({
                "from": e.from.to_string(),
                "to": format!("{mailbox}@{}", client.node.name()),
                "bytes": e.payload.len(),
                "request": e.is_request(),
            });
            v[kind] = json!(text);
            outln!("{v}");
        } else {
            outln!("{}\t{text}", e.from);
        }
        if let (Some(r), true) = (reply, e.is_request()) {
            e.reply(Bytes::from(r.to_string()))
                .map_err(|err| format!("reply to {}: {err}", e.from))?;
        }
    }
    drop(mb);
    client.node.shutdown();
    Ok(())
}
