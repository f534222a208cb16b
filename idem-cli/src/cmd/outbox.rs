//! `idem outbox`: the events of a SQL store's outbox table: listing them, parking one an
//! operator wants held, and sending parked ones back to the relays.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::time::Duration;

use idem::outbox::{MySqlOutbox, OutboxBackend as _, PendingEvent, PgOutbox, SqliteOutbox};
use idem::{MySqlStore, SqliteStore};
use serde_json::json;

use crate::store::{self, Kind};
use crate::{Failure, output};

/// `idem outbox …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// List events: waiting to be published (default), parked, or sent.
    List(ListArgs),
    /// Send parked events back to the relays: published next in their partitions.
    Retry(RetryArgs),
    /// Park waiting events: no relay publishes them until they are sent back with `retry`.
    Park(ParkArgs),
}

/// Where the outbox is.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct OutboxArgs {
    /// The database's URL: sqlite://FILE, postgres://… or mysql://…. Default: IDEM_STORE_URL,
    /// else DATABASE_URL.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// The outbox table (`schema.table` on PostgreSQL and MySQL).
    #[arg(long, value_name = "NAME", default_value = idem::outbox::DEFAULT_OUTBOX_TABLE)]
    outbox_table: String,
}

/// Which events `list` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum State {
    /// Waiting to be published: not sent, not parked (oldest first).
    Pending,
    /// Parked: held back until sent back (oldest first).
    Parked,
    /// Sent and not yet purged (newest first).
    Sent,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Parked => "parked",
            State::Sent => "sent",
        }
    }
}

/// `idem outbox list`.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    /// Which events.
    #[arg(long, value_enum, default_value = "pending")]
    state: State,
    /// At most this many.
    #[arg(long, value_name = "N", default_value_t = 50)]
    limit: u32,
    /// Print one JSON document: `{"state": …, "events": [...]}`.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    outbox: OutboxArgs,
}

/// `idem outbox retry`.
#[derive(Debug, clap::Args)]
pub(crate) struct RetryArgs {
    /// The parked events' sequence numbers (the `seq` column of `list`).
    #[arg(
        value_name = "SEQ",
        required_unless_present = "all_parked",
        conflicts_with = "all_parked"
    )]
    seqs: Vec<i64>,
    /// Every parked event.
    #[arg(long)]
    all_parked: bool,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    outbox: OutboxArgs,
}

/// `idem outbox park`.
#[derive(Debug, clap::Args)]
pub(crate) struct ParkArgs {
    /// The waiting events' sequence numbers (the `seq` column of `list`).
    #[arg(value_name = "SEQ", required = true)]
    seqs: Vec<i64>,
    /// Why, kept as the event's last error.
    #[arg(long, value_name = "TEXT", default_value = "parked by an operator")]
    reason: String,
    /// Park without asking (required when no one is at a terminal to ask).
    #[arg(long)]
    yes: bool,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    outbox: OutboxArgs,
}

/// An outbox of any SQL database.
enum Outbox {
    Sqlite(SqliteOutbox),
    Postgres(PgOutbox),
    Mysql(MySqlOutbox),
}

/// `$body` with `$o` the outbox, whichever database it is on.
macro_rules! on_outbox {
    ($outbox:expr, $o:ident => $body:expr) => {
        match $outbox {
            Outbox::Sqlite($o) => $body,
            Outbox::Postgres($o) => $body,
            Outbox::Mysql($o) => $body,
        }
    };
}

impl Outbox {
    async fn open(args: &OutboxArgs) -> Result<(Outbox, String), Failure> {
        let url = store::resolve(args.store.as_deref())?;
        let shown = store::redact(&url);
        let unreachable =
            |e: idem::sqlx::Error| Failure::Failed(format!("could not open {shown}: {e}"));
        let outbox = match store::kind(&url)? {
            Kind::Sqlite => {
                let options = SqliteStore::connect_options(&url)?.create_if_missing(false);
                let pool = idem::sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(options)
                    .await
                    .map_err(unreachable)?;
                Outbox::Sqlite(SqliteOutbox::with_table(pool, &args.outbox_table)?)
            }
            Kind::Postgres => {
                let pool = idem::sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&url)
                    .await
                    .map_err(unreachable)?;
                Outbox::Postgres(PgOutbox::with_table(pool, &args.outbox_table)?)
            }
            Kind::Mysql => {
                let options =
                    MySqlStore::connect_options(&url.replacen("mariadb://", "mysql://", 1))?;
                let pool = idem::sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(1)
                    .connect_with(options)
                    .await
                    .map_err(unreachable)?;
                Outbox::Mysql(MySqlOutbox::with_table(pool, &args.outbox_table)?)
            }
            Kind::Redis | Kind::RedisCluster => {
                return Err(Failure::Usage(format!(
                    "{shown} is a Redis store, which has no outbox: name the SQL database of \
                     the outbox (sqlite://FILE, postgres://…, mysql://…)"
                )));
            }
        };
        Ok((outbox, shown))
    }

    async fn list(&self, state: State, limit: u32) -> idem::Result<Vec<PendingEvent>> {
        on_outbox!(self, o => match state {
            State::Pending => o.pending(limit).await,
            State::Parked => o.parked(limit).await,
            State::Sent => o.sent(limit).await,
        })
    }

    async fn unpark(&self, seq: i64) -> idem::Result<bool> {
        on_outbox!(self, o => o.unpark(seq).await)
    }

    async fn unpark_all(&self) -> idem::Result<u64> {
        on_outbox!(self, o => o.unpark_all().await)
    }

    async fn hold(&self, seq: i64, reason: &str) -> idem::Result<bool> {
        on_outbox!(self, o => o.hold(seq, reason).await)
    }

    async fn counts(&self) -> idem::Result<idem::outbox::OutboxCounts> {
        on_outbox!(self, o => o.counts().await)
    }
}

/// Runs one `idem outbox` command.
pub(crate) async fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::List(args) => list(args).await,
        Command::Retry(args) => retry(args).await,
        Command::Park(args) => park(args).await,
    }
}

async fn list(args: ListArgs) -> Result<(), Failure> {
    let (outbox, _) = Outbox::open(&args.outbox).await?;
    let events = outbox.list(args.state, args.limit).await?;
    if args.json {
        let events: Vec<_> = events
            .iter()
            .map(|e| {
                json!({
                    "seq": e.seq,
                    "id": e.event.id,
                    "topic": e.event.topic,
                    "partition_key": e.event.partition_key,
                    "attempts": e.attempts,
                    "failures": e.failures,
                    "age_seconds": e.age.as_secs(),
                    "last_error": e.last_error,
                })
            })
            .collect();
        return output::json(&json!({ "state": args.state.name(), "events": events }));
    }
    if events.is_empty() {
        let counts = outbox.counts().await?;
        println!(
            "no {} events ({} pending, {} parked, {} sent)",
            args.state.name(),
            counts.pending,
            counts.parked,
            counts.sent
        );
        return Ok(());
    }
    let mut table = output::Table::with_header(&[
        "seq",
        "id",
        "topic",
        "partition",
        "attempts",
        "age",
        "last error",
    ]);
    for e in &events {
        table.row([
            e.seq.to_string(),
            e.event.id.clone(),
            e.event.topic.clone(),
            e.event.partition_key.clone(),
            e.attempts.to_string(),
            age(e.age),
            e.last_error.clone().unwrap_or_default(),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}

async fn retry(args: RetryArgs) -> Result<(), Failure> {
    let (outbox, shown) = Outbox::open(&args.outbox).await?;
    if args.all_parked {
        let n = outbox.unpark_all().await?;
        if args.json {
            return output::json(&json!({ "unparked": n }));
        }
        println!("sent {n} parked events back to the relays of {shown}");
        return Ok(());
    }
    let (mut done, mut missing) = (Vec::new(), Vec::new());
    for &seq in &args.seqs {
        if outbox.unpark(seq).await? {
            done.push(seq);
        } else {
            missing.push(seq);
        }
    }
    report(
        args.json,
        "unparked",
        "not_parked",
        "sent back",
        "is not parked",
        &done,
        &missing,
    )
}

async fn park(args: ParkArgs) -> Result<(), Failure> {
    if !args.yes {
        confirm(&format!(
            "park {} event(s)? No relay publishes them until `idem outbox retry`, and their \
             partitions' later events go on without them [y/N] ",
            args.seqs.len()
        ))?;
    }
    let (outbox, _) = Outbox::open(&args.outbox).await?;
    let (mut done, mut missing) = (Vec::new(), Vec::new());
    for &seq in &args.seqs {
        if outbox.hold(seq, &args.reason).await? {
            done.push(seq);
        } else {
            missing.push(seq);
        }
    }
    report(
        args.json,
        "parked",
        "not_waiting",
        "parked",
        "is not waiting to be published (sent, parked, or not in the outbox)",
        &done,
        &missing,
    )
}

/// Prints what a command did to each event; the command fails if any was not as expected.
fn report(
    json: bool,
    done_key: &str,
    missing_key: &str,
    done_verb: &str,
    missing_why: &str,
    done: &[i64],
    missing: &[i64],
) -> Result<(), Failure> {
    if json {
        output::json(&json!({ done_key: done, missing_key: missing }))?;
    } else {
        for seq in done {
            println!("{done_verb} event {seq}");
        }
        for seq in missing {
            eprintln!("idem: event {seq} {missing_why}");
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Failure::Quiet)
    }
}

/// Asks on the terminal; without one, `--yes` is required.
fn confirm(question: &str) -> Result<(), Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::Usage(
            "parking holds events back from the relays: pass --yes to park without a terminal"
                .into(),
        ));
    }
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::Failed(format!("could not read the answer: {e}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Failure::Failed("nothing parked".into()))
    }
}

/// A duration as people read it: `45s`, `12m`, `3h05m`, `2d04h`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(age(Duration::from_secs(45)), "45s");
        assert_eq!(age(Duration::from_secs(12 * 60 + 3)), "12m03s");
        assert_eq!(age(Duration::from_secs(3 * 3600 + 5 * 60)), "3h05m");
        assert_eq!(age(Duration::from_secs(2 * 86400 + 4 * 3600)), "2d04h");
    }
}
