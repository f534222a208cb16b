//! Whether the tests can reach PostgreSQL, decided when they are built: `DATABASE_URL`
//! pointing at one sets `cfg(idem_postgres)`; without it the PostgreSQL tests are compiled
//! `#[ignore]`d, unless `IDEM_REQUIRE_POSTGRES=1` makes its absence an error (CI).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(idem_postgres)");
    println!("cargo::rerun-if-env-changed=DATABASE_URL");
    println!("cargo::rerun-if-env-changed=IDEM_REQUIRE_POSTGRES");
    let configured = std::env::var("DATABASE_URL")
        .is_ok_and(|url| url.starts_with("postgres://") || url.starts_with("postgresql://"));
    if configured {
        println!("cargo::rustc-cfg=idem_postgres");
    } else if std::env::var("IDEM_REQUIRE_POSTGRES").as_deref() == Ok("1") {
        eprintln!(
            "IDEM_REQUIRE_POSTGRES=1 but DATABASE_URL does not point at PostgreSQL: set \
             DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"
        );
        std::process::exit(1);
    }
}
