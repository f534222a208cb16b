//! `idem`: the command-line tool of [idem](https://docs.rs/idempotency), for the people who run
//! services built on it.
//!
//! It works against every store by URL: `--store`, else `IDEM_STORE_URL`, else `DATABASE_URL`
//! (`sqlite://FILE`, `postgres://…`, `redis://…`, or several `redis://` URLs, comma-separated,
//! for a Redis Cluster). Each command group is a module of `cmd`; each command prints a table
//! for people and, with `--json`, one JSON document for scripts.
//!
//! Exit codes: 0 done, 1 the command failed (the store could not be reached, no such record),
//! 2 the command was wrong (arguments, no store named, a URL of no known store, a release
//! without a terminal to confirm it on and without `--yes`).

#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![forbid(unsafe_code)]

mod cmd;
mod output;
mod store;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Inspect and maintain the idempotency records of services built on idem.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the DDL of the SQL stores' tables (records, outbox, PostgreSQL's notify trigger).
    Schema(cmd::schema::Args),
    /// Look at idempotency records; release a claim stuck in progress.
    #[command(subcommand)]
    Records(cmd::records::Command),
    /// Delete every record whose retention has ended (or, with --dry-run, count them).
    Purge(cmd::purge::Args),
    /// Look at the outbox's events, park them and send parked ones back.
    #[command(subcommand)]
    Outbox(cmd::outbox::Command),
    /// List dead letters (NATS JetStream, RabbitMQ) and re-drive them under their original key.
    #[command(subcommand)]
    DeadLetters(cmd::dead_letters::Command),
    /// Counts by state and scope prefix, the oldest claim in progress, records expiring soon.
    Stats(cmd::stats::Args),
}

/// Why a command did not succeed, and so its exit code.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The command was wrong: exit code 2.
    Usage(String),
    /// The command was right but did not succeed: exit code 1.
    Failed(String),
    /// Already said (on stdout or stderr): exit code 1, nothing more printed.
    Quiet,
}

impl From<idem::Error> for Failure {
    fn from(e: idem::Error) -> Self {
        match e {
            idem::Error::Config(msg) => Failure::Usage(msg),
            e => Failure::Failed(e.to_string()),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idem: could not start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Schema(args) => cmd::schema::run(args),
            Command::Records(command) => cmd::records::run(command).await,
            Command::Purge(args) => cmd::purge::run(args).await,
            Command::Outbox(command) => cmd::outbox::run(command).await,
            Command::DeadLetters(command) => cmd::dead_letters::run(command).await,
            Command::Stats(args) => cmd::stats::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A store's or a broker's error may quote what it holds.
        Err(Failure::Usage(msg)) => {
            eprintln!("idem: {}", output::printable_lines(&msg));
            ExitCode::from(2)
        }
        Err(Failure::Failed(msg)) => {
            eprintln!("idem: {}", output::printable_lines(&msg));
            ExitCode::FAILURE
        }
        Err(Failure::Quiet) => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn every_command_is_well_formed() {
        // Unique argument names across flattened groups, valid defaults, and the rest of clap's
        // own checks, for every subcommand.
        Cli::command().debug_assert();
    }
}
