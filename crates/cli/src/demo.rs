//! `tidegate demo`: the travel-booking story of the Atomix paper, run for real on the engine.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tidegate_runtime::{Ack, Compensation, EffectClass, Error, Outcome, Tidegate, Tool, ToolError, TxOptions};

/// The outside world: providers that print what reaches them and keep the booking record.
#[derive(Clone, Default)]
struct Providers {
    fail_flight: Arc<Mutex<bool>>,
    /// booking id -> (version of the provider record, itinerary)
    bookings: Arc<Mutex<BTreeMap<String, (u32, String)>>>,
}

fn say(who: &str, what: impl std::fmt::Display) {
    println!("    {who:<10} {what}");
}

impl Providers {
    fn tools(&self) -> anyhow::Result<[Tool; 5]> {
        let p = self.clone();
        let flight = Tool::builder("reserve_flight", EffectClass::ReversibleWithCost)
            .scope(|a| format!("travel:flight:{}", s(a, "trip")))
            .call(move |a| {
                let p = p.clone();
                async move {
                    if *p.fail_flight.lock().map_err(poisoned)? {
                        say("airline", format!("REFUSED flight {} (no seats)", s(&a, "route")));
                        return Err(ToolError::failed("no seats left on this route"));
                    }
                    say("airline", format!("holds flight {} for trip {}", s(&a, "route"), s(&a, "trip")));
                    Ok(json!({"pnr": format!("PNR-{}", s(&a, "trip"))}))
                }
            })
            .compensate(|_a, out| async move {
                say("airline", format!("cancels {} and keeps a 40 EUR fee", out["pnr"].as_str().unwrap_or("?")));
                Ok(Compensation::with_residue("cancellation fee 40 EUR"))
            })
            .build()?;
        let hotel = Tool::builder("reserve_hotel", EffectClass::Reversible)
            .scope(|a| format!("travel:hotel:{}", s(a, "trip")))
            .call(|a| async move {
                say("hotel", format!("reserves {} for trip {}", s(&a, "hotel"), s(&a, "trip")));
                Ok(json!({"confirmation": format!("HTL-{}", s(&a, "trip"))}))
            })
            .compensate(|_a, out| async move {
                say("hotel", format!("cancels {} free of charge", out["confirmation"].as_str().unwrap_or("?")));
                Ok(Compensation::clean())
            })
            .build()?;
        let car = Tool::builder("reserve_car", EffectClass::Reversible)
            .scope(|a| format!("travel:car:{}", s(a, "trip")))
            .call(|a| async move {
                say("car rental", format!("reserves a car for trip {}", s(&a, "trip")));
                Ok(json!({"contract": format!("CAR-{}", s(&a, "trip"))}))
            })
            .compensate(|_a, out| async move {
                say("car rental", format!("cancels {}", out["contract"].as_str().unwrap_or("?")));
                Ok(Compensation::clean())
            })
            .build()?;
        let email = Tool::builder("send_confirmation", EffectClass::Gated)
            .scope(|a| format!("mail:{}", s(a, "to")))
            .call(|a| async move {
                say("mail", format!("SENDS to {}: \"{}\"", s(&a, "to"), s(&a, "subject")));
                Ok(json!({"message_id": "msg-1"}))
            })
            .build()?;
        let p = self.clone();
        let rebook = Tool::builder("rebook", EffectClass::Bufferable)
            .scope(|a| format!("travel:booking:{}", s(a, "booking")))
            .call(move |a| {
                let p = p.clone();
                async move {
                    let mut b = p.bookings.lock().map_err(poisoned)?;
                    let entry = b.entry(s(&a, "booking").to_owned()).or_insert((0, String::new()));
                    entry.0 += 1;
                    entry.1 = s(&a, "itinerary").to_owned();
                    say("booking", format!("record {} now v{}: {}", s(&a, "booking"), entry.0, entry.1));
                    Ok(json!({"record_version": entry.0}))
                }
            })
            .build()?;
        Ok([flight, hotel, car, email, rebook])
    }
}

fn s<'a>(a: &'a Value, k: &str) -> &'a str {
    a[k].as_str().unwrap_or("?")
}

fn poisoned<T>(_: T) -> ToolError {
    ToolError::failed("provider state poisoned")
}

fn ack(a: &Ack) -> String {
    match a {
        Ack::Executed { output, .. } => format!("executed now, provider said {output}"),
        Ack::Staged { .. } => "staged: applies only if the transaction commits".into(),
        Ack::Queued { .. } => "queued: fires only if the transaction commits".into(),
        Ack::Replayed { output, .. } => format!("already done, recorded outcome {output}"),
    }
}

fn print_outcome(o: &Outcome) {
    let verdict = if o.committed { "COMMITTED".to_owned() } else { "ABORTED".to_owned() };
    let why = o.reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default();
    println!("  => {} {verdict}{why}", o.tx);
    for e in &o.effects {
        let detail = e.detail.as_ref().map(|d| format!(" - {d}")).unwrap_or_default();
        println!("     {} {:<18} {:<21} {:?} [{}]{detail}", e.id, e.tool, e.class.to_string(), e.disposition, e.tag);
    }
}

/// Options of `tidegate demo` beyond the data directory.
#[derive(Debug, Clone, Default)]
pub struct DemoOptions {
    /// Write one operation record per transaction to this file (`tidegate check` reads it).
    pub trace: Option<std::path::PathBuf>,
    /// The consistency level.
    pub level: Option<tidegate_runtime::Level>,
}

/// Where the demo's ledger lives: `--store URL`, else `--memory`, else the data directory.
pub fn store_url(
    dir: &crate::data_dir::DataDir,
    memory: bool,
    store: Option<&str>,
) -> anyhow::Result<tidegate_runtime::StoreUrl> {
    Ok(match (store, memory) {
        (Some(text), _) => text.parse()?,
        (None, true) => tidegate_runtime::StoreUrl::Memory,
        (None, false) => tidegate_runtime::StoreUrl::sqlite(dir.path()?),
    })
}

pub fn run(url: tidegate_runtime::StoreUrl, opts: DemoOptions) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(story(url, opts))
}

async fn story(url: tidegate_runtime::StoreUrl, opts: DemoOptions) -> anyhow::Result<()> {
    let (store, sqlite): (Option<std::sync::Arc<dyn tidegate_storage::LedgerStore>>, _) = match &url {
        tidegate_runtime::StoreUrl::Memory => (None, None),
        // The embedded ledger is verified in full before anything is appended to it.
        tidegate_runtime::StoreUrl::Sqlite(dir) => {
            let s = crate::data_dir::DataDir { data_dir: Some(dir.clone()) }.open()?;
            (Some(s.clone() as std::sync::Arc<dyn tidegate_storage::LedgerStore>), Some(s))
        }
        other => (Some(other.open()?.store), None),
    };
    let dir = url.dir().map(|d| crate::data_dir::DataDir { data_dir: Some(d.to_path_buf()) });
    let mut builder = Tidegate::builder();
    if let Some(s) = &store {
        builder = builder.store(s.clone());
    }
    if let Some(level) = opts.level {
        builder = builder.level(level);
    }
    if let Some(path) = &opts.trace {
        builder = builder.trace_file(path)?;
    }
    let tg = builder.build()?;
    let world = Providers::default();
    let [flight, hotel, car, email, rebook] = world.tools()?;
    for t in [&flight, &hotel, &car, &email, &rebook] {
        tg.register(t)?;
    }
    let recovered = tg.recover().await?;
    let open = tg.open_report();
    let rebuilt = match (open.checkpoint_lsn, &open.checkpoint_fallback) {
        (_, Some(why)) => format!("checkpoint not used ({why}); {} events replayed", open.replayed_events),
        (Some(lsn), None) => {
            format!("rebuilt from the checkpoint at LSN {lsn} plus {} later events", open.replayed_events)
        }
        (None, None) => format!("{} events from earlier runs replayed", open.replayed_events),
    };
    match (&sqlite, &dir) {
        (Some(s), Some(d)) => println!("Ledger: {} ({rebuilt}; {})\n", d.path()?.display(), s.open_report()),
        _ if url.is_durable() => println!("Ledger: {url} ({rebuilt})\n"),
        _ => println!("Ledger: in memory (--memory)\n"),
    }
    if recovered.unfinished > 0 {
        println!(
            "Recovered an interrupted earlier run: {} unfinished transaction(s); orphans aborted: {:?}; in-doubt calls left unresolved for an operator: {:?}; commits resumed: {:?}; aborts resumed: {:?}; expired: {:?}\n",
            recovered.unfinished,
            recovered.orphans,
            recovered.unresolved,
            recovered.commits_resumed,
            recovered.aborts_resumed,
            recovered.expired
        );
    }

    println!("Tidegate demo: a holiday-booking agent (flight, hotel, car, confirmation email)\n");
    println!("1. Everything succeeds: the email is held until the whole booking commits.");
    let tx = tg.begin_with(TxOptions::agent("booker").may_touch([
        "travel:flight:T1",
        "travel:hotel:T1",
        "travel:car:T1",
        "mail:ana@example.com",
    ]))?;
    for (tool, args) in [
        (&flight, json!({"trip": "T1", "route": "LIS-OSL"})),
        (&hotel, json!({"trip": "T1", "hotel": "Fjord Inn"})),
        (&car, json!({"trip": "T1"})),
        (&email, json!({"to": "ana@example.com", "subject": "Your trip T1 is booked"})),
    ] {
        let a = tx.call(tool, args).await?;
        say("agent", format!("{} -> {}", tool.name(), ack(&a)));
    }
    say("agent", "seals and commits");
    tx.seal()?;
    print_outcome(&tx.commit().await?);

    println!("\n2. The flight fails: the reservations are cancelled in reverse order, the email is never sent.");
    *world.fail_flight.lock().map_err(|_| anyhow::anyhow!("poisoned"))? = true;
    let tx = tg.begin("booker")?;
    for (tool, args) in [
        (&hotel, json!({"trip": "T2", "hotel": "Harbour Hotel"})),
        (&car, json!({"trip": "T2"})),
        (&email, json!({"to": "ben@example.com", "subject": "Your trip T2 is booked"})),
        (&flight, json!({"trip": "T2", "route": "OSL-NYC"})),
    ] {
        match tx.call(tool, args).await {
            Ok(a) => say("agent", format!("{} -> {}", tool.name(), ack(&a))),
            Err(Error::Aborted(o)) => {
                say("agent", format!("{} failed; the engine aborts the transaction", tool.name()));
                print_outcome(&o);
            }
            Err(e) => return Err(e).context("unexpected error in scenario 2"),
        }
    }
    *world.fail_flight.lock().map_err(|_| anyhow::anyhow!("poisoned"))? = false;

    println!("\n3. Two agents race to rebook reservation B7 (read, think, write, confirm).");
    let scope = ["travel:booking:B7", "mail:ana@example.com"];
    let mut agents = Vec::new();
    for (name, itinerary, think_ms) in [("alice", "LIS-OSL on Friday", 60u64), ("bob", "LIS-OSL on Saturday", 10)] {
        let (tg, rebook, email) = (tg.clone(), rebook.clone(), email.clone());
        agents.push(tokio::spawn(async move {
            let mut attempt = 0;
            tg.run(TxOptions::agent(name).may_touch(scope), move |tx| {
                attempt += 1;
                let (rebook, email) = (rebook.clone(), email.clone());
                async move {
                    if attempt > 1 {
                        say(
                            name,
                            "previous attempt aborted as a stale read (B7 changed under it); retrying at a fresh epoch",
                        );
                    }
                    let seen = tx.read("travel:booking:B7")?.version;
                    say(
                        name,
                        format!("attempt {attempt} in {}: reads B7 at {seen}, thinks for {think_ms} ms", tx.id()),
                    );
                    tokio::time::sleep(Duration::from_millis(think_ms)).await;
                    tx.call(&rebook, json!({"booking": "B7", "itinerary": itinerary, "based_on": seen.0})).await?;
                    tx.call(&email, json!({"to": "ana@example.com", "subject": format!("B7 rebooked: {itinerary}")}))
                        .await?;
                    say(name, format!("staged the rebooking and queued the email; commits {}", tx.id()));
                    Ok(())
                }
            })
            .await
        }));
        // Alice begins first: she holds the earlier epoch.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for a in agents {
        match a.await? {
            Ok(((), o)) => print_outcome(&o),
            Err(Error::Aborted(o)) => print_outcome(&o),
            Err(e) => return Err(e.into()),
        }
    }
    let (waits, waited) = tg.wait_stats();
    let bookings = world.bookings.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    println!(
        "  B7 was written {} times, each by an agent that had seen the previous write: no lost update.",
        bookings.get("B7").map_or(0, |b| b.0)
    );
    println!("  ({waits} commit(s) waited for an earlier epoch, {} ms in all.)", waited.as_millis());
    tg.check_integrity().map_err(|e| anyhow::anyhow!("engine integrity check failed: {e}"))?;
    println!(
        "\nEngine integrity check: ok. {} transactions committed, {} aborted.",
        tg.stats().committed,
        tg.stats().aborted
    );
    if let Some(path) = &opts.trace {
        tg.flush_trace()?;
        println!("Operation records written to {} (check them: tidegate check {0})", path.display());
    }
    Ok(())
}
