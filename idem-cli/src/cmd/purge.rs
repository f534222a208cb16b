//! `idem purge`: deleting the records whose retention has ended, or counting them.

use std::io::IsTerminal as _;

use idem::store::StoreAdmin as _;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::store::{self, StoreArgs};
use crate::{Failure, output};

/// `idem purge`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Say how many records would be deleted, and delete none.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON document: `{"purged": N}` (`{"expired": N}` with --dry-run).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// Counts the expired records, then deletes them a batch at a time: a progress bar on a
/// terminal, a line a batch on stderr otherwise.
pub(crate) async fn run(args: Args) -> Result<(), Failure> {
    let (store, shown) = store::open(&args.store).await?;
    let expired = store.count_expired().await?;
    if args.dry_run {
        if args.json {
            return output::json(&json!({ "expired": expired }));
        }
        println!("{expired} expired records would be purged from {shown} (none deleted)");
        return Ok(());
    }
    let progress = Progress::new(expired);
    let mut purged = 0u64;
    loop {
        let n = store.purge_batch().await?;
        if n == 0 {
            break;
        }
        purged += n;
        progress.advance(purged);
    }
    progress.finish();
    if args.json {
        return output::json(&json!({ "purged": purged }));
    }
    println!("purged {purged} expired records from {shown}");
    Ok(())
}

/// How a purge shows that it is getting on.
enum Progress {
    /// A bar on stderr, a terminal.
    Bar(ProgressBar),
    /// `purged N of M` lines on stderr, which is not a terminal (a log, a pipe).
    Lines(u64),
}

impl Progress {
    fn new(expected: u64) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress::Lines(expected);
        }
        let bar = ProgressBar::new(expected);
        bar.set_style(
            ProgressStyle::with_template(
                "purging {bar:40} {pos}/{len} records ({per_sec}, {eta} left)",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Progress::Bar(bar)
    }

    /// `purged` records deleted so far.
    fn advance(&self, purged: u64) {
        match self {
            Progress::Bar(bar) => {
                // Records that expired since the count make the purge longer than counted.
                if bar.length().is_some_and(|len| purged > len) {
                    bar.set_length(purged);
                }
                bar.set_position(purged);
            }
            Progress::Lines(expected) => {
                eprintln!("idem: purged {purged} of {}", (*expected).max(purged));
            }
        }
    }

    fn finish(self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}
