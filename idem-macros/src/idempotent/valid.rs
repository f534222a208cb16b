//! The checks of `#[idempotent]`: each argument against the function it is on. Every check
//! records its errors and goes on; the model is built only when all of them passed.

use proc_macro2::Span;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, ReceiverKind, ReturnType, Signature, Type};

use super::ast::Args;
use crate::attr::FieldPath;
use crate::bindings::{self, Param};
use crate::ctxt::Ctxt;
use crate::krate::{Krate, Site};
use crate::template::{self, Part, Template};
use crate::types::{self, Bounded};

/// Everything the expansion needs, checked.
pub(super) struct Model {
    pub(super) krate: Krate,
    pub(super) template: Template,
    pub(super) scope_span: Span,
    /// The scope template as written, for the function's contract.
    pub(super) scope_text: String,
    pub(super) key: Expr,
    pub(super) store: Option<Expr>,
    pub(super) fingerprinted: Vec<Fingerprinted>,
    pub(super) policy: Policy,
    pub(super) transaction: Option<Ident>,
    pub(super) claim: Option<Ident>,
    /// The resume name of a resumable function: its request is stored with its claim.
    pub(super) resumable: Option<String>,
    /// The size cap of a resumable function's stored request, in bytes.
    pub(super) max_request: u64,
    pub(super) ret: Type,
}

/// One value that goes into the fingerprint: an argument or a field of one, with the
/// `#[cfg]`s of its parameter.
pub(super) struct Fingerprinted {
    pub(super) path: FieldPath,
    pub(super) cfgs: Vec<syn::Attribute>,
    /// The argument is there because `key = …` reads it (`key = req.key`): when it cannot be
    /// fingerprinted, the error says so.
    pub(super) read_by_key: bool,
}

/// The per-handler policy, as far as the attribute sets it.
pub(super) struct Policy {
    pub(super) lease_ms: Option<u64>,
    pub(super) retain_ms: Option<u64>,
    /// `wait = "2s"`: how long a duplicate of a running call waits for its answer.
    pub(super) wait_ms: Option<u64>,
    pub(super) store_final: bool,
    pub(super) fail_closed: bool,
    /// `on_cancel = "finish"`: the body runs on a task of its own, to its end, even when the
    /// caller's future is dropped.
    pub(super) finish_on_cancel: bool,
}

pub(super) fn validate(
    args: Args,
    func: &ItemFn,
    skipped: &[Option<Span>],
    cx: &mut Ctxt,
) -> Option<Model> {
    let sig = &func.sig;
    if let Some(again) = func.attrs.iter().find(|a| is_idempotent(a.path())) {
        cx.spanned(
            again,
            "#[idempotent] is given twice: the inner one would find the outer one's claim and refuse every call as in progress. Keep one",
        );
    }
    // What an `async fn` becomes when an attribute on its `impl` or `trait` (`#[async_trait]`)
    // rewrote it first: a function returning a future. Its return type is not the answer.
    let rewritten = sig.asyncness.is_none()
        && matches!(&sig.output, ReturnType::Type(_, ty) if types::is_future(ty));
    if rewritten {
        let (fn_token, name) = (&sig.fn_token, &sig.ident);
        cx.spanned(
            quote::quote!(#fn_token #name),
            format_args!(
                "`{name}` returns a future, but #[idempotent] needs an `async fn`, whose body it rewrites. If it was written `async fn`, an attribute on its `impl` or `trait` (such as `#[async_trait]`) rewrote it before #[idempotent] saw it: declare the method `async fn` in the trait without that attribute, or put #[idempotent] on an inherent `async fn` that the trait method calls"
            ),
        );
    } else if sig.asyncness.is_none() {
        cx.at(
            sig.fn_token.span,
            "#[idempotent] needs an `async fn`: the claim is taken before the body and completed after it, across `.await`s",
        );
    }
    let ret = if rewritten {
        None
    } else {
        return_type(sig, cx)
    };
    if let Some(ret) = &ret {
        owned(ret, cx);
    }
    let mut params = bindings::params(sig);
    for (p, skip) in params.iter_mut().zip(skipped) {
        p.skipped |= skip.is_some();
    }
    let template = scope(&args, &params, sig, cx);
    key(&args, &params, sig, cx);
    store(&args, cx);
    let fingerprinted = fingerprinted(&args, &params, skipped, sig, cx);
    if let Some(list) = &fingerprinted {
        fingerprintable(list, sig, cx);
    }
    let policy = policy(&args, cx);
    if let Some(ret) = &ret {
        bounded(ret, sig, policy.store_final, cx);
    }
    detachable(&args, sig, policy.finish_on_cancel, cx);
    let krate = Krate::new(args.krate.as_ref(), Site::Attribute, cx);
    for name in [&args.transaction, &args.claim].into_iter().flatten() {
        if bound(&params).any(|i| i == name) {
            cx.at(
                name.span(),
                format_args!("`{name}` would hide the argument `{name}`: name it something else"),
            );
        }
    }
    if let (Some(tx), Some(claim)) = (&args.transaction, &args.claim)
        && tx == claim
    {
        cx.at(
            claim.span(),
            format_args!(
                "`transaction` and `claim` both name `{claim}`: the body gets two values, so give them two names, e.g. `transaction = tx, claim = claim`"
            ),
        );
    }
    let resumable = resumable(&args, &policy, cx);
    let max_request = max_request(&args, cx);
    Some(Model {
        krate,
        template: template?,
        scope_span: args.scope.as_ref()?.span(),
        scope_text: args.scope.as_ref()?.value(),
        key: args.key?,
        store: args.store,
        fingerprinted: fingerprinted?,
        policy,
        transaction: args.transaction,
        claim: args.claim,
        resumable,
        max_request: max_request?,
        ret: ret?,
    })
}

/// The size cap of a resumable call's stored request (`max_request = "256KiB"`): 1 byte to
/// 1 MiB, 64 KiB when not given. Only a resumable call stores its request.
fn max_request(args: &Args, cx: &mut Ctxt) -> Option<u64> {
    const DEFAULT: u64 = 64 * 1024;
    let Some(lit) = &args.max_request else {
        return Some(DEFAULT);
    };
    if args.resumable.is_none() {
        cx.at(
            lit.span(),
            "`max_request` without `resumable`: only a resumable call stores its request, so there is nothing to cap; add `resumable`, or drop `max_request`",
        );
        return None;
    }
    let bytes =
        cx.ok(crate::size::parse(&lit.value()).map_err(|msg| syn::Error::new(lit.span(), msg)))?;
    if bytes == 0 || bytes > crate::size::MAX_REQUEST {
        cx.at(
            lit.span(),
            format_args!(
                "a stored request's size cap of \"{}\" is out of range: give 1B to 1MiB (the default is \"64KiB\"); a store keeps the request with its record until the call completes",
                lit.value()
            ),
        );
        return None;
    }
    Some(bytes)
}

/// The resume name of `resumable`: the name given, else the scope template as written. It is
/// stored with every claim and names the completer's resume function, so it must be a name a
/// store keeps: 1 to 200 bytes of printable ASCII. Resuming needs a claim that can be taken
/// over, committed apart from the body.
fn resumable(args: &Args, policy: &Policy, cx: &mut Ctxt) -> Option<String> {
    let (span, name) = args.resumable.as_ref()?;
    if let Some(tx) = &args.transaction {
        cx.at(
            *span,
            format_args!(
                "`resumable` with `transaction = {tx}`: a transactional call's claim commits with its body, so a call cut off leaves nothing to resume (its transaction rolls back); drop `transaction` to make the call resumable, or drop `resumable`"
            ),
        );
    }
    if policy.fail_closed {
        cx.at(
            *span,
            "`resumable` with `on_expired_lease = \"fail_closed\"`: a fail-closed claim is never taken over, so nothing could resume it; keep the default \"reclaim\" (and give the call's outside steps a downstream key), or drop `resumable`",
        );
    }
    let (text, at) = match name {
        Some(lit) => (lit.value(), lit.span()),
        None => (args.scope.as_ref()?.value(), args.scope.as_ref()?.span()),
    };
    if text.is_empty() || text.len() > 200 || !text.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        let what = if name.is_some() {
            "the resume name"
        } else {
            "the scope template, which names a resumable call unless `resumable = \"name\"` gives another,"
        };
        cx.at(
            at,
            format_args!(
                "{what} must be 1 to 200 bytes of printable ASCII: it is stored with every claim and names the completer's resume function"
            ),
        );
        return None;
    }
    Some(text)
}

/// The names the attribute gives the body (`tx`, `claim`) that the body uses although no
/// argument binds them, each with its message: the first use is bound to that error, so the
/// compiler says it once, there, and not "cannot find value".
pub(super) fn unbound_names(args: &Args, func: &ItemFn) -> Vec<(Ident, String)> {
    let introduced = [
        ("tx", "transaction", &args.transaction),
        ("claim", "claim", &args.claim),
    ];
    let mut out = Vec::new();
    for (name, arg, given) in introduced {
        if given.as_ref().is_some_and(|g| g == name) {
            continue;
        }
        let Some(used) = bindings::unbound_use(func, name) else {
            continue;
        };
        let msg = match given {
            Some(other) => format!(
                "the body uses `{name}`, but `{arg} = {other}` names it `{other}`: use `{other}`, or write `{arg} = {name}`"
            ),
            None if arg == "transaction" => format!(
                "the body uses `{name}`, which #[idempotent] gives only in transactional mode: add `transaction = {name}` to run the body in the claim's database transaction (`{name}: &mut sqlx::Transaction<'static, DB>`, with a `SqliteStore` or `PgStore`)"
            ),
            None => format!(
                "the body uses `{name}`, which #[idempotent] gives only when asked: add `claim = {name}` for this call's `idem::ClaimInfo` (its attempt number, whether it took over an abandoned claim, `downstream_key`)"
            ),
        };
        out.push((used, msg));
    }
    out
}

/// `#[idempotent]` or `#[idem::idempotent]`.
fn is_idempotent(path: &syn::Path) -> bool {
    path.segments
        .last()
        .is_some_and(|s| s.ident == "idempotent")
}

/// `key` is given, and is not the same for every call: a literal, or an expression that reads
/// no argument (a constant, a function of nothing), is.
fn key(args: &Args, params: &[Param], sig: &Signature, cx: &mut Ctxt) {
    match &args.key {
        None if !args.given.contains("key") => cx.at(
            Span::call_site(),
            "missing `key`: the idempotency key, e.g. `key = key` for an `IdempotencyKey` argument or `key = msg.id` for a message",
        ),
        Some(key) if literal(key) => cx.spanned(
            key,
            "`key` is a literal, so every call has the same key and gets the first call's answer: take the key from the request, e.g. `key = key` for an `IdempotencyKey` argument or `key = msg.id` for a message",
        ),
        Some(key) if !reads_an_argument(key, params) => cx.spanned(
            key,
            format_args!(
                "this `key` reads no argument of `{}`, so it is the same on every call, or unrelated to the request, and a call gets the answer of another: take the key from the request, e.g. `key = key` for an `IdempotencyKey` argument or `key = msg.id` for a message (a key held elsewhere is passed in as an argument)",
                sig.ident
            ),
        ),
        _ => {}
    }
}

/// Whether `e` names an argument (or `self`) anywhere: in a path, a field access, a method's
/// receiver or argument, a closure, or a macro's tokens (`format!("{order_no}")` included).
fn reads_an_argument(e: &Expr, params: &[Param]) -> bool {
    struct Reads<'a> {
        names: Vec<&'a Ident>,
        found: bool,
    }
    impl Reads<'_> {
        fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
            for t in tokens {
                match t {
                    proc_macro2::TokenTree::Ident(i) => self.found |= self.names.contains(&&i),
                    proc_macro2::TokenTree::Group(g) => self.tokens(g.stream()),
                    // An inline format argument: `{order_no}`, `{order_no:?}`.
                    proc_macro2::TokenTree::Literal(l) => {
                        let text = l.to_string();
                        self.found |= self.names.iter().any(|n| {
                            let (plain, spaced) = (format!("{{{n}}}"), format!("{{{n}:"));
                            text.contains(&plain) || text.contains(&spaced)
                        });
                    }
                    proc_macro2::TokenTree::Punct(_) => {}
                }
            }
        }
    }
    impl<'ast> syn::visit::Visit<'ast> for Reads<'_> {
        fn visit_expr_path(&mut self, p: &'ast syn::ExprPath) {
            if p.qself.is_none()
                && let Some(i) = p.path.get_ident()
            {
                self.found |= self.names.contains(&i);
            }
            syn::visit::visit_expr_path(self, p);
        }
        fn visit_macro(&mut self, m: &'ast syn::Macro) {
            self.tokens(m.tokens.clone());
        }
    }
    let mut reads = Reads {
        names: bound(params).collect(),
        found: false,
    };
    syn::visit::Visit::visit_expr(&mut reads, e);
    reads.found
}

/// The names a store is built with: a call of one of these (`MemoryStore::new()`,
/// `SqliteStore::builder()…`, `Default::default()`), or of one starting `new_`, `open_` or
/// `connect_`, makes a store.
const CONSTRUCTORS: &[&str] = &["new", "open", "connect", "default", "builder"];

/// `store` names a store that outlives the call. An expression that builds one (a
/// constructor, a builder, a struct literal) builds it again on every call: a memory store
/// that starts empty, a SQL store with a new pool and purge task, so every call is a first.
fn store(args: &Args, cx: &mut Ctxt) {
    let Some(e) = &args.store else { return };
    let Some(built) = built_here(e) else { return };
    cx.spanned(
        e,
        format_args!(
            "this `store` builds a new store on every call ({built}): a memory store starts empty, a SQL or Redis store opens new connections, so no call finds the records of the ones before it and a retry runs the body again. Build the store once and name it here: a `static` (`static STORE: LazyLock<MemoryStore> = LazyLock::new(MemoryStore::new);` with `store = *STORE`), a field of the application state (`store = app.store`), or `&self.store`"
        ),
    );
}

/// What builds a store in `e`, if something does: the constructor called, or the struct
/// literal, looked for where the value comes from (through references, `.await`, `?` and
/// method calls on it).
fn built_here(e: &Expr) -> Option<String> {
    match e {
        Expr::Call(c) => {
            let Expr::Path(p) = &*c.func else { return None };
            let last = p.path.segments.last()?.ident.to_string();
            let builds = CONSTRUCTORS.contains(&last.as_str())
                || ["new_", "open_", "connect_"]
                    .iter()
                    .any(|pre| last.starts_with(pre));
            builds.then(|| {
                let path = p.path.to_token_stream().to_string().replace(' ', "");
                format!("`{path}` is called each time")
            })
        }
        Expr::Struct(s) => {
            let path = s.path.to_token_stream().to_string().replace(' ', "");
            Some(format!("a `{path}` literal is a new value each time"))
        }
        Expr::MethodCall(m) => built_here(&m.receiver),
        Expr::Reference(r) => built_here(&r.expr),
        Expr::Paren(p) => built_here(&p.expr),
        Expr::Group(g) => built_here(&g.expr),
        Expr::Await(a) => built_here(&a.base),
        Expr::Try(t) => built_here(&t.expr),
        _ => None,
    }
}

fn literal(e: &Expr) -> bool {
    match e {
        Expr::Lit(_) => true,
        Expr::Reference(r) => literal(&r.expr),
        Expr::Paren(p) => literal(&p.expr),
        Expr::Group(g) => literal(&g.expr),
        _ => false,
    }
}

/// The argument an expression reads from: `app` in `app.idem`, `self` in `self.store()`.
fn root(e: &Expr) -> Option<&Ident> {
    match e {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident(),
        Expr::Field(f) => root(&f.base),
        Expr::MethodCall(m) => root(&m.receiver),
        Expr::Index(i) => root(&i.expr),
        Expr::Reference(r) => root(&r.expr),
        Expr::Paren(p) => root(&p.expr),
        Expr::Group(g) => root(&g.expr),
        Expr::Unary(u) => root(&u.expr),
        Expr::Try(t) => root(&t.expr),
        _ => None,
    }
}

/// Every name the parameters bind.
fn bound(params: &[Param]) -> impl Iterator<Item = &Ident> {
    params.iter().flat_map(|p| &p.idents)
}

/// The return type, when it can be a `Result` of a replayable value.
fn return_type(sig: &Signature, cx: &mut Ctxt) -> Option<Type> {
    match &sig.output {
        ReturnType::Type(_, ty) if types::obviously_not_result(ty) => {
            cx.at(
                ty.span(),
                format_args!(
                    "an #[idempotent] function must return `Result<T, E>`, not `{}`: the `Ok` value is stored and replayed, an `Err` releases the claim so a retry can run",
                    ty.to_token_stream()
                ),
            );
            None
        }
        ReturnType::Type(_, ty) => {
            if let Some(span) = types::impl_trait(ty) {
                cx.at(
                    span,
                    "an #[idempotent] function cannot return `impl Trait`: a replay rebuilds the value from stored bytes, which needs a concrete type",
                );
            }
            Some((**ty).clone())
        }
        ReturnType::Default => {
            cx.at(
                sig.paren_token.span.close(),
                "an #[idempotent] function must return `Result<T, E>`: add `-> Result<T, E>` (the `Ok` value is stored and replayed)",
            );
            None
        }
    }
}

/// `T` and `E` of a return type written `Result<T, E>`, when it has no `impl Trait`: that one is
/// refused on its own ([`return_type`]).
fn concrete_result(ret: &Type) -> Option<(&Type, &Type)> {
    types::result_args(ret).filter(|_| types::impl_trait(ret).is_none())
}

/// The answer owns its data: a replay rebuilds it from the stored bytes. Otherwise serde's
/// lifetime error, on the whole attribute. (A final error cannot borrow either, but
/// `FinalError`'s own bounds already say so, at its impl.)
fn owned(ret: &Type, cx: &mut Ctxt) {
    let Some((ok, _)) = concrete_result(ret) else {
        return;
    };
    if let Some(part) = types::borrowed_part(ok) {
        cx.spanned(
            part,
            format_args!(
                "`{}` borrows, but the answer of an #[idempotent] function is rebuilt from stored bytes when a retry is replayed, so it must own its data: return an owned type (`String` for `&str`, `Vec<T>` for `&[T]`, `Cow<'static, str>`, a struct without a lifetime)",
                types::display(part)
            ),
        );
    }
}

/// A type parameter of the function as the answer (or the body of a `Json` answer) or the error
/// type has the bounds they need. Otherwise the compiler would name a bound of idem's own,
/// and suggest it.
fn bounded(ret: &Type, sig: &Signature, store_final: bool, cx: &mut Ctxt) {
    let Some((ok, err)) = concrete_result(ret) else {
        return;
    };
    let generics = &sig.generics;
    let body = types::json_body(ok).unwrap_or(ok);
    if types::bounded_by(body, generics, REPLAYABLE) == Bounded::No {
        let t = types::display(body);
        cx.spanned(
            body,
            format_args!(
                "the answer `{t}` is a type parameter without the bounds a replay needs: it is stored, and rebuilt from the stored bytes, so add `{t}: serde::Serialize + serde::de::DeserializeOwned` (or `{t}: idem::replay::ReplayBytes` for an encoding of your own)"
            ),
        );
    }
    let mut missing = Vec::new();
    if types::bounded_by(err, generics, &["From"]) == Bounded::No {
        missing.push("From<idem::Error>");
    }
    if store_final && types::bounded_by(err, generics, &["FinalError"]) == Bounded::No {
        missing.push("idem::FinalError");
    }
    if !missing.is_empty() {
        let (e, missing) = (types::display(err), missing.join(" + "));
        let why = if store_final {
            "idem returns its own failures (a store that is down, a key reused with another request, a call still in progress) as the error type, and `on_error = \"store_final\"` asks it which errors are final"
        } else {
            "idem returns its own failures (a store that is down, a key reused with another request, a call still in progress) as the error type"
        };
        cx.spanned(
            err,
            format_args!(
                "the error type `{e}` is a type parameter without `{missing}`: {why}, so add `{e}: {missing}`"
            ),
        );
    }
}

/// The traits that can make an answer replayable, by name.
const REPLAYABLE: &[&str] = &["Deserialize", "DeserializeOwned", "Replay", "ReplayBytes"];

/// The scope template, with every placeholder naming an argument.
fn scope(args: &Args, params: &[Param], sig: &Signature, cx: &mut Ctxt) -> Option<Template> {
    let Some(lit) = &args.scope else {
        if !args.given.contains("scope") {
            cx.at(
                Span::call_site(),
                "missing `scope`: name what the operation acts on, e.g. `scope = \"refund:<order_no>\"` (a function's name is not an identity: renaming it must not reset idempotency)",
            );
        }
        return None;
    };
    let template = cx.ok(template::parse(&lit.value(), lit.span()))?;
    for part in &template.parts {
        if let Part::Hole(h) = part
            && h.fields.is_empty()
            && let Some(float) = float_argument(sig, &h.root)
        {
            cx.at(
                lit.span(),
                format_args!(
                    "`<{}>` in the scope is a float (`{float}`), and a float makes no stable key: the same amount can render with other digits (`0.1 + 0.2` is `0.30000000000000004`), so a retry could get another scope. Use an integer in minor units (`{}_cents: u64`) or the text the client sent (`String`)",
                    h.written, h.root
                ),
            );
        }
        if let Part::Hole(h) = part
            && !bound(params).any(|i| *i == h.root)
        {
            let names = bound(params)
                .map(|i| format!("`{i}`"))
                .collect::<Vec<_>>()
                .join(", ");
            cx.at(
                lit.span(),
                format_args!(
                    "`<{}>` in the scope names no argument of `{}`: its arguments are {names}",
                    h.written, sig.ident
                ),
            );
        }
    }
    Some(template)
}

/// The float type of the argument `name`, written `f32` or `f64` (or a reference to one). A
/// float reached otherwise (a field, an alias) is refused by its type, where the scope is
/// rendered.
fn float_argument(sig: &Signature, name: &str) -> Option<String> {
    sig.inputs.iter().find_map(|arg| match arg {
        FnArg::Typed(t) if matches!(&*t.pat, syn::Pat::Ident(p) if p.ident == name) => {
            match types::unreferenced(&t.ty) {
                Type::Path(p) if p.qself.is_none() => {
                    let ident = p.path.get_ident()?;
                    (ident == "f32" || ident == "f64").then(|| ident.to_string())
                }
                _ => None,
            }
        }
        _ => None,
    })
}

/// What goes into the fingerprint: the listed arguments or fields, or every argument but the
/// skipped ones, the key and the store.
fn fingerprinted(
    args: &Args,
    params: &[Param],
    skipped: &[Option<Span>],
    sig: &Signature,
    cx: &mut Ctxt,
) -> Option<Vec<Fingerprinted>> {
    let find = |name: &Ident| params.iter().find(|p| p.idents.iter().any(|i| i == name));
    let mut ok = true;
    let mut check = |list: &[FieldPath], cx: &mut Ctxt| {
        for path in list.iter().filter(|p| find(&p.root).is_none()) {
            ok = false;
            cx.at(
                path.root.span(),
                format_args!("`{}` is not an argument of `{}`", path.root, sig.ident),
            );
        }
    };
    if let (Some(_), Some((span, _))) = (&args.fingerprint, &args.skip) {
        cx.at(
            *span,
            "use either `fingerprint(…)` (exactly these arguments) or `skip(…)` (all but these), not both",
        );
    }
    let out = if let Some((_, list)) = &args.fingerprint {
        check(list, cx);
        listed(args, list, params, skipped, cx);
        list.iter()
            .filter_map(|path| {
                let p = find(&path.root)?;
                Some(Fingerprinted {
                    path: FieldPath {
                        root: path.root.clone(),
                        fields: path.fields.clone(),
                    },
                    cfgs: p.cfgs.clone(),
                    read_by_key: false,
                })
            })
            .collect()
    } else {
        let skip = args.skip.as_ref().map(|(_, l)| l.as_slice());
        let skip = skip.unwrap_or_default();
        check(skip, cx);
        for path in skip.iter().filter(|p| !p.fields.is_empty()) {
            cx.spanned(
                path,
                "`skip` takes argument names, not fields: to hash part of an argument, list what makes up the request with `fingerprint(…)`, e.g. `fingerprint(order_no, req.cents)`",
            );
        }
        all_but(args, params, skip)
    };
    ok.then_some(out)
}

/// A fingerprinted argument whose type is a type parameter or an `impl Trait` without
/// `Serialize`: the fix is a bound, which the compiler would word as a bound of idem's own.
fn fingerprintable(list: &[Fingerprinted], sig: &Signature, cx: &mut Ctxt) {
    for f in list.iter().filter(|f| f.path.fields.is_empty()) {
        let Some(ty) = sig.inputs.iter().find_map(|arg| match arg {
            FnArg::Typed(t) if matches!(&*t.pat, syn::Pat::Ident(p) if p.ident == f.path.root) => {
                Some(&*t.ty)
            }
            _ => None,
        }) else {
            continue;
        };
        let bare = types::unreferenced(ty);
        if types::bounded_by(bare, &sig.generics, &["Serialize"]) != Bounded::No {
            continue;
        }
        let shown = types::display(bare);
        let fix = match bare {
            Type::ImplTrait(_) => format!("`{shown} + serde::Serialize`"),
            _ => format!("`{shown}: serde::Serialize`"),
        };
        let why = if f.read_by_key {
            "`key = …` reads it, so it is part of the request fingerprint"
        } else {
            "it is part of the request fingerprint"
        };
        cx.spanned(
            bare,
            format_args!(
                "`{}` cannot be fingerprinted: {why}, and its type `{shown}` is not known to be `serde::Serialize`. Add the bound, {fix}, or leave the argument out with `#[idem(skip)]`",
                f.path.root
            ),
        );
    }
}

/// `fingerprint(…)` names something, and nothing twice or also skipped.
fn listed(
    args: &Args,
    list: &[FieldPath],
    params: &[Param],
    skipped: &[Option<Span>],
    cx: &mut Ctxt,
) {
    let Some((span, _)) = args.fingerprint else {
        return;
    };
    if list.is_empty() {
        cx.at(
            span,
            "`fingerprint()` lists nothing, so a retry with other arguments would get the first answer instead of an error: list what makes up the request, e.g. `fingerprint(order_no, cents)`, or leave `fingerprint` out to hash every argument",
        );
    } else if let Some(key) = plain_ident(&args.key)
        && list.iter().all(|p| p.fields.is_empty() && p.root == key)
    {
        cx.at(
            span,
            format_args!(
                "`fingerprint({key})` lists only the key, which is the same on every retry: a retry with other arguments would get the first answer instead of an error. List what makes up the request, e.g. `fingerprint(order_no, cents)`"
            ),
        );
    }
    let text = |p: &FieldPath| quote::ToTokens::to_token_stream(p).to_string();
    for (i, path) in list.iter().enumerate() {
        if list[..i].iter().any(|e| text(e) == text(path)) {
            cx.spanned(
                path,
                format_args!("`{}` is listed twice in `fingerprint(…)`", text(path)),
            );
        }
    }
    for (param, skip) in params.iter().zip(skipped) {
        let Some(skip) = skip else { continue };
        if let Some(ident) = param
            .idents
            .iter()
            .find(|i| list.iter().any(|p| p.root == **i))
        {
            cx.at(
                *skip,
                format_args!(
                    "`{ident}` is marked `#[idem(skip)]`, but `fingerprint(…)` lists it: remove one of the two"
                ),
            );
        }
    }
}

/// Every argument but `self`, the skipped ones, the key and the store: the key identifies the
/// request, and the store (or the application state it is read from, `app` in
/// `store = app.idem`) keeps it; neither is part of what the request says.
fn all_but(args: &Args, params: &[Param], skip: &[FieldPath]) -> Vec<Fingerprinted> {
    let implicit = [
        plain_ident(&args.key),
        plain_ident(&args.store),
        args.store.as_ref().and_then(root).cloned(),
    ];
    let key_root = args.key.as_ref().and_then(root);
    params
        .iter()
        .filter(|p| !p.skipped && !p.is_receiver)
        .flat_map(|p| p.idents.iter().map(move |i| (i, p)))
        .filter(|(i, _)| {
            !skip.iter().any(|s| s.root == **i) && !implicit.iter().flatten().any(|k| k == *i)
        })
        .map(|(i, p)| Fingerprinted {
            path: FieldPath {
                root: i.clone(),
                fields: Vec::new(),
            },
            cfgs: p.cfgs.clone(),
            read_by_key: key_root == Some(i),
        })
        .collect()
}

/// `key = key`: the expression is an argument itself.
fn plain_ident(e: &Option<Expr>) -> Option<Ident> {
    match e {
        Some(Expr::Path(p)) if p.qself.is_none() => p.path.get_ident().cloned(),
        _ => None,
    }
}

/// The shortest lease: below a second, a body's ordinary latency (a database round trip under
/// load, a pause) outlives its claim, and a retry that arrives then runs the body again.
const MIN_LEASE_MS: u64 = 1_000;

/// Lease, retention, and what happens to errors and abandoned claims.
fn policy(args: &Args, cx: &mut Ctxt) -> Policy {
    let mut duration = |lit: &Option<LitStr>| {
        let l = lit.as_ref()?;
        cx.ok(crate::duration::parse(&l.value()).map_err(|msg| syn::Error::new(l.span(), msg)))
    };
    let lease_ms = duration(&args.lease);
    let retain_ms = duration(&args.retain);
    let wait_ms = duration(&args.wait);
    if let (Some(ms), Some(lit)) = (lease_ms, &args.lease)
        && ms < MIN_LEASE_MS
    {
        cx.at(
            lit.span(),
            format_args!(
                "a lease of {} is too short: a claim that runs out while the body still runs lets a retry run the body a second time. Give the longest time the body can take, at least \"1s\" (the default is \"5m\")",
                lit.value()
            ),
        );
    }
    let (lease, retain) = (lease_ms.unwrap_or(300_000), retain_ms.unwrap_or(86_400_000));
    if let (Some(ms), Some(lit)) = (wait_ms, &args.wait) {
        if let Some(tx) = &args.transaction {
            cx.at(
                lit.span(),
                format_args!(
                    "`wait` with `transaction = {tx}`: a transactional duplicate already waits for the running call, on its record's row lock, and then replays its answer; drop `wait`"
                ),
            );
        } else if ms > lease {
            cx.at(
                lit.span(),
                format_args!(
                    "a wait of {} is longer than the lease, {}: a duplicate would still wait after the running call is presumed dead. Wait at most the lease, or lengthen the lease",
                    lit.value(),
                    args.lease.as_ref().map_or("5m (the default)".to_owned(), LitStr::value)
                ),
            );
        }
    }
    if retain < lease {
        let span = args.retain.as_ref().or(args.lease.as_ref());
        cx.at(
            span.map_or_else(Span::call_site, LitStr::span),
            format_args!(
                "the retention ({retain} ms) is shorter than the lease ({lease} ms): a record must outlive the claim that writes it"
            ),
        );
    }
    let store_final = choice(
        &args.on_error,
        &[("release", false), ("store_final", true)],
        |other| {
            format!(
                "unknown error policy \"{other}\": use \"release\" (the default: an error frees the key for a retry) or \"store_final\" (errors that say they are final are stored and replayed)"
            )
        },
        cx,
    );
    let fail_closed = choice(
        &args.on_expired_lease,
        &[("reclaim", false), ("fail_closed", true)],
        |other| {
            format!(
                "unknown expired-lease policy \"{other}\": use \"reclaim\" (the default) or \"fail_closed\""
            )
        },
        cx,
    );
    let finish_on_cancel = choice(
        &args.on_cancel,
        &[("release", false), ("finish", true)],
        |other| {
            format!(
                "unknown cancellation policy \"{other}\": use \"release\" (the default: a caller that is dropped, such as a client that hung up, releases the claim and a retry runs the body again) or \"finish\" (the body runs to its end on a task of its own, and a retry gets its answer)"
            )
        },
        cx,
    );
    Policy {
        lease_ms,
        retain_ms,
        wait_ms,
        store_final,
        fail_closed,
        finish_on_cancel,
    }
}

/// `on_cancel = "finish"` moves the body onto a task of its own: it cannot borrow from the
/// caller, and a transaction already undoes a body cut halfway.
fn detachable(args: &Args, sig: &Signature, finish: bool, cx: &mut Ctxt) {
    let Some(lit) = args.on_cancel.as_ref().filter(|_| finish) else {
        return;
    };
    if let Some(tx) = &args.transaction {
        cx.at(
            lit.span(),
            format_args!(
                "`on_cancel = \"finish\"` with `transaction = {tx}`: in transactional mode a dropped call rolls back everything it did, claim included, so a retry starts from nothing; keep the default, or drop `transaction` to run the body to its end on a task of its own"
            ),
        );
    }
    for arg in &sig.inputs {
        let (borrowed, what) = match arg {
            FnArg::Receiver(r) => match &r.kind {
                ReceiverKind::Reference(..) => (true, "`self`".to_owned()),
                ReceiverKind::Typed(_, ty) => (types::borrows(ty), "`self`".to_owned()),
                _ => (false, String::new()),
            },
            FnArg::Typed(t) => (
                types::borrows(&t.ty),
                format!("`{}`", t.pat.to_token_stream()),
            ),
        };
        if borrowed {
            cx.spanned(
                arg,
                format_args!(
                    "{what} is borrowed, but `on_cancel = \"finish\"` runs the body on a task of its own, which outlives the caller: take it by value (an owned value, or an `Arc` of it, cloned by the caller)"
                ),
            );
        }
    }
}

/// One of a few words, each meaning a flag; the first is the default.
fn choice(
    lit: &Option<LitStr>,
    words: &[(&str, bool)],
    unknown: impl Fn(&str) -> String,
    cx: &mut Ctxt,
) -> bool {
    let Some(lit) = lit else { return false };
    let value = lit.value();
    match words.iter().find(|(w, _)| *w == value) {
        Some((_, flag)) => *flag,
        None => {
            cx.at(lit.span(), unknown(&value));
            false
        }
    }
}
