//! A request/reply service and its client.
//!
//! In one process (two nodes on loopback):
//!     cargo run --example request_reply
//! Or as two processes, the service first:
//!     cargo run --example request_reply -- serve 127.0.0.1:7100 127.0.0.1:7101
//!     cargo run --example request_reply -- call  127.0.0.1:7100 127.0.0.1:7101
//! (the service node is "svc" on the first address, the client "cli" on the second).

use std::net::SocketAddr;
use std::time::Duration;

use batchwire::{Address, Error, Node, NodeConfig};

const SECRET: &[u8] = b"example-secret";

fn service_config(svc: SocketAddr, cli: SocketAddr) -> NodeConfig {
    NodeConfig::new("svc", svc, SECRET).peer("cli", cli)
}

fn client_config(svc: SocketAddr, cli: SocketAddr) -> NodeConfig {
    NodeConfig::new("cli", cli, SECRET).peer("svc", svc)
}

/// The service: answer every request on mailbox "upper" with its payload in capitals.
fn serve(node: &Node, max: Option<usize>) -> Result<(), Error> {
    let mb = node.mailbox("upper")?;
    let mut served = 0;
    while max.is_none_or(|m| served < m) {
        let Ok(req) = mb.recv() else { break };
        let text = String::from_utf8_lossy(&req.payload).to_uppercase();
        req.reply(text)?;
        served += 1;
    }
    Ok(())
}

/// The client: a few requests, one of them to a mailbox that does not exist.
fn call(node: &Node) -> Result<(), Error> {
    assert!(
        node.wait_for_peers(&["svc"], Duration::from_secs(10)),
        "svc is not up"
    );
    let upper = Address::new("svc", "upper")?;
    for word in ["hello", "batchwire", "requests"] {
        let reply = node.request(&upper, word, Duration::from_secs(5))?;
        println!("{word} -> {}", String::from_utf8_lossy(&reply.payload));
    }
    // Errors are typed: no such mailbox, timeout, peer down...
    match node.request(&Address::new("svc", "nobody")?, "?", Duration::from_secs(5)) {
        Err(e) => println!("to a missing mailbox: {e}"),
        Ok(_) => println!("unexpected reply"),
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = |i: usize, d: &str| -> Result<SocketAddr, Box<dyn std::error::Error>> {
        Ok(args.get(i).map_or(d, |s| s.as_str()).parse()?)
    };
    match args.first().map(String::as_str) {
        Some("serve") => {
            let node = Node::start(service_config(addr(1, "")?, addr(2, "")?))?;
            println!("serving on {}", node.local_addr());
            serve(&node, None)?;
        }
        Some("call") => {
            let node = Node::start(client_config(addr(1, "")?, addr(2, "")?))?;
            call(&node)?;
        }
        _ => {
            // Both in this process, on free ports.
            let free = || std::net::TcpListener::bind("127.0.0.1:0")?.local_addr();
            let (svc, cli) = (free()?, free()?);
            let service = Node::start(service_config(svc, cli))?;
            let client = Node::start(client_config(svc, cli))?;
            std::thread::scope(|s| {
                let server = s.spawn(|| serve(&service, Some(3)));
                let r = call(&client);
                server.join().expect("server thread")?;
                r
            })?;
        }
    }
    Ok(())
}
