//! Which services the tests can reach, decided when they are built: `DATABASE_URL` pointing at
//! PostgreSQL sets `cfg(idem_postgres)`, `IDEM_MYSQL_URL` (mysql://…) `cfg(idem_mysql)`,
//! `IDEM_REDIS_URL` (redis://…) `cfg(idem_redis)`,
//! `NATS_URL` (nats://…) `cfg(idem_nats)`, `AMQP_URL` (amqp://…) `cfg(idem_amqp)`. Without one,
//! its tests are compiled `#[ignore]`d, unless `IDEM_REQUIRE_POSTGRES=1` (`IDEM_REQUIRE_REDIS=1`,
//! `IDEM_REQUIRE_NATS=1`, `IDEM_REQUIRE_AMQP=1`) makes its absence an error (CI).

/// A service: its `cfg`, the variable naming it and the schemes it takes, the variable that
/// makes it required, and an example.
const SERVICES: &[(&str, &str, &[&str], &str, &str)] = &[
    (
        "idem_postgres",
        "DATABASE_URL",
        &["postgres://", "postgresql://"],
        "IDEM_REQUIRE_POSTGRES",
        "DATABASE_URL=postgres://postgres@127.0.0.1:5432/test",
    ),
    (
        "idem_mysql",
        "IDEM_MYSQL_URL",
        &["mysql://", "mariadb://"],
        "IDEM_REQUIRE_MYSQL",
        "IDEM_MYSQL_URL=mysql://root@127.0.0.1:3306/test",
    ),
    (
        "idem_redis",
        "IDEM_REDIS_URL",
        &["redis://", "rediss://", "valkey://"],
        "IDEM_REQUIRE_REDIS",
        "IDEM_REDIS_URL=redis://127.0.0.1:6379",
    ),
    (
        "idem_nats",
        "NATS_URL",
        &["nats://"],
        "IDEM_REQUIRE_NATS",
        "NATS_URL=nats://127.0.0.1:4222",
    ),
    (
        "idem_amqp",
        "AMQP_URL",
        &["amqp://"],
        "IDEM_REQUIRE_AMQP",
        "AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f",
    ),
];

fn main() {
    for (cfg, var, schemes, require, example) in SERVICES {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-env-changed={var}");
        println!("cargo::rerun-if-env-changed={require}");
        let configured = std::env::var(var)
            .is_ok_and(|url| schemes.iter().any(|scheme| url.starts_with(scheme)));
        if configured {
            println!("cargo::rustc-cfg={cfg}");
        } else if std::env::var(require).as_deref() == Ok("1") {
            eprintln!("{require}=1 but {var} does not name the service: set {example}");
            std::process::exit(1);
        }
    }
}
