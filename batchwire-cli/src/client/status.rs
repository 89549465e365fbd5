//! `batchwire members` and `status`: what a node says of itself and its cluster.

use super::*;

/// Why a node gave no status.
enum NoStatus {
    /// It has no status mailbox: not a `batchwire node` (a client, or a library node).
    NotServed(String),
    /// Anything else.
    Failed(String),
}

impl NoStatus {
    fn text(self) -> String {
        match self {
            NoStatus::NotServed(s) | NoStatus::Failed(s) => s,
        }
    }
}

/// Ask `node`'s status mailbox.
fn ask_status(
    client: &Client,
    node: &str,
    timeout: Duration,
) -> Result<serde_json::Value, NoStatus> {
    client.reach(node).map_err(NoStatus::Failed)?;
    let to = Address::new(node, STATUS_MAILBOX).map_err(|e| NoStatus::Failed(e.to_string()))?;
    let reply = client
        .node
        .request(&to, Bytes::new(), timeout)
        .map_err(|e| match e {
            batchwire::Error::Undeliverable { .. } => NoStatus::NotServed(format!(
                "{node} has no {STATUS_MAILBOX:?} mailbox: it is not a `batchwire node` \
                 (a client, or a node of an application)"
            )),
            e => NoStatus::Failed(format!("status of {node}: {e}")),
        })?;
    serde_json::from_slice(&reply.payload)
        .map_err(|e| NoStatus::Failed(format!("status of {node}: the reply is not JSON: {e}")))
}

/// Whether a member (as JSON) is shown: live ones, and with `all` every one.
fn shown(m: &serde_json::Value, all: bool) -> bool {
    all || matches!(m["state"].as_str(), Some("alive" | "suspect"))
}

/// `batchwire members`.
pub fn members(c: &Connect, node: Option<&str>, all: bool) -> Result<(), String> {
    let client = c.start(&[])?;
    let me = client.node.name().to_string();
    let list: Vec<serde_json::Value> = match node {
        // The client's own view (it joined): wait a moment for it to settle.
        None if client.joined => {
            settle(&client.node, client.timeout);
            client
                .node
                .members()
                .iter()
                .filter(|m| m.name != me)
                .map(member_json)
                .filter(|m| shown(m, all))
                .collect()
        }
        _ => {
            let target = node
                .map(str::to_string)
                .or_else(|| c.peers.first().map(|p| p.name.clone()))
                .ok_or("--node NAME: whose view to show")?;
            let s = ask_status(&client, &target, client.timeout).map_err(NoStatus::text)?;
            s["members"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|m| m["name"] != me.as_str() && shown(m, all))
                .collect()
        }
    };
    if c.json {
        outln!("{}", serde_json::Value::Array(list));
    } else {
        outln!(
            "{:<20} {:<24} {:<8} incarnation",
            "name",
            "address",
            "state"
        );
        for m in &list {
            outln!(
                "{:<20} {:<24} {:<8} {}",
                m["name"].as_str().unwrap_or(""),
                m["addr"].as_str().unwrap_or(""),
                m["state"].as_str().unwrap_or(""),
                m["incarnation"]
            );
        }
    }
    client.node.shutdown();
    Ok(())
}

/// Wait until the view has not changed for half a second (at most `max`).
fn settle(node: &Node, max: Duration) {
    let end = Instant::now() + max;
    let mut last = node.members();
    let mut since = Instant::now();
    while Instant::now() < end && since.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(50));
        let now = node.members();
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
}

/// `batchwire status`.
pub fn status(c: &Connect, node: Option<&str>, all: bool) -> Result<(), String> {
    let client = c.start(&[])?;
    let me = client.node.name().to_string();
    let targets: Vec<String> = match node {
        Some(n) => vec![n.to_string()],
        None if client.joined => {
            settle(&client.node, client.timeout);
            client
                .node
                .members()
                .into_iter()
                .filter(|m| m.name != me && m.state.is_live())
                .map(|m| m.name)
                .collect()
        }
        None => c.peers.iter().map(|p| p.name.clone()).collect(),
    };
    let mut answers = Vec::new();
    let mut failed = 0;
    for t in &targets {
        match ask_status(&client, t, client.timeout) {
            Ok(s) => answers.push(s),
            Err(e) => {
                // Asking every member: one that left while asked, or that serves no status
                // (a client), is not a failure of the cluster.
                let gone = node.is_none()
                    && client
                        .node
                        .members()
                        .iter()
                        .any(|m| m.name == *t && !m.state.is_live());
                let not_served = matches!(e, NoStatus::NotServed(_));
                if !(gone || not_served && node.is_none()) {
                    failed += 1;
                }
                answers.push(json!({
                    "node": t, "error": e.text(), "gone": gone, "not_served": not_served,
                }));
            }
        }
    }
    if c.json {
        outln!("{}", serde_json::Value::Array(answers.clone()));
    } else {
        for s in &answers {
            match s["error"].as_str() {
                Some(_) if s["not_served"] == true && node.is_none() => outln!(
                    "node {}: serves no status (a client, or a node of an application)",
                    s["node"].as_str().unwrap_or("?")
                ),
                Some(e) if s["gone"] == true => {
                    outln!(
                        "node {}: left while asked ({e})",
                        s["node"].as_str().unwrap_or("?")
                    )
                }
                Some(e) => outln!("node {}: no answer: {e}", s["node"].as_str().unwrap_or("?")),
                None => print_status(s, &me, all),
            }
        }
    }
    client.node.shutdown();
    if failed == 0 {
        Ok(())
    } else {
        Err(format!(
            "{failed} of {} node(s) did not answer",
            targets.len()
        ))
    }
}

fn print_status(s: &serde_json::Value, me: &str, all: bool) {
    outln!(
        "node {} (batchwire {}) listening on {}, advertised {}, up {} s, {} threads",
        s["node"].as_str().unwrap_or("?"),
        s["version"].as_str().unwrap_or("?"),
        s["listen"].as_str().unwrap_or("?"),
        s["advertise"].as_str().unwrap_or("?"),
        s["uptime_secs"],
        s["threads"]
    );
    let members = s["members"].as_array().cloned().unwrap_or_default();
    let listed: Vec<_> = members
        .iter()
        .filter(|m| m["name"] != me && shown(m, all))
        .collect();
    outln!("  members ({}):", listed.len());
    for m in listed {
        outln!(
            "    {:<20} {:<24} {:<8} incarnation {}",
            m["name"].as_str().unwrap_or(""),
            m["addr"].as_str().unwrap_or(""),
            m["state"].as_str().unwrap_or(""),
            m["incarnation"]
        );
    }
    let peers = s["stats"]["peers"].as_array().cloned().unwrap_or_default();
    // Peers that are gone (a client that left, say) only with --all.
    let live = |name: &serde_json::Value| {
        members
            .iter()
            .any(|m| m["name"] == *name && shown(m, false))
    };
    let listed: Vec<_> = peers
        .iter()
        .filter(|p| p["peer"] != me && (all || p["connected"] == true || live(&p["peer"])))
        .collect();
    outln!("  peers ({}):", listed.len());
    for p in listed {
        outln!(
            "    {:<20} {:<12} sent {} msgs ({} B), received {} msgs ({} B), connects {}, failed {}, unacked {} B",
            p["peer"].as_str().unwrap_or(""),
            if p["connected"] == true {
                "connected"
            } else {
                "disconnected"
            },
            p["messages_sent"],
            p["bytes_sent"],
            p["messages_received"],
            p["bytes_received"],
            p["connects"],
            p["send_failed"],
            p["unacked_bytes"]
        );
    }
}
