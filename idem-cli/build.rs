//! Which services the tests can reach, decided when they are built: `DATABASE_URL` pointing at
//! PostgreSQL sets `cfg(idem_postgres)`, `IDEM_REDIS_URL` pointing at Redis (or Valkey) sets
//! `cfg(idem_redis)`. Without one, its tests are compiled `#[ignore]`d, unless
//! `IDEM_REQUIRE_POSTGRES=1` or `IDEM_REQUIRE_REDIS=1` makes its absence an error (CI).

/// One service: the `cfg` it sets, the variable that points at it and the URL schemes it
/// accepts, the variable that makes it required, and what to set.
const SERVICES: &[(&str, &str, &[&str], &str, &str)] = &[
    (
        "idem_postgres",
        "DATABASE_URL",
        &["postgres://", "postgresql://"],
        "IDEM_REQUIRE_POSTGRES",
        "DATABASE_URL=postgres://postgres@127.0.0.1:5432/test",
    ),
    (
        "idem_redis",
        "IDEM_REDIS_URL",
        &["redis://", "rediss://", "valkey://"],
        "IDEM_REQUIRE_REDIS",
        "IDEM_REDIS_URL=redis://127.0.0.1:6379",
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
            eprintln!("{require}=1 but {var} is not set as the tests need: set {example}");
            std::process::exit(1);
        }
    }
}
