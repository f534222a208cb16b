//! `idem records …`: looking at idempotency records.

use std::time::Duration;

use idem::{Record, RecordState, Store as _};
use serde_json::json;

use crate::Failure;
use crate::output::{self, Table};
use crate::store::{self, StoreArgs};

/// How many bytes of a stored body are shown unless `--full` asks for all.
const BODY_PREVIEW: usize = 512;

/// `idem records`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Show the live record of one request: its state, fence, lease, fingerprint and stored
    /// answer.
    Show(ShowArgs),
}

/// `idem records show`.
#[derive(Debug, clap::Args)]
pub(crate) struct ShowArgs {
    /// The record's scope, as the service rendered it (`refund:A1`).
    scope: String,
    /// The idempotency key the client sent.
    key: String,
    /// Show the whole stored body, not its first 512 bytes.
    #[arg(long)]
    full: bool,
    /// Print one JSON document (`null` when there is no live record).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// Runs a `records` command.
pub(crate) async fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Show(args) => show(args).await,
    }
}

async fn show(args: ShowArgs) -> Result<(), Failure> {
    let (store, shown) = store::open(&args.store).await?;
    let record = store.lookup(&args.scope, &args.key).await?;
    let Some(record) = record else {
        if args.json {
            output::json(&serde_json::Value::Null)?;
        }
        eprintln!(
            "idem: no live record for scope {:?}, key {:?} in {shown} (never claimed, released, \
             or past its retention)",
            args.scope, args.key
        );
        return Err(Failure::Quiet);
    };
    let body = Body::of(&record, args.full);
    if args.json {
        let response = record.response.as_ref();
        return output::json(&json!({
            "scope": args.scope,
            "key": args.key,
            "state": state(&record),
            "fence": record.fence,
            "lease_remaining_ms": record.lease_remaining.map(|d| d.as_millis() as u64),
            "fingerprint": record.fingerprint.to_string(),
            "response": response.map(|r| json!({
                "status": r.status,
                "is_error": r.is_error,
                "body_bytes": r.body.len(),
                "body": body.as_ref().and_then(|b| b.text.clone()),
                "body_hex": body.as_ref().and_then(|b| b.hex.clone()),
                "body_truncated": body.as_ref().is_some_and(|b| b.truncated),
            })),
        }));
    }
    let mut t = Table::pairs();
    t.row(["scope", &args.scope])
        .row(["key", &args.key])
        .row(["state", state(&record)])
        .row(["fence", &record.fence.to_string()]);
    if let Some(lease) = record.lease_remaining {
        t.row(["lease left", &human(lease)]);
    }
    t.row(["fingerprint", &record.fingerprint.to_string()]);
    if let Some(r) = &record.response {
        let status = r
            .status
            .map_or_else(|| "none".to_owned(), |s| s.to_string());
        t.row(["status", &status]).row([
            "stored as",
            if r.is_error {
                "a final error"
            } else {
                "a success"
            },
        ]);
    }
    if let Some(b) = &body {
        let note = match (b.truncated, &b.text) {
            (true, _) => format!(
                "{} bytes, the first {BODY_PREVIEW} shown (--full for all)",
                b.total
            ),
            (false, Some(_)) => format!("{} bytes", b.total),
            (false, None) => format!("{} bytes, not UTF-8: hex", b.total),
        };
        t.row(["body", &note]);
    }
    print!("{}", t.render());
    if let Some(b) = body {
        println!();
        println!("{}", b.text.or(b.hex).unwrap_or_default());
    }
    Ok(())
}

/// A record's state as the store writes it.
fn state(record: &Record) -> &'static str {
    match record.state {
        RecordState::InProgress => "in_progress",
        RecordState::Completed => "completed",
    }
}

/// A duration as people read it: `4m 58s`, `850ms`.
fn human(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{secs}s"),
        60..3600 => format!("{}m {}s", secs / 60, secs % 60),
        _ => format!("{}h {}m", secs / 3600, secs % 3600 / 60),
    }
}

/// A stored body as shown: UTF-8 text, or hex when it is not; cut to [`BODY_PREVIEW`] bytes
/// unless all was asked for.
struct Body {
    text: Option<String>,
    hex: Option<String>,
    truncated: bool,
    total: usize,
}

impl Body {
    fn of(record: &Record, full: bool) -> Option<Body> {
        let bytes = &record.response.as_ref()?.body;
        let total = bytes.len();
        let shown = if full { total } else { total.min(BODY_PREVIEW) };
        Some(match std::str::from_utf8(bytes) {
            Ok(text) => {
                // Cut on a character boundary.
                let mut end = shown;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                Body {
                    text: Some(text[..end].to_owned()),
                    hex: None,
                    truncated: end < total,
                    total,
                }
            }
            Err(_) => Body {
                text: None,
                hex: Some(bytes[..shown].iter().map(|b| format!("{b:02x}")).collect()),
                truncated: shown < total,
                total,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_secs(42)), "42s");
        assert_eq!(human(Duration::from_secs(298)), "4m 58s");
        assert_eq!(human(Duration::from_secs(7260)), "2h 1m");
    }
}
