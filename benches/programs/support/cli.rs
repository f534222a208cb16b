//! The benchmark programs' command lines: `--flag value` pairs and `--help`.

/// Prints `usage` and exits: on standard output with status 0 when `problem` is `None` (the user
/// asked for it), else on standard error after the problem, with status 2.
pub fn usage(usage: &str, problem: Option<&str>) -> ! {
    match problem {
        None => {
            println!("{usage}");
            std::process::exit(0)
        }
        Some(problem) => {
            eprintln!("{problem}\n{usage}");
            std::process::exit(2)
        }
    }
}

/// The value that follows `flag`, or the usage and status 2 when there is none.
pub fn value(args: &mut impl Iterator<Item = String>, flag: &str, usage_text: &str) -> String {
    args.next()
        .unwrap_or_else(|| usage(usage_text, Some(&format!("{flag} needs a value"))))
}
