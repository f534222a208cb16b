//! The refund service's binary as a process of its own, for tests that kill it (SIGKILL) and
//! start it again on the same address.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The example `refund_service`, running; killed when dropped.
pub struct Service {
    child: Child,
    /// `http://host:port`.
    pub base: String,
}

impl Service {
    /// The service on `database_url`, listening on `addr` (`127.0.0.1:0` for any port), with
    /// `env` besides; returns once it listens. Nothing from the environment of the tests reaches
    /// it but what it is given (no broker, no Redis).
    pub fn start(database_url: &str, addr: &str, env: &[(&str, &str)]) -> Service {
        let mut child = Command::new(super::example_binary("refund_service"))
            .env("IDEM_ADDR", addr)
            .env("DATABASE_URL", database_url)
            .env("RUST_LOG", "warn")
            .env_remove("NATS_URL")
            .env_remove("IDEM_STORE_URL")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the example");
        match listening_on(&mut child) {
            Ok(base) => Service { child, base },
            Err(line) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the example did not start on {addr}: {line:?}")
            }
        }
    }

    /// `host:port`.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// `path` on the service.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // SIGKILL: nothing of the service's runs after it, as in a crash.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address the service printed on its first line (it prints nothing else to stdout), or
/// that line when it names none. What its log writes to stdout after that is read and dropped,
/// so that the log never fills the pipe nor finds it closed.
pub fn listening_on(child: &mut Child) -> Result<String, String> {
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let mut out = BufReader::new(out);
        let _ = out.read_line(&mut line);
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    }
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .map(str::to_owned)
        .ok_or(line)
}

/// A port nothing listens on now, for a service that is to be started again on it.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
