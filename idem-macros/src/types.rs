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

#[cfg(test)]
mod tests {
    use syn::{Type, parse_quote};

    use super::{borrowed_part, is_future};

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
