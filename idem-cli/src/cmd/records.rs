//! `idem records …`: looking at idempotency records, releasing a claim stuck in progress, and
//! retrying parked work.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::time::Duration;

use idem::lifecycle::State;
use idem::store::{ForcedRelease, RecordInfo, RecordQuery, Retried, StoreAdmin as _};
use serde_json::{Value, json};

use crate::Failure;
use crate::output::{self, Table};
use crate::store::{self, StoreArgs};

/// How many bytes of a stored body or a recovery point are shown unless `--full` asks for all.
const BODY_PREVIEW: usize = 512;

/// The most records one `records list` returns.
const MAX_LIMIT: usize = 10_000;

/// `idem records`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// List records, in the order their retention ends (for one retention, oldest first; by
    /// scope and key under --prefix): scope, key, state, attempt, age, lease left, expiry.
    List(ListArgs),
    /// Show one record in full: state, fence, attempt, lease, fingerprint, recovery point and
    /// stored answer.
    Show(ShowArgs),
    /// Release a claim stuck in progress (its owner crashed): the next request with the key
    /// runs again, and the old owner, if it wakes up, can no longer complete.
    Release(ReleaseArgs),
    /// Retry parked work (its attempts ran out): it is in progress again, and a completer (or
    /// the request's own retry) resumes it at once, with its attempts counted afresh.
    Retry(RetryArgs),
}

/// `idem records list`.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Only records in this state: in_progress, completed, released or parked; or
    /// unfinished: claims in progress that hold work left to do (a stored request, or an
    /// outcome that may have had its effect) and whose lease ran out, waiting for a retry, a
    /// completer or an operator (what `idem stats` counts as unfinished).
    #[arg(long, value_name = "STATE", value_parser = parse_state)]
    state: Option<StateFilter>,
    /// Only records whose scope starts with this text (`order:`, `refund:ORD-1`).
    #[arg(long, value_name = "SCOPE_PREFIX")]
    prefix: Option<String>,
    /// Only records first claimed longer ago than this: 90s, 5m, 2h, 1d.
    #[arg(long, value_name = "AGE", value_parser = idem::store::admin::parse_age)]
    older_than: Option<Duration>,
    /// At most this many records (1 to 10000).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = parse_limit)]
    limit: usize,
    /// Print one JSON document: an array of records.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// `idem records show`.
#[derive(Debug, clap::Args)]
pub(crate) struct ShowArgs {
    /// The record's scope, as the service rendered it (`refund:A1`).
    scope: String,
    /// The idempotency key the client sent.
    key: String,
    /// Show the whole stored body and recovery point, not their first 512 bytes.
    #[arg(long)]
    full: bool,
    /// Print one JSON document (`null` when there is no such record).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// `idem records release`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReleaseArgs {
    /// The record's scope, as the service rendered it (`order:1`).
    scope: String,
    /// The idempotency key the client sent.
    key: String,
    /// Release only the claim with this fence (what `records show` or `list` printed): if
    /// the record moved on since (another claim, a completion), nothing is released.
    #[arg(long, value_name = "N")]
    fence: Option<u64>,
    /// Release without asking: what scripts (and anything without a terminal) must pass.
    #[arg(long)]
    yes: bool,
    /// Print one JSON document: `{"released": true, "fence": N}`, or why nothing was released.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// `idem records retry`.
#[derive(Debug, clap::Args)]
pub(crate) struct RetryArgs {
    /// The record's scope, as the service rendered it (`refund:ORD-1`).
    scope: String,
    /// The idempotency key the client sent.
    key: String,
    /// Print one JSON document: `{"retried": true, "fence": N}`, or why nothing was retried.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

/// Runs a `records` command.
pub(crate) async fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::List(args) => list(args).await,
        Command::Show(args) => show(args).await,
        Command::Release(args) => release(args).await,
        Command::Retry(args) => retry(args).await,
    }
}

/// What `records list --state` keeps: the records in one state, or the unfinished ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateFilter {
    State(State),
    /// Claims in progress holding work left to do, their lease run out
    /// ([`RecordInfo::is_unfinished`]).
    Unfinished,
}

fn parse_state(text: &str) -> Result<StateFilter, String> {
    if text == "unfinished" {
        return Ok(StateFilter::Unfinished);
    }
    State::parse(text).map(StateFilter::State).map_err(|_| {
        format!("{text:?} is not a state: in_progress, completed, released, parked, or unfinished")
    })
}

fn parse_limit(text: &str) -> Result<usize, String> {
    text.parse()
        .ok()
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .ok_or_else(|| format!("{text:?} is not a limit between 1 and {MAX_LIMIT}"))
}

async fn list(args: ListArgs) -> Result<(), Failure> {
    let (store, shown) = store::open(&args.store).await?;
    let mut query = RecordQuery::new().limit(args.limit);
    match args.state {
        Some(StateFilter::State(state)) => query = query.state(state),
        // The claims in progress that hold work come from the store's index of unfinished work;
        // those whose lease ran out are picked here, from as many as one listing reads.
        Some(StateFilter::Unfinished) => {
            query = query
                .state(State::InProgress)
                .holding_work(true)
                .limit(MAX_LIMIT)
        }
        None => {}
    }
    if let Some(prefix) = args.prefix {
        query = query.scope_prefix(prefix);
    }
    if let Some(age) = args.older_than {
        query = query.older_than(age);
    }
    let mut records = store.list(&query).await?;
    if args.state == Some(StateFilter::Unfinished) {
        let read = records.len();
        records.retain(RecordInfo::is_unfinished);
        records.truncate(args.limit);
        if read == MAX_LIMIT {
            eprintln!(
                "idem: only the {MAX_LIMIT} oldest claims in progress holding work were looked at: narrow with --prefix or --older-than"
            );
        }
    }
    if args.json {
        return output::json(&Value::Array(
            records.iter().map(RecordInfo::summary_json).collect(),
        ));
    }
    if records.is_empty() {
        println!("no records match in {shown}");
        return Ok(());
    }
    let mut t = Table::with_header(&[
        "scope",
        "key",
        "state",
        "attempt",
        "age",
        "lease left",
        "expires in",
    ]);
    for r in &records {
        t.row([
            r.scope.clone(),
            r.key.clone(),
            r.state.as_str().to_owned(),
            r.attempt.to_string(),
            output::duration(r.age),
            r.lease_remaining
                .map_or_else(|| "-".to_owned(), output::duration),
            expiry(r.expires_in),
        ]);
    }
    print!("{}", t.render());
    if records.len() == args.limit {
        eprintln!(
            "idem: the first {} records shown: --limit N for more",
            args.limit
        );
    }
    Ok(())
}

async fn show(args: ShowArgs) -> Result<(), Failure> {
    let (store, shown) = store::open(&args.store).await?;
    let Some(record) = store.inspect(&args.scope, &args.key).await? else {
        if args.json {
            output::json(&Value::Null)?;
        }
        eprintln!(
            "idem: no record for scope {:?}, key {:?} in {shown} (never claimed, or purged)",
            args.scope, args.key
        );
        return Err(Failure::Quiet);
    };
    let body = record
        .response
        .as_ref()
        .map(|r| Shown::of(&r.body, args.full));
    let point = record
        .recovery_point
        .as_deref()
        .map(|p| Shown::of(p, args.full));
    if args.json {
        let mut v = record.summary_json();
        if let Some(p) = &point {
            v["recovery_point"] = p.json();
        }
        if let (Some(r), Some(b)) = (&record.response, &body) {
            v["response"] = json!({
                "status": r.status,
                "is_error": r.is_error,
                "body_bytes": b.total,
                "body": b.text,
                "body_hex": b.hex,
                "body_truncated": b.truncated,
            });
        }
        return output::json(&v);
    }
    let mut t = Table::pairs();
    t.row(["scope", &record.scope])
        .row(["key", &record.key])
        .row(["state", record.state.as_str()])
        .row(["fence", &record.fence.to_string()])
        .row(["attempt", &record.attempt.to_string()])
        .row(["age", &output::duration(record.age)]);
    if let Some(note) = &record.note {
        t.row(["note", &output::printable(note)]);
    }
    if let Some(request) = &record.request {
        t.row([
            "request",
            &format!("{} bytes stored: a completer can resume it", request.len()),
        ]);
    }
    if let Some(lease) = record.lease_remaining {
        let left = if lease.is_zero() {
            "0s (ran out: the next request takes the claim over)".to_owned()
        } else {
            output::duration(lease)
        };
        t.row(["lease left", &left]);
    }
    t.row(["expires in", &expiry(record.expires_in)])
        .row(["fingerprint", &record.fingerprint.to_string()]);
    if let Some(p) = &point {
        t.row(["recovery point", &format!("{}: {}", p.note(), p.content())]);
    }
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
        t.row(["body", &b.note()]);
    }
    print!("{}", t.render());
    if let Some(b) = body {
        println!();
        println!("{}", output::printable_lines(b.content()));
    }
    Ok(())
}

async fn release(args: ReleaseArgs) -> Result<(), Failure> {
    let (store, shown) = store::open(&args.store).await?;
    let (scope, key) = (args.scope.as_str(), args.key.as_str());
    let mut fence = args.fence;
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            return Err(Failure::Usage(
                "records release asks for a confirmation on a terminal: pass --yes to release \
                 without one"
                    .into(),
            ));
        }
        // Say what would be released, and ask only when there is something to release; the
        // answer is about the claim shown, so only that claim is released.
        match store.inspect(scope, key).await? {
            Some(r)
                if matches!(r.state, State::InProgress | State::Parked)
                    && (!r.expires_in.is_zero() || r.holds_work())
                    && fence.is_none_or(|f| f == r.fence) =>
            {
                fence = Some(r.fence);
                let lease = r
                    .lease_remaining
                    .map_or_else(|| "-".to_owned(), output::duration);
                eprint!(
                    "Release the claim on scope {scope:?}, key {key:?} in {shown} (fence {}, \
                     attempt {}, claimed {} ago, lease left {lease})? Its owner, if it is still \
                     running, will be refused its completion. [y/N] ",
                    r.fence,
                    r.attempt,
                    output::duration(r.age),
                );
                let _ = std::io::stderr().flush();
                let mut answer = String::new();
                std::io::stdin()
                    .lock()
                    .read_line(&mut answer)
                    .map_err(|e| Failure::Failed(format!("could not read the answer: {e}")))?;
                if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
                    eprintln!("idem: nothing released");
                    return Err(Failure::Quiet);
                }
            }
            _ => {}
        }
    }
    let done = match fence {
        Some(f) => store.force_release_fenced(scope, key, f).await?,
        None => store.force_release(scope, key).await?,
    };
    if args.json {
        output::json(&done.to_json())?;
    }
    match done {
        ForcedRelease::Released { fence } => {
            if !args.json {
                println!(
                    "released scope {scope:?}, key {key:?}: its fence is now {fence}\nthe next \
                     request with this key runs; the previous owner can no longer complete"
                );
            }
            Ok(())
        }
        ForcedRelease::NotInProgress(state) => {
            eprintln!(
                "idem: nothing released: the record of scope {scope:?}, key {key:?} is {}, not \
                 in progress",
                state.as_str()
            );
            Err(Failure::Quiet)
        }
        ForcedRelease::NotFound => {
            eprintln!(
                "idem: nothing released: no record for scope {scope:?}, key {key:?} in {shown} \
                 (never claimed, or purged)"
            );
            Err(Failure::Quiet)
        }
        ForcedRelease::FenceMoved { fence: now, state } => {
            eprintln!(
                "idem: nothing released: the record of scope {scope:?}, key {key:?} has fence \
                 {now} now ({}), not {}: the claim you saw has ended",
                state.as_str(),
                fence.unwrap_or_default()
            );
            Err(Failure::Quiet)
        }
        _ => {
            eprintln!("idem: nothing released: the store answered what this tool does not know");
            Err(Failure::Quiet)
        }
    }
}

async fn retry(args: RetryArgs) -> Result<(), Failure> {
    let (store, shown) = store::open(&args.store).await?;
    let (scope, key) = (args.scope.as_str(), args.key.as_str());
    let done = store.retry(scope, key).await?;
    if args.json {
        output::json(&done.to_json())?;
    }
    match done {
        Retried::Retried { fence } => {
            if !args.json {
                println!(
                    "retried scope {}, key {}: in progress again (fence {fence}); a completer, or \
                     the request's retry, resumes it now",
                    output::printable(scope),
                    output::printable(key)
                );
            }
            Ok(())
        }
        Retried::NotParked(state) => {
            eprintln!(
                "idem: nothing retried: the record of scope {scope:?}, key {key:?} is {}, not \
                 parked",
                state.as_str()
            );
            Err(Failure::Quiet)
        }
        Retried::NotFound => {
            eprintln!(
                "idem: nothing retried: no record for scope {scope:?}, key {key:?} in {shown} \
                 (never claimed, or purged)"
            );
            Err(Failure::Quiet)
        }
        _ => {
            eprintln!("idem: nothing retried: the store answered what this tool does not know");
            Err(Failure::Quiet)
        }
    }
}

/// When a record's retention ends, or that it has.
fn expiry(left: Duration) -> String {
    if left.is_zero() {
        "expired".to_owned()
    } else {
        output::duration(left)
    }
}

/// Stored bytes as shown: UTF-8 text, or hex when they are not; cut to [`BODY_PREVIEW`] bytes
/// unless all was asked for.
struct Shown {
    text: Option<String>,
    hex: Option<String>,
    truncated: bool,
    total: usize,
}

impl Shown {
    fn of(bytes: &[u8], full: bool) -> Shown {
        let total = bytes.len();
        let shown = if full { total } else { total.min(BODY_PREVIEW) };
        match std::str::from_utf8(bytes) {
            Ok(text) => {
                // Cut on a character boundary.
                let mut end = shown;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                Shown {
                    text: Some(text[..end].to_owned()),
                    hex: None,
                    truncated: end < total,
                    total,
                }
            }
            Err(_) => Shown {
                text: None,
                hex: Some(bytes[..shown].iter().map(|b| format!("{b:02x}")).collect()),
                truncated: shown < total,
                total,
            },
        }
    }

    /// Its size, and how it is shown.
    fn note(&self) -> String {
        match (self.truncated, &self.text) {
            (true, _) => format!(
                "{} bytes, the first {BODY_PREVIEW} shown (--full for all)",
                self.total
            ),
            (false, Some(_)) => format!("{} bytes", self.total),
            (false, None) => format!("{} bytes, not UTF-8: hex", self.total),
        }
    }

    /// The text, or the hex.
    fn content(&self) -> &str {
        self.text.as_deref().or(self.hex.as_deref()).unwrap_or("")
    }

    fn json(&self) -> Value {
        json!({
            "bytes": self.total,
            "text": self.text,
            "hex": self.hex,
            "truncated": self.truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_limits_parse_or_say_why_not() {
        assert_eq!(
            parse_state("in_progress"),
            Ok(StateFilter::State(State::InProgress))
        );
        assert_eq!(parse_state("unfinished"), Ok(StateFilter::Unfinished));
        assert!(parse_state("stuck").unwrap_err().contains("unfinished"));
        assert_eq!(parse_limit("5"), Ok(5));
        assert!(parse_limit("0").is_err());
        assert!(parse_limit("10001").is_err());
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary_and_bytes_are_hex() {
        let text = "é".repeat(BODY_PREVIEW);
        let s = Shown::of(text.as_bytes(), false);
        assert!(s.truncated);
        assert_eq!(s.text.as_deref().map(str::len), Some(BODY_PREVIEW));
        assert_eq!(
            Shown::of(text.as_bytes(), true).text.as_deref(),
            Some(&*text)
        );
        let s = Shown::of(&[0xff, 0x00], false);
        assert_eq!(s.content(), "ff00");
        assert_eq!(s.note(), "2 bytes, not UTF-8: hex");
    }
}
