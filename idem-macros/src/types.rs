//! What can be told about a type from its tokens alone, before the compiler sees it.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{GenericArgument, PathArguments, Type};

/// The type arguments of a type written `…::Name<A, B>` (its last segment named `name`).
pub(crate) fn args_of<'a>(ty: &'a Type, name: &str) -> Option<Vec<&'a Type>> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last().filter(|s| s.ident == name)?;
    Some(match &last.arguments {
        PathArguments::AngleBracketed(args) => args
            .args
            .iter()
            .filter_map(|a| match a {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    })
}

/// `T` and `E` of a return type written `Result<T, E>` (any path ending in `Result`).
pub(crate) fn result_args(ty: &Type) -> Option<(&Type, &Type)> {
    match args_of(ty, "Result")?.as_slice() {
        [ok, err] => Some((ok, err)),
        _ => None,
    }
}

/// `T` of an `Ok` type written like an answer of the HTTP integration, `Json<T>` or
/// `(StatusCode, Json<T>)`, with no `impl Trait` in it (the expansion names the type).
pub(crate) fn json_body(ok: &Type) -> Option<&Type> {
    let json = match ok {
        Type::Tuple(t) if t.elems.len() == 2 => &t.elems[1],
        Type::Paren(p) => return json_body(&p.elem),
        t => t,
    };
    let body = match args_of(json, "Json")?.as_slice() {
        [body] => *body,
        _ => return None,
    };
    struct ImplTrait(bool);
    impl<'ast> Visit<'ast> for ImplTrait {
        fn visit_type_impl_trait(&mut self, _: &'ast syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut found = ImplTrait(false);
    found.visit_type(ok);
    (!found.0).then_some(body)
}

/// Return types that cannot be a `Result` or an alias of one, rejected before type checking so
/// the message is one, on the type. Anything else is checked by the compiler.
pub(crate) fn obviously_not_result(ty: &Type) -> bool {
    const NOT_RESULT: &[&str] = &[
        "bool",
        "char",
        "str",
        "u8",
        "u16",
        "u32",
        "u64",
        "u128",
        "usize",
        "i8",
        "i16",
        "i32",
        "i64",
        "i128",
        "isize",
        "f32",
        "f64",
        "String",
        "Vec",
        "Option",
        "Box",
        "HashMap",
        "BTreeMap",
        "Json",
        "StatusCode",
        "Response",
    ];
    match ty {
        Type::Path(p) => {
            p.qself.is_none()
                && p.path
                    .segments
                    .last()
                    .is_some_and(|s| NOT_RESULT.iter().any(|n| s.ident == n))
        }
        Type::Paren(p) => obviously_not_result(&p.elem),
        Type::Tuple(_)
        | Type::Reference(_)
        | Type::Array(_)
        | Type::Slice(_)
        | Type::Never(_)
        | Type::Ptr(_) => true,
        _ => false,
    }
}

/// The first `impl Trait` inside a type.
pub(crate) fn impl_trait(ty: &Type) -> Option<Span> {
    struct Finder(Option<Span>);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, t: &'ast syn::TypeImplTrait) {
            self.0.get_or_insert(t.span());
        }
    }
    let mut finder = Finder(None);
    finder.visit_type(ty);
    finder.0
}

/// A type as a user writes it: `&str`, `Vec<u8>`, not the token stream's `& str`, `Vec < u8 >`.
pub(crate) fn display(ty: &Type) -> String {
    quote::ToTokens::to_token_stream(ty)
        .to_string()
        .replace("& ", "&")
        .replace(" <", "<")
        .replace("< ", "<")
        .replace(" >", ">")
        .replace(" ,", ",")
        .replace(":: ", "::")
        .replace(" ::", "::")
}

/// Whether `ty` borrows: a reference, or a type with a lifetime (`Foo<'a>`, `impl Trait + '_`),
/// anywhere inside it.
pub(crate) fn borrows(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_type_reference(&mut self, r: &'ast syn::TypeReference) {
            match &r.lifetime {
                Some(l) if l.ident == "static" => self.visit_type(&r.elem),
                _ => self.0 = true,
            }
        }
        fn visit_lifetime(&mut self, l: &'ast syn::Lifetime) {
            if l.ident != "static" {
                self.0 = true;
            }
        }
    }
    let mut f = Finder(false);
    f.visit_type(ty);
    f.0
}

/// The first part of `ty` that borrows, for a value that is rebuilt from stored bytes: a
/// reference (`&str`, `&'static str` too), or a type with a lifetime other than `'static`
/// (`Order<'a>`, `Cow<'_, str>`).
pub(crate) fn borrowed_part(ty: &Type) -> Option<&Type> {
    struct Finder<'ast>(Option<&'ast Type>);
    impl<'ast> Visit<'ast> for Finder<'ast> {
        fn visit_type(&mut self, ty: &'ast Type) {
            if self.0.is_some() {
                return;
            }
            let borrows = match ty {
                Type::Reference(_) => true,
                Type::Path(p) => p.path.segments.iter().any(|s| match &s.arguments {
                    PathArguments::AngleBracketed(a) => a
                        .args
                        .iter()
                        .any(|a| matches!(a, GenericArgument::Lifetime(l) if l.ident != "static")),
                    _ => false,
                }),
                _ => false,
            };
            if borrows {
                self.0 = Some(ty);
            } else {
                syn::visit::visit_type(self, ty);
            }
        }
    }
    let mut f = Finder(None);
    f.visit_type(ty);
    f.0
}

/// Whether a type returns a future: `impl Future<…>`, `Pin<Box<dyn Future<…> + Send>>`,
/// `BoxFuture<'_, …>`. What an `async fn` becomes when another attribute (`#[async_trait]`)
/// rewrote it first.
pub(crate) fn is_future(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_trait_bound(&mut self, b: &'ast syn::TraitBound) {
            self.0 |= b.path.segments.last().is_some_and(|s| s.ident == "Future");
        }
        fn visit_type_path(&mut self, p: &'ast syn::TypePath) {
            let last = p.path.segments.last();
            if last.is_some_and(|s| s.ident == "BoxFuture" || s.ident == "LocalBoxFuture") {
                self.0 = true;
            }
            syn::visit::visit_type_path(self, p);
        }
    }
    let mut f = Finder(false);
    f.visit_type(ty);
    f.0
}

/// What the tokens say about a bound of a type parameter or an `impl Trait`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Bounded {
    /// One of its bounds names the trait (by its last path segment).
    Yes,
    /// Every bound is a standard trait that cannot imply it (`Clone`, `Debug`, `Send`, …), or
    /// there is none: the compiler would refuse the type, and the fix is a bound.
    No,
    /// Not a type parameter of the function, or bounded by a trait of the user's (which may
    /// have the trait as a supertrait): the compiler decides.
    Unknown,
}

/// Whether `ty`, a type parameter of `generics` (`T`, with its bounds inline and in the
/// `where` clause) or an `impl Trait`, is bounded by one of `traits`.
pub(crate) fn bounded_by(ty: &Type, generics: &syn::Generics, traits: &[&str]) -> Bounded {
    let bounds: Vec<&syn::TypeParamBound> = match ty {
        Type::ImplTrait(t) => t.bounds.iter().collect(),
        Type::Paren(p) => return bounded_by(&p.elem, generics, traits),
        Type::Group(g) => return bounded_by(&g.elem, generics, traits),
        Type::Path(p) if p.qself.is_none() => {
            let Some(ident) = p.path.get_ident() else {
                return Bounded::Unknown;
            };
            let Some(param) = generics.type_params().find(|t| t.ident == *ident) else {
                return Bounded::Unknown;
            };
            let mut bounds: Vec<_> = param.bounds.iter().collect();
            for pred in generics.where_clause.iter().flat_map(|w| &w.predicates) {
                let syn::WherePredicate::Type(pred) = pred else {
                    continue;
                };
                match &pred.bounded_ty {
                    Type::Path(b) if b.qself.is_none() && b.path.is_ident(ident) => {
                        bounds.extend(&pred.bounds);
                    }
                    // `Vec<T>: Trait`, `<T as Trait>::Item: …`: more than tokens can judge.
                    other if mentions(other, ident) => return Bounded::Unknown,
                    _ => {}
                }
            }
            bounds
        }
        _ => return Bounded::Unknown,
    };
    let mut known = true;
    for bound in bounds {
        match bound {
            syn::TypeParamBound::Trait(t) if t.maybe.is_some() => {}
            syn::TypeParamBound::Trait(t) => {
                let Some(last) = t.path.segments.last() else {
                    continue;
                };
                if traits.iter().any(|n| last.ident == n) {
                    return Bounded::Yes;
                }
                known &= standard_trait(&t.path);
            }
            syn::TypeParamBound::Lifetime(_) => {}
            _ => known = false,
        }
    }
    if known { Bounded::No } else { Bounded::Unknown }
}

/// A trait of the standard library (or serde's `Serialize`) that implies none of the traits
/// the checks ask about: written bare (`Debug`) or from `std`, `core`, `alloc` or `serde`.
fn standard_trait(path: &syn::Path) -> bool {
    const STANDARD: &[&str] = &[
        "Clone",
        "Copy",
        "Debug",
        "Display",
        "Default",
        "Send",
        "Sync",
        "Sized",
        "Unpin",
        "PartialEq",
        "Eq",
        "PartialOrd",
        "Ord",
        "Hash",
        "ToString",
        "Any",
        "Serialize",
        "From",
        "Into",
        "AsRef",
    ];
    // Known by these names only when written with their crate: a bare `Error` may be the user's.
    const QUALIFIED: &[&str] = &["Error"];
    let qualified = match path.segments.first() {
        Some(first) if path.segments.len() > 1 => {
            if !["std", "core", "alloc", "serde"]
                .iter()
                .any(|c| first.ident == c)
            {
                return false;
            }
            true
        }
        _ => false,
    };
    path.segments.last().is_some_and(|s| {
        STANDARD.iter().any(|n| s.ident == n)
            || (qualified && QUALIFIED.iter().any(|n| s.ident == n))
    })
}

/// Whether `ty` names `ident` anywhere.
fn mentions(ty: &Type, ident: &syn::Ident) -> bool {
    struct Finder<'a>(&'a syn::Ident, bool);
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_ident(&mut self, i: &'ast syn::Ident) {
            self.1 |= i == self.0;
        }
    }
    let mut f = Finder(ident, false);
    f.visit_type(ty);
    f.1
}

/// `ty` without the references around it: `&mut T` is `T`.
pub(crate) fn unreferenced(ty: &Type) -> &Type {
    match ty {
        Type::Reference(r) => unreferenced(&r.elem),
        Type::Paren(p) => unreferenced(&p.elem),
        Type::Group(g) => unreferenced(&g.elem),
        t => t,
    }
}

#[cfg(test)]
mod tests {
    use syn::{Generics, Type, parse_quote};

    use super::{Bounded, borrowed_part, bounded_by, is_future};

    fn generics(f: syn::ItemFn) -> Generics {
        f.sig.generics
    }

    #[test]
    fn a_parameter_with_standard_bounds_lacks_the_trait() {
        let g = generics(parse_quote!(
            fn f<T: Clone + std::fmt::Debug + Send + 'static, U>() {}
        ));
        assert_eq!(
            bounded_by(&parse_quote!(T), &g, &["Serialize"]),
            Bounded::No
        );
        assert_eq!(
            bounded_by(&parse_quote!(U), &g, &["Serialize"]),
            Bounded::No
        );
        let t: Type = parse_quote!(impl std::fmt::Display);
        assert_eq!(bounded_by(&t, &g, &["Serialize"]), Bounded::No);
        let g = generics(parse_quote!(
            fn f<E>()
            where
                E: std::error::Error + From<String>,
            {
            }
        ));
        assert_eq!(
            bounded_by(&parse_quote!(E), &g, &["FinalError"]),
            Bounded::No
        );
    }

    #[test]
    fn a_bound_inline_or_in_the_where_clause_is_seen() {
        let g = generics(parse_quote!(
            fn f<T: serde::Serialize, U>()
            where
                U: for<'de> Deserialize<'de>,
            {
            }
        ));
        assert_eq!(
            bounded_by(&parse_quote!(T), &g, &["Serialize"]),
            Bounded::Yes
        );
        assert_eq!(
            bounded_by(&parse_quote!(U), &g, &["Deserialize"]),
            Bounded::Yes
        );
        let t: Type = parse_quote!(impl Display + Serialize);
        assert_eq!(bounded_by(&t, &g, &["Serialize"]), Bounded::Yes);
    }

    #[test]
    fn what_tokens_cannot_judge_is_left_to_the_compiler() {
        // A trait of the user's may have the bound as a supertrait; a bare `Error` may be theirs.
        let g = generics(parse_quote!(
            fn f<T: Answer, E: Error, V>()
            where
                Vec<V>: Clone,
            {
            }
        ));
        assert_eq!(
            bounded_by(&parse_quote!(T), &g, &["Serialize"]),
            Bounded::Unknown
        );
        assert_eq!(
            bounded_by(&parse_quote!(E), &g, &["From"]),
            Bounded::Unknown
        );
        assert_eq!(
            bounded_by(&parse_quote!(V), &g, &["Serialize"]),
            Bounded::Unknown
        );
        // Not a parameter of the function: a concrete type, or one of the `impl` block's.
        assert_eq!(
            bounded_by(&parse_quote!(Order), &g, &["Serialize"]),
            Bounded::Unknown
        );
        let t: Type = parse_quote!(impl my::Payload);
        assert_eq!(bounded_by(&t, &g, &["Serialize"]), Bounded::Unknown);
    }

    #[test]
    fn borrowed_answers_are_found_and_owned_ones_pass() {
        for (ty, part) in [
            (parse_quote!(&str), "& str"),
            (parse_quote!(&'static str), "& 'static str"),
            (parse_quote!(Cow<'a, str>), "Cow < 'a , str >"),
            (parse_quote!(Json<Order<'_>>), "Order < '_ >"),
            (parse_quote!(Vec<&'a [u8]>), "& 'a [u8]"),
        ] {
            let ty: Type = ty;
            let found = borrowed_part(&ty).map(|t| quote::quote!(#t).to_string());
            assert_eq!(found.as_deref(), Some(part), "{}", quote::quote!(#ty));
        }
        for ty in [
            parse_quote!(String),
            parse_quote!(Cow<'static, str>),
            parse_quote!((StatusCode, Json<Order>)),
        ] {
            let ty: Type = ty;
            assert!(borrowed_part(&ty).is_none(), "{}", quote::quote!(#ty));
        }
    }

    #[test]
    fn futures_written_by_hand_or_by_another_attribute() {
        for ty in [
            parse_quote!(Pin<Box<dyn Future<Output = Result<u64, Error>> + Send + 'a>>),
            parse_quote!(impl std::future::Future<Output = u64>),
            parse_quote!(BoxFuture<'static, u64>),
        ] {
            let ty: Type = ty;
            assert!(is_future(&ty), "{}", quote::quote!(#ty));
        }
        assert!(!is_future(&parse_quote!(Result<u64, Error>)));
    }
}
