//! `idem purge`: deleting the records whose retention has ended.

use std::time::Duration;

use idem::Store as _;
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
    /// Print one JSON document: `{"purged": N}`.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// Deletes every expired record, showing a spinner on a terminal while it runs.
pub(crate) async fn run(args: Args) -> Result<(), Failure> {
    if args.dry_run {
        return Err(Failure::Usage(
            "purge --dry-run is not supported yet: the stores cannot count expired records \
             without deleting them"
                .into(),
        ));
    }
    let (store, shown) = store::open(&args.store).await?;
    // Drawn only on a terminal (indicatif hides it otherwise), and only once a purge has run
    // for a moment.
    let spinner = ProgressBar::new_spinner().with_message(format!("purging {shown}"));
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let purge = store.purge_expired();
    tokio::pin!(purge);
    let purged = tokio::select! {
        n = &mut purge => n,
        () = tokio::time::sleep(Duration::from_millis(500)) => {
            spinner.enable_steady_tick(Duration::from_millis(120));
            purge.await
        }
    };
    spinner.finish_and_clear();
    let purged = purged?;
    if args.json {
        return output::json(&json!({ "purged": purged }));
    }
    println!("purged {purged} expired records from {shown}");
    Ok(())
}
