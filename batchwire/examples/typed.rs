//! Typed messages and typed requests: serde values, serialized with postcard.
//!
//!     cargo run --example typed

use std::time::Duration;

use batchwire::{Address, Node, NodeConfig};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug)]
enum Command {
    Deposit { account: String, cents: u64 },
    Balance { account: String },
}

#[derive(Serialize, Deserialize, Debug)]
struct Balance {
    account: String,
    cents: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let free = || std::net::TcpListener::bind("127.0.0.1:0")?.local_addr();
    let (bank_addr, app_addr) = (free()?, free()?);
    let secret = b"example-secret";
    let bank = Node::start(NodeConfig::new("bank", bank_addr, secret).peer("app", app_addr))?;
    let app = Node::start(NodeConfig::new("app", app_addr, secret).peer("bank", bank_addr))?;

    let ledger = bank.mailbox("ledger")?;
    let server = std::thread::spawn(move || {
        let mut accounts = std::collections::HashMap::<String, u64>::new();
        // Deposits are one-way messages; balances are requests.
        while let Ok(e) = ledger.recv_timeout(Duration::from_secs(5)) {
            match e.value::<Command>() {
                Ok(Command::Deposit { account, cents }) => {
                    *accounts.entry(account).or_default() += cents;
                }
                Ok(Command::Balance { account }) => {
                    let cents = accounts.get(&account).copied().unwrap_or(0);
                    e.reply_value(&Balance { account, cents }).expect("reply");
                    return;
                }
                Err(err) => eprintln!("bad command from {}: {err}", e.from),
            }
        }
    });

    let ledger = Address::new("bank", "ledger")?;
    for cents in [150, 250, 600] {
        app.send_value(
            &ledger,
            &Command::Deposit {
                account: "alice".into(),
                cents,
            },
        )?;
    }
    // Messages from one sender to one mailbox arrive in order: the balance comes after the
    // deposits.
    let b: Balance = app.request_value(
        &ledger,
        &Command::Balance {
            account: "alice".into(),
        },
        Duration::from_secs(5),
    )?;
    println!("{} has {} cents", b.account, b.cents);
    assert_eq!(b.cents, 1000);
    server.join().expect("server");
    Ok(())
}
