//! `idem stats`: a store at a glance — counts by state and by scope prefix, the oldest claim in
//! progress, and how many records expire soon, read with bounded work (`StoreStats` says what
//! each count covers on a large store).

use std::time::Duration;

use idem::store::StoreAdmin as _;

use crate::Failure;
use crate::output::{self, Table};
use crate::store::{self, StoreArgs};

/// `idem stats`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// What "expiring soon" means: 90s, 5m, 2h, 1d.
    #[arg(long, value_name = "AGE", default_value = "1h", value_parser = idem::store::admin::parse_age)]
    expiring_within: Duration,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// Prints the store's counts.
pub(crate) async fn run(args: Args) -> Result<(), Failure> {
    let (store, shown) = store::open(&args.store).await?;
    let stats = store.stats(args.expiring_within).await?;
    if args.json {
        let mut v = stats.to_json();
        v["expiring_within_ms"] = output::millis(args.expiring_within).into();
        return output::json(&v);
    }
    let within = output::duration(args.expiring_within);
    let mut t = Table::pairs();
    t.row(["store", &shown])
        .row(["live records", &stats.states.total().to_string()])
        .row(["in_progress", &stats.states.in_progress.to_string()])
        .row(["completed", &stats.states.completed.to_string()])
        .row(["released", &stats.states.released.to_string()])
        .row([
            "oldest in progress".to_owned(),
            stats
                .oldest_in_progress
                .map_or_else(|| "-".to_owned(), output::duration),
        ])
        .row([
            format!("expiring within {within}"),
            bounded(stats.expiring_soon),
        ])
        .row([
            "expired".to_owned(),
            format!("{} (waiting for the purge)", bounded(stats.expired)),
        ]);
    if !stats.complete {
        t.row([
            "counted".to_owned(),
            format!(
                "{} records: every one that holds unfinished work, and the newest others (the store holds more)",
                stats.counted
            ),
        ]);
    }
    print!("{}", t.render());
    if !stats.by_prefix.is_empty() {
        let mut t = Table::with_header(&["prefix", "in_progress", "completed", "released"]);
        for (prefix, c) in &stats.by_prefix {
            t.row([
                prefix.clone(),
                c.in_progress.to_string(),
                c.completed.to_string(),
                c.released.to_string(),
            ]);
        }
        println!();
        print!("{}", t.render());
    }
    Ok(())
}

/// A count read up to [`StoreStats::BOUND`](idem::store::StoreStats::BOUND): "N or more" when it
/// reached it.
fn bounded(n: u64) -> String {
    if n >= idem::store::StoreStats::BOUND {
        format!("{n} or more")
    } else {
        n.to_string()
    }
}
