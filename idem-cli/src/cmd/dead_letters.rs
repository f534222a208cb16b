//! `idem dead-letters`: the dead letters of a NATS JetStream stream or a RabbitMQ queue,
//! listed, and re-driven to where they were first published under their original key, so a
//! consumer whose record answers the key replays the message instead of running it again.

use std::collections::HashSet;

use idem::consumer::{amqp, nats};
use serde_json::json;

use crate::{Failure, output};

/// `idem dead-letters …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// List dead letters: where they came from, their key, deliveries and why.
    List(ListArgs),
    /// Publish dead letters back where they came from, under their original key, and remove
    /// each from the dead letters once the broker confirmed its publish.
    Redrive(RedriveArgs),
}

/// Where the dead letters are: a JetStream stream or a RabbitMQ queue.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BrokerArgs {
    /// A NATS server (nats://HOST:4222) whose JetStream stream `--stream` holds the dead letters.
    #[arg(long, value_name = "URL", conflicts_with = "amqp", requires = "stream")]
    nats: Option<String>,
    /// The dead-letter stream (with --nats).
    #[arg(long, value_name = "NAME", requires = "nats")]
    stream: Option<String>,
    /// A RabbitMQ broker (amqp://USER:PASSWORD@HOST:5672/%2f) whose queue `--queue` holds the
    /// dead letters.
    #[arg(long, value_name = "URL", requires = "queue")]
    amqp: Option<String>,
    /// The dead-letter queue (with --amqp).
    #[arg(long, value_name = "NAME", requires = "amqp")]
    queue: Option<String>,
    /// At most this many dead letters.
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: usize,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

/// `idem dead-letters list`.
#[derive(Debug, clap::Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    broker: BrokerArgs,
}

/// `idem dead-letters redrive`.
#[derive(Debug, clap::Args)]
pub(crate) struct RedriveArgs {
    /// Which dead letters: stream sequences (JetStream) or message ids (RabbitMQ), as `list`
    /// shows them.
    #[arg(
        value_name = "SEQ|ID",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    which: Vec<String>,
    /// Every dead letter (up to --limit).
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    broker: BrokerArgs,
}

/// A broker, connected.
enum Broker {
    Nats {
        context: async_nats::jetstream::Context,
        stream: Box<async_nats::jetstream::stream::Stream>,
    },
    Amqp {
        connection: lapin::Connection,
        queue: String,
    },
}

impl Broker {
    async fn connect(args: &BrokerArgs) -> Result<Broker, Failure> {
        match (&args.nats, &args.stream, &args.amqp, &args.queue) {
            (Some(url), Some(name), None, None) => {
                let client = async_nats::connect(url.as_str()).await.map_err(|e| {
                    Failure::Failed(format!(
                        "could not reach NATS at {}: {e}",
                        crate::store::redact(url)
                    ))
                })?;
                let context = async_nats::jetstream::new(client);
                let stream = context
                    .get_stream(name)
                    .await
                    .map_err(|e| Failure::Failed(format!("no JetStream stream {name:?}: {e}")))?;
                Ok(Broker::Nats {
                    context,
                    stream: Box::new(stream),
                })
            }
            (None, None, Some(url), Some(queue)) => {
                let connection =
                    lapin::Connection::connect(url, lapin::ConnectionProperties::default())
                        .await
                        .map_err(|e| {
                            Failure::Failed(format!(
                                "could not reach RabbitMQ at {}: {e}",
                                crate::store::redact(url)
                            ))
                        })?;
                Ok(Broker::Amqp {
                    connection,
                    queue: queue.clone(),
                })
            }
            _ => Err(Failure::Usage(
                "name the dead letters: --nats URL --stream NAME, or --amqp URL --queue NAME"
                    .into(),
            )),
        }
    }
}

/// Runs one `idem dead-letters` command.
pub(crate) async fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::List(args) => list(args.broker).await,
        Command::Redrive(args) => redrive(args).await,
    }
}

fn count(n: Option<impl ToString>) -> String {
    n.map(|n| n.to_string()).unwrap_or_else(|| "-".into())
}

/// A value of a dead letter as people read it: what its publisher wrote, [`printable`], or `-`.
///
/// [`printable`]: output::printable
fn text(s: &Option<String>) -> String {
    s.as_deref()
        .map_or_else(|| "-".into(), |s| output::printable(s).into_owned())
}

fn nats_json(l: &nats::DeadLetter) -> serde_json::Value {
    json!({
        "seq": l.sequence,
        "original_subject": l.original_subject,
        "origin": l.origin,
        "key": l.key,
        "consumer": l.consumer,
        "delivered": l.delivered,
        "reason": l.reason,
        "size": l.size,
    })
}

fn amqp_json(l: &amqp::DeadLetter) -> serde_json::Value {
    json!({
        "position": l.position,
        "message_id": l.message_id,
        "exchange": l.exchange,
        "routing_key": l.routing_key,
        "queue": l.queue,
        "reason": l.reason,
        "count": l.count,
        "delivered": l.delivered,
        "size": l.size,
    })
}

fn nats_table(letters: &[nats::DeadLetter]) -> String {
    let mut table = output::Table::with_header(&[
        "seq",
        "original subject",
        "key",
        "consumer",
        "delivered",
        "reason",
    ]);
    for l in letters {
        table.row([
            l.sequence.to_string(),
            text(&l.original_subject),
            text(&l.key),
            text(&l.consumer),
            count(l.delivered),
            text(&l.reason),
        ]);
    }
    table.render()
}

fn amqp_table(letters: &[amqp::DeadLetter]) -> String {
    let mut table = output::Table::with_header(&[
        "#",
        "message id (key)",
        "exchange",
        "routing key",
        "from queue",
        "dead-lettered",
        "reason",
    ]);
    for l in letters {
        table.row([
            l.position.to_string(),
            text(&l.message_id),
            l.exchange
                .as_deref()
                .map(|e| if e.is_empty() { "(default)" } else { e })
                .unwrap_or("-")
                .to_owned(),
            text(&l.routing_key),
            text(&l.queue),
            count(l.count),
            text(&l.reason),
        ]);
    }
    table.render()
}

async fn list(args: BrokerArgs) -> Result<(), Failure> {
    match Broker::connect(&args).await? {
        Broker::Nats { stream, .. } => {
            let letters = nats::dead_letters(&stream, 1, args.limit).await?;
            if args.json {
                let all: Vec<_> = letters.iter().map(nats_json).collect();
                return output::json(&json!({ "dead_letters": all }));
            }
            if letters.is_empty() {
                println!("no dead letters");
            } else {
                print!("{}", nats_table(&letters));
            }
        }
        Broker::Amqp { connection, queue } => {
            let letters = amqp::dead_letters(&connection, &queue, args.limit).await?;
            let _ = connection.close(200, "done".into()).await;
            if args.json {
                let all: Vec<_> = letters.iter().map(amqp_json).collect();
                return output::json(&json!({ "dead_letters": all }));
            }
            if letters.is_empty() {
                println!("no dead letters");
            } else {
                print!("{}", amqp_table(&letters));
            }
        }
    }
    Ok(())
}

async fn redrive(args: RedriveArgs) -> Result<(), Failure> {
    let json = args.broker.json;
    match Broker::connect(&args.broker).await? {
        Broker::Nats { context, stream } => {
            let sequences: Vec<u64> = if args.all {
                nats::dead_letters(&stream, 1, args.broker.limit)
                    .await?
                    .iter()
                    .map(|l| l.sequence)
                    .collect()
            } else {
                args.which
                    .iter()
                    .map(|s| {
                        s.parse().map_err(|_| {
                            Failure::Usage(format!(
                                "{s:?} is not a stream sequence: JetStream dead letters are \
                                 named by the `seq` that `list` shows"
                            ))
                        })
                    })
                    .collect::<Result<_, _>>()?
            };
            let mut done = Vec::new();
            for seq in sequences {
                match nats::redrive(&context, &stream, seq).await {
                    Ok(r) => {
                        if !json {
                            println!(
                                "re-drove {seq} to {} under key {} (stored as {}:{}{})",
                                text(&r.letter.original_subject),
                                text(&r.letter.key),
                                r.stream,
                                r.stream_sequence,
                                if r.duplicate { ", a duplicate" } else { "" }
                            );
                        }
                        done.push(json!({
                            "seq": seq,
                            "subject": r.letter.original_subject,
                            "key": r.letter.key,
                            "stream": r.stream,
                            "stream_seq": r.stream_sequence,
                            "duplicate": r.duplicate,
                        }));
                    }
                    Err(e) => {
                        if json {
                            output::json(
                                &json!({ "redriven": done, "failed": seq, "error": e.to_string() }),
                            )?;
                            return Err(Failure::Quiet);
                        }
                        return Err(Failure::Failed(format!("dead letter {seq}: {e}")));
                    }
                }
            }
            if json {
                output::json(&json!({ "redriven": done }))?;
            } else if done.is_empty() {
                println!("no dead letters");
            }
        }
        Broker::Amqp { connection, queue } => {
            let wanted: HashSet<&str> = args.which.iter().map(String::as_str).collect();
            let mut seen = HashSet::new();
            let result = amqp::redrive(&connection, &queue, args.broker.limit, |l| {
                let id = l.message_id.clone().unwrap_or_default();
                let pick = args.all || wanted.contains(id.as_str());
                if pick {
                    seen.insert(id);
                }
                pick
            })
            .await;
            let _ = connection.close(200, "done".into()).await;
            let redriven = result?;
            if json {
                let all: Vec<_> = redriven.iter().map(amqp_json).collect();
                output::json(&json!({ "redriven": all }))?;
            } else {
                for l in &redriven {
                    println!(
                        "re-drove {} to exchange {:?} with routing key {}",
                        text(&l.message_id),
                        l.exchange.as_deref().unwrap_or(""),
                        text(&l.routing_key)
                    );
                }
                if redriven.is_empty() {
                    println!("no dead letters");
                }
            }
            let missing: Vec<&&str> = wanted.iter().filter(|w| !seen.contains(**w)).collect();
            if !missing.is_empty() {
                eprintln!(
                    "idem: no dead letter with message id {missing:?} in the first {}",
                    args.broker.limit
                );
                return Err(Failure::Quiet);
            }
        }
    }
    Ok(())
}
