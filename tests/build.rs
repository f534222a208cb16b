//! Which services the tests can reach, decided when they are built.
//!
//! A test that needs a service that is not configured is compiled `#[ignore]`d with the reason
//! (`#[cfg_attr(not(idem_postgres), ignore = "…")]`), so the test runner lists it as ignored,
//! never as passed. Where CI requires a service (`IDEM_REQUIRE_POSTGRES=1` and its siblings), its
//! absence fails the build instead.

struct Service {
    /// The `cfg` set when the service is configured.
    cfg: &'static str,
    /// The variable that points at it, and the URL schemes it accepts (any value when empty).
    var: &'static str,
    schemes: &'static [&'static str],
    /// The variable that makes it required.
    require: &'static str,
    name: &'static str,
    example: &'static str,
}

const SERVICES: &[Service] = &[
    Service {
        cfg: "idem_postgres",
        var: "DATABASE_URL",
        schemes: &["postgres://", "postgresql://"],
        require: "IDEM_REQUIRE_POSTGRES",
        name: "PostgreSQL",
        example: "DATABASE_URL=postgres://postgres@127.0.0.1:5432/test",
    },
    Service {
        cfg: "idem_mysql",
        var: "IDEM_MYSQL_URL",
        schemes: &["mysql://", "mariadb://"],
        require: "IDEM_REQUIRE_MYSQL",
        name: "MySQL or MariaDB",
        example: "IDEM_MYSQL_URL=mysql://root@127.0.0.1:3306/test",
    },
    Service {
        cfg: "idem_redis",
        var: "IDEM_REDIS_URL",
        schemes: &["redis://", "rediss://", "valkey://"],
        require: "IDEM_REQUIRE_REDIS",
        name: "Redis",
        example: "IDEM_REDIS_URL=redis://127.0.0.1:6379",
    },
    Service {
        cfg: "idem_redis_cluster",
        var: "IDEM_REDIS_CLUSTER",
        schemes: &["redis://", "rediss://", "valkey://"],
        require: "IDEM_REQUIRE_REDIS",
        name: "a Redis Cluster",
        example: "IDEM_REDIS_CLUSTER=redis://127.0.0.1:7101,redis://127.0.0.1:7102,…",
    },
    Service {
        cfg: "idem_nats",
        var: "NATS_URL",
        schemes: &["nats://"],
        require: "IDEM_REQUIRE_NATS",
        name: "NATS with JetStream",
        example: "NATS_URL=nats://127.0.0.1:4222",
    },
    Service {
        cfg: "idem_amqp",
        var: "AMQP_URL",
        schemes: &["amqp://"],
        require: "IDEM_REQUIRE_AMQP",
        name: "RabbitMQ",
        example: "AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f",
    },
];

/// Whether `program arg` runs and succeeds.
fn runs(program: &str, arg: &str) -> bool {
    std::process::Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Private Redis servers (restarts, settings the shared server must not get) need the binary.
fn redis_server_runs() -> bool {
    runs("redis-server", "--version")
}

fn main() {
    let mut skipped = Vec::new();
    for s in SERVICES {
        println!("cargo::rustc-check-cfg=cfg({})", s.cfg);
        println!("cargo::rerun-if-env-changed={}", s.var);
        println!("cargo::rerun-if-env-changed={}", s.require);
        let configured = std::env::var(s.var)
            .is_ok_and(|url| s.schemes.iter().any(|scheme| url.starts_with(scheme)));
        let required = std::env::var(s.require).as_deref() == Ok("1");
        if configured {
            println!("cargo::rustc-cfg={}", s.cfg);
        } else if required {
            eprintln!(
                "{}=1 but {} does not point at {}: set {}",
                s.require, s.var, s.name, s.example
            );
            std::process::exit(1);
        } else {
            skipped.push(format!("{} (set {})", s.name, s.example));
        }
    }
    println!("cargo::rustc-check-cfg=cfg(idem_redis_server)");
    println!("cargo::rerun-if-env-changed=PATH");
    if redis_server_runs() {
        println!("cargo::rustc-cfg=idem_redis_server");
    } else if std::env::var("IDEM_REQUIRE_REDIS").as_deref() == Ok("1") {
        eprintln!(
            "IDEM_REQUIRE_REDIS=1 but there is no redis-server binary to start private servers"
        );
        std::process::exit(1);
    } else {
        skipped.push("a redis-server binary (install Redis)".to_owned());
    }
    // The guide's walkthrough is run as written: with bash, curl and openssl.
    println!("cargo::rustc-check-cfg=cfg(idem_walkthrough_tools)");
    println!("cargo::rerun-if-env-changed=IDEM_REQUIRE_CURL");
    let tools = [
        ("bash", "--version"),
        ("curl", "--version"),
        ("openssl", "version"),
    ];
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(tool, arg)| !runs(tool, arg))
        .map(|(tool, _)| *tool)
        .collect();
    if missing.is_empty() {
        println!("cargo::rustc-cfg=idem_walkthrough_tools");
    } else if std::env::var("IDEM_REQUIRE_CURL").as_deref() == Ok("1") {
        eprintln!(
            "IDEM_REQUIRE_CURL=1 but the walkthrough's tools (src/guide/walkthrough.md) are missing: {}",
            missing.join(", ")
        );
        std::process::exit(1);
    } else {
        skipped.push(format!(
            "{} (the guide's walkthrough)",
            missing.join(" and ")
        ));
    }
    // The admin view is tested in a real headless Chromium, driven through ChromeDriver.
    println!("cargo::rustc-check-cfg=cfg(idem_chromium)");
    println!("cargo::rerun-if-env-changed=IDEM_REQUIRE_CHROMIUM");
    if runs("chromedriver", "--version")
        && (runs("chromium", "--version") || runs("chromium-browser", "--version"))
    {
        println!("cargo::rustc-cfg=idem_chromium");
    } else if std::env::var("IDEM_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
        eprintln!(
            "IDEM_REQUIRE_CHROMIUM=1 but chromium and chromedriver are not installed \
             (apt-get install chromium chromium-driver)"
        );
        std::process::exit(1);
    } else {
        skipped.push("Chromium and ChromeDriver (the admin view's browser test)".to_owned());
    }
    if !skipped.is_empty() {
        println!(
            "cargo::warning=tests that need {} are listed as ignored",
            skipped.join(", ")
        );
    }
}
